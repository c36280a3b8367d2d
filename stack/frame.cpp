// SPDX-License-Identifier: MIT
#include "stack/frame.hpp"

#include <cstring>

#include "base/byteorder.hpp"
#include "base/inet_sum.hpp"

namespace softrdma::stack {

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
    const auto sum = static_cast<std::uint16_t>(~ones_fold(ones_sum(ip, ihl)));
    std::memcpy(ip + 10, &sum, 2);  // host-order sum stored as is: network order (base/inet_sum.hpp)
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
    return ones_fold(ones_sum(ip + f.ihl, tcp_len, ones_sum(pseudo, sizeof pseudo))) == 0xffff;
}

bool ip_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept {
    return ones_fold(ones_sum(frame + 14, f.ihl)) == 0xffff;
}

}  // namespace softrdma::stack
