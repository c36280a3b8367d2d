// SPDX-License-Identifier: MIT
#include "stack/frame.hpp"

#include <cstring>

#include "base/byteorder.hpp"

namespace softrdma::stack {

namespace {

// The Internet checksum's ones' complement sum (RFC 1071) of n bytes, not yet folded. Words are read in host
// order: the ones' complement sum is byte-order independent (RFC 1071 section 2.B), so a sum folded to all
// ones means the same in either order, and a checksum stored as it is computed lands in network order. An odd
// last byte counts as the first byte of a zero-padded word. Our own code (no DPDK), so the parser also builds
// in the fuzzing build, which has no DPDK.
std::uint64_t sum_words(const std::byte* p, std::size_t n) noexcept {
    std::uint64_t s = 0;
    for (; n >= 2; p += 2, n -= 2) {
        std::uint16_t w;
        std::memcpy(&w, p, 2);
        s += w;
    }
    if (n != 0) {
        const std::byte last[2] = {p[0], std::byte{0}};
        std::uint16_t w;
        std::memcpy(&w, last, 2);
        s += w;
    }
    return s;
}

std::uint16_t fold(std::uint64_t s) noexcept {
    while ((s >> 16) != 0) s = (s & 0xffff) + (s >> 16);
    return static_cast<std::uint16_t>(s);
}

}  // namespace

TcpFrame parse_tcp_frame(const std::byte* f, std::uint32_t len) noexcept {
    TcpFrame v;
    if (len < 14 + 20 + 20 || get_be16(f + 12) != 0x0800) return v;
    const std::byte* ip = f + 14;
    if ((std::to_integer<unsigned>(ip[0]) >> 4) != 4 || std::to_integer<unsigned>(ip[9]) != 6) return v;
    v.ihl = (std::to_integer<std::uint32_t>(ip[0]) & 0x0f) * 4;
    const std::uint32_t total = get_be16(ip + 2);
    if ((get_be16(ip + 6) & 0x3fff) != 0) return v;  // a fragment (MF or offset): lwIP reassembles
    if (v.ihl < 20 || total < v.ihl + 20 || 14 + total > len) return v;
    const std::byte* tcp = ip + v.ihl;
    const std::uint32_t doff = (std::to_integer<std::uint32_t>(tcp[12]) >> 4) * 4;
    if (doff < 20 || v.ihl + doff > total) return v;
    v.hdr_len = 14 + v.ihl + doff;
    v.payload_len = total - v.ihl - doff;
    v.seq = get_be32(tcp + 4);
    std::memcpy(&v.src_ip_be, ip + 12, 4);
    v.src_port = get_be16(tcp);
    v.dst_port = get_be16(tcp + 2);
    v.valid = true;
    return v;
}

void cut_payload(std::byte* frame, std::uint32_t hdr_len) noexcept {
    std::byte* ip = frame + 14;
    const std::uint32_t ihl = (std::to_integer<std::uint32_t>(ip[0]) & 0x0f) * 4;
    put_be16(ip + 2, static_cast<std::uint16_t>(hdr_len - 14));
    // A FIN sits after the payload (sequence number seq + payload length). Kept on a segment cut to seq + 0,
    // lwIP would queue the FIN out of order at seq and, once the gap before it filled, end the stream there, the
    // cut payload never acknowledged: the peer's FIN never taken. The peer resends the FIN with its payload.
    ip[ihl + 13] &= ~std::byte{0x01};
    std::memset(ip + 10, 0, 2);
    const auto sum = static_cast<std::uint16_t>(~fold(sum_words(ip, ihl)));
    std::memcpy(ip + 10, &sum, 2);  // host-order sum stored as is: network order (see sum_words)
}

bool tcp_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept {
    // The sum over pseudo header, header and payload folds to all ones when the segment is intact.
    const std::byte* ip = frame + 14;
    const std::uint32_t tcp_len = f.hdr_len - 14 - f.ihl + f.payload_len;
    std::byte pseudo[12];
    std::memcpy(pseudo, ip + 12, 8);  // source and destination addresses
    pseudo[8] = std::byte{0};
    pseudo[9] = std::byte{6};         // protocol: TCP
    put_be16(pseudo + 10, static_cast<std::uint16_t>(tcp_len));
    return fold(sum_words(pseudo, sizeof pseudo) + sum_words(ip + f.ihl, tcp_len)) == 0xffff;
}

bool ip_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept {
    return fold(sum_words(frame + 14, f.ihl)) == 0xffff;
}

}  // namespace softrdma::stack
