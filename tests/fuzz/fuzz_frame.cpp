// SPDX-License-Identifier: MIT
// libFuzzer target: the RX thread's frame parser (stack/frame.cpp) on arbitrary Ethernet frames.
// The input is the frame, copied into a buffer of exactly its size (ASan sees any read past it).
// Invariants: an accepted frame's headers and payload lie inside the frame and agree with an independent
// reading of the same fields here; both checksum checks agree with a plain RFC 1071 sum computed here;
// cut_payload leaves a frame that parses again with no payload, the same headers and a good IPv4 checksum.
#include <cstring>
#include <vector>

#include "base/byteorder.hpp"
#include "stack/frame.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace softrdma;

namespace {

unsigned u8(const std::vector<std::byte>& f, std::size_t i) { return std::to_integer<unsigned>(f[i]); }
std::uint32_t be16(const std::vector<std::byte>& f, std::size_t i) { return u8(f, i) << 8 | u8(f, i + 1); }

// RFC 1071, byte by byte in network order.
std::uint32_t sum_be(const std::vector<std::byte>& f, std::size_t from, std::size_t n) {
    std::uint32_t s = 0;
    for (std::size_t i = 0; i < n; ++i) s += (i % 2 == 0) ? u8(f, from + i) << 8 : u8(f, from + i);
    return s;
}
std::uint16_t fold(std::uint32_t s) {
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return static_cast<std::uint16_t>(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::vector<std::byte> f(size);
    if (size != 0) std::memcpy(f.data(), data, size);
    const auto len = static_cast<std::uint32_t>(size);
    const stack::TcpFrame v = stack::parse_tcp_frame(f.data(), len);

    // The same decision, read independently.
    bool ok = size >= 54 && be16(f, 12) == 0x0800 && (u8(f, 14) >> 4) == 4 && u8(f, 23) == 6 &&
              (be16(f, 20) & 0x3fff) == 0;
    std::uint32_t ihl = 0, total = 0, doff = 0;
    if (ok) {
        ihl = (u8(f, 14) & 0xf) * 4;
        total = be16(f, 16);
        ok = ihl >= 20 && total >= ihl + 20 && 14 + total <= size;
    }
    if (ok) {
        doff = (u8(f, 14 + ihl + 12) >> 4) * 4;
        ok = doff >= 20 && ihl + doff <= total;
    }
    FUZZ_CHECK(v.valid == ok);
    if (!v.valid) return 0;

    FUZZ_CHECK(v.ihl == ihl && v.ihl >= 20 && v.ihl <= 60);
    FUZZ_CHECK(v.hdr_len == 14 + ihl + doff && v.hdr_len >= 54);
    FUZZ_CHECK(std::uint64_t{v.hdr_len} + v.payload_len <= size);
    FUZZ_CHECK(v.hdr_len + v.payload_len == 14 + total);
    FUZZ_CHECK(v.seq == (be16(f, 14 + ihl + 4) << 16 | be16(f, 14 + ihl + 6)));
    FUZZ_CHECK(v.src_port == be16(f, 14 + ihl) && v.dst_port == be16(f, 14 + ihl + 2));
    FUZZ_CHECK(std::memcmp(&v.src_ip_be, f.data() + 26, 4) == 0);

    FUZZ_CHECK(stack::ip_checksum_ok(f.data(), v) == (fold(sum_be(f, 14, ihl)) == 0xffff));
    const std::uint32_t tcp_len = total - ihl;
    const std::uint32_t pseudo = sum_be(f, 26, 8) + 6 + tcp_len;
    FUZZ_CHECK(stack::tcp_checksum_ok(f.data(), v) == (fold(pseudo + sum_be(f, 14 + ihl, tcp_len)) == 0xffff));

    // What the RX thread gives lwIP for a segment whose payload it drops: no payload, no FIN, other flags kept.
    const std::uint8_t flags = std::to_integer<std::uint8_t>(f[14 + ihl + 13]);
    stack::cut_payload(f.data(), v.hdr_len);
    FUZZ_CHECK(std::to_integer<std::uint8_t>(f[14 + ihl + 13]) == (flags & 0xfe));
    const stack::TcpFrame c = stack::parse_tcp_frame(f.data(), len);
    FUZZ_CHECK(c.valid);
    FUZZ_CHECK(c.payload_len == 0 && c.hdr_len == v.hdr_len && c.seq == v.seq && c.ihl == v.ihl);
    FUZZ_CHECK(stack::ip_checksum_ok(f.data(), c));
    FUZZ_CHECK(fold(sum_be(f, 14, ihl)) == 0xffff);
    return 0;
}
