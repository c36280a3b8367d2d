// SPDX-License-Identifier: MIT
// The iWARP vocabulary the API shares with the protocol layers: the TERMINATE cause triple and the MPA
// connection choices. Standard C++ only; the protocol layers (mpa, ddp, rdmap) use these same types.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace softrdma {

// (layer, error type, error code): every iWARP protocol error (RFC 5040 section 4.8 and 7, RFC 5041 section 7,
// RFC 5044 section 8, RFC 6581 section 9). verbs::to_string(TermCode) names it.
enum class TermLayer : std::uint8_t { rdmap = 0, ddp = 1, llp = 2 };

struct TermCode {
    TermLayer layer{TermLayer::rdmap};
    std::uint8_t etype{0};  // 4 bits on the wire
    std::uint8_t ecode{0};  // 8 bits on the wire

    friend constexpr bool operator==(const TermCode&, const TermCode&) = default;
};

// MPA CRC (RFC 5044 section 7.1): off = we ask for none but accept a peer's; preferred = ask for it;
// required = refuse a peer without it; forbidden = refuse a peer that insists.
enum class CrcPolicy : std::uint8_t { off, preferred, required, forbidden };

// RFC 6581 ready-to-receive messages: zero-length RDMA WRITE, RDMA READ or SEND.
struct RtrSet {
    bool write = false;
    bool read = false;
    bool send = false;
};

// Private data as received in an MPA request or reply (at most 512 bytes on the wire: RFC 5044 section 7.1).
inline constexpr std::size_t kMaxPrivateDataReceived = 512;
struct PrivateData {
    std::array<std::byte, kMaxPrivateDataReceived> bytes{};
    std::uint16_t size = 0;

    std::span<const std::byte> span() const { return {bytes.data(), size}; }
    void assign(std::span<const std::byte> s);  // truncates at kMaxPrivateDataReceived
};

}  // namespace softrdma
