// SPDX-License-Identifier: MIT
#include "stack/frame.hpp"

#include <cstring>

#include <rte_ip.h>

#include "base/byteorder.hpp"

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
    auto* ip = reinterpret_cast<rte_ipv4_hdr*>(frame + 14);
    ip->total_length = rte_cpu_to_be_16(static_cast<std::uint16_t>(hdr_len - 14));
    ip->hdr_checksum = 0;
    ip->hdr_checksum = rte_ipv4_cksum(ip);
}

bool tcp_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept {
    // The sum over pseudo header, header and payload folds to all ones when the segment is intact.
    const auto* ip = reinterpret_cast<const rte_ipv4_hdr*>(frame + 14);
    std::uint32_t sum = rte_raw_cksum(frame + 14 + f.ihl, f.hdr_len - 14 - f.ihl + f.payload_len);
    sum += rte_ipv4_phdr_cksum(ip, 0);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return sum == 0xffff;
}

bool ip_checksum_ok(const std::byte* frame, const TcpFrame& f) noexcept {
    std::uint32_t sum = rte_raw_cksum(frame + 14, f.ihl);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return sum == 0xffff;
}

}  // namespace softrdma::stack
