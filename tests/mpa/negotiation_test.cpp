// SPDX-License-Identifier: MIT
// MPA negotiation: the full matrix between our two roles, byte-exact frames against siw captures and the Chelsio
// defaults, IRD/ORD and RTR failures, time limits, and bytes after the reply.
#include <catch2/catch.hpp>

#include <cstring>

#include "mpa/negotiation.hpp"
#include "test_util.hpp"

using namespace softrdma::mpa;
using namespace std::chrono_literals;
using softrdma::mpa::test::hex;

namespace {

const Clock::time_point t0{};

std::vector<std::byte> take_output(Negotiator& n) {
    auto o = n.output();
    std::vector<std::byte> v(o.begin(), o.end());
    n.output_sent(v.size());
    return v;
}

// Feeds `in` one byte at a time when `bytewise`, else at once; returns bytes consumed.
template <class N>
std::size_t feed(N& n, const std::vector<std::byte>& in, bool bytewise, Clock::time_point now = t0) {
    if (!bytewise) return n.input(in, now);
    std::size_t used = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        const std::size_t c = n.input(std::span(in.data() + i, 1), now);
        used += c;
        if (c == 0) break;
    }
    return used;
}

struct Run {
    Outcome init = Outcome::in_progress;
    Outcome resp = Outcome::in_progress;
};

// Runs both roles against each other. The responder accepts with (ird, ord) from its config.
Run negotiate(Initiator& i, Responder& r, const NegotiationConfig& rc, bool bytewise,
              std::span<const std::byte> resp_pd = {}) {
    r.start(t0);
    if (i.start(t0) == Outcome::failed) return {Outcome::failed, r.outcome()};
    auto req = take_output(i);
    auto extra = req;
    extra.push_back(std::byte{0xEE});  // must not be consumed: the initiator sends nothing before the reply
    REQUIRE(feed(r, extra, bytewise) == req.size());
    if (r.outcome() == Outcome::request_received) REQUIRE(r.accept(resp_pd, rc.ird, rc.ord));
    auto rep = take_output(r);
    if (!rep.empty()) {
        auto more = rep;
        const auto fpdu = hex("00224143000000000000000000000001000000000000000000000000000000000000000000000000");
        more.insert(more.end(), fpdu.begin(), fpdu.end());
        REQUIRE(feed(i, more, bytewise) == rep.size());  // FPDU bytes after the reply are handed back
    }
    return {i.outcome(), r.outcome()};
}

}  // namespace

TEST_CASE("negotiation: matrix of revision x CRC x markers x peer-to-peer, both roles", "[negotiation]") {
    const CrcPolicy pols[] = {CrcPolicy::off, CrcPolicy::preferred, CrcPolicy::required, CrcPolicy::forbidden};
    const RtrSet sets[] = {{true, true, false}, {false, true, false}, {false, false, true}, {false, false, false},
                           {true, false, false}};
    int runs = 0;
    for (std::uint8_t irev : {1, 2})
    for (std::uint8_t rrev : {1, 2})
    for (auto icrc : pols)
    for (auto rcrc : pols)
    for (int mk = 0; mk < 16; ++mk)
    for (int p2p = 0; p2p < 4; ++p2p)
    for (std::size_t os = 0; os < (p2p ? std::size(sets) : 1); ++os)
    for (std::size_t as = 0; as < (p2p ? std::size(sets) : 1); ++as) {
        NegotiationConfig ic, rc;
        ic.revision = irev;
        rc.revision = rrev;
        ic.crc = icrc;
        rc.crc = rcrc;
        ic.markers_rx = mk & 1;
        rc.markers_rx = mk & 2;
        ic.markers_tx_ok = mk & 4;
        rc.markers_tx_ok = mk & 8;
        ic.peer_to_peer = p2p & 1;
        rc.peer_to_peer = p2p & 2;
        ic.rtr = sets[os];
        rc.rtr = sets[as];
        const auto pd = softrdma::mpa::test::bytes_of("app data");
        ic.private_data = pd;
        Initiator i(ic);
        Responder r(rc);
        const bool bytewise = (runs++ % 7) == 0;
        const Run res = negotiate(i, r, rc, bytewise, softrdma::mpa::test::bytes_of("reply data"));
        CAPTURE(irev, rrev, int(icrc), int(rcrc), mk, p2p, os, as);

        // ---- oracle ----
        const bool i_asks_crc = icrc == CrcPolicy::preferred || icrc == CrcPolicy::required;
        const bool r_asks_crc = rcrc == CrcPolicy::preferred || rcrc == CrcPolicy::required;
        const std::uint8_t rev = std::min(irev, rrev);
        if (ic.peer_to_peer && irev == 1) {
            CHECK(res.init == Outcome::failed);  // cannot ask for P2P with revision 1
            continue;
        }
        // Responder-side rejections.
        std::optional<FailReason> r_reject;
        if (ic.markers_rx && !rc.markers_tx_ok) r_reject = FailReason::unsupported;
        else if (rcrc == CrcPolicy::forbidden && i_asks_crc) r_reject = FailReason::unsupported;
        else if (ic.peer_to_peer && rev == 2) {
            const RtrSet o = ic.rtr, a = rc.rtr;
            const bool match = rc.peer_to_peer && ((o.write && a.write) || (o.read && a.read) || (o.send && a.send) ||
                                                   (!o.write && !o.read && !o.send && a.write));
            if (!match) r_reject = FailReason::no_matching_rtr;
        }
        if (r_reject) {
            CHECK(res.resp == Outcome::failed);
            CHECK(r.failure().reason == *r_reject);
            CHECK_FALSE(r.failure().send_terminate);
            CHECK(res.init == Outcome::rejected);  // the initiator sees R set
            CHECK(i.reply().reject);
            continue;
        }
        REQUIRE(res.resp == Outcome::agreed);
        // Initiator-side failures.
        std::optional<FailReason> i_fail;
        bool term = false;
        if (rc.markers_rx && !ic.markers_tx_ok) i_fail = FailReason::unsupported;
        else if (icrc == CrcPolicy::forbidden && r_asks_crc) i_fail = FailReason::unsupported;
        else if (ic.peer_to_peer && rev == 1) {
            i_fail = FailReason::no_matching_rtr;
            term = true;
        } else if (ic.peer_to_peer && !ic.rtr.write && !ic.rtr.read && !ic.rtr.send) {
            i_fail = FailReason::no_matching_rtr;  // responder proposed WRITE, which we did not offer
            term = true;
        }
        if (i_fail) {
            CHECK(res.init == Outcome::failed);
            CHECK(i.failure().reason == *i_fail);
            CHECK(i.failure().send_terminate == term);
            if (*i_fail == FailReason::no_matching_rtr) CHECK(i.failure().code == kTermNoMatchingRtr);
            continue;
        }
        REQUIRE(res.init == Outcome::agreed);
        const Agreed& a = i.agreed();
        const Agreed& b = r.agreed();
        CHECK(a.revision == rev);
        CHECK(b.revision == rev);
        CHECK(a.enhanced == (rev == 2));
        CHECK(b.enhanced == (rev == 2));
        CHECK(a.crc == (i_asks_crc || r_asks_crc));
        CHECK(b.crc == a.crc);
        CHECK(a.markers_rx == ic.markers_rx);
        CHECK(b.markers_tx == ic.markers_rx);
        CHECK(a.markers_tx == rc.markers_rx);
        CHECK(b.markers_rx == rc.markers_rx);
        CHECK(a.p2p == (ic.peer_to_peer && rev == 2));
        CHECK(b.p2p == a.p2p);
        CHECK(a.rtr == b.rtr);
        if (a.p2p) {
            const RtrSet o = ic.rtr, s = rc.rtr;
            const RtrType want = (o.write && s.write) ? RtrType::write
                                 : (o.read && s.read) ? RtrType::read
                                                      : RtrType::send;
            CHECK(a.rtr == want);
        } else {
            CHECK(a.rtr == RtrType::none);
        }
        CHECK_FALSE(a.responder_waits_for_first_fpdu);
        CHECK(b.responder_waits_for_first_fpdu);
        CHECK(std::string(reinterpret_cast<const char*>(b.peer_private_data.bytes.data()), b.peer_private_data.size) ==
              "app data");
        CHECK(std::string(reinterpret_cast<const char*>(a.peer_private_data.bytes.data()), a.peer_private_data.size) ==
              "reply data");
        // FPDU engines line up: what one side sends the other can deframe.
        CHECK(tx_config(a, 1448).markers == rx_config(b).markers);
        CHECK(tx_config(b, 1448).markers == rx_config(a).markers);
        CHECK(tx_config(a, 1448).crc == rx_config(b).crc);
    }
    CHECK(runs > 1000);
}

TEST_CASE("negotiation: our initiator sends what siw sends; siw's reply is accepted", "[negotiation][captures]") {
    NegotiationConfig c;  // defaults: rev 2, CRC off, IRD/ORD 1/1, no P2P
    Initiator i(c);
    REQUIRE(i.start(t0) == Outcome::in_progress);
    CHECK(take_output(i) == hex("4d504120494420526571204672616d651002000400010001"));  // rping.pcapng frame 8
    // Reply (frame 10) and the responder's first FPDU (frame 13 has a READ request; use frame 15) in one read.
    auto in = hex("4d504120494420526570204672616d651002000400010001");
    const auto fpdu = hex("00224143000000000000000000000001000000000000000000000000000000000000000000000000");
    in.insert(in.end(), fpdu.begin(), fpdu.end());
    CHECK(i.input(in, t0 + 1ms) == 24);
    REQUIRE(i.outcome() == Outcome::agreed);
    CHECK(i.agreed().revision == 2);
    CHECK(i.agreed().enhanced);
    CHECK_FALSE(i.agreed().crc);
    CHECK(i.agreed().ird == 1);
    CHECK(i.agreed().ord == 1);
    CHECK_FALSE(i.agreed().p2p);
    // Further input is not consumed.
    CHECK(i.input(fpdu, t0 + 2ms) == 0);
}

TEST_CASE("negotiation: our responder answers siw byte-exactly (rping, rping_crc, rping_p2p)", "[negotiation][captures]") {
    struct Case {
        const char* req;
        const char* rep;
        bool p2p;
        bool crc;
    };
    const Case cases[] = {
        {"4d504120494420526571204672616d651002000400010001", "4d504120494420526570204672616d651002000400010001", false, false},
        // rping_crc.pcapng and rping_crcreq.pcapng (stock siw server, client requiring CRC): our responder has
        // CRC policy off, like stock siw, and follows the request's C.
        {"4d504120494420526571204672616d655002000400010001", "4d504120494420526570204672616d655002000400010001", false, true},
        {"4d504120494420526571204672616d65100200048001c001", "4d504120494420526570204672616d651002000480018001", true, false},
    };
    for (const auto& cs : cases) {
        NegotiationConfig c;
        c.peer_to_peer = true;  // accept P2P (WRITE preferred, like siw)
        Responder r(c);
        r.start(t0);
        CHECK(feed(r, hex(cs.req), true) == 24);
        REQUIRE(r.outcome() == Outcome::request_received);
        CHECK(r.request().ird_ord.ird == 1);
        CHECK(r.request().ird_ord.ord == 1);
        CHECK(r.request().ird_ord.peer_to_peer == cs.p2p);
        CHECK(r.request_private_data().empty());
        REQUIRE(r.accept({}, 1, 1));
        CHECK(take_output(r) == hex(cs.rep));
        CHECK(r.agreed().crc == cs.crc);
        CHECK(r.agreed().p2p == cs.p2p);
        CHECK(r.agreed().rtr == (cs.p2p ? RtrType::write : RtrType::none));
        CHECK(r.agreed().responder_waits_for_first_fpdu);
    }
    // And our P2P initiator offering WRITE and READ sends siw's P2P request.
    NegotiationConfig c;
    c.peer_to_peer = true;
    Initiator i(c);
    i.start(t0);
    CHECK(take_output(i) == hex(cases[2].req));
    CHECK(i.input(hex(cases[2].rep), t0) == 24);
    REQUIRE(i.outcome() == Outcome::agreed);
    CHECK(i.agreed().rtr == RtrType::write);
}

TEST_CASE("negotiation: Chelsio defaults (rev 2, CRC required, P2P READ RTR, depth 32)", "[negotiation]") {
    // cxgb4 request: flags C|enhanced, IRD word 0x8000|32, ORD word 0x4000|32.
    const auto chelsio_req = hex("4d504120494420526571204672616d65" "5002" "0004" "8020" "4020");
    SECTION("our responder picks READ and follows CRC") {
        NegotiationConfig c;
        c.peer_to_peer = true;
        Responder r(c);
        r.start(t0);
        CHECK(r.input(chelsio_req, t0) == chelsio_req.size());
        REQUIRE(r.outcome() == Outcome::request_received);
        REQUIRE(r.accept({}, 32, 32));
        CHECK(take_output(r) == hex("4d504120494420526570204672616d65" "5002" "0004" "8020" "4020"));
        CHECK(r.agreed().crc);
        CHECK(r.agreed().rtr == RtrType::read);
        CHECK(r.agreed().ird == 32);
        CHECK(r.agreed().ord == 32);
    }
    SECTION("a responder that does not accept P2P rejects with no matching RTR") {
        NegotiationConfig c;  // peer_to_peer false
        Responder r(c);
        r.start(t0);
        r.input(chelsio_req, t0);
        CHECK(r.outcome() == Outcome::failed);
        CHECK(r.failure().code == kTermNoMatchingRtr);
        const auto out = take_output(r);
        REQUIRE(out.size() == 20);
        CHECK((std::to_integer<int>(out[16]) & kFlagReject) != 0);
    }
    SECTION("our initiator offering WRITE only: a READ-only reply is a TERMINATE 0x07") {
        NegotiationConfig c;
        c.peer_to_peer = true;
        c.rtr = {true, false, false};
        c.crc = CrcPolicy::required;
        Initiator i(c);
        i.start(t0);
        i.input(hex("4d504120494420526570204672616d65" "5002" "0004" "8020" "4020"), t0);
        CHECK(i.outcome() == Outcome::failed);
        CHECK(i.failure().code == kTermNoMatchingRtr);
        CHECK(i.failure().send_terminate);
        CHECK(i.agreed().crc);  // the TERMINATE is framed with CRC
    }
    SECTION("our initiator with CRC required refuses a reply without C") {
        NegotiationConfig c;
        c.crc = CrcPolicy::required;
        Initiator i(c);
        i.start(t0);
        CHECK(take_output(i)[16] == std::byte{0x50});
        i.input(hex("4d504120494420526570204672616d651002000400010001"), t0);
        CHECK(i.outcome() == Outcome::failed);
        CHECK(i.failure().reason == FailReason::unsupported);
    }
}

TEST_CASE("negotiation: IRD/ORD", "[negotiation]") {
    NegotiationConfig c;
    c.ird = 4;
    c.ord = 8;
    c.max_ird = 64;
    auto reply_with = [](std::uint16_t ird, std::uint16_t ord) {
        std::array<std::byte, 24> b{};
        IrdOrd io{ird, ord};
        encode_frame(b, FrameParams{FrameKind::reply, false, false, false, 2, &io, {}});
        return std::vector<std::byte>(b.begin(), b.end());
    };
    SECTION("peer ORD above max IRD: TERMINATE insufficient IRD") {
        Initiator i(c);
        i.start(t0);
        i.input(reply_with(16, 65), t0);
        CHECK(i.outcome() == Outcome::failed);
        CHECK(i.failure().code == kTermInsufficientIrd);
        CHECK(i.failure().code == softrdma::TermCode{softrdma::TermLayer::llp, 0, 0x06});
        CHECK(i.failure().send_terminate);
    }
    SECTION("peer ORD above IRD but within max: IRD grows; our ORD is cut to the peer IRD") {
        Initiator i(c);
        i.start(t0);
        i.input(reply_with(2, 64), t0);
        REQUIRE(i.outcome() == Outcome::agreed);
        CHECK(i.agreed().ird == 64);
        CHECK(i.agreed().ord == 2);
    }
    SECTION("responder cuts its ORD to the initiator's IRD") {
        Initiator i(c);
        Responder r(NegotiationConfig{});
        r.start(t0);
        i.start(t0);
        r.input(take_output(i), t0);
        REQUIRE(r.accept({}, 16, 100));
        CHECK(r.agreed().ord == 4);
        CHECK(r.agreed().ird == 16);
        i.input(take_output(r), t0);
        REQUIRE(i.outcome() == Outcome::agreed);
        CHECK(i.agreed().ord == 8);
        CHECK(i.agreed().ird == 4);
    }
}

TEST_CASE("negotiation: rejects, bad keys, revisions", "[negotiation]") {
    SECTION("application reject carries private data both ways") {
        NegotiationConfig ic;
        const auto pd = softrdma::mpa::test::bytes_of("let me in");
        ic.private_data = pd;
        Initiator i(ic);
        Responder r(NegotiationConfig{});
        i.start(t0);
        r.start(t0);
        r.input(take_output(i), t0);
        REQUIRE(r.outcome() == Outcome::request_received);
        CHECK(r.request_private_data().size() == pd.size());
        REQUIRE(r.reject(softrdma::mpa::test::bytes_of("no")));
        CHECK(r.outcome() == Outcome::rejected);
        CHECK_FALSE(r.accept({}, 1, 1));
        i.input(take_output(r), t0);
        CHECK(i.outcome() == Outcome::rejected);
        CHECK(i.agreed().peer_private_data.size == 2);
    }
    SECTION("bad key in the reply: TERMINATE 0x04") {
        Initiator i(NegotiationConfig{});
        i.start(t0);
        i.input(hex("4d504120494420526571204672616d651002000400010001"), t0);  // a request key
        CHECK(i.outcome() == Outcome::failed);
        CHECK(i.failure().code == kTermInvalidFrame);
        CHECK(i.failure().code.ecode == 0x04);
        CHECK(i.failure().send_terminate);
    }
    SECTION("bad key in the request: close without a reply") {
        Responder r(NegotiationConfig{});
        r.start(t0);
        r.input(softrdma::mpa::test::bytes_of("GET / HTTP/1.1\r\nHost: x\r\n"), t0);
        CHECK(r.outcome() == Outcome::failed);
        CHECK(r.output().empty());
        CHECK_FALSE(r.failure().send_terminate);
    }
    SECTION("revision 1 request: revision 1 reply without IRD/ORD") {
        Responder r(NegotiationConfig{});
        r.start(t0);
        r.input(hex("4d504120494420526571204672616d650001" "0000"), t0);
        REQUIRE(r.outcome() == Outcome::request_received);
        REQUIRE(r.accept({}, 1, 1));
        CHECK(take_output(r) == hex("4d504120494420526570204672616d650001" "0000"));
        CHECK_FALSE(r.agreed().enhanced);
    }
    SECTION("revision 0 request (pre-RFC draft): answered with revision 0, as siw") {
        Responder r(NegotiationConfig{});
        r.start(t0);
        r.input(hex("4d504120494420526571204672616d650000" "0000"), t0);
        REQUIRE(r.outcome() == Outcome::request_received);
        REQUIRE(r.accept({}, 1, 1));
        CHECK(take_output(r) == hex("4d504120494420526570204672616d650000" "0000"));
        CHECK_FALSE(r.agreed().enhanced);
    }
    SECTION("revision 3 request: no reply, the connection closes (siw -EPROTO, Chelsio aborts)") {
        Responder r(NegotiationConfig{});
        r.start(t0);
        r.input(hex("4d504120494420526571204672616d650003" "0000"), t0);
        CHECK(r.outcome() == Outcome::failed);
        CHECK(r.failure().reason == FailReason::protocol);
        CHECK_FALSE(r.failure().send_terminate);
        CHECK(r.output().empty());
    }
    SECTION("revision 2 request without the enhanced flag: revision 2 reply, no IRD/ORD") {
        Responder r(NegotiationConfig{});
        r.start(t0);
        r.input(hex("4d504120494420526571204672616d650002" "0000"), t0);
        REQUIRE(r.outcome() == Outcome::request_received);
        REQUIRE(r.accept({}, 1, 1));
        CHECK(take_output(r) == hex("4d504120494420526570204672616d650002" "0000"));
        CHECK_FALSE(r.agreed().enhanced);
    }
    SECTION("markers by default: a request asking for them is rejected, as siw") {
        NegotiationConfig ic;
        ic.markers_rx = true;
        Initiator i(ic);
        Responder r(NegotiationConfig{});
        i.start(t0);
        r.start(t0);
        r.input(take_output(i), t0);
        CHECK(r.outcome() == Outcome::failed);
        CHECK(r.failure().reason == FailReason::unsupported);
        const auto rep = take_output(r);
        REQUIRE(rep.size() >= 20);
        CHECK((std::to_integer<int>(rep[16]) & kFlagReject) != 0);
        CHECK((std::to_integer<int>(rep[16]) & 0x80) == 0);  // the reply does not carry M
        i.input(rep, t0);
        CHECK(i.outcome() == Outcome::rejected);
    }
    SECTION("markers by default: a reply asking for them fails the initiator") {
        NegotiationConfig rc;
        rc.markers_rx = true;
        rc.markers_tx_ok = true;
        Initiator i(NegotiationConfig{});
        Responder r(rc);
        i.start(t0);
        r.start(t0);
        r.input(take_output(i), t0);
        REQUIRE(r.accept({}, 1, 1));
        i.input(take_output(r), t0);
        CHECK(i.outcome() == Outcome::failed);
        CHECK(i.failure().reason == FailReason::unsupported);
    }
    SECTION("reply revision above the request's is a protocol error") {
        NegotiationConfig c;
        c.revision = 1;
        Initiator i(c);
        i.start(t0);
        CHECK(take_output(i) == hex("4d504120494420526571204672616d650001" "0000"));
        i.input(hex("4d504120494420526570204672616d651002000400010001"), t0);
        CHECK(i.outcome() == Outcome::failed);
    }
    SECTION("markers: a responder that will not send them rejects like siw") {
        NegotiationConfig ic, rc;
        ic.markers_rx = true;
        rc.markers_tx_ok = false;
        Initiator i(ic);
        Responder r(rc);
        i.start(t0);
        r.start(t0);
        auto req = take_output(i);
        CHECK(req[16] == std::byte{0x90});
        r.input(req, t0);
        CHECK(r.outcome() == Outcome::failed);
        i.input(take_output(r), t0);
        CHECK(i.outcome() == Outcome::rejected);
    }
    SECTION("private data too long") {
        std::vector<std::byte> pd(253);
        NegotiationConfig c;
        c.private_data = pd;
        Initiator i(c);
        CHECK(i.start(t0) == Outcome::failed);
        Responder r(NegotiationConfig{});
        r.start(t0);
        r.input(hex("4d504120494420526571204672616d651002000400010001"), t0);
        CHECK_FALSE(r.accept(pd, 1, 1));
        CHECK(r.accept(std::span(pd.data(), 252), 1, 1));
        CHECK(take_output(r).size() == 20 + 256);
    }
}

TEST_CASE("negotiation: time limits", "[negotiation]") {
    SECTION("initiator waits 10 s for the reply, even with part of it received") {
        Initiator i(NegotiationConfig{});
        i.start(t0);
        const auto rep = hex("4d504120494420526570204672616d651002000400010001");
        CHECK(i.input(std::span(rep.data(), 10), t0 + 5s) == 10);
        CHECK(i.poll(t0 + 10s - 1ns) == Outcome::in_progress);
        CHECK(i.poll(t0 + 10s) == Outcome::failed);
        CHECK(i.failure().reason == FailReason::timeout);
        CHECK(i.input(std::span(rep.data() + 10, 14), t0 + 11s) == 0);
    }
    SECTION("a reply arriving late is not accepted") {
        Initiator i(NegotiationConfig{});
        i.start(t0);
        CHECK(i.input(hex("4d504120494420526570204672616d651002000400010001"), t0 + 10s) == 0);
        CHECK(i.outcome() == Outcome::failed);
    }
    SECTION("responder waits 5 s for the request; no time limit once it is in") {
        Responder r(NegotiationConfig{});
        r.start(t0);
        CHECK(r.poll(t0 + 5s - 1ns) == Outcome::in_progress);
        CHECK(r.poll(t0 + 5s) == Outcome::failed);
        CHECK(r.failure().reason == FailReason::timeout);
        Responder r2(NegotiationConfig{});
        r2.start(t0);
        r2.input(hex("4d504120494420526571204672616d651002000400010001"), t0 + 4s);
        CHECK(r2.poll(t0 + 60s) == Outcome::request_received);
    }
    SECTION("configured limits") {
        NegotiationConfig c;
        c.reply_timeout = 250ms;
        Initiator i(c);
        i.start(t0);
        CHECK(i.poll(t0 + 249ms) == Outcome::in_progress);
        CHECK(i.poll(t0 + 250ms) == Outcome::failed);
    }
}

TEST_CASE("negotiation: partial writes of the output", "[negotiation]") {
    Initiator i(NegotiationConfig{});
    i.start(t0);
    CHECK(i.output().size() == 24);
    i.output_sent(5);
    CHECK(i.output().size() == 19);
    CHECK(i.output()[0] == std::byte{'D'});  // "MPA ID Req Frame": index 5
}

namespace {
struct Sink {
    std::vector<std::vector<std::byte>> payloads;
    std::size_t ulpdu_header_length(std::uint16_t) { return 14; }
    softrdma::ProtoStatus on_ulpdu_header(std::span<const std::byte>, std::size_t) {
        payloads.emplace_back();
        return std::nullopt;
    }
    softrdma::ProtoStatus on_ulpdu_payload(std::span<const std::byte> b) {
        payloads.back().insert(payloads.back().end(), b.begin(), b.end());
        return std::nullopt;
    }
    softrdma::ProtoStatus on_ulpdu_end() { return std::nullopt; }
};
}  // namespace

TEST_CASE("negotiation: agreed modes drive FpduTx and Deframer end to end", "[negotiation]") {
    for (int mode = 0; mode < 8; ++mode) {
        NegotiationConfig ic, rc;
        ic.crc = (mode & 1) ? CrcPolicy::preferred : CrcPolicy::off;
        ic.markers_rx = mode & 2;
        rc.markers_rx = mode & 4;
        ic.markers_tx_ok = rc.markers_tx_ok = true;  // markers are opt-in (refused by default, as siw)
        Initiator i(ic);
        Responder r(rc);
        i.start(t0);
        r.start(t0);
        r.input(take_output(i), t0);
        REQUIRE(r.accept({}, 1, 1));
        // The reply and the responder's first FPDUs arrive in one read (the initiator sent its first FPDU).
        auto stream = take_output(r);
        const std::size_t reply_size = stream.size();
        FpduTx rtx(tx_config(r.agreed(), 1448));
        std::vector<std::byte> hdr(14, std::byte{0xC1}), pl(3000, std::byte{0x42});
        for (std::size_t off = 0; off < pl.size();) {
            const std::size_t k = std::min(rtx.mulpdu() - hdr.size(), pl.size() - off);
            std::vector<std::byte> out(rtx.wire_size(hdr.size() + k));
            REQUIRE(out.size() <= 1448);
            REQUIRE(rtx.write(out, hdr, std::span<const std::byte>(pl.data() + off, k)) == out.size());
            stream.insert(stream.end(), out.begin(), out.end());
            off += k;
        }
        const std::size_t used = i.input(stream, t0);
        REQUIRE(i.outcome() == Outcome::agreed);
        REQUIRE(used == reply_size);
        CHECK(i.agreed().crc == bool(mode & 1));
        CHECK(i.agreed().markers_rx == bool(mode & 2));
        CHECK(r.agreed().markers_tx == bool(mode & 2));
        Sink s;
        Deframer<Sink> d(rx_config(i.agreed()));
        REQUIRE_FALSE(d.feed(std::span(stream).subspan(used), s));
        std::vector<std::byte> got;
        for (const auto& p : s.payloads) got.insert(got.end(), p.begin(), p.end());
        CHECK(got == pl);
        CHECK(d.at_fpdu_boundary());
    }
}
