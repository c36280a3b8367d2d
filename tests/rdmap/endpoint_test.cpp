// SPDX-License-Identifier: MIT
// rdmap::Endpoint on bytes: two endpoints back-to-back through the real MPA FpduTx and Deframer doing every
// operation, and forged peer input producing the exact TERMINATE bytes.
#include <catch2/catch.hpp>

#include <array>

#include <cstring>
#include <vector>

#include "harness.hpp"
#include "mpa/errors.hpp"

using namespace softrdma;
using namespace softrdma::rdmap;
using namespace softrdma::test;

namespace {

std::vector<std::byte> untagged(Opcode op, bool last, std::uint32_t qn, std::uint32_t msn, std::uint32_t mo,
                                std::uint32_t rsvd = 0) {
    const OpInfo& i = op_info(op);
    std::vector<std::byte> h(i.hdr_len);
    ddp::UntaggedHeader{ddp::ctrl_with_last(i.ctrl, last), rsvd, qn, msn, mo}.encode(h);
    return h;
}
std::vector<std::byte> tagged(Opcode op, bool last, std::uint32_t stag, std::uint64_t to) {
    const OpInfo& i = op_info(op);
    std::vector<std::byte> h(i.hdr_len);
    ddp::TaggedHeader{ddp::ctrl_with_last(i.ctrl, last), stag, to}.encode(h);
    return h;
}
std::vector<std::byte> read_request(std::uint32_t msn, const ReadRequest& rr) {
    std::vector<std::byte> h = untagged(Opcode::read_request, true, kQnReadRequest, msn, 0);
    rr.encode(h);
    return h;
}
std::vector<std::byte> atomic_request(std::uint32_t msn, const AtomicRequest& a) {
    std::vector<std::byte> h = untagged(Opcode::atomic_request, true, kQnReadRequest, msn, 0);
    a.encode(h);
    return h;
}

WorkRequest send_wr(std::uint64_t id, std::span<const std::byte> a, std::span<const std::byte> b = {}) {
    WorkRequest w;
    w.wr_id = id;
    w.op = WrOp::send;
    w.sgl[0] = a;
    w.num_sge = 1;
    if (!b.empty()) {
        w.sgl[1] = b;
        w.num_sge = 2;
    }
    return w;
}

// The one FPDU `s` sends now must be a TERMINATE with exactly these fields and attached bytes.
void expect_terminate(Side& s, TermCode code, bool m, bool d, bool r, std::span<const std::byte> hdr = {},
                      std::size_t seg_len = 0) {
    const std::vector<std::byte> wire = s.drain();  // first: a failure may also surface while sending
    CHECK(s.ep.state() == State::error);
    CHECK(s.ep.error() == code);
    REQUIRE(s.upper.terminates.size() == 1);
    CHECK_FALSE(s.upper.terminates[0].received);
    CHECK(s.upper.terminates[0].code == code);
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 1);
    CHECK(f[0].wire == wire.size());
    const std::vector<std::byte>& u = f[0].ulpdu;
    REQUIRE(u.size() >= kTerminateLen);
    CHECK(load_be16(u, 0) == 0x4147);
    CHECK(load_be32(u, 2) == 0);             // reserved
    CHECK(load_be32(u, 6) == kQnTerminate);  // QN 2
    CHECK(load_be32(u, 10) == 1);            // MSN 1
    CHECK(load_be32(u, 14) == 0);            // MO 0
    const TerminateHeader th = TerminateHeader::decode(u);
    CHECK(th.code == code);
    CHECK(th.m == m);
    CHECK(th.d == d);
    CHECK(th.r == r);
    CHECK((load_be32(u, 18) & 0x1FFF) == 0);
    if (hdr.empty()) {
        CHECK(u.size() == kTerminateLen);
    } else {
        REQUIRE(u.size() == kTerminateLen + 2 + hdr.size());
        CHECK(load_be16(u, kTerminateLen) == seg_len);
        CHECK(std::memcmp(u.data() + kTerminateLen + 2, hdr.data(), hdr.size()) == 0);
        CHECK(s.upper.term_attached[0].size() == 2 + hdr.size());
    }
    CHECK(s.drain().empty());  // exactly one TERMINATE, then silence
}

SideConfig small_mss() {
    SideConfig c;
    c.emss = 128;  // MULPDU 122: SEND payload 104 per FPDU, WRITE/READ response 108
    return c;
}

}  // namespace

// ==== back-to-back operations ===============================================================================

TEST_CASE("SEND/RECV: gathered SGEs, segmented at MULPDU, stream cut anywhere", "[rdmap]") {
    Side a(small_mss()), b(small_mss());
    b.upper.post_recv(1000);
    b.upper.recv_chunk = 50;  // receive buffer handed out as 50-byte SGEs
    const auto p1 = bytes_of(120, 1), p2 = bytes_of(180, 2);
    REQUIRE(a.ep.post(send_wr(7, p1, p2)) == PostStatus::ok);

    const std::vector<std::byte> wire = a.drain();
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 3);  // 300 bytes, 104 per segment
    for (std::size_t i = 0; i < 3; ++i) {
        const auto h = ddp::UntaggedHeader::decode(f[i].ulpdu);
        REQUIRE(h);
        CHECK(h->qn == 0);
        CHECK(h->msn == 1);
        CHECK(h->mo == 104 * i);
        CHECK(h->last() == (i == 2));
        CHECK(f[i].ulpdu.size() <= a.tx.mulpdu());
    }
    REQUIRE(a.upper.completions.size() == 1);
    CHECK(a.upper.completions[0].kind == WcKind::send);
    CHECK(a.upper.completions[0].wr_id == 7);

    CHECK_FALSE(b.feed(wire, 7));
    REQUIRE(b.upper.completions.size() == 1);
    const Completion& c = b.upper.completions[0];
    CHECK(c.kind == WcKind::recv);
    CHECK(c.msn == 1);
    CHECK(c.byte_len == 300);
    CHECK_FALSE(c.solicited);
    CHECK_FALSE(c.has_imm);
    const std::vector<std::byte>& got = b.upper.bound[1];
    CHECK(std::equal(p1.begin(), p1.end(), got.begin()));
    CHECK(std::equal(p2.begin(), p2.end(), got.begin() + 120));
    CHECK(got[300] == std::byte{0xEE});  // nothing past the message
}

TEST_CASE("next_payload: the source and header of the next FPDU's payload, only for SEND and WRITE data",
          "[rdmap]") {
    Side a(small_mss()), b(small_mss());
    Endpoint& tx = a.ep.tx();
    CHECK(tx.next_payload().src == nullptr);  // nothing queued
    const auto p1 = bytes_of(150, 1), p2 = bytes_of(100, 2);
    REQUIRE(a.ep.post(send_wr(1, p1, p2)) == PostStatus::ok);
    CHECK(tx.next_payload().src == p1.data());
    CHECK(tx.next_payload().hdr_len == op_info(Opcode::send).hdr_len);
    // One FPDU at a time (104 payload bytes each): the next starts where the last one stopped, across SGEs.
    std::vector<std::byte> out(mpa::fpdu_size_unmarked(a.tx.mulpdu()));
    REQUIRE(a.ep.pull_tx(out) != 0);
    CHECK(tx.next_payload().src == p1.data() + 104);
    REQUIRE(a.ep.pull_tx(out) != 0);
    CHECK(tx.next_payload().src == p2.data() + (208 - 150));
    REQUIRE(a.ep.pull_tx(out) != 0);
    CHECK(tx.next_payload().src == nullptr);  // the SEND is out
    WorkRequest w;
    w.op = WrOp::write;
    w.sgl[0] = p2;
    w.num_sge = 1;
    w.remote_stag = 0x1234;
    REQUIRE(a.ep.post(w) == PostStatus::ok);
    CHECK(tx.next_payload().src == p2.data());
    CHECK(tx.next_payload().hdr_len == op_info(Opcode::write).hdr_len);
    a.drain();
    WorkRequest r;
    r.op = WrOp::read;
    r.read_len = 64;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    CHECK(tx.next_payload().src == nullptr);  // a request carries no payload of ours
    (void)b;
}

TEST_CASE("SEND: zero-length, solicited, MSN per message", "[rdmap]") {
    Side a, b;
    for (int i = 0; i < 3; ++i) b.upper.post_recv(64);
    const auto p = bytes_of(10, 3);
    WorkRequest z;
    z.wr_id = 1;
    REQUIRE(a.ep.post(z) == PostStatus::ok);
    WorkRequest se = send_wr(2, p);
    se.solicited = true;
    REQUIRE(a.ep.post(se) == PostStatus::ok);
    REQUIRE(a.ep.post(send_wr(3, p)) == PostStatus::ok);
    const std::vector<std::byte> wire = a.drain();
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 3);
    CHECK(load_be16(f[0].ulpdu, 0) == 0x4143);
    CHECK(f[0].ulpdu.size() == 18);
    CHECK(load_be16(f[1].ulpdu, 0) == 0x4145);
    CHECK(ddp::UntaggedHeader::decode(f[2].ulpdu)->msn == 3);
    b.feed(wire, 1);
    REQUIRE(b.upper.completions.size() == 3);
    CHECK(b.upper.completions[0].byte_len == 0);
    CHECK(b.upper.completions[1].solicited);
    CHECK(b.upper.completions[2].msn == 3);
    CHECK(b.upper.completions[2].byte_len == 10);
}

TEST_CASE("WRITE: tagged placement into a region handed out in pieces", "[rdmap]") {
    Side a(small_mss()), b(small_mss());
    b.upper.add_region(0x100, 1000, bit(Access::remote_write)).chunk = 64;
    const auto p = bytes_of(500, 4);
    WorkRequest w = send_wr(9, p);
    w.op = WrOp::write;
    w.remote_stag = 0x100;
    w.remote_to = 100;
    REQUIRE(a.ep.post(w) == PostStatus::ok);
    const std::vector<std::byte> wire = a.drain();
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 5);  // 108 per segment
    CHECK(ddp::TaggedHeader::decode(f[1].ulpdu)->to == 208);
    CHECK(load_be16(f[4].ulpdu, 0) == 0xC140);
    CHECK(load_be16(f[0].ulpdu, 0) == 0x8140);
    b.feed(wire, 13);
    CHECK(b.upper.completions.empty());  // a WRITE completes nothing at the sink
    const auto& mem = b.upper.regions[0x100].mem;
    CHECK(std::equal(p.begin(), p.end(), mem.begin() + 100));
    CHECK(mem[99] == std::byte{0});
    CHECK(mem[600] == std::byte{0});
    REQUIRE(a.upper.completions.size() == 1);
    CHECK(a.upper.completions[0].kind == WcKind::write);
}

TEST_CASE("READ: request, segmented response matched to the request, completion", "[rdmap]") {
    Side a(small_mss()), b(small_mss());
    a.upper.add_region(0x200, 1000, bit(Access::local_write));
    Region& src = b.upper.add_region(0x300, 2000, bit(Access::remote_read));
    src.mem = bytes_of(2000, 5);
    src.chunk = 40;  // source comes back in pieces
    WorkRequest r;
    r.wr_id = 11;
    r.op = WrOp::read;
    r.local_stag = 0x200;
    r.local_to = 50;
    r.remote_stag = 0x300;
    r.remote_to = 1000;
    r.read_len = 700;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    const std::vector<std::byte> req = a.drain();
    const std::vector<Fpdu> f = split_fpdus(req);
    REQUIRE(f.size() == 1);
    REQUIRE(f[0].ulpdu.size() == 46);
    CHECK(ReadRequest::decode(f[0].ulpdu) == ReadRequest{0x200, 50, 700, 0x300, 1000});
    CHECK(a.ep.orq_outstanding() == 1);
    b.feed(req, 5);
    CHECK(b.ep.irq_outstanding() == 1);
    const std::vector<std::byte> resp = b.drain();
    const std::vector<Fpdu> g = split_fpdus(resp);
    REQUIRE(g.size() == 7);  // 108 per segment
    for (const Fpdu& x : g) CHECK(ddp::TaggedHeader::decode(x.ulpdu)->stag == 0x200);
    a.feed(resp, 3);
    REQUIRE(a.upper.completions.size() == 1);
    CHECK(a.upper.completions[0].kind == WcKind::read);
    CHECK(a.upper.completions[0].wr_id == 11);
    CHECK(a.upper.completions[0].byte_len == 700);
    CHECK(std::equal(src.mem.begin() + 1000, src.mem.begin() + 1700, a.upper.regions[0x200].mem.begin() + 50));
    CHECK(a.ep.orq_outstanding() == 0);
    CHECK(b.ep.irq_outstanding() == 0);
}

TEST_CASE("READ: zero-length (RTR style, STag 1 unregistered) and ORD credits", "[rdmap]") {
    SideConfig c;
    c.ep.ord = 1;
    Side a(c), b;
    WorkRequest r;
    r.op = WrOp::read;
    r.local_stag = 1;
    r.remote_stag = 1;
    r.wr_id = 1;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    r.wr_id = 2;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    const std::vector<std::byte> first = a.drain();
    CHECK(split_fpdus(first).size() == 1);  // ORD 1: the second READ waits
    CHECK_FALSE(a.ep.tx_ready());
    b.feed(first);
    a.feed(b.drain());
    REQUIRE(a.upper.completions.size() == 1);
    CHECK(a.upper.completions[0].byte_len == 0);
    CHECK(a.ep.tx_ready());
    pump(a, b);
    REQUIRE(a.upper.completions.size() == 2);
    CHECK(a.upper.completions[1].wr_id == 2);
    CHECK(a.ep.state() == State::operational);
    CHECK(b.ep.state() == State::operational);
}

TEST_CASE("WRITE with immediate data: WRITE then Immediate Data consuming a receive", "[rdmap]") {
    Side a, b;
    b.upper.add_region(0x100, 64, bit(Access::remote_write));
    b.upper.post_recv(16);
    const auto p = bytes_of(32, 6);
    WorkRequest w = send_wr(21, p);
    w.op = WrOp::write;
    w.remote_stag = 0x100;
    w.with_imm = true;
    w.imm = 0x1122334455667788ULL;
    REQUIRE(a.ep.post(w) == PostStatus::ok);
    const std::vector<std::byte> wire = a.drain();
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 2);
    CHECK(load_be16(f[1].ulpdu, 0) == 0x4148);
    REQUIRE(f[1].ulpdu.size() == 26);
    CHECK(decode_imm(f[1].ulpdu) == 0x1122334455667788ULL);
    CHECK(ddp::UntaggedHeader::decode(f[1].ulpdu)->qn == 0);
    b.feed(wire, 3);
    REQUIRE(b.upper.completions.size() == 1);
    CHECK(b.upper.completions[0].has_imm);
    CHECK(b.upper.completions[0].imm == 0x1122334455667788ULL);
    CHECK(b.upper.completions[0].byte_len == 0);
    CHECK(std::equal(p.begin(), p.end(), b.upper.regions[0x100].mem.begin()));
    REQUIRE(a.upper.completions.size() == 1);
    CHECK(a.upper.completions[0].kind == WcKind::write);
}

// Verbs applications expect SEND with immediate data as ONE receive completion carrying the data and the
// immediate (IBV_WC_WITH_IMM). On the wire (RFC 7306) it is a SEND followed by an Immediate Data message; the
// SEND's segments carry kImmFollows in RsvdULP, and the receiver holds that SEND's completion until its
// Immediate Data joins it: one completion, one receive consumed, wherever TCP cuts the stream.
TEST_CASE("SEND with immediate data and solicited event: one receive completion carrying the immediate", "[rdmap]") {
    const auto p = bytes_of(5, 7);
    WorkRequest s = send_wr(22, p);
    s.with_imm = true;
    s.imm = 42;
    s.solicited = true;
    SECTION("the wire: SEND announcing its Immediate Data, then Immediate Data with SE") {
        Side a;
        REQUIRE(a.ep.post(s) == PostStatus::ok);
        const std::vector<Fpdu> f = split_fpdus(a.drain());
        REQUIRE(f.size() == 2);
        CHECK(load_be16(f[0].ulpdu, 0) == 0x4143);  // SE rides on the Immediate Data message
        CHECK(ddp::UntaggedHeader::decode(f[0].ulpdu)->rsvd_ulp == kImmFollows);
        CHECK(load_be16(f[1].ulpdu, 0) == 0x4149);
        CHECK(ddp::UntaggedHeader::decode(f[1].ulpdu)->msn == 2);
        CHECK(ddp::UntaggedHeader::decode(f[1].ulpdu)->rsvd_ulp == 0);
    }
    SECTION("a plain SEND announces nothing and completes at its last segment") {
        Side a, b;
        b.upper.post_recv(16);
        REQUIRE(a.ep.post(send_wr(1, p)) == PostStatus::ok);
        const std::vector<std::byte> wire = a.drain();
        CHECK(ddp::UntaggedHeader::decode(split_fpdus(wire)[0].ulpdu)->rsvd_ulp == 0);
        CHECK_FALSE(rdmap::receive(b.rx, b.ep, wire).has_value());
        REQUIRE(b.upper.completions.size() == 1);
        CHECK_FALSE(b.upper.completions[0].has_imm);
    }
    SECTION("cut at every byte: one completion, one receive") {
        Side a;
        REQUIRE(a.ep.post(s) == PostStatus::ok);
        const std::vector<std::byte> wire = a.drain();
        for (std::size_t cut = 1; cut < wire.size(); ++cut) {
            CAPTURE(cut);
            Side b;
            b.upper.post_recv(16);
            b.upper.post_recv(16);
            CHECK_FALSE(rdmap::receive(b.rx, b.ep, std::span(wire).first(cut)).has_value());
            CHECK(b.upper.completions.empty());  // nothing before the Immediate Data has come whole
            CHECK_FALSE(rdmap::receive(b.rx, b.ep, std::span(wire).subspan(cut)).has_value());
            REQUIRE(b.upper.completions.size() == 1);
            const Completion& c = b.upper.completions[0];
            CHECK(c.kind == WcKind::recv);
            CHECK(c.byte_len == 5);
            CHECK(c.has_imm);
            CHECK(c.imm == 42);
            CHECK(c.solicited);
            CHECK(c.msn == 1);
            CHECK(b.upper.posted.size() == 1);  // only the SEND took a receive; the other is still posted
            REQUIRE(b.upper.bound.count(1) == 1);
            CHECK(std::equal(p.begin(), p.end(), b.upper.bound[1].begin()));
        }
    }
    SECTION("a multi-segment SEND, delivered one byte at a time") {
        SideConfig c = small_mss();
        Side a(c), b(c);
        b.upper.post_recv(4096);
        const auto big = bytes_of(1000, 3);
        WorkRequest w = send_wr(23, big);
        w.with_imm = true;
        w.imm = 7;
        REQUIRE(a.ep.post(w) == PostStatus::ok);
        const std::vector<std::byte> wire = a.drain();
        const std::vector<Fpdu> f = split_fpdus(wire);
        REQUIRE(f.size() > 2);
        for (std::size_t i = 0; i + 1 < f.size(); ++i)
            CHECK(ddp::UntaggedHeader::decode(f[i].ulpdu)->rsvd_ulp == kImmFollows);
        CHECK_FALSE(b.feed(wire, 1).has_value());
        REQUIRE(b.upper.completions.size() == 1);
        CHECK(b.upper.completions[0].byte_len == 1000);
        CHECK(b.upper.completions[0].has_imm);
        CHECK(b.upper.completions[0].imm == 7);
    }
    SideConfig no_crc;  // the next two sections edit FPDUs in place
    no_crc.crc = false;
    SECTION("another RFC 7306 peer's SEND and Immediate Data (no kImmFollows): a receive each, as the RFC has it") {
        Side a(no_crc), b(no_crc);
        b.upper.post_recv(16);
        b.upper.post_recv(16);
        REQUIRE(a.ep.post(s) == PostStatus::ok);
        std::vector<std::byte> wire = a.drain();
        // Clear the SEND's RsvdULP (bytes 2..5 after the MPA length).
        const std::vector<Fpdu> f = split_fpdus(wire);
        REQUIRE(f.size() == 2);
        std::fill_n(wire.begin() + 2 + 2, 4, std::byte{0});
        CHECK(ddp::UntaggedHeader::decode(split_fpdus(wire)[0].ulpdu)->rsvd_ulp == 0);
        CHECK_FALSE(rdmap::receive(b.rx, b.ep, wire).has_value());
        REQUIRE(b.upper.completions.size() == 2);
        CHECK(b.upper.completions[0].byte_len == 5);
        CHECK_FALSE(b.upper.completions[0].has_imm);
        CHECK(b.upper.completions[1].has_imm);
        CHECK(b.upper.completions[1].imm_only);
        CHECK(b.upper.completions[1].imm == 42);
        CHECK(b.upper.completions[1].solicited);
    }
    SECTION("an announced SEND whose next message is not its Immediate Data completes at that message's header") {
        Side a(no_crc), b(no_crc);
        b.upper.post_recv(16);
        b.upper.post_recv(16);
        REQUIRE(a.ep.post(s) == PostStatus::ok);
        std::vector<std::byte> wire = a.drain();
        const std::vector<Fpdu> f = split_fpdus(wire);
        REQUIRE(f.size() == 2);
        wire.resize(f[0].wire);  // the Immediate Data never comes; a plain SEND (MSN 2) does
        b.feed(wire);
        CHECK(b.upper.completions.empty());
        Side a2(no_crc);
        REQUIRE(a2.ep.post(send_wr(2, p)) == PostStatus::ok);
        std::vector<std::byte> next = a2.drain();
        store_be32(std::span(next), 2 + 10, 2);  // MSN 2 (after the MPA length, ctrl and RsvdULP, QN)
        REQUIRE(ddp::UntaggedHeader::decode(split_fpdus(next)[0].ulpdu)->msn == 2);
        CHECK_FALSE(b.feed(next).has_value());
        REQUIRE(b.upper.completions.size() == 2);
        CHECK(b.upper.completions[0].msn == 1);
        CHECK_FALSE(b.upper.completions[0].has_imm);
        CHECK(b.upper.completions[1].msn == 2);
    }
}

TEST_CASE("atomics: fetch-add and compare-swap on an aligned target", "[rdmap]") {
    Side a, b;
    Region& t = b.upper.add_region(0x400, 64, bit(Access::remote_atomic));
    std::uint64_t v = 100;
    std::memcpy(t.mem.data() + 8, &v, 8);
    WorkRequest fa;
    fa.wr_id = 31;
    fa.op = WrOp::fetch_add;
    fa.remote_stag = 0x400;
    fa.remote_to = 8;
    fa.swap_add = 5;
    REQUIRE(a.ep.post(fa) == PostStatus::ok);
    const std::vector<Fpdu> f = split_fpdus(a.drain());
    REQUIRE(f.size() == 1);
    REQUIRE(f[0].ulpdu.size() == 70);
    CHECK(load_be16(f[0].ulpdu, 0) == 0x414A);
    CHECK(ddp::UntaggedHeader::decode(f[0].ulpdu)->qn == 1);
    const AtomicRequest ar = AtomicRequest::decode(f[0].ulpdu);
    CHECK(ar.op == 0);
    CHECK(ar.to == 8);
    CHECK(ar.add_swap == 5);
    CHECK(ar.add_swap_mask == 0);

    Side a2, b2;
    Region& t2 = b2.upper.add_region(0x400, 64, bit(Access::remote_atomic));
    std::memcpy(t2.mem.data() + 8, &v, 8);
    REQUIRE(a2.ep.post(fa) == PostStatus::ok);
    WorkRequest cs;
    cs.wr_id = 32;
    cs.op = WrOp::cmp_swap;
    cs.remote_stag = 0x400;
    cs.remote_to = 8;
    cs.compare = 105;
    cs.swap_add = 7;
    REQUIRE(a2.ep.post(cs) == PostStatus::ok);
    cs.wr_id = 33;
    cs.compare = 1;  // fails: value stays 7
    cs.swap_add = 9;
    REQUIRE(a2.ep.post(cs) == PostStatus::ok);
    pump(a2, b2, 5);
    REQUIRE(a2.upper.completions.size() == 3);
    CHECK(a2.upper.completions[0].kind == WcKind::atomic);
    CHECK(a2.upper.completions[0].atomic_original == 100);
    CHECK(a2.upper.completions[1].atomic_original == 105);
    CHECK(a2.upper.completions[2].wr_id == 33);
    CHECK(a2.upper.completions[2].atomic_original == 7);
    std::memcpy(&v, t2.mem.data() + 8, 8);
    CHECK(v == 7);
    CHECK(a2.ep.state() == State::operational);
    CHECK(b2.ep.state() == State::operational);
}

TEST_CASE("READ and atomic responses come back in request order", "[rdmap]") {
    Side a, b;
    a.upper.add_region(0x200, 64, bit(Access::local_write));
    b.upper.add_region(0x300, 64, bit(Access::remote_read)).mem = bytes_of(64, 9);
    b.upper.add_region(0x400, 8, bit(Access::remote_atomic));
    WorkRequest r;
    r.op = WrOp::read;
    r.wr_id = 1;
    r.local_stag = 0x200;
    r.remote_stag = 0x300;
    r.read_len = 64;
    WorkRequest fa;
    fa.op = WrOp::fetch_add;
    fa.wr_id = 2;
    fa.remote_stag = 0x400;
    fa.swap_add = 1;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    REQUIRE(a.ep.post(fa) == PostStatus::ok);
    r.wr_id = 3;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    pump(a, b, 11);
    REQUIRE(a.upper.completions.size() == 3);
    CHECK(a.upper.completions[0].wr_id == 1);
    CHECK(a.upper.completions[1].wr_id == 2);
    CHECK(a.upper.completions[2].wr_id == 3);
}

TEST_CASE("SEND with invalidate", "[rdmap]") {
    Side a, b;
    b.upper.add_region(0x500, 16);
    b.upper.post_recv(16);
    const auto p = bytes_of(4, 8);
    WorkRequest s = send_wr(41, p);
    s.with_inv = true;
    s.inv_stag = 0x500;
    REQUIRE(a.ep.post(s) == PostStatus::ok);
    const std::vector<std::byte> wire = a.drain();
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 1);
    CHECK(load_be16(f[0].ulpdu, 0) == 0x4144);
    CHECK(ddp::UntaggedHeader::decode(f[0].ulpdu)->rsvd_ulp == 0x500);
    b.feed(wire);
    REQUIRE(b.upper.completions.size() == 1);
    CHECK(b.upper.completions[0].has_inv);
    CHECK(b.upper.completions[0].inv_stag == 0x500);
    CHECK(b.upper.invalidated == std::vector<std::uint32_t>{0x500});
}

TEST_CASE("zero-length WRITE RTR with STag 1: nothing looked up, nothing completed", "[rdmap]") {
    Side a, b;
    WorkRequest rtr;
    rtr.op = WrOp::write;
    rtr.remote_stag = 1;  // iwarp-wire.md: STag 1, not 0
    rtr.signaled = false;
    REQUIRE(a.ep.post(rtr) == PostStatus::ok);
    const std::vector<std::byte> wire = a.drain();
    const std::vector<Fpdu> f = split_fpdus(wire);
    REQUIRE(f.size() == 1);
    CHECK(f[0].ulpdu.size() == 14);
    CHECK(load_be16(f[0].ulpdu, 0) == 0xC140);
    CHECK(load_be32(f[0].ulpdu, 2) == 1);
    CHECK_FALSE(b.feed(wire));
    CHECK(b.upper.lookups == 0);
    CHECK(b.upper.completions.empty());
    CHECK(a.upper.completions.empty());
    CHECK(b.ep.state() == State::operational);
}

TEST_CASE("post: bad work requests and a full queue", "[rdmap]") {
    SideConfig c;
    c.ep.sq_depth = 2;
    Side a(c);
    WorkRequest w;
    w.num_sge = kMaxSge + 1;
    CHECK(a.ep.post(w) == PostStatus::bad_wr);
    WorkRequest fa;
    fa.op = WrOp::fetch_add;
    fa.remote_to = 4;  // atomics need 8-byte alignment
    CHECK(a.ep.post(fa) == PostStatus::bad_address);
    WorkRequest wrap;
    wrap.op = WrOp::write;
    wrap.remote_to = ~std::uint64_t{0} - 2;
    const std::array<std::byte, 4> four{};
    wrap.sgl[0] = four;
    wrap.num_sge = 1;
    CHECK(a.ep.post(wrap) == PostStatus::bad_address);  // 4 bytes from 2^64-3 wrap
    wrap.remote_to = ~std::uint64_t{0} - 3;
    CHECK(a.ep.post(wrap) == PostStatus::ok);  // the last 4 bytes do not
    WorkRequest rw;
    rw.op = WrOp::read;
    rw.remote_to = ~std::uint64_t{0};
    rw.read_len = 2;
    CHECK(a.ep.post(rw) == PostStatus::bad_address);
    SideConfig z;
    z.ep.ord = 0;
    Side noord(z);
    WorkRequest r;
    r.op = WrOp::read;
    CHECK(noord.ep.post(r) == PostStatus::bad_wr);  // ORD 0: a READ could never be sent
    CHECK(a.ep.post(WorkRequest{}) == PostStatus::ok);
    CHECK(a.ep.post(WorkRequest{}) == PostStatus::queue_full);  // with the WRITE above: two
}

TEST_CASE("output buffer too small for the next FPDU: nothing written, resumes later", "[rdmap]") {
    Side a(small_mss()), b(small_mss());
    b.upper.post_recv(400);
    const auto p = bytes_of(300, 1);
    REQUIRE(a.ep.post(send_wr(1, p)) == PostStatus::ok);
    std::vector<std::byte> tiny(60);
    CHECK(a.ep.pull_tx(tiny) == 0);
    std::vector<std::byte> one(a.tx.wire_size(122));
    const std::size_t n = a.ep.pull_tx(one);
    CHECK(n == one.size());
    b.feed(std::span<const std::byte>(one).first(n));
    b.feed(a.drain());
    REQUIRE(b.upper.completions.size() == 1);
    CHECK(b.upper.completions[0].byte_len == 300);
}

// ==== forged peer input -> exact TERMINATE ===================================================================

TEST_CASE("TERMINATE: unknown opcode, bad versions (no header attached)", "[rdmap][terminate]") {
    SECTION("reserved opcode 12") {
        Side b;
        std::vector<std::byte> h = untagged(Opcode::send, true, 0, 1, 0);
        store_be16(h, 0, 0x414C);
        CHECK(b.feed(make_fpdu(h)) == err::o_opcode);
        expect_terminate(b, err::o_opcode, false, false, false);
    }
    SECTION("tagged flag on an untagged opcode") {
        Side b;
        std::vector<std::byte> h = untagged(Opcode::send, true, 0, 1, 0);
        store_be16(h, 0, 0xC143);
        b.feed(make_fpdu(h));
        expect_terminate(b, err::o_opcode, false, false, false);
    }
    SECTION("DDP version 2, untagged") {
        Side b;
        std::vector<std::byte> h = untagged(Opcode::send, true, 0, 1, 0);
        store_be16(h, 0, 0x4243);
        b.feed(make_fpdu(h));
        expect_terminate(b, ddp::err::u_version, false, false, false);
    }
    SECTION("DDP version 0, tagged") {
        Side b;
        std::vector<std::byte> h = tagged(Opcode::write, true, 1, 0);
        store_be16(h, 0, 0xC040);
        b.feed(make_fpdu(h));
        expect_terminate(b, ddp::err::t_version, false, false, false);
    }
    SECTION("RDMAP version 2") {
        Side b;
        std::vector<std::byte> h = untagged(Opcode::send, true, 0, 1, 0);
        store_be16(h, 0, 0x4183);
        b.feed(make_fpdu(h));
        expect_terminate(b, err::o_version, false, false, false);
    }
}

TEST_CASE("TERMINATE: untagged QN / MSN / MO / buffer errors attach the DDP header", "[rdmap][terminate]") {
    const auto payload = bytes_of(20, 1);
    SECTION("SEND on QN 1") {
        Side b;
        b.upper.post_recv(64);
        const auto h = untagged(Opcode::send, true, 1, 1, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_invalid_qn, true, true, false, h, 38);
    }
    SECTION("SEND on QN 7") {
        Side b;
        const auto h = untagged(Opcode::send, true, 7, 1, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_invalid_qn, true, true, false, h, 38);
    }
    SECTION("first SEND with MSN 2") {
        Side b;
        b.upper.post_recv(64);
        const auto h = untagged(Opcode::send, true, 0, 2, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_msn_range, true, true, false, h, 38);
    }
    SECTION("SEND with MO 4") {
        Side b;
        b.upper.post_recv(64);
        const auto h = untagged(Opcode::send, true, 0, 1, 4);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_invalid_mo, true, true, false, h, 38);
    }
    SECTION("second segment skips ahead") {
        Side b;
        b.upper.post_recv(64);
        b.feed(make_fpdu(untagged(Opcode::send, false, 0, 1, 0), payload));
        const auto h = untagged(Opcode::send, true, 0, 1, 30);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_invalid_mo, true, true, false, h, 38);
    }
    SECTION("segment of another opcode inside a SEND") {
        Side b;
        b.upper.post_recv(64);
        b.feed(make_fpdu(untagged(Opcode::send, false, 0, 1, 0), payload));
        const auto h = untagged(Opcode::send_se, true, 0, 1, 20);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, err::o_opcode, false, false, false);
    }
    SECTION("SEND with no receive posted (no RNR retry in iWARP)") {
        Side b;
        const auto h = untagged(Opcode::send, true, 0, 1, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_no_buffer, true, true, false, h, 38);
    }
    SECTION("SEND longer than the receive buffer") {
        Side b;
        b.upper.post_recv(8);
        const auto h = untagged(Opcode::send, true, 0, 1, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_too_long, true, true, false, h, 38);
        CHECK(b.upper.bound[1].size() == 8);  // filled, not overrun (ASan watches)
    }
    SECTION("READ request carrying payload") {
        Side b;
        const auto h = read_request(1, ReadRequest{1, 0, 0, 1, 0});
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::u_too_long, true, true, false, std::span<const std::byte>(h).first(18), 66);
    }
}

TEST_CASE("TERMINATE: tagged placement errors", "[rdmap][terminate]") {
    const auto payload = bytes_of(16, 2);
    SECTION("invalid STag") {
        Side b;
        const auto h = tagged(Opcode::write, true, 0x999, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::t_invalid_stag, true, true, false, h, 30);
    }
    SECTION("out of bounds") {
        Side b;
        b.upper.add_region(0x100, 20, bit(Access::remote_write));
        const auto h = tagged(Opcode::write, true, 0x100, 8);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::t_base_bounds, true, true, false, h, 30);
        CHECK(b.upper.regions[0x100].mem[8] == std::byte{0});  // nothing placed
    }
    SECTION("no remote-write right: RDMAP access violation, the WRITE's header attached, R clear") {
        Side b;
        b.upper.add_region(0x100, 64, bit(Access::remote_read));
        const auto h = tagged(Opcode::write, true, 0x100, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, err::p_access, true, true, false, h, 30);
    }
    SECTION("STag of another protection domain") {
        Side b;
        b.upper.add_region(0x100, 64).other_pd = true;
        const auto h = tagged(Opcode::write, true, 0x100, 0);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::t_stag_not_assoc, true, true, false, h, 30);
    }
    SECTION("TO wrap") {
        Side b;
        const auto h = tagged(Opcode::write, true, 0x100, ~std::uint64_t{0} - 3);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::t_to_wrap, true, true, false, h, 30);
    }
    SECTION("WRITE continuation jumps") {
        Side b;
        b.upper.add_region(0x100, 64);
        b.feed(make_fpdu(tagged(Opcode::write, false, 0x100, 0), payload));
        const auto h = tagged(Opcode::write, true, 0x100, 32);
        b.feed(make_fpdu(h, payload));
        expect_terminate(b, ddp::err::t_base_bounds, true, true, false, h, 30);
    }
}

// With an RX thread the rx endpoint counts inbound requests against IRD while the other thread answers them.
// Here the "other thread" answers each request the moment it is accepted (the worst timing): requests of one
// input still count as of its start, so three in one input at IRD 2 end the stream, while a later input sees
// the answers. Read per request (as before), the third was accepted or refused depending on timing.
TEST_CASE("IRD: an rx endpoint counts one input's requests as of its start", "[rdmap][terminate]") {
    struct InstantAnswer final : FakeUpper {
        std::atomic<std::uint32_t>* answered{nullptr};
        void on_inbound_request(const rdmap::IrqEntry&) override { answered->fetch_add(1); }
    };
    std::atomic<std::uint32_t> answered{0};
    InstantAnswer upper;
    upper.answered = &answered;
    upper.add_region(0x300, 64, bit(Access::remote_read));
    rdmap::Endpoint ep(rdmap::Role::rx, upper, rdmap::no_framer(), rdmap::Config{.ird = 2, .answered = &answered});
    mpa::Deframer<rdmap::Endpoint> rx(mpa::DeframerConfig{true, false, 0});
    auto reads = [](std::uint32_t first, std::uint32_t n) {
        std::vector<std::byte> all;
        for (std::uint32_t i = 0; i < n; ++i) {
            const auto f = make_fpdu(read_request(first + i, ReadRequest{1, 0, 8, 0x300, 0}));
            all.insert(all.end(), f.begin(), f.end());
        }
        return all;
    };
    SECTION("two inputs of two: each within IRD once the previous are answered") {
        CHECK_FALSE(rdmap::receive(rx, ep, reads(1, 2)).has_value());
        CHECK_FALSE(rdmap::receive(rx, ep, reads(3, 2)).has_value());
        CHECK(ep.state() == rdmap::State::operational);
        CHECK(answered.load() == 4);
    }
    SECTION("three in one input: the third is beyond IRD") {
        CHECK(rdmap::receive(rx, ep, reads(1, 3)) == err::o_catastrophic_stream);
        CHECK(ep.state() == rdmap::State::error);
        CHECK(answered.load() == 2);
    }
}

TEST_CASE("TERMINATE: READ request checks", "[rdmap][terminate]") {
    SECTION("more READs than our IRD") {
        SideConfig c;
        c.ep.ird = 1;
        Side b(c);
        b.upper.add_region(0x300, 64, bit(Access::remote_read));
        CHECK_FALSE(b.feed(make_fpdu(read_request(1, ReadRequest{1, 0, 8, 0x300, 0}))));
        const auto h = read_request(2, ReadRequest{1, 0, 8, 0x300, 0});
        CHECK(b.feed(make_fpdu(h)) == err::o_catastrophic_stream);
        expect_terminate(b, err::o_catastrophic_stream, true, true, false, std::span<const std::byte>(h).first(18), 46);
    }
    SECTION("source STag invalid: RDMAP remote protection, whole READ request attached") {
        Side b;
        const auto h = read_request(1, ReadRequest{1, 0, 8, 0x301, 0});
        b.feed(make_fpdu(h));
        expect_terminate(b, err::p_invalid_stag, true, true, true, h, 46);
    }
    SECTION("source without remote-read right") {
        Side b;
        b.upper.add_region(0x300, 64, bit(Access::remote_write));
        const auto h = read_request(1, ReadRequest{1, 0, 8, 0x300, 0});
        b.feed(make_fpdu(h));
        expect_terminate(b, err::p_access, true, true, true, h, 46);
    }
    SECTION("source out of bounds") {
        Side b;
        b.upper.add_region(0x300, 64, bit(Access::remote_read));
        const auto h = read_request(1, ReadRequest{1, 0, 65, 0x300, 0});
        b.feed(make_fpdu(h));
        expect_terminate(b, err::p_base_bounds, true, true, true, h, 46);
    }
    SECTION("source revoked between request and response") {
        Side b;
        b.upper.add_region(0x300, 64, bit(Access::remote_read));
        const auto h = read_request(1, ReadRequest{1, 0, 8, 0x300, 0});
        CHECK_FALSE(b.feed(make_fpdu(h)));
        b.upper.regions.erase(0x300);
        expect_terminate(b, err::p_invalid_stag, true, true, true, h, 46);
    }
    SECTION("READ request with MSN 2 first") {
        Side b;
        const auto h = read_request(2, ReadRequest{1, 0, 0, 1, 0});
        b.feed(make_fpdu(h));
        expect_terminate(b, ddp::err::u_msn_range, true, true, false, std::span<const std::byte>(h).first(18), 46);
    }
}

TEST_CASE("TERMINATE: READ response must match the oldest request exactly", "[rdmap][terminate]") {
    const auto setup = [](Side& a) {
        a.upper.add_region(0x200, 100, bit(Access::local_write));
        WorkRequest r;
        r.op = WrOp::read;
        r.wr_id = 5;
        r.local_stag = 0x200;
        r.local_to = 10;
        r.remote_stag = 0x300;
        r.read_len = 32;
        REQUIRE(a.ep.post(r) == PostStatus::ok);
        REQUIRE(split_fpdus(a.drain()).size() == 1);
    };
    const auto data = bytes_of(32, 3);
    SECTION("no READ outstanding") {
        Side a;
        a.feed(make_fpdu(tagged(Opcode::read_response, true, 0x200, 10), data));
        expect_terminate(a, err::o_opcode, false, false, false);
    }
    SECTION("wrong sink STag") {
        Side a;
        setup(a);
        const auto h = tagged(Opcode::read_response, true, 0x201, 10);
        a.feed(make_fpdu(h, data));
        expect_terminate(a, ddp::err::t_invalid_stag, true, true, false, h, 46);
        REQUIRE(a.upper.completions.size() == 1);  // the READ is flushed
        CHECK(a.upper.completions[0].status == WcStatus::flushed);
        CHECK(a.upper.completions[0].wr_id == 5);
    }
    SECTION("wrong sink TO") {
        Side a;
        setup(a);
        const auto h = tagged(Opcode::read_response, true, 0x200, 11);
        a.feed(make_fpdu(h, data));
        expect_terminate(a, ddp::err::t_base_bounds, true, true, false, h, 46);
    }
    SECTION("longer than the read size") {
        Side a;
        setup(a);
        const auto more = bytes_of(33, 3);
        const auto h = tagged(Opcode::read_response, true, 0x200, 10);
        a.feed(make_fpdu(h, more));
        expect_terminate(a, ddp::err::t_base_bounds, true, true, false, h, 47);
    }
    SECTION("last segment short of the read size") {
        Side a;
        setup(a);
        const auto h = tagged(Opcode::read_response, true, 0x200, 10);
        a.feed(make_fpdu(h, std::span<const std::byte>(data).first(31)));
        expect_terminate(a, ddp::err::t_base_bounds, true, true, false, h, 45);
    }
    SECTION("atomic response where a READ response is due") {
        Side a;
        setup(a);
        std::vector<std::byte> h = untagged(Opcode::atomic_response, true, kQnAtomicResponse, 1, 0);
        AtomicResponse{1, 0}.encode(h);
        a.feed(make_fpdu(h));
        expect_terminate(a, err::o_opcode, false, false, false);
    }
}

TEST_CASE("TERMINATE: atomic request checks", "[rdmap][terminate]") {
    AtomicRequest ar{};
    ar.op = 0;
    ar.stag = 0x400;
    ar.add_swap = 1;
    SECTION("misaligned target") {
        Side b;
        b.upper.add_region(0x400, 64, bit(Access::remote_atomic));
        ar.to = 4;
        const auto h = atomic_request(1, ar);
        b.feed(make_fpdu(h));
        expect_terminate(b, err::p_base_bounds, true, true, false, h, 70);  // R: READ requests only
    }
    SECTION("no remote-atomic right") {
        Side b;
        b.upper.add_region(0x400, 64, bit(Access::remote_write));
        const auto h = atomic_request(1, ar);
        b.feed(make_fpdu(h));
        expect_terminate(b, err::p_access, true, true, false, h, 70);
    }
    SECTION("unknown atomic operation") {
        Side b;
        b.upper.add_region(0x400, 64, bit(Access::remote_atomic));
        ar.op = 5;
        b.feed(make_fpdu(atomic_request(1, ar)));
        expect_terminate(b, err::o_opcode, false, false, false);
    }
    SECTION("atomic beyond IRD shares the READ budget") {
        SideConfig c;
        c.ep.ird = 1;
        Side b(c);
        b.upper.add_region(0x400, 64, bit(Access::remote_atomic));
        CHECK_FALSE(b.feed(make_fpdu(read_request(1, ReadRequest{1, 0, 0, 1, 0}))));
        const auto h = atomic_request(2, ar);
        b.feed(make_fpdu(h));
        expect_terminate(b, err::o_catastrophic_stream, true, true, false, std::span<const std::byte>(h).first(18), 70);
    }
}

TEST_CASE("TERMINATE: MPA errors reach the same choke point", "[rdmap][terminate]") {
    SECTION("CRC mismatch: placed, not delivered") {
        Side b;
        b.upper.post_recv(64);
        std::vector<std::byte> f = make_fpdu(untagged(Opcode::send, true, 0, 1, 0), bytes_of(8, 1));
        f.back() ^= std::byte{1};
        CHECK(b.feed(f) == mpa::kTermCrc);
        CHECK(b.upper.completions.empty());
        expect_terminate(b, mpa::kTermCrc, false, false, false);
    }
    SECTION("ULPDU shorter than its header") {
        Side b;
        const auto h = read_request(1, ReadRequest{});
        std::vector<std::byte> f = make_fpdu(std::span<const std::byte>(h).first(20));
        b.feed(f);
        expect_terminate(b, mpa::kTermBadUlpduLength, false, false, false);
    }
}

TEST_CASE("received TERMINATE: reported, posted work flushed, no TERMINATE back", "[rdmap][terminate]") {
    Side a, b;
    // a SEND that finds no receive at b: b terminates, a receives it.
    const auto p = bytes_of(10, 1);
    REQUIRE(a.ep.post(send_wr(1, p)) == PostStatus::ok);
    WorkRequest r;
    r.op = WrOp::read;
    r.wr_id = 2;
    r.local_stag = 1;
    r.remote_stag = 1;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    b.feed(a.drain());
    CHECK(b.ep.state() == State::error);
    REQUIRE(b.upper.terminates.size() == 1);
    const std::vector<std::byte> term = b.drain();
    CHECK(split_fpdus(term).size() == 1);
    CHECK(a.feed(term) == ddp::err::u_no_buffer);
    CHECK(a.ep.state() == State::error);
    REQUIRE(a.upper.terminates.size() == 1);
    CHECK(a.upper.terminates[0].received);
    CHECK(a.upper.terminates[0].code == ddp::err::u_no_buffer);
    CHECK(a.upper.terminates[0].m);
    CHECK(a.upper.terminates[0].d);
    REQUIRE(a.upper.term_attached[0].size() == 2 + 18);
    CHECK(load_be16(a.upper.term_attached[0], 0) == 28);  // the offending segment: 18 + 10
    CHECK(load_be16(a.upper.term_attached[0], 2) == 0x4143);
    // The READ that was outstanding is flushed; the SEND had completed.
    REQUIRE(a.upper.completions.size() == 2);
    CHECK(a.upper.completions[0].wr_id == 1);
    CHECK(a.upper.completions[0].status == WcStatus::success);
    CHECK(a.upper.completions[1].wr_id == 2);
    CHECK(a.upper.completions[1].status == WcStatus::flushed);
    CHECK(a.drain().empty());
    CHECK(a.ep.post(send_wr(3, p)) == PostStatus::not_operational);
    // More input after the end is refused without another report.
    CHECK(a.feed(make_fpdu(untagged(Opcode::send, true, 0, 1, 0))).has_value());
    CHECK(a.upper.terminates.size() == 1);
}

// A stream that fails flushes in posting order, as siw does (its ORQ, then its SQ): the READ already on the
// wire, held by the rx endpoint until its response, completes before the SEND still queued at the tx endpoint,
// whichever half saw the failure.
TEST_CASE("failure: flushes complete in posting order, requests on the wire before the send queue",
          "[rdmap][terminate]") {
    Side a;
    WorkRequest r;
    r.op = WrOp::read;
    r.wr_id = 1;
    r.local_stag = 1;
    r.remote_stag = 1;
    r.read_len = 8;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    REQUIRE(split_fpdus(a.drain()).size() == 1);  // the READ request is on the wire
    const auto p = bytes_of(10, 1);
    REQUIRE(a.ep.post(send_wr(2, p)) == PostStatus::ok);  // queued, not yet framed
    SECTION("a protocol error found here (TERMINATE sent)") {
        CHECK(a.feed(make_fpdu(untagged(Opcode::send, true, 5, 1, 0))) == ddp::err::u_invalid_qn);
        CHECK(a.upper.terminates.size() == 1);
        CHECK(split_fpdus(a.drain()).size() == 1);  // the TERMINATE, and not the SEND
    }
    SECTION("a TERMINATE received") {
        std::vector<std::byte> h = untagged(Opcode::terminate, true, kQnTerminate, 1, 0);
        store_be32(h, 18, TerminateHeader{err::o_opcode, false, false, false}.word());
        a.feed(make_fpdu(h));
        CHECK(a.drain().empty());
    }
    SECTION("stop()") {
        a.ep.stop(mpa::kTermConnectionLost);
        CHECK(a.drain().empty());
    }
    CHECK(a.ep.state() == State::error);
    REQUIRE(a.upper.completions.size() == 2);
    CHECK(a.upper.completions[0].wr_id == 1);
    CHECK(a.upper.completions[0].status == WcStatus::flushed);
    CHECK(a.upper.completions[1].wr_id == 2);
    CHECK(a.upper.completions[1].status == WcStatus::flushed);
}

// RFC 7306 is agreed out of band (Config::rfc7306). Without it: nothing of it is posted, and an inbound RFC 7306
// message is what Linux siw answers it with: TERMINATE, RDMAP remote operation, unexpected opcode (0x06).
TEST_CASE("RFC 7306 not agreed: post refuses immediate data and atomics; inbound ones draw unexpected opcode",
          "[rdmap][terminate]") {
    SideConfig plain;
    plain.ep.rfc7306 = false;
    SECTION("post") {
        Side a(plain);
        const auto p = bytes_of(8, 1);
        WorkRequest imm = send_wr(1, p);
        imm.with_imm = true;
        CHECK(a.ep.post(imm) == PostStatus::not_agreed);
        WorkRequest wimm;
        wimm.op = WrOp::write;
        wimm.with_imm = true;
        wimm.remote_stag = 5;
        CHECK(a.ep.post(wimm) == PostStatus::not_agreed);
        for (const WrOp op : {WrOp::fetch_add, WrOp::cmp_swap}) {
            WorkRequest at;
            at.op = op;
            at.remote_stag = 5;
            CHECK(a.ep.post(at) == PostStatus::not_agreed);
        }
        CHECK(a.drain().empty());  // nothing reaches the wire
        CHECK(a.ep.state() == State::operational);
        CHECK(a.ep.post(send_wr(2, p)) == PostStatus::ok);  // the rest of RFC 5040 is unaffected
    }
    SECTION("inbound Immediate Data") {
        Side b(plain);
        std::vector<std::byte> h = untagged(Opcode::imm_data, true, kQnSend, 1, 0);
        encode_imm(h, 42);
        CHECK(b.feed(make_fpdu(h)) == err::o_opcode);
        expect_terminate(b, err::o_opcode, false, false, false);
        CHECK(b.upper.completions.empty());
    }
    SECTION("inbound Atomic Request") {
        Side b(plain);
        b.feed(make_fpdu(atomic_request(1, AtomicRequest{})));
        expect_terminate(b, err::o_opcode, false, false, false);
    }
    SECTION("agreed: the same Immediate Data is taken") {
        Side a, b;  // harness default: rfc7306 on
        const auto p = bytes_of(8, 1);
        WorkRequest imm = send_wr(1, p);
        imm.with_imm = true;
        imm.imm = 9;
        REQUIRE(a.ep.post(imm) == PostStatus::ok);
        b.upper.post_recv(64);
        b.upper.post_recv(64);
        CHECK_FALSE(b.feed(a.drain()).has_value());
        CHECK(b.ep.state() == State::operational);
    }
}

// An orderly end (the connection closed, the QP moved to ERR) is a FIN and nothing else: stop() flushes what is
// outstanding and queues no TERMINATE (Linux siw answers a TERMINATE before a FIN with a reset).
TEST_CASE("stop(): posted work flushed, nothing sent", "[rdmap][terminate]") {
    Side a;
    const auto p = bytes_of(10, 1);
    REQUIRE(a.ep.post(send_wr(1, p)) == PostStatus::ok);
    a.ep.stop(mpa::kTermConnectionLost);
    CHECK(a.ep.state() == State::error);
    CHECK_FALSE(a.ep.tx_ready());
    CHECK(a.drain().empty());
    CHECK(a.upper.terminates.empty());
    REQUIRE(a.upper.completions.size() == 1);
    CHECK(a.upper.completions[0].status == WcStatus::flushed);
}

// The control word as the peer put it on the wire reaches the report: siw's x86 build lays the fields out as
// little-endian bit fields, so its "LLP, MPA, code 0x01" arrives reading as layer 0 type 2.
TEST_CASE("received TERMINATE: the raw control word is reported as received", "[rdmap][terminate]") {
    Side b;
    std::vector<std::byte> h = untagged(Opcode::terminate, true, kQnTerminate, 1, 0);
    const std::uint32_t siw_word = 0x02010000;  // siw x86: layer 2 in the low nibble, type 0 in the high one
    store_be32(h, 18, siw_word);
    b.feed(make_fpdu(h));
    REQUIRE(b.upper.terminates.size() == 1);
    CHECK(b.upper.terminates[0].received);
    CHECK(b.upper.terminates[0].raw == siw_word);
    CHECK(b.upper.terminates[0].code == TermCode{TermLayer::rdmap, 2, 0x01});  // how RFC 5040 reads it
    CHECK(b.drain().empty());
}

// Config::opaque_access_errors (verbs' default): a prober learns nothing from the TERMINATE about why its
// access failed. A WRITE to an STag that does not exist, to a region of another PD, without the right, or
// outside the bounds all draw the same DDP "invalid STag"; READ sources and atomic targets the same RDMAP
// "invalid STag". The precise cause reaches the upper layer only.
TEST_CASE("opaque access errors: every failed remote access reads invalid STag on the wire", "[rdmap][terminate]") {
    SideConfig oc;
    oc.ep.opaque_access_errors = true;
    const auto payload = bytes_of(16, 1);
    struct Case {
        const char* name;
        TermCode cause;
        int setup;  // 0 no region, 1 other PD, 2 read-only, 3 in bounds but past the end
    };
    const Case writes[] = {{"no such STag", ddp::err::t_invalid_stag, 0},
                           {"another PD", ddp::err::t_stag_not_assoc, 1},
                           {"no remote-write right", err::p_access, 2},
                           {"past the end", ddp::err::t_base_bounds, 3}};
    for (const Case& c : writes) {
        SECTION(std::string("WRITE: ") + c.name) {
            Side b(oc);
            if (c.setup == 1) b.upper.add_region(0x100, 64).other_pd = true;
            if (c.setup == 2) b.upper.add_region(0x100, 64, bit(Access::remote_read));
            if (c.setup == 3) b.upper.add_region(0x100, 8, bit(Access::remote_write));
            const auto h = tagged(Opcode::write, true, 0x100, 0);
            b.feed(make_fpdu(h, payload));
            // DDP tagged invalid STag: the DDP header attached (M, D), no R.
            expect_terminate(b, ddp::err::t_invalid_stag, true, true, false, h, 30);
            CHECK(b.upper.terminates[0].cause == c.cause);
        }
    }
    SECTION("READ request: source outside its region reads invalid STag too") {
        Side b(oc);
        b.upper.add_region(0x200, 64, bit(Access::remote_read));
        const auto h = read_request(1, ReadRequest{0x77, 0, 128, 0x200, 0});
        b.feed(make_fpdu(h));
        expect_terminate(b, err::p_invalid_stag, true, true, true, h, 46);
        CHECK(b.upper.terminates[0].cause == err::p_base_bounds);
    }
}

// ==== CRC off: the plain (non-fused) payload path ===========================================================

TEST_CASE("CRC off: SEND, WRITE, READ through the memcpy path", "[rdmap]") {
    SideConfig c = small_mss();
    c.crc = false;
    Side a(c), b(c);
    b.upper.post_recv(300);
    b.upper.add_region(0x100, 300, bit(Access::remote_write));
    Region& src = b.upper.add_region(0x300, 300, bit(Access::remote_read));
    src.mem = bytes_of(300, 4);
    a.upper.add_region(0x200, 300, bit(Access::local_write));
    const auto p = bytes_of(250, 2);
    REQUIRE(a.ep.post(send_wr(1, p)) == PostStatus::ok);
    WorkRequest w = send_wr(2, p);
    w.op = WrOp::write;
    w.remote_stag = 0x100;
    REQUIRE(a.ep.post(w) == PostStatus::ok);
    WorkRequest r;
    r.op = WrOp::read;
    r.wr_id = 3;
    r.local_stag = 0x200;
    r.remote_stag = 0x300;
    r.read_len = 250;
    REQUIRE(a.ep.post(r) == PostStatus::ok);
    pump(a, b, 9);
    REQUIRE(a.upper.completions.size() == 3);
    REQUIRE(b.upper.completions.size() == 1);
    CHECK(std::equal(p.begin(), p.end(), b.upper.bound[1].begin()));
    CHECK(std::equal(p.begin(), p.end(), b.upper.regions[0x100].mem.begin()));
    CHECK(std::equal(src.mem.begin(), src.mem.begin() + 250, a.upper.regions[0x200].mem.begin()));
}

// ==== robustness: corrupted streams never read or write out of bounds (run under ASan/UBSan) ===============

namespace {
std::uint32_t lcg(std::uint32_t& s) {
    s = s * 1664525u + 1013904223u;
    return s >> 8;
}
// A varied valid stream from `a` to `b` (CRC off, so corruption reaches DDP/RDMAP parsing).
std::vector<std::byte> sample_stream() {
    SideConfig c = small_mss();
    c.crc = false;
    Side a(c);
    const auto p = bytes_of(300, 1);
    a.ep.post(send_wr(1, p));
    WorkRequest w = send_wr(2, p);
    w.op = WrOp::write;
    w.remote_stag = 0x100;
    w.with_imm = true;
    a.ep.post(w);
    WorkRequest r;
    r.op = WrOp::read;
    r.local_stag = 0x200;
    r.remote_stag = 0x300;
    r.read_len = 64;
    a.ep.post(r);
    WorkRequest fa;
    fa.op = WrOp::fetch_add;
    fa.remote_stag = 0x400;
    fa.swap_add = 1;
    a.ep.post(fa);
    WorkRequest s = send_wr(5, p);
    s.with_inv = true;
    s.inv_stag = 0x100;
    a.ep.post(s);
    return a.drain();
}
}  // namespace

TEST_CASE("corrupted input: every outcome is clean (no crash, at most one TERMINATE)", "[rdmap][robustness]") {
    const std::vector<std::byte> good = sample_stream();
    REQUIRE(good.size() > 500);
    std::uint32_t seed = 12345;
    for (int iter = 0; iter < 3000; ++iter) {
        std::vector<std::byte> in = good;
        const int flips = 1 + static_cast<int>(lcg(seed) % 4);
        for (int k = 0; k < flips; ++k) in[lcg(seed) % in.size()] ^= static_cast<std::byte>(1u << (lcg(seed) % 8));
        if (iter % 5 == 0) in.resize(lcg(seed) % in.size());  // truncated too
        SideConfig c = small_mss();
        c.crc = false;
        c.ep.ird = 2;
        Side b(c);
        for (int i = 0; i < 4; ++i) b.upper.post_recv(1 + lcg(seed) % 400);
        b.upper.add_region(0x100, 1 + lcg(seed) % 400).chunk = 1 + lcg(seed) % 64;
        b.upper.add_region(0x300, 64);
        b.upper.add_region(0x400, 8);
        b.feed(in, 1 + lcg(seed) % 97);
        const std::vector<std::byte> out = b.drain(128 + lcg(seed) % 4096);  // >= the largest TERMINATE FPDU
        CHECK(b.upper.terminates.size() <= 1);
        if (b.ep.state() == State::error) {
            REQUIRE(b.upper.terminates.size() == 1);
            if (b.upper.terminates[0].received) {  // corruption made a TERMINATE: reported, never answered
                CHECK(out.empty());
                continue;
            }
            // Our TERMINATE is the last thing sent, well formed.
            const std::vector<Fpdu> f = split_fpdus(out);
            REQUIRE_FALSE(f.empty());
            CHECK(load_be16(f.back().ulpdu, 0) == 0x4147);
        }
    }
}
