// SPDX-License-Identifier: MIT
// stack/frame.cpp, the RX thread's frame parser, on frames the wire tests' TCP writer builds (checksums
// computed there, independently): accepted with the right fields, both checksums good; any flipped byte of
// the IPv4 header or the TCP segment caught; cut_payload leaves a good frame without payload. And the checksum
// sum they (and lwIP, LWIP_CHKSUM) use, base/inet_sum.hpp, against RFC 1071's plain 16-bit loop.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "base/inet_sum.hpp"

#include "stack/frame.hpp"
#include "tests/wire/pcap.hpp"
#include "tests/wire/tcp_flow.hpp"

using namespace softrdma;

namespace {
std::vector<wire::Frame> frames() {
    wire::PcapWriter pcap;
    const wire::Endpoint client{{0x02, 0, 0, 0, 0, 0x03}, {10, 99, 0, 3}, 40000};
    const wire::Endpoint server{{0x02, 0, 0, 0, 0, 0x04}, {10, 99, 0, 4}, 4791};
    wire::TcpSessionWriter tcp(pcap, client, server, 536);
    std::vector<std::uint8_t> data(777);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 31 + 7);
    tcp.send(wire::Dir::client_to_server, std::span(data).first(1));    // odd length: a padded last word
    tcp.send(wire::Dir::client_to_server, data);
    tcp.send(wire::Dir::server_to_client, std::span(data).first(100));
    return wire::parse_capture(pcap.image());
}
}  // namespace

TEST_CASE("frame parser: fields, checksums, cut_payload", "[stack][frame]") {
    const std::vector<wire::Frame> all = frames();
    REQUIRE(all.size() >= 6);
    std::size_t with_payload = 0;
    for (const wire::Frame& fr : all) {
        std::vector<std::byte> f(fr.bytes.size());
        std::memcpy(f.data(), fr.bytes.data(), f.size());
        const auto len = static_cast<std::uint32_t>(f.size());
        const stack::TcpFrame v = stack::parse_tcp_frame(f.data(), len);
        REQUIRE(v.valid);
        CHECK(v.ihl == 20);
        CHECK(v.hdr_len + v.payload_len <= len);
        CHECK((v.src_port == 40000 || v.src_port == 4791));
        CHECK(stack::ip_checksum_ok(f.data(), v));
        CHECK(stack::tcp_checksum_ok(f.data(), v));
        if (v.payload_len != 0) ++with_payload;

        // One flipped bit anywhere in the IPv4 header or the TCP segment is caught by one of the two.
        for (std::size_t i = 14; i < v.hdr_len + v.payload_len; ++i) {
            f[i] ^= std::byte{0x10};
            const stack::TcpFrame w = stack::parse_tcp_frame(f.data(), len);
            if (w.valid && w.ihl == v.ihl && w.hdr_len == v.hdr_len && w.payload_len == v.payload_len) {
                INFO("byte " << i);
                CHECK_FALSE((stack::ip_checksum_ok(f.data(), w) && stack::tcp_checksum_ok(f.data(), w)));
            }
            f[i] ^= std::byte{0x10};
        }

        // A FIN on the segment (after its payload) does not survive the cut; the other flags do.
        const std::size_t flags = 14 + v.ihl + 13;
        f[flags] |= std::byte{0x01};
        const std::byte others = f[flags] & ~std::byte{0x01};
        stack::cut_payload(f.data(), v.hdr_len);
        const stack::TcpFrame c = stack::parse_tcp_frame(f.data(), len);
        REQUIRE(c.valid);
        CHECK(c.payload_len == 0);
        CHECK(c.hdr_len == v.hdr_len);
        CHECK(c.seq == v.seq);
        CHECK(stack::ip_checksum_ok(f.data(), c));
        CHECK((f[flags] & std::byte{0x01}) == std::byte{0});
        CHECK(f[flags] == others);
    }
    CHECK(with_payload >= 3);
}

TEST_CASE("frame parser: not TCP over IPv4, fragments, bad lengths are refused", "[stack][frame]") {
    std::vector<std::uint8_t> b = frames().at(3).bytes;
    auto parse = [&b] {
        std::vector<std::byte> f(b.size());
        std::memcpy(f.data(), b.data(), b.size());
        return stack::parse_tcp_frame(f.data(), static_cast<std::uint32_t>(f.size()));
    };
    REQUIRE(parse().valid);
    auto with = [&](std::size_t at, std::uint8_t v) {
        const std::uint8_t old = b[at];
        b[at] = v;
        const bool ok = parse().valid;
        b[at] = old;
        return ok;
    };
    CHECK_FALSE(with(12, 0x86));  // IPv6 ethertype
    CHECK_FALSE(with(14, 0x65));  // IP version 6
    CHECK_FALSE(with(14, 0x44));  // IHL 16 bytes
    CHECK_FALSE(with(23, 17));    // UDP
    CHECK_FALSE(with(20, 0x20));  // MF: a fragment
    CHECK_FALSE(with(16, 0xff));  // total length past the frame
    CHECK_FALSE(with(46, 0x40));  // TCP data offset 16 bytes
    b.resize(53);
    CHECK_FALSE(parse().valid);   // shorter than the headers
}

namespace {
// RFC 1071's loop, 16 bits at a time with the carries added back, words in host order, an odd last byte
// padded with a zero.
std::uint16_t rfc1071_sum(const unsigned char* p, std::size_t n) {
    std::uint32_t s = 0;
    for (; n >= 2; p += 2, n -= 2) {
        std::uint16_t w;
        std::memcpy(&w, p, 2);
        s += w;
        s = (s & 0xffff) + (s >> 16);
    }
    if (n != 0) {
        const unsigned char last[2] = {p[0], 0};
        std::uint16_t w;
        std::memcpy(&w, last, 2);
        s += w;
        s = (s & 0xffff) + (s >> 16);
    }
    return static_cast<std::uint16_t>(s);
}
}  // namespace

TEST_CASE("ones' complement sum: eight bytes per step equals RFC 1071's loop", "[stack][checksum]") {
    // RFC 1071 section 3's example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2 (as big-endian words).
    const unsigned char ex[8] = {0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7};
    std::uint16_t be;
    const std::uint16_t sum = ones_fold(ones_sum(ex, sizeof ex));
    std::memcpy(&be, &sum, 2);
    const unsigned char* b = reinterpret_cast<const unsigned char*>(&be);
    CHECK(((b[0] << 8) | b[1]) == 0xddf2);

    std::mt19937 rng(1071);
    std::vector<unsigned char> buf(65536 + 16);
    for (const int pattern : {0, 1, 2}) {  // random bytes; all ones (a carry on every step); all zeros
        for (auto& c : buf) c = pattern == 0 ? static_cast<unsigned char>(rng()) : pattern == 1 ? 0xff : 0;
        std::vector<std::size_t> lengths;
        for (std::size_t n = 0; n <= 80; ++n) lengths.push_back(n);
        for (std::size_t n : {1459u, 1460u, 8960u, 9001u, 65535u, 65536u}) lengths.push_back(n);
        for (const std::size_t n : lengths) {
            for (std::size_t off = 0; off < 8; ++off) {
                INFO("pattern " << pattern << " length " << n << " offset " << off);
                const unsigned char* p = buf.data() + off;
                const std::uint16_t want = rfc1071_sum(p, n);
                REQUIRE(ones_fold(ones_sum(p, n)) == want);
                // In two pieces, the first of even length, its sum carried into the second's.
                const std::size_t cut = (n / 3) & ~std::size_t{1};
                REQUIRE(ones_fold(ones_sum(p + cut, n - cut, ones_sum(p, cut))) == want);
            }
        }
    }
    // A non-zero sum never folds to zero: all ones stay 0xffff (RFC 1071's loop cannot give 0 either).
    CHECK(ones_fold(ones_sum(buf.data(), 0)) == 0);
    const unsigned char ff[4] = {0xff, 0xff, 0xff, 0xff};
    CHECK(ones_fold(ones_sum(ff, 4)) == 0xffff);
    CHECK(ones_fold(~std::uint64_t{0}) == 0xffff);
}
