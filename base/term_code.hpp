// SPDX-License-Identifier: MIT
// The (layer, error type, error code) triple that names every iWARP protocol error.
//
// RFC 5040 section 4.8 (Terminate header) and 7.4 (error codes) define it; every layer (MPA/LLP, DDP,
// RDMAP) reports its violations as one of these values, and RDMAP turns it into a TERMINATE message at a
// single choke point. The type is the API's (<softrdma/iwarp.hpp>, TerminateInfo hands it to applications);
// this header adds the data path's result type.
#pragma once

#include <cstdint>
#include <optional>

#include <softrdma/iwarp.hpp>

namespace softrdma {

// Result of a data-path protocol step: std::nullopt = success, otherwise the TERMINATE cause.
// Data-path functions return this; they never throw.
//
// Used as std::optional<TermCode> is (nullopt, operator bool, has_value, *, ->, ==), but held in one 32-bit
// word. std::optional<TermCode> is three bytes and a flag, which GCC 12 builds on the stack a byte at a
// time and then reloads as one 32-bit register: a load wider than the store just before it, which the CPU
// cannot forward (a store-forwarding stall, ~12+ cycles), at every return of every step of every FPDU. In
// proto_bench's placement loop that was most of rx_header's and rx_end's time (perf annotate, 2026-11-29).
class ProtoStatus {
public:
    constexpr ProtoStatus() noexcept = default;
    constexpr ProtoStatus(std::nullopt_t) noexcept {}  // NOLINT: implicit, as std::optional's
    constexpr ProtoStatus(TermCode t) noexcept  // NOLINT: implicit, as std::optional's
        : bits_(kSet | static_cast<std::uint32_t>(t.layer) << 16 | std::uint32_t{t.etype} << 8 | t.ecode) {}

    constexpr bool has_value() const noexcept { return bits_ != 0; }
    constexpr explicit operator bool() const noexcept { return bits_ != 0; }
    // The cause; only meaningful when has_value().
    constexpr TermCode operator*() const noexcept {
        return TermCode{static_cast<TermLayer>(bits_ >> 16 & 0xffu), static_cast<std::uint8_t>(bits_ >> 8),
                        static_cast<std::uint8_t>(bits_)};
    }
    constexpr TermCode value() const noexcept { return **this; }
    struct Arrow {
        TermCode code;
        constexpr const TermCode* operator->() const noexcept { return &code; }
    };
    constexpr Arrow operator->() const noexcept { return Arrow{**this}; }

    friend constexpr bool operator==(const ProtoStatus&, const ProtoStatus&) noexcept = default;
    friend constexpr bool operator==(ProtoStatus s, std::nullopt_t) noexcept { return !s.has_value(); }
    friend constexpr bool operator==(ProtoStatus s, TermCode t) noexcept { return s == ProtoStatus(t); }

private:
    static constexpr std::uint32_t kSet = 1u << 24;
    std::uint32_t bits_ = 0;  // 0 = success; else kSet | layer << 16 | etype << 8 | ecode
};
static_assert(sizeof(ProtoStatus) == 4);

}  // namespace softrdma
