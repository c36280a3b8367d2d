// SPDX-License-Identifier: MIT
// The (layer, error type, error code) triple that names every iWARP protocol error.
//
// RFC 5040 section 4.8 (Terminate header) and 7.4 (error codes) define it; every layer (MPA/LLP, DDP,
// RDMAP) reports its violations as one of these values, and RDMAP turns it into a TERMINATE message at a
// single choke point. It lives in base/ with what every layer shares: the protocol layers report it and the
// verbs API hands it to applications (TerminateInfo).
#pragma once

#include <cstdint>
#include <optional>

namespace softrdma {

enum class TermLayer : std::uint8_t { rdmap = 0, ddp = 1, llp = 2 };

struct TermCode {
    TermLayer layer{TermLayer::rdmap};
    std::uint8_t etype{0};  // 4 bits on the wire
    std::uint8_t ecode{0};  // 8 bits on the wire

    friend constexpr bool operator==(const TermCode&, const TermCode&) = default;
};

// Result of a data-path protocol step: std::nullopt = success, otherwise the TERMINATE cause.
// Data-path functions return this; they never throw.
using ProtoStatus = std::optional<TermCode>;

}  // namespace softrdma
