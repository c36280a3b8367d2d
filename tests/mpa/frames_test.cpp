// SPDX-License-Identifier: MIT
// MPA Request/Reply frames: round trips, resumable decoding, bounds, and real siw frames from the captures.
#include <catch2/catch.hpp>

#include <cstring>

#include "mpa/errors.hpp"
#include "mpa/frames.hpp"
#include "test_util.hpp"

using namespace softrdma::mpa;
using softrdma::mpa::test::hex;

namespace {

// Feeds bytes in pieces of `step` (0 = all at once); returns total consumed.
std::size_t feed_in_steps(FrameDecoder& d, std::span<const std::byte> in, std::size_t step) {
    std::size_t off = 0;
    while (off < in.size() && d.status() == FrameDecoder::Status::need_more) {
        const std::size_t k = step == 0 ? in.size() - off : std::min(step, in.size() - off);
        const auto r = d.feed(in.subspan(off, k));
        REQUIRE(r.consumed <= k);
        off += r.consumed;
        if (r.consumed < k) break;
    }
    return off;
}

}  // namespace

TEST_CASE("frames: encode/decode round trip of every frame kind", "[frames]") {
    std::vector<std::byte> pd_small = softrdma::mpa::test::bytes_of("hello"), pd_none;
    std::vector<std::byte> pd_max(kMaxAppPrivateDataV2);
    for (std::size_t i = 0; i < pd_max.size(); ++i) pd_max[i] = static_cast<std::byte>(i * 7);
    const IrdOrd io_variants[] = {
        {1, 1, false, false, false, false},
        {0x3fff, 0, true, false, true, true},
        {32, 32, true, false, false, true},
        {5, 7, true, true, false, false},
    };
    for (FrameKind kind : {FrameKind::request, FrameKind::reply}) {
        for (std::uint8_t rev : {1, 2}) {
            for (int flags = 0; flags < 8; ++flags) {
                for (const auto* pd : {&pd_none, &pd_small, &pd_max}) {
                    for (std::size_t v = 0; v < (rev == 2 ? std::size(io_variants) + 1 : 1); ++v) {
                        const IrdOrd* io = (rev == 2 && v < std::size(io_variants)) ? &io_variants[v] : nullptr;
                        FrameParams p{kind, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0, rev, io, *pd};
                        std::array<std::byte, kMaxFrameSize + 8> buf{};
                        const std::size_t n = encode_frame(buf, p);
                        REQUIRE(n == frame_size(p));
                        REQUIRE(n == kFrameHeaderSize + (io ? 4 : 0) + pd->size());
                        for (std::size_t step : {0u, 1u, 3u}) {
                            FrameDecoder d(kind);
                            // Trailing bytes after the frame are not consumed.
                            std::vector<std::byte> wire(buf.begin(), buf.begin() + n);
                            wire.push_back(std::byte{0xAB});
                            REQUIRE(feed_in_steps(d, wire, step) == n);
                            REQUIRE(d.status() == FrameDecoder::Status::done);
                            const Frame& f = d.frame();
                            CHECK(f.kind == kind);
                            CHECK(f.markers == p.markers);
                            CHECK(f.crc == p.crc);
                            CHECK(f.reject == p.reject);
                            CHECK(f.revision == rev);
                            CHECK(f.enhanced == (io != nullptr));
                            if (io) CHECK(f.ird_ord == *io);
                            REQUIRE(f.private_data().size() == pd->size());
                            CHECK(std::equal(pd->begin(), pd->end(), f.private_data().begin()));
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("frames: flag and IRD/ORD bit positions", "[frames]") {
    const IrdOrd io{0x1234 & kIrdOrdMask, 0x0321, true, true, true, true};
    std::array<std::byte, 64> buf{};
    const std::size_t n = encode_frame(buf, FrameParams{FrameKind::request, true, true, true, 2, &io, {}});
    REQUIRE(n == 24);
    CHECK(std::memcmp(buf.data(), "MPA ID Req Frame", 16) == 0);
    CHECK(buf[16] == std::byte{0xF0});  // M C R enhanced
    CHECK(buf[17] == std::byte{2});
    CHECK(buf[18] == std::byte{0});
    CHECK(buf[19] == std::byte{4});
    CHECK(buf[20] == std::byte{0xD2});  // 0x8000 | 0x4000 | 0x1234
    CHECK(buf[21] == std::byte{0x34});
    CHECK(buf[22] == std::byte{0xC3});  // 0x8000 | 0x4000 | 0x0321
    CHECK(buf[23] == std::byte{0x21});
}

TEST_CASE("frames: encoder limits", "[frames]") {
    std::vector<std::byte> pd(kMaxAppPrivateDataV2 + 1);
    const IrdOrd io{};
    std::array<std::byte, kMaxFrameSize> buf{};
    CHECK(encode_frame(buf, FrameParams{FrameKind::request, false, false, false, 2, &io, pd}) == 0);
    pd.resize(kMaxAppPrivateDataV2);
    CHECK(encode_frame(buf, FrameParams{FrameKind::request, false, false, false, 2, &io, pd}) == kFrameHeaderSize + 256);
    pd.resize(kMaxPrivateDataSent + 1);
    CHECK(encode_frame(buf, FrameParams{FrameKind::request, false, false, false, 1, nullptr, pd}) == 0);
    // IRD/ORD only with revision 2.
    CHECK(encode_frame(buf, FrameParams{FrameKind::request, false, false, false, 1, &io, {}}) == 0);
    // Output too small.
    CHECK(encode_frame(std::span(buf.data(), 19), FrameParams{FrameKind::request, false, false, false, 1, nullptr, {}}) == 0);
}

TEST_CASE("frames: decoder rejects bad keys, oversized and short frames", "[frames]") {
    std::array<std::byte, 64> buf{};
    const IrdOrd io{1, 1};
    const std::size_t n = encode_frame(buf, FrameParams{FrameKind::request, false, false, false, 2, &io, {}});
    SECTION("request key where a reply is expected fails at the key, byte by byte") {
        FrameDecoder d(FrameKind::reply);
        std::size_t fed = 0;
        while (d.status() == FrameDecoder::Status::need_more) {
            d.feed(std::span(buf.data() + fed, 1));
            ++fed;
        }
        CHECK(d.status() == FrameDecoder::Status::error);
        CHECK(d.error() == kTermInvalidFrame);
        CHECK(fed == 10);  // "MPA ID Re" is common; byte 9 ('q' vs 'p') differs
    }
    SECTION("garbage key") {
        FrameDecoder d(FrameKind::request);
        const auto g = softrdma::mpa::test::bytes_of("GET / HTTP/1.1\r\n....");
        const auto r = d.feed(g);
        CHECK(r.status == FrameDecoder::Status::error);
        CHECK(r.consumed <= kFrameHeaderSize);
    }
    SECTION("private data length over 512") {
        buf[18] = std::byte{0x02};
        buf[19] = std::byte{0x01};
        FrameDecoder d(FrameKind::request);
        const auto r = d.feed(std::span(buf.data(), n));
        CHECK(r.status == FrameDecoder::Status::error);
        CHECK(r.consumed == kFrameHeaderSize);
        CHECK(d.error() == kTermInvalidFrame);
    }
    SECTION("512 bytes of private data are accepted") {
        std::vector<std::byte> big(kFrameHeaderSize + 512 + 3);
        std::memcpy(big.data(), "MPA ID Req Frame", 16);
        big[17] = std::byte{1};
        big[18] = std::byte{0x02};
        big[19] = std::byte{0x00};
        FrameDecoder d(FrameKind::request);
        const auto r = d.feed(big);
        CHECK(r.status == FrameDecoder::Status::done);
        CHECK(r.consumed == kFrameHeaderSize + 512);
    }
    SECTION("enhanced frame without room for IRD/ORD") {
        buf[19] = std::byte{0x02};
        FrameDecoder d(FrameKind::request);
        CHECK(d.feed(std::span(buf.data(), n)).status == FrameDecoder::Status::error);
    }
    SECTION("a finished decoder consumes nothing more") {
        FrameDecoder d(FrameKind::request);
        CHECK(d.feed(std::span(buf.data(), n)).status == FrameDecoder::Status::done);
        CHECK(d.feed(std::span(buf.data(), n)).consumed == 0);
    }
}

TEST_CASE("frames: real siw frames from the captures decode as the README says", "[frames][captures]") {
    struct Case {
        const char* hex;
        FrameKind kind;
        bool crc;
        IrdOrd io;
    };
    const Case cases[] = {
        // rping.pcapng frames 8 and 10: rev 2, enhanced, no CRC, IRD/ORD 1/1.
        {"4d504120494420526571204672616d651002000400010001", FrameKind::request, false, {1, 1}},
        {"4d504120494420526570204672616d651002000400010001", FrameKind::reply, false, {1, 1}},
        // rping_crc.pcapng: C=1 both ways.
        {"4d504120494420526571204672616d655002000400010001", FrameKind::request, true, {1, 1}},
        {"4d504120494420526570204672616d655002000400010001", FrameKind::reply, true, {1, 1}},
        // rping_p2p.pcapng: request 8001 c001 (P2P, WRITE+READ RTR), reply 8001 8001 (P2P, WRITE RTR).
        {"4d504120494420526571204672616d65100200048001c001", FrameKind::request, false, {1, 1, true, false, true, true}},
        {"4d504120494420526570204672616d651002000480018001", FrameKind::reply, false, {1, 1, true, false, true, false}},
    };
    for (const auto& c : cases) {
        const auto bytes = hex(c.hex);
        FrameDecoder d(c.kind);
        REQUIRE(feed_in_steps(d, bytes, 1) == bytes.size());
        REQUIRE(d.status() == FrameDecoder::Status::done);
        const Frame& f = d.frame();
        CHECK(f.revision == 2);
        CHECK(f.enhanced);
        CHECK_FALSE(f.markers);
        CHECK_FALSE(f.reject);
        CHECK(f.crc == c.crc);
        CHECK(f.ird_ord == c.io);
        CHECK(f.private_data().empty());
        // Re-encoding gives the same bytes.
        std::array<std::byte, 64> out{};
        const std::size_t n = encode_frame(out, FrameParams{c.kind, false, c.crc, false, 2, &c.io, {}});
        REQUIRE(n == bytes.size());
        CHECK(std::memcmp(out.data(), bytes.data(), n) == 0);
    }
}
