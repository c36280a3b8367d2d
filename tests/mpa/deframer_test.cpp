// SPDX-License-Identifier: MIT
// FpduTx and Deframer: framing, Marker placement, every split point, corruption cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "mpa/crc32c.hpp"
#include "mpa/deframer.hpp"
#include "mpa/errors.hpp"
#include "mpa/fpdu.hpp"
#include "test_util.hpp"

using namespace softrdma::mpa;
using softrdma::ProtoStatus;
using softrdma::TermCode;
using softrdma::TermLayer;

namespace {

// Header lengths like DDP/RDMAP (RFC 5041/5040, not counting the MPA length): tagged 14, untagged 18,
// READ request 46. Control word 0xFFFF is "invalid".
std::size_t test_header_length(std::uint16_t ctrl) {
    if (ctrl == 0xFFFF) return 0;
    if (ctrl & 0x8000) return 14;
    if ((ctrl & 0xF) == 1) return 46;
    return 18;
}

struct Ulpdu {
    std::vector<std::byte> header;
    std::vector<std::byte> payload;
    friend bool operator==(const Ulpdu&, const Ulpdu&) = default;
};

// Records what the deframer hands over; checks that payload spans point into the input.
struct Recorder {
    std::vector<Ulpdu> done;
    Ulpdu cur;
    std::size_t expect_payload = 0;
    std::size_t header_calls = 0, payload_calls = 0;
    const std::byte* in_lo = nullptr;
    const std::byte* in_hi = nullptr;
    ProtoStatus invalid_ctrl_error;

    std::size_t ulpdu_header_length(std::uint16_t ctrl) { return test_header_length(ctrl); }
    ProtoStatus on_ulpdu_header(std::span<const std::byte> h, std::size_t n) {
        ++header_calls;
        if (n == 0 && h.size() == 2 && test_header_length(softrdma::get_be16(h.data())) == 0)
            return invalid_ctrl_error;
        cur = Ulpdu{{h.begin(), h.end()}, {}};
        expect_payload = n;
        return std::nullopt;
    }
    ProtoStatus on_ulpdu_payload(std::span<const std::byte> b) {
        ++payload_calls;
        REQUIRE(!b.empty());
        REQUIRE(b.data() >= in_lo);
        REQUIRE(b.data() + b.size() <= in_hi);  // zero copy: points into the caller's buffer
        cur.payload.insert(cur.payload.end(), b.begin(), b.end());
        REQUIRE(cur.payload.size() <= expect_payload);
        return std::nullopt;
    }
    ProtoStatus on_ulpdu_end() {
        REQUIRE(cur.payload.size() == expect_payload);
        done.push_back(cur);
        return std::nullopt;
    }
};
static_assert(UlpduHandler<Recorder>);
static_assert(!CrcFusingHandler<Recorder>);

// Same, but copies with the fused copy+CRC helper.
struct FusingRecorder : Recorder {
    std::size_t fused_calls = 0;
    std::vector<std::byte> sink = std::vector<std::byte>(70000);
    ProtoStatus on_ulpdu_payload_crc(std::span<const std::byte> b, std::uint32_t& crc) {
        ++fused_calls;
        crc = crc32c_copy(crc, sink.data(), b.data(), b.size());
        cur.payload.insert(cur.payload.end(), sink.data(), sink.data() + b.size());
        return std::nullopt;
    }
};
static_assert(CrcFusingHandler<FusingRecorder>);

std::vector<std::byte> make_header(std::uint16_t ctrl, std::mt19937& rng) {
    std::vector<std::byte> h = softrdma::mpa::test::random_bytes(rng, test_header_length(ctrl));
    softrdma::put_be16(h.data(), ctrl);
    return h;
}

struct Stream {
    std::vector<std::byte> wire;
    std::vector<Ulpdu> ulpdus;
};

// FPDUs of assorted sizes, payload given in several SGE pieces.
Stream make_stream(const FpduTxConfig& cfg, std::uint64_t offset, std::uint32_t seed, std::size_t count = 7) {
    std::mt19937 rng(seed);
    FpduTx tx(cfg, offset);
    Stream s;
    const std::size_t sizes[] = {0, 1, 3, 2, 100, 509, 1000, 1442, 4, 777};
    const std::uint16_t ctrls[] = {0xC140, 0x4143, 0x4141, 0xC142, 0x4143};
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint16_t ctrl = ctrls[i % std::size(ctrls)];
        Ulpdu u{make_header(ctrl, rng), {}};
        std::size_t plen = (ctrl & 0xF) == 1 ? 0 : sizes[i % std::size(sizes)];
        if (u.header.size() + plen > tx.mulpdu()) plen = tx.mulpdu() - u.header.size();
        u.payload = softrdma::mpa::test::random_bytes(rng, plen);
        // Split the payload into up to three SGEs.
        std::vector<std::span<const std::byte>> sges;
        const std::size_t a = plen / 3, b = plen / 2;
        if (a) sges.emplace_back(u.payload.data(), a);
        if (b > a) sges.emplace_back(u.payload.data() + a, b - a);
        if (plen > b) sges.emplace_back(u.payload.data() + b, plen - b);
        const std::size_t want = tx.wire_size(u.header.size() + plen);
        std::vector<std::byte> out(want + 16, std::byte{0x5A});
        const std::size_t n = tx.write(out, u.header, sges);
        REQUIRE(n == want);
        REQUIRE(n <= cfg.emss);  // every FPDU fits one segment
        REQUIRE(out[n] == std::byte{0x5A});
        s.wire.insert(s.wire.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
        s.ulpdus.push_back(std::move(u));
    }
    return s;
}

template <class Handler>
ProtoStatus feed_cuts(Deframer<Handler>& d, Handler& h, const std::vector<std::byte>& wire,
                      const std::vector<std::size_t>& cuts) {
    std::size_t prev = 0;
    ProtoStatus st;
    auto piece = [&](std::size_t from, std::size_t to) {
        // Copy each piece to its own exact-size heap buffer so ASan catches any read past it.
        std::vector<std::byte> buf(wire.begin() + static_cast<std::ptrdiff_t>(from),
                                   wire.begin() + static_cast<std::ptrdiff_t>(to));
        h.in_lo = buf.data();
        h.in_hi = buf.data() + buf.size();
        return d.feed(buf, h);
    };
    for (std::size_t c : cuts) {
        if ((st = piece(prev, c))) return st;
        prev = c;
    }
    return piece(prev, wire.size());
}

const FpduTxConfig kModes[] = {
    {false, false, 1448}, {true, false, 1448}, {false, true, 1448}, {true, true, 1448}, {true, true, 536},
};

}  // namespace

TEST_CASE("fpdu: MULPDU and sizes", "[fpdu]") {
    CHECK(pad_length(0) == 2);
    CHECK(pad_length(1) == 1);
    CHECK(pad_length(2) == 0);
    CHECK(pad_length(0x22) == 0);
    CHECK(pad_length(0x4e) == 0);
    CHECK(pad_length(0x4f) == 3);
    CHECK(mulpdu_for(1448, false) == 1442);  // as siw sends (ib_write_bw.pcapng: ULPDU 1442)
    CHECK(mulpdu_for(1460, false) == 1454);
    CHECK(mulpdu_for(1450, false) == 1442);
    CHECK(mulpdu_for(1448, true) == 1430);
    CHECK(mulpdu_for(9000, false) == 8994);
    CHECK(mulpdu_for(65535, false) == 65526);
    CHECK(mulpdu_for(8, false) == 0);
    // Every MULPDU-sized FPDU fits the EMSS at every 4-aligned stream position.
    for (std::uint32_t emss : {536u, 1000u, 1448u, 1460u, 4000u, 8960u}) {
        for (bool markers : {false, true}) {
            for (std::uint64_t pos = 0; pos < 1024; pos += 4) {
                FpduTx tx({true, markers, emss}, pos);
                REQUIRE(tx.wire_size(tx.mulpdu()) <= emss);
            }
        }
    }
}

TEST_CASE("fpdu: byte-exact FPDU matches a real siw FPDU with CRC", "[fpdu][captures]") {
    // rping_crc.pcapng frame 15: SEND, ULPDU 34 bytes.
    const auto want = softrdma::mpa::test::hex(
        "00224143000000000000000000000001000000000000000000000000000000000000000084609a12");
    const std::vector<std::byte> hdr(want.begin() + 2, want.begin() + 20);
    const std::vector<std::byte> payload(want.begin() + 20, want.begin() + 36);
    FpduTx tx({true, false, 1448});
    std::vector<std::byte> out(tx.wire_size(34));
    REQUIRE(tx.write(out, hdr, payload) == want.size());
    CHECK(out == want);
    // With CRC off the field is zero (rping.pcapng frame 15).
    FpduTx tx0({false, false, 1448});
    REQUIRE(tx0.write(out, hdr, payload) == want.size());
    CHECK(std::all_of(out.end() - 4, out.end(), [](std::byte b) { return b == std::byte{0}; }));
    // Frame 14 has two pad bytes.
    const auto f14 = softrdma::mpa::test::hex(
        "004ec14211a236000000560cda9fff3072646d612d70696e672d303a204142434445464748494a4b4c4d4e4f5051525354"
        "55565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200724edf49");
    FpduTx tx14({true, false, 1448});
    std::vector<std::byte> out14(tx14.wire_size(0x4e));
    REQUIRE(tx14.write(out14, std::span(f14.data() + 2, 14), std::span(f14.data() + 16, 0x4e - 14)) == f14.size());
    CHECK(out14 == f14);
}

TEST_CASE("fpdu: marker placement against hand-computed positions", "[fpdu][markers]") {
    FpduTx tx({true, true, 1448});
    std::vector<std::byte> hdr(14, std::byte{0x11});
    hdr[0] = std::byte{0xC1};
    hdr[1] = std::byte{0x40};
    // FPDU 1: ULPDU 600 (hdr 14 + payload 586). Unmarked size 2+600+2+4 = 608.
    // Stream 0: marker(0) at [0,4) FPDUPTR 0; length [4,6); ULPDU [6,512); marker at 512 FPDUPTR 512;
    // ULPDU rest [516,610); pad [610,612); CRC [612,616). Total 616 = 608 + 2 markers.
    std::vector<std::byte> p1(586, std::byte{0x22});
    CHECK(tx.wire_size(600) == 616);
    std::vector<std::byte> w1(616);
    REQUIRE(tx.write(w1, hdr, p1) == 616);
    auto be16 = [](const std::vector<std::byte>& v, std::size_t at) { return softrdma::get_be16(v.data() + at); };
    CHECK(be16(w1, 0) == 0);
    CHECK(be16(w1, 2) == 0);
    CHECK(be16(w1, 4) == 600);
    CHECK(w1[6] == std::byte{0xC1});
    CHECK(be16(w1, 512) == 0);
    CHECK(be16(w1, 514) == 512);
    CHECK(w1[511] == std::byte{0x22});
    CHECK(w1[516] == std::byte{0x22});
    CHECK(w1[610] == std::byte{0});  // pad
    // CRC covers everything before the CRC field, markers included.
    CHECK(load_crc32c(w1.data() + 612) == crc32c(std::span(w1.data(), 612)));
    CHECK(tx.stream_position() == 616);
    // FPDU 2 at 616: ULPDU 1000 -> unmarked 1008; marker at 1024 (FPDUPTR 1024-616 = 408) and 1536 (920).
    std::vector<std::byte> p2(986, std::byte{0x33});
    CHECK(tx.wire_size(1000) == 1016);
    std::vector<std::byte> w2(1016);
    REQUIRE(tx.write(w2, hdr, p2) == 1016);
    CHECK(be16(w2, 0) == 1000);
    CHECK(be16(w2, 1024 - 616) == 0);
    CHECK(be16(w2, 1024 - 616 + 2) == 408);
    CHECK(be16(w2, 1536 - 616 + 2) == 920);
    CHECK(tx.stream_position() == 1632);
    // FPDU 3 at 1632: ULPDU 410 -> unmarked 2+410+0+4 = 416 -> ends exactly at 2048; the marker at 2048 goes
    // with the next FPDU, not this one.
    std::vector<std::byte> p3(396, std::byte{0x44});
    CHECK(tx.wire_size(410) == 416);
    std::vector<std::byte> w3(416);
    REQUIRE(tx.write(w3, hdr, p3) == 416);
    CHECK(tx.stream_position() == 2048);
    // FPDU 4 starts on a marker: FPDUPTR 0, then the length.
    std::vector<std::byte> w4(tx.wire_size(14));
    CHECK(w4.size() == 4 + 20);
    REQUIRE(tx.write(w4, hdr, std::span<const std::byte>{}) == w4.size());
    CHECK(be16(w4, 2) == 0);
    CHECK(be16(w4, 4) == 14);
    // Marker between pad and CRC: start at 2072, ULPDU 430: 2+430+0 = 432 ends at 2504... choose a length that
    // ends the pad at 2560: start 2072, 2 + len + pad = 488 -> len 486 (pad 0): marker at 2560, CRC after it.
    std::vector<std::byte> p5(472, std::byte{0x55});
    CHECK(tx.wire_size(486) == 496);
    std::vector<std::byte> w5(496);
    REQUIRE(tx.write(w5, hdr, p5) == 496);
    CHECK(be16(w5, 488 + 2) == 488);  // marker at 2560, FPDUPTR 2560-2072
    CHECK(load_crc32c(w5.data() + 492) == crc32c(std::span(w5.data(), 492)));
    // Deframe all five.
    std::vector<std::byte> all;
    for (auto* w : {&w1, &w2, &w3, &w4, &w5}) all.insert(all.end(), w->begin(), w->end());
    Recorder r;
    Deframer<Recorder> d({true, true, 0});
    REQUIRE_FALSE(feed_cuts(d, r, all, {}));
    REQUIRE(r.done.size() == 5);
    CHECK(r.done[0].payload == p1);
    CHECK(r.done[1].payload == p2);
    CHECK(r.done[4].payload == p5);
}

TEST_CASE("fpdu: write refuses oversize ULPDU and short output", "[fpdu]") {
    FpduTx tx({true, false, 1448});
    std::vector<std::byte> hdr(14), big(65536 - 14), out(70000);
    CHECK(tx.write(out, hdr, big) == 0);
    big.resize(65535 - 14);
    CHECK(tx.write(out, hdr, big) == 2 + 65535 + 3 + 4);
    CHECK(tx.stream_position() == 2 + 65535 + 3 + 4);
    std::vector<std::byte> small(10);
    CHECK(tx.write(small, hdr, std::span<const std::byte>{}) == 0);
    CHECK(tx.stream_position() == 2 + 65535 + 3 + 4);
}

// write_deferred (zero-copy transmit: the payload goes out from where it is, copied into the FPDU after): the
// same bytes as write() once the caller fills the payload, the stream position advanced alike; nothing without
// CRC and Markers off (the CRC covers the payload; Markers cut it), nothing when out is short.
TEST_CASE("fpdu: write_deferred leaves exactly the payload for the caller", "[fpdu]") {
    const std::byte hdr[18] = {std::byte{0x41}, std::byte{0x43}, std::byte{7}};
    for (const std::size_t plen : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{1442 - 18},
                                   std::size_t{8960 - 6 - 18}, std::size_t{65535 - 18}}) {
        std::vector<std::byte> payload(plen);
        for (std::size_t i = 0; i < plen; ++i) payload[i] = static_cast<std::byte>(i * 7 + 3);
        FpduTx a({false, false, 65536}, 8), b({false, false, 65536}, 8);
        std::vector<std::byte> want(a.wire_size(18 + plen) + 8, std::byte{0xEE}), got(want.size(), std::byte{0xEE});
        const std::size_t n = a.write(want, hdr, payload);
        REQUIRE(n == fpdu_size_unmarked(18 + plen));
        REQUIRE(b.write_deferred(got, hdr, plen) == n);
        // Untouched: the payload (still 0xEE) and everything past the FPDU.
        for (std::size_t i = 0; i < plen; ++i) REQUIRE(got[2 + 18 + i] == std::byte{0xEE});
        REQUIRE(got[n] == std::byte{0xEE});
        std::copy(payload.begin(), payload.end(), got.begin() + 2 + 18);
        REQUIRE(got == want);
        REQUIRE(b.stream_position() == a.stream_position());
    }
    FpduTx ok({false, false, 1448});
    CHECK(ok.can_defer());
    std::vector<std::byte> out(70000, std::byte{0xEE});
    CHECK(ok.write_deferred(std::span(out).first(fpdu_size_unmarked(18 + 1000) - 1), hdr, 1000) == 0);
    CHECK(ok.write_deferred(out, hdr, 65535 - 17) == 0);  // ULPDU over 65535
    CHECK(ok.stream_position() == 0);
    for (const FpduTxConfig cfg : {FpduTxConfig{true, false, 1448}, FpduTxConfig{false, true, 1448}}) {
        FpduTx no(cfg);
        CHECK_FALSE(no.can_defer());
        CHECK(no.write_deferred(out, hdr, 100) == 0);
        CHECK(no.stream_position() == 0);
    }
    CHECK(std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{0xEE}; }));
}

// write() without CRC and Markers (its own path, the one small messages take): RFC 5044's layout built by
// hand -- length, header, the pieces back to back, pad and CRC field zero -- at every pad length, from several
// pieces (an empty one among them) and none, at a stream position that is not 0; nothing past the FPDU written.
TEST_CASE("fpdu: without CRC or Markers, write() lays the FPDU out as RFC 5044 says", "[fpdu]") {
    const std::byte hdr[18] = {std::byte{0x41}, std::byte{0x43}, std::byte{7}, std::byte{0x99}};
    std::vector<std::byte> src(200);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13 + 5);
    for (const std::size_t plen : {0u, 1u, 2u, 3u, 4u, 64u, 65u, 199u}) {
        CAPTURE(plen);
        const std::span<const std::byte> all(src.data(), plen);
        const std::size_t cut = plen / 3;
        const std::span<const std::byte> pieces[3] = {all.first(cut), all.subspan(cut, 0), all.subspan(cut)};
        FpduTx tx({false, false, 1448}, 12);
        const std::size_t ulpdu = sizeof hdr + plen;
        // 2 + ULPDU rounded up to a multiple of 4, then the CRC field; every byte not set below stays 0.
        std::vector<std::byte> want((2 + ulpdu + 3) / 4 * 4 + 4, std::byte{0});
        want[0] = static_cast<std::byte>(ulpdu >> 8);
        want[1] = static_cast<std::byte>(ulpdu & 0xff);
        std::copy(std::begin(hdr), std::end(hdr), want.begin() + 2);
        std::copy(all.begin(), all.end(), want.begin() + 2 + sizeof hdr);
        std::vector<std::byte> out(want.size() + 8, std::byte{0xEE});
        REQUIRE(tx.write(out, hdr, std::span<const std::span<const std::byte>>(pieces)) == want.size());
        CHECK(std::equal(want.begin(), want.end(), out.begin()));
        CHECK(std::all_of(out.begin() + static_cast<std::ptrdiff_t>(want.size()), out.end(),
                          [](std::byte x) { return x == std::byte{0xEE}; }));
        CHECK(tx.stream_position() == 12 + want.size());
        CHECK(tx.write(std::span(out).first(want.size() - 1), hdr, std::span<const std::span<const std::byte>>(pieces)) == 0);
        CHECK(tx.stream_position() == 12 + want.size());
    }
}

TEST_CASE("deframer: every split point of a multi-FPDU stream, all modes", "[deframer]") {
    for (const auto& mode : kModes) {
        for (std::uint64_t offset : {0u, 4u, 508u}) {
            const Stream s = make_stream(mode, offset, 42 + static_cast<std::uint32_t>(offset));
            CAPTURE(mode.crc, mode.markers, mode.emss, offset, s.wire.size());
            for (std::size_t cut = 0; cut <= s.wire.size(); ++cut) {
                Recorder r;
                Deframer<Recorder> d({mode.crc, mode.markers, offset});
                REQUIRE_FALSE(feed_cuts(d, r, s.wire, {cut}));
                REQUIRE(r.done == s.ulpdus);
                REQUIRE(d.at_fpdu_boundary());
            }
        }
    }
}

TEST_CASE("deframer: byte at a time, two cuts, random cuts", "[deframer]") {
    std::mt19937 rng(2024);
    for (const auto& mode : kModes) {
        const Stream s = make_stream(mode, 0, 7, 10);
        CAPTURE(mode.crc, mode.markers, mode.emss);
        {
            std::vector<std::size_t> cuts;
            for (std::size_t i = 1; i < s.wire.size(); ++i) cuts.push_back(i);
            Recorder r;
            Deframer<Recorder> d({mode.crc, mode.markers, 0});
            REQUIRE_FALSE(feed_cuts(d, r, s.wire, cuts));
            REQUIRE(r.done == s.ulpdus);
        }
        for (int iter = 0; iter < 300; ++iter) {
            std::vector<std::size_t> cuts;
            std::size_t at = 0;
            while (true) {
                at += 1 + rng() % (iter % 3 == 0 ? 8 : 700);
                if (at >= s.wire.size()) break;
                cuts.push_back(at);
            }
            Recorder r;
            Deframer<Recorder> d({mode.crc, mode.markers, 0});
            REQUIRE_FALSE(feed_cuts(d, r, s.wire, cuts));
            REQUIRE(r.done == s.ulpdus);
        }
    }
}

TEST_CASE("deframer: fused copy+CRC handler", "[deframer]") {
    for (const auto& mode : kModes) {
        const Stream s = make_stream(mode, 0, 9, 10);
        FusingRecorder r;
        Deframer<FusingRecorder> d({mode.crc, mode.markers, 0});
        const ProtoStatus st = feed_cuts(d, r, s.wire, {100, s.wire.size() / 2, s.wire.size() / 2 + 1, s.wire.size() - 5});
        CAPTURE(mode.crc, mode.markers, s.wire.size(), st ? st->ecode : 0, r.done.size());
        REQUIRE_FALSE(st);
        REQUIRE(r.done == s.ulpdus);
        if (mode.crc)
            CHECK(r.fused_calls > 0);
        else
            CHECK(r.fused_calls == 0);
        if (!mode.crc) continue;
        // A payload byte flipped: placed, then the CRC fails and on_ulpdu_end is not called for that FPDU.
        auto bad = s.wire;
        // The 5th FPDU has a 100-byte payload; find it by its content.
        const auto& p4 = s.ulpdus[4].payload;
        auto it = std::search(bad.begin(), bad.end(), p4.begin(), p4.begin() + 8);
        REQUIRE(it != bad.end());
        const std::size_t flip = static_cast<std::size_t>(it - bad.begin()) + 3;
        bad[flip] ^= std::byte{0x01};
        FusingRecorder r2;
        Deframer<FusingRecorder> d2({mode.crc, mode.markers, 0});
        CHECK(feed_cuts(d2, r2, bad, {flip}) == ProtoStatus{kTermCrc});
        CHECK(r2.done.size() == 4);
    }
}

TEST_CASE("deframer: corruptions give the exact TermCode", "[deframer][errors]") {
    std::mt19937 rng(5);
    auto one_fpdu = [&](const FpduTxConfig& cfg, std::uint16_t ctrl, std::size_t plen) {
        FpduTx tx(cfg);
        auto hdr = make_header(ctrl, rng);
        auto pl = softrdma::mpa::test::random_bytes(rng, plen);
        std::vector<std::byte> w(tx.wire_size(hdr.size() + plen));
        REQUIRE(tx.write(w, hdr, pl) == w.size());
        return w;
    };
    SECTION("bad CRC: every byte of the CRC field, every position of the payload") {
        const auto w = one_fpdu({true, false, 1448}, 0x4143, 30);  // 2+48 -> pad 2, CRC at [52,56)
        for (std::size_t i = 0; i < w.size(); ++i) {
            auto bad = w;
            bad[i] ^= std::byte{0x80};
            Recorder r;
            Deframer<Recorder> d({true, false, 0});
            const ProtoStatus st = feed_cuts(d, r, bad, {});
            if (i < 2) continue;  // the length changed: framing error or short stream, checked below
            CAPTURE(i);
            REQUIRE(st == ProtoStatus{kTermCrc});
            REQUIRE(r.done.empty());
            // Stays failed, no more handler calls.
            const auto calls = r.header_calls;
            CHECK(d.feed(w, r) == ProtoStatus{kTermCrc});
            CHECK(r.header_calls == calls);
            CHECK(d.failed());
        }
    }
    SECTION("CRC not negotiated: the field is not checked") {
        auto w = one_fpdu({false, false, 1448}, 0x4143, 30);
        w[w.size() - 1] = std::byte{0x77};
        Recorder r;
        Deframer<Recorder> d({false, false, 0});
        CHECK_FALSE(feed_cuts(d, r, w, {}));
        CHECK(r.done.size() == 1);
    }
    SECTION("bad marker FPDUPTR (each of its bytes)") {
        const auto w = one_fpdu({true, true, 1448}, 0xC140, 1000);
        for (std::size_t at : {2u, 3u, 514u, 515u}) {
            auto bad = w;
            bad[at] ^= std::byte{0x10};
            Recorder r;
            Deframer<Recorder> d({true, true, 0});
            CHECK(feed_cuts(d, r, bad, {at}) == ProtoStatus{kTermMarker});
        }
        // Reserved half and the low two FPDUPTR bits are ignored (but still in the CRC).
        auto odd = w;
        odd[515] ^= std::byte{0x01};
        Recorder r;
        Deframer<Recorder> d({true, true, 0});
        CHECK(feed_cuts(d, r, odd, {}) == ProtoStatus{kTermCrc});
        Deframer<Recorder> d0({false, true, 0});
        Recorder r0;
        auto odd0 = one_fpdu({false, true, 1448}, 0xC140, 1000);
        odd0[512] = std::byte{0xFF};
        odd0[515] ^= std::byte{0x03};
        CHECK_FALSE(feed_cuts(d0, r0, odd0, {}));
        CHECK(r0.done.size() == 1);
    }
    SECTION("ULPDU length shorter than the control word or the header") {
        auto w = one_fpdu({true, false, 1448}, 0x4143, 30);
        for (std::uint16_t len : {0, 1}) {
            auto bad = w;
            softrdma::put_be16(bad.data(), len);
            Recorder r;
            Deframer<Recorder> d({true, false, 0});
            CHECK(feed_cuts(d, r, bad, {1}) == ProtoStatus{kTermBadUlpduLength});
            CHECK(r.header_calls == 0);
        }
        for (std::uint16_t len : {2, 10, 17}) {  // untagged header is 18
            auto bad = w;
            softrdma::put_be16(bad.data(), len);
            Recorder r;
            Deframer<Recorder> d({true, false, 0});
            CHECK(feed_cuts(d, r, bad, {}) == ProtoStatus{kTermBadUlpduLength});
            CHECK(r.header_calls == 0);
        }
        // Exactly the header: zero payload, accepted.
        auto ok = one_fpdu({true, false, 1448}, 0x4143, 0);
        Recorder r;
        Deframer<Recorder> d({true, false, 0});
        CHECK_FALSE(feed_cuts(d, r, ok, {3}));
        CHECK(r.done.size() == 1);
        CHECK(r.payload_calls == 0);
    }
    SECTION("invalid control word: the handler's error, else a DDP error") {
        auto w = one_fpdu({true, false, 1448}, 0x4143, 30);
        w[2] = std::byte{0xFF};
        w[3] = std::byte{0xFF};
        Recorder r;
        r.invalid_ctrl_error = TermCode{TermLayer::rdmap, 2, 0x06};
        Deframer<Recorder> d({true, false, 0});
        CHECK(feed_cuts(d, r, w, {3}) == ProtoStatus{TermCode{TermLayer::rdmap, 2, 0x06}});
        Recorder r2;
        Deframer<Recorder> d2({true, false, 0});
        CHECK(feed_cuts(d2, r2, w, {}) == ProtoStatus{kTermDdpTaggedInvalid});
    }
    SECTION("handler errors stop the stream") {
        struct Refuser : Recorder {
            ProtoStatus on_ulpdu_payload(std::span<const std::byte>) { return TermCode{TermLayer::ddp, 2, 0x05}; }
        };
        auto w = one_fpdu({true, false, 1448}, 0x4143, 30);
        Refuser r;
        Deframer<Refuser> d({true, false, 0});
        r.in_lo = w.data();
        r.in_hi = w.data() + w.size();
        CHECK(d.feed(w, r) == ProtoStatus{TermCode{TermLayer::ddp, 2, 0x05}});
        CHECK(d.failed());
    }
}

TEST_CASE("deframer: real siw FPDUs from rping_crc.pcapng", "[deframer][captures]") {
    const auto f12 = softrdma::mpa::test::hex(
        "0022414300000000000000000000000100000000000055b578222d50a5a969000000004050b2a85d");
    const auto f14 = softrdma::mpa::test::hex(
        "004ec14211a236000000560cda9fff3072646d612d70696e672d303a204142434445464748494a4b4c4d4e4f5051525354"
        "55565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200724edf49");
    std::vector<std::byte> stream = f12;
    stream.insert(stream.end(), f14.begin(), f14.end());
    for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
        Recorder r;
        Deframer<Recorder> d({true, false, 0});
        REQUIRE_FALSE(feed_cuts(d, r, stream, {cut}));
        REQUIRE(r.done.size() == 2);
        CHECK(r.done[0].header.size() == 18);  // untagged SEND
        CHECK(r.done[0].payload.size() == 16);
        CHECK(r.done[1].header.size() == 14);  // tagged READ response
        CHECK(r.done[1].payload.size() == 0x4e - 14);
    }
}

TEST_CASE("deframer: a Marker at every 4-aligned position of an FPDU (header, payload, pad, before CRC)", "[deframer][markers]") {
    // Starting the stream at every 4-aligned offset below 512 moves the Marker across every position of the
    // FPDUs: inside the ULPDU header (even right after the control word), payload, pad, just before the CRC,
    // and at the FPDU start. The length field and the CRC are 4-aligned, so a Marker never splits them.
    std::mt19937 rng(77);
    for (bool crc : {false, true}) {
        for (std::uint64_t offset = 0; offset < kMarkerInterval; offset += 4) {
            FpduTx tx({crc, true, 1448}, offset);
            std::vector<std::byte> wire;
            std::vector<Ulpdu> want;
            for (std::size_t plen : {0u, 1u, 2u, 3u, 61u, 130u}) {
                Ulpdu u{make_header(plen == 0 ? 0x4141 : 0x4143, rng), softrdma::mpa::test::random_bytes(rng, plen)};
                std::vector<std::byte> out(tx.wire_size(u.header.size() + plen));
                REQUIRE(tx.write(out, u.header, u.payload) == out.size());
                wire.insert(wire.end(), out.begin(), out.end());
                want.push_back(std::move(u));
            }
            CAPTURE(crc, offset);
            std::vector<std::size_t> bytewise;
            for (std::size_t i = 1; i < wire.size(); ++i) bytewise.push_back(i);
            for (const auto& cuts : {std::vector<std::size_t>{}, bytewise}) {
                Recorder r;
                Deframer<Recorder> d({crc, true, offset});
                REQUIRE_FALSE(feed_cuts(d, r, wire, cuts));
                REQUIRE(r.done == want);
            }
            // A wrong Marker anywhere is caught: corrupt the first Marker's FPDUPTR.
            const std::size_t first_marker = static_cast<std::size_t>((kMarkerInterval - offset) % kMarkerInterval);
            if (first_marker + 4 <= wire.size()) {
                auto bad = wire;
                bad[first_marker + 3] ^= std::byte{0x04};
                Recorder r;
                Deframer<Recorder> d({crc, true, offset});
                REQUIRE(feed_cuts(d, r, bad, {first_marker + 1}) == ProtoStatus{kTermMarker});
            }
        }
    }
}

// FpduTx's large pieces go through base::copy_out / copy_staged (the CRC fused into the first, staging copy):
// at aliasing and other distances between source and output, with and without CRC, the deframer must take the
// FPDU back whole (CRC checked) with the same payload, and nothing past the FPDU written.
TEST_CASE("FpduTx: large payload pieces at every kind of source/output distance, CRC on and off", "[fpdu]") {
    std::mt19937 rng(77);
    const std::vector<std::byte> hdr = make_header(0x4141, rng);  // untagged SEND-like, 18 bytes
    std::vector<std::byte> src_mem(8192 + 4096), out_mem(16384 + 8192);
    const auto page = [](std::byte* p) { return p + (4096 - reinterpret_cast<std::uintptr_t>(p) % 4096) % 4096; };
    std::byte* src = page(src_mem.data());
    for (std::size_t i = 0; i < 8192; ++i) src[i] = static_cast<std::byte>(rng());
    for (const bool crc : {true, false}) {
        for (const std::size_t plen : {1023u, 1024u, 5000u, 8192u - 18u}) {
            // distance = (payload's place in the output - src) mod 4 KiB; payload sits 2 + 18 bytes into it
            for (const std::size_t distance : {0u, 1u, 20u, 44u, 63u, 64u, 100u, 4000u}) {
                CAPTURE(crc, plen, distance);
                FpduTx tx({crc, false, 9000});
                const std::size_t want = tx.wire_size(hdr.size() + plen);
                std::byte* out = page(out_mem.data()) + 4096 + distance - (kLengthFieldSize + hdr.size());
                REQUIRE(out + want + 16 <= out_mem.data() + out_mem.size());
                std::fill(out_mem.begin(), out_mem.end(), std::byte{0x5A});
                const std::span<const std::byte> sge(src, plen);
                REQUIRE(tx.write(std::span<std::byte>(out, want + 16), hdr, {&sge, 1}) == want);
                CHECK(out[want] == std::byte{0x5A});
                CHECK(out[-1] == std::byte{0x5A});
                const std::vector<std::byte> wire(out, out + want);
                for (const bool fusing : {false, true}) {
                    FusingRecorder r;
                    ProtoStatus st;
                    if (fusing) {
                        Deframer<FusingRecorder> d({crc, false, 0});
                        st = feed_cuts(d, r, wire, {});
                    } else {
                        Deframer<Recorder> d({crc, false, 0});
                        st = feed_cuts(d, static_cast<Recorder&>(r), wire, {});
                    }
                    REQUIRE_FALSE(st);
                    REQUIRE(r.done.size() == 1);
                    CHECK(r.done[0].header == hdr);
                    CHECK(std::equal(r.done[0].payload.begin(), r.done[0].payload.end(), src, src + plen));
                    CHECK(r.done[0].payload.size() == plen);
                }
            }
        }
    }
}
