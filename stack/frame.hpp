// SPDX-License-Identifier: MIT
// The one parser of received Ethernet + IPv4 + TCP frames outside lwIP: what the RX thread needs to follow a
// connection (threading/rx_thread.cpp) — addresses, ports, sequence number, header and payload lengths — and
// the TCP checksum check it does because lwIP is then given only the headers (Stack::input_headers). lwIP
// reads the same headers again in tcp_input to advance its own state; that is lwIP's parser, not a second one
// of ours.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::stack {

// The parts of a frame a follower of TCP connections needs. valid false for anything else (ARP, IPv6,
// fragments, truncated or inconsistent lengths): such frames go to lwIP whole.
struct TcpFrame {
    bool valid{false};
    std::uint32_t ihl{0};          // IPv4 header bytes
    std::uint32_t hdr_len{0};      // Ethernet + IPv4 + TCP header bytes: the payload starts here
    std::uint32_t payload_len{0};  // TCP payload bytes
    std::uint32_t seq{0};          // TCP sequence number of the first payload byte
    std::uint32_t src_ip_be{0};    // network order
    std::uint16_t src_port{0};     // host order
    std::uint16_t dst_port{0};
};

TcpFrame parse_tcp_frame(const std::byte* frame, std::uint32_t len) noexcept;

// True when the TCP checksum (pseudo header, header, payload) of a frame parse_tcp_frame accepted is intact.
bool tcp_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept;
// The IPv4 header checksum of a frame parse_tcp_frame accepted (lwIP always checks it: whoever places a
// segment's payload ahead of lwIP must drop what lwIP would drop).
bool ip_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept;

// Rewrites the IPv4 header of a frame parse_tcp_frame accepted so that its segment carries no payload (total
// length cut to the headers, header checksum redone, FIN cleared): what lwIP is given for a segment whose
// payload is dropped (the RX thread's gap frames: lwIP sees the headers, the peer gets a duplicate ACK). The TCP
// checksum is left as it was (wrong now): lwIP does not check it for frames the RX thread followed.
void cut_payload(std::byte* frame, std::uint32_t hdr_len) noexcept;

// TCP sequence space comparison (RFC 1982 serial arithmetic): a comes after b.
constexpr bool seq_after(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) > 0; }

}  // namespace softrdma::stack
