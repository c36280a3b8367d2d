// SPDX-License-Identifier: MIT
// DDP (RFC 5041): header round trips, control word, segmentation at MULPDU boundaries, strict untagged
// reassembly checks, tagged continuity, the placement loop's bounds, and the layers' result type (ProtoStatus).
#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "ddp/header.hpp"
#include "ddp/reassembly.hpp"
#include "ddp/segment.hpp"
#include "base/byteorder.hpp"
#include "base/term_code.hpp"

using namespace softrdma;
using namespace softrdma::ddp;

namespace {
std::vector<std::byte> hex(std::initializer_list<unsigned> v) {
    std::vector<std::byte> out;
    for (unsigned b : v) out.push_back(static_cast<std::byte>(b));
    return out;
}
}  // namespace

TEST_CASE("big-endian accessors", "[ddp]") {
    std::array<std::byte, 8> b{};
    store_be64(b, 0, 0x0102030405060708ULL);
    CHECK(b[0] == std::byte{1});
    CHECK(b[7] == std::byte{8});
    CHECK(load_be64(b, 0) == 0x0102030405060708ULL);
    CHECK(load_be32(b, 4) == 0x05060708u);
    store_be16(b, 2, 0xBEEF);
    CHECK(load_be16(b, 2) == 0xBEEF);
}

// Every layer's checks return ProtoStatus (base/term_code.hpp): one 32-bit word standing in for
// std::optional<TermCode>. Every cause must come back as it went in, and none may read as success.
TEST_CASE("ProtoStatus keeps every TERMINATE cause and success apart, as std::optional<TermCode> does", "[ddp]") {
    const ProtoStatus ok = std::nullopt;
    CHECK_FALSE(ok);
    CHECK_FALSE(ok.has_value());
    CHECK(ok == std::nullopt);
    CHECK(ok == ProtoStatus{});
    std::size_t kept = 0;
    for (unsigned layer = 0; layer < 3; ++layer)
        for (unsigned etype = 0; etype < 16; ++etype)
            for (unsigned ecode = 0; ecode < 256; ++ecode) {
                const TermCode t{static_cast<TermLayer>(layer), static_cast<std::uint8_t>(etype),
                                 static_cast<std::uint8_t>(ecode)};
                const ProtoStatus s = t;
                const bool good = s.has_value() && static_cast<bool>(s) && *s == t && s.value() == t &&
                                  s->layer == t.layer && s->etype == t.etype && s->ecode == t.ecode && s == t &&
                                  s != ok && !(s == std::nullopt);
                if (!good) FAIL_CHECK("layer " << layer << " etype " << etype << " ecode " << ecode);
                kept += good ? 1 : 0;
            }
    CHECK(kept == 3u * 16u * 256u);
    CHECK(ProtoStatus(TermCode{TermLayer::rdmap, 0, 0}) != ProtoStatus(TermCode{TermLayer::ddp, 0, 0}));
    CHECK(ProtoStatus(TermCode{TermLayer::ddp, 1, 2}) != ProtoStatus(TermCode{TermLayer::ddp, 2, 1}));
}

TEST_CASE("control word masks", "[ddp]") {
    CHECK(ctrl_tagged(0xC140));
    CHECK(ctrl_last(0xC140));
    CHECK(ctrl_ddp_version(0xC140) == 1);
    CHECK_FALSE(ctrl_tagged(0x0143));
    CHECK_FALSE(ctrl_last(0x0143));
    CHECK(ctrl_with_last(0x0143, true) == 0x4143);
    CHECK(ctrl_with_last(0x4143, false) == 0x0143);
    CHECK_FALSE(check_ddp_ctrl(0x4143).has_value());
    CHECK_FALSE(check_ddp_ctrl(0x4143 | kCtrlDdpReserved).has_value());  // reserved bits not checked on RX
    CHECK(check_ddp_ctrl(0x4043) == err::u_version);                     // DV 0
    CHECK(check_ddp_ctrl(0x4243) == err::u_version);                     // DV 2
    CHECK(check_ddp_ctrl(0xC040) == err::t_version);
    CHECK(check_ddp_ctrl(0xC340) == err::t_version);
}

TEST_CASE("tagged header round trip and wire bytes", "[ddp]") {
    const TaggedHeader h{0xC140, 0x11223344, 0x0102030405060708ULL};
    std::array<std::byte, kTaggedHeaderLen> b{};
    h.encode(b);
    CHECK(std::vector<std::byte>(b.begin(), b.end()) ==
          hex({0xC1, 0x40, 0x11, 0x22, 0x33, 0x44, 1, 2, 3, 4, 5, 6, 7, 8}));
    const auto d = TaggedHeader::decode(b);
    REQUIRE(d);
    CHECK(*d == h);
    CHECK(d->last());
    CHECK_FALSE(TaggedHeader::decode(std::span<const std::byte>(b).first(13)));  // short
    b[0] = std::byte{0x41};                                                       // T clear
    CHECK_FALSE(TaggedHeader::decode(b));
}

TEST_CASE("untagged header round trip and wire bytes", "[ddp]") {
    const UntaggedHeader h{0x4144, 0xAABBCCDD, 0, 7, 0x100};
    std::array<std::byte, kUntaggedHeaderLen> b{};
    h.encode(b);
    CHECK(std::vector<std::byte>(b.begin(), b.end()) ==
          hex({0x41, 0x44, 0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 1, 0}));
    const auto d = UntaggedHeader::decode(b);
    REQUIRE(d);
    CHECK(*d == h);
    CHECK_FALSE(UntaggedHeader::decode(std::span<const std::byte>(b).first(17)));
    b[0] = std::byte{0xC1};
    CHECK_FALSE(UntaggedHeader::decode(b));
}

TEST_CASE("segmentation at MULPDU boundaries", "[ddp]") {
    static constexpr std::size_t M = 100;  // payload bytes per segment = MULPDU - header length
    const auto check = [](std::size_t total, std::size_t count) {
        const SegmentPlan p(total, M);
        REQUIRE(p.count() == count);
        std::size_t sum = 0;
        for (std::size_t i = 0; i < p.count(); ++i) {
            const Segment s = p.at(i);
            CHECK(s.offset == sum);
            CHECK(s.len <= M);
            CHECK(s.last == (i + 1 == p.count()));
            CHECK(p.from(s.offset) == s);
            if (!s.last) CHECK(s.len == M);
            sum += s.len;
        }
        CHECK(sum == total);
    };
    check(0, 1);
    CHECK(SegmentPlan(0, M).at(0) == Segment{0, 0, true});
    check(1, 1);
    check(M - 1, 1);
    check(M, 1);
    check(M + 1, 2);
    CHECK(SegmentPlan(M + 1, M).at(1) == Segment{M, 1, true});
    check(2 * M, 2);
    check(1 << 20, ((1 << 20) + M - 1) / M);
    check(1, 1);
    CHECK(SegmentPlan(5, 1).count() == 5);
}

TEST_CASE("untagged queue: strict MSN and MO", "[ddp]") {
    UntaggedQueue q;
    CHECK(q.expected_msn() == 1);  // RFC 5041 section 5.3: MSN starts at 1
    UntaggedHeader h{0x0143, 0, 0, 1, 0};
    CHECK_FALSE(q.check(h, 10));
    h.msn = 2;
    CHECK(q.check(h, 10) == err::u_msn_range);
    h.msn = 0;
    CHECK(q.check(h, 10) == err::u_msn_range);
    h.msn = 1;
    h.mo = 5;
    CHECK(q.check(h, 10) == err::u_invalid_mo);
    h.mo = 0;
    q.advance(10, false);  // first of two segments
    CHECK(q.in_message());
    CHECK(q.check(h, 10) == err::u_invalid_mo);  // must continue at MO 10
    h.mo = 10;
    CHECK_FALSE(q.check(h, 10));
    q.advance(10, true);
    CHECK_FALSE(q.in_message());
    CHECK(q.expected_msn() == 2);
    CHECK(q.expected_mo() == 0);
    h.msn = 2;
    h.mo = 0;
    CHECK(q.check(h, 0xFFFFFFFFu) == std::nullopt);
    h.mo = 0;
    q.advance(0, false);  // zero-length non-last segment still opens the message
    CHECK(q.in_message());
}

TEST_CASE("untagged queue: MO space overflow is message too long", "[ddp]") {
    UntaggedQueue q;
    q.advance(0xFFFFFF00u, false);
    UntaggedHeader h{0x0143, 0, 0, 1, 0xFFFFFF00u};
    CHECK_FALSE(q.check(h, 0xFF));
    CHECK(q.check(h, 0x100) == err::u_too_long);
}

TEST_CASE("tagged stream: continuity and TO wrap", "[ddp]") {
    TaggedStream t;
    TaggedHeader h{0x8140, 5, 1000};
    CHECK_FALSE(t.check(h, 100));
    t.advance(h, 100);
    CHECK(t.in_message());
    CHECK(t.received() == 100);
    h.to = 1000;
    CHECK(t.check(h, 10) == err::t_base_bounds);  // must continue at 1100
    h.to = 1100;
    h.stag = 6;
    CHECK(t.check(h, 10) == err::t_invalid_stag);
    h.stag = 5;
    h.ctrl = 0xC140;
    CHECK_FALSE(t.check(h, 10));
    t.advance(h, 10);
    CHECK_FALSE(t.in_message());
    CHECK(t.received() == 110);
    const TaggedHeader w{0xC140, 9, ~std::uint64_t{0} - 9};
    CHECK_FALSE(t.check(w, 10));                   // last byte at 2^64-1
    CHECK(t.check(w, 11) == err::t_to_wrap);
    CHECK_FALSE(t.check(TaggedHeader{0xC140, 9, ~std::uint64_t{0}}, 0));  // zero-length at the top
}

TEST_CASE("place: one copy into the targets the resolver names, nothing beyond", "[ddp]") {
    std::vector<std::byte> src(100);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i);
    std::vector<std::byte> dst(130, std::byte{0xAA});
    std::size_t calls = 0;
    // Targets of 16 bytes each starting at dst[10]: the piece crosses several.
    const auto resolve = [&](std::size_t off, std::size_t len) {
        ++calls;
        const std::size_t n = std::min(len, 16 - (off % 16));
        return Target{dst.data() + 10 + off, n, std::nullopt};
    };
    REQUIRE_FALSE(place(std::span<const std::byte>(src).first(40), 0, resolve));
    REQUIRE_FALSE(place(std::span<const std::byte>(src).subspan(40), 40, resolve));
    CHECK(calls == 8);
    for (std::size_t i = 0; i < 100; ++i) CHECK(dst[10 + i] == static_cast<std::byte>(i));
    for (std::size_t i = 0; i < 10; ++i) CHECK(dst[i] == std::byte{0xAA});
    for (std::size_t i = 110; i < 130; ++i) CHECK(dst[i] == std::byte{0xAA});
}

TEST_CASE("place: resolver errors and broken resolvers", "[ddp]") {
    std::vector<std::byte> src(10, std::byte{1});
    std::vector<std::byte> dst(10);
    CHECK(place(src, 0, [](std::size_t, std::size_t) { return Target{nullptr, 0, err::t_base_bounds}; }) ==
          err::t_base_bounds);
    CHECK(place(src, 0, [&](std::size_t, std::size_t) { return Target{dst.data(), 0, std::nullopt}; }) ==
          err::local_catastrophic);
    CHECK(place(src, 0, [&](std::size_t, std::size_t len) { return Target{dst.data(), len + 1, std::nullopt}; }) ==
          err::local_catastrophic);
    CHECK(place(src, 0, [](std::size_t, std::size_t len) { return Target{nullptr, len, std::nullopt}; }) ==
          err::local_catastrophic);
    CHECK_FALSE(place({}, 0, [](std::size_t, std::size_t) { return Target{nullptr, 0, err::t_base_bounds}; }));
}
