// SPDX-License-Identifier: MIT
// What a real iWARP peer expects around the wire format, checked between two softrdma processes (the live run
// against Linux siw is tests/interop/): an orderly close is a FIN and nothing else; RFC 7306 messages go only
// where both ends agreed to them; the initiator's first-FPDU guard (nudge / hold) behaves as verbs/cm.cpp
// says; markers are refused unless asked for. Captures are read back to see what was on the wire.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <thread>

#include "mpa/errors.hpp"
#include "mpa/fpdu.hpp"
#include "mpa/frames.hpp"
#include "stack/tcp.hpp"
#include "tests/verbs/fixture.hpp"
#include "tests/wire/pcap.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

namespace {

// One direction of a captured connection, keyed by TCP source port.
struct Direction {
    int data_segments = 0;
    int fins = 0;
    int rsts = 0;
    int terminates = 0;           // RDMAP opcode 7
    int rfc7306 = 0;              // RDMAP opcodes 8..11
    int fpdus = 0;
    std::vector<std::uint64_t> zero_writes_us;  // zero-length RDMA WRITEs (the RTR and first-FPDU nudges)
    std::uint64_t mpa_frame_us = 0;             // the MPA request/reply (first data segment)
    std::uint64_t first_fpdu_us = 0;            // the first FPDU after it
};

// Reads a capture of one softrdma connection (IPv4/TCP over Ethernet, no markers): per direction, the TCP
// flags seen and the RDMAP opcode of every FPDU after the MPA frame.
std::map<std::uint16_t, Direction> read_directions(const std::string& pcap) {
    std::map<std::uint16_t, Direction> dirs;
    for (const auto& f : wire::read_capture(pcap)) {
        const auto& b = f.bytes;
        if (b.size() < 54 || b[12] != 0x08 || b[13] != 0x00 || b[23] != 6) continue;  // IPv4 TCP only
        const std::size_t ihl = (b[14] & 0x0f) * 4u;
        const std::size_t ip_len = (b[16] << 8) | b[17];
        const std::size_t tcp = 14 + ihl;
        const std::size_t doff = (b[tcp + 12] >> 4) * 4u;
        if (ip_len < ihl + doff || 14 + ip_len > b.size()) continue;
        const std::uint16_t sport = static_cast<std::uint16_t>((b[tcp] << 8) | b[tcp + 1]);
        Direction& d = dirs[sport];
        const std::uint8_t flags = b[tcp + 13];
        if (flags & 0x01) ++d.fins;
        if (flags & 0x04) ++d.rsts;
        const std::size_t len = ip_len - ihl - doff;
        if (len == 0) continue;
        if (d.data_segments++ == 0) {
            d.mpa_frame_us = f.time_us;
            continue;
        }
        const std::uint8_t* pl = b.data() + tcp + doff;
        for (std::size_t off = 0; off + 4 <= len;) {
            const std::size_t ulpdu = (pl[off] << 8) | pl[off + 1];
            const std::uint16_t ctrl = static_cast<std::uint16_t>((pl[off + 2] << 8) | pl[off + 3]);
            const unsigned opcode = ctrl & 0x0f;
            if (d.fpdus++ == 0) d.first_fpdu_us = f.time_us;
            if (opcode == 7) ++d.terminates;
            if (opcode >= 8 && opcode <= 11) ++d.rfc7306;
            if (opcode == 0 && (ctrl & 0x8000) != 0 && ulpdu == 14) d.zero_writes_us.push_back(f.time_us);
            off += mpa::fpdu_size_unmarked(static_cast<std::uint16_t>(ulpdu));
        }
    }
    return dirs;
}

std::string describe(const std::map<std::uint16_t, Direction>& dirs) {
    std::string s;
    for (const auto& [port, d] : dirs)
        s += "port " + std::to_string(port) + ": " + std::to_string(d.fpdus) + " FPDUs, " +
             std::to_string(d.terminates) + " TERMINATE, " + std::to_string(d.rfc7306) + " RFC 7306, " +
             std::to_string(d.zero_writes_us.size()) + " zero-length WRITEs, FIN " + std::to_string(d.fins) +
             ", RST " + std::to_string(d.rsts) + "\n";
    return s;
}

// Fails the role when the QP recorded a TERMINATE (sent or received).
void expect_no_terminate(Peer& p) {
    if (const auto& t = p.qp->terminate_info()) throw std::runtime_error("QP recorded " + t->describe());
}

}  // namespace

// Linux siw answers a TERMINATE that precedes a FIN with a reset: an orderly close must be a FIN each way and
// nothing else, whichever end closes, in either threading mode (the captured end runs to completion; the other
// end runs in the suite's mode, so each mode is seen from the wire once as closer and once as the closed).
TEST_CASE("an orderly close is a FIN each way: no TERMINATE, no RST, whoever closes", "[verbs][memif][interop]") {
    for (const bool server_closes : {false, true}) {
        for (const bool capture_client : {true, false}) {
            const std::string pcap = "/tmp/" + unique_name("verbs-close-") + ".pcap";
            auto body = [&](PeerConfig cfg, bool server) {
                const bool capture = server != capture_client;
                if (capture) cfg.port.capture_path = pcap;
                Peer p(cfg, 4096, verbs::access::local_write);
                p.post_recv(1, 0, 64);
                if (server) p.serve();
                else p.connect();
                // One SEND each way, so both directions are in RDMA mode with data behind them.
                const verbs::Sge s = p.mr->sge(1024, 32);
                p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                             .sg_list = {&s, 1}});
                auto wc = p.wait_wc(2);
                for (const auto& w : wc)
                    if (w.status != WcStatus::success) throw std::runtime_error("completion failed");
                if (server == server_closes) {
                    p.ctx->run_until([] { return false; }, 50ms);  // the peer's SEND completion is in
                    p.id->disconnect();
                }
                p.wait_event(verbs::CmEventType::disconnected);
                expect_no_terminate(p);
                return p.end(0);
            };
            check_outcomes(run_pair([&](const PeerConfig& c) { return body(c, true); },
                                    [&](const PeerConfig& c) { return body(c, false); }));
            const auto dirs = read_directions(pcap);
            std::filesystem::remove(pcap);
            INFO((server_closes ? "server" : "client") << " closes, capture at the "
                                                       << (capture_client ? "client" : "server") << "\n"
                                                       << describe(dirs));
            REQUIRE(dirs.size() == 2);
            for (const auto& [port, d] : dirs) {
                CHECK(d.terminates == 0);
                CHECK(d.rsts == 0);
                CHECK(d.fins == 1);
                CHECK(d.fpdus >= 1);
            }
        }
    }
}

// RFC 7306 leaves the agreement to the application (ConnParam::rfc7306 on both ends). Without it nothing of
// RFC 7306 leaves at all; with it on one end only, the end without it answers as siw does.
TEST_CASE("RFC 7306 not agreed: immediate data and atomics refused at post time, nothing sent",
          "[verbs][memif][interop]") {
    const std::string pcap = "/tmp/" + unique_name("verbs-7306-") + ".pcap";
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.conn.rfc7306 = false;
        p.post_recv(1, 0, 64);
        p.serve();
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);  // the plain SEND after the refusals
        return p.end(0);
    };
    auto client = [&pcap](const PeerConfig& c) {
        PeerConfig cfg = c;
        cfg.port.capture_path = pcap;
        Peer p(cfg, 4096, verbs::access::local_write);
        p.conn.rfc7306 = false;
        p.connect();
        const verbs::Sge d = p.mr->sge(0, 16), r = p.mr->sge(256, 8);
        const verbs::SendWr refused[] = {
            {.wr_id = 1, .opcode = verbs::WrOpcode::send_with_imm, .sg_list = {&d, 1}, .imm_data = 7},
            {.wr_id = 2, .opcode = verbs::WrOpcode::rdma_write_with_imm, .sg_list = {&d, 1}, .imm_data = 8,
             .rdma = {p.remote.addr, p.remote.rkey}},
            {.wr_id = 3, .opcode = verbs::WrOpcode::atomic_fetch_and_add, .sg_list = {&r, 1},
             .atomic = {p.remote.addr, 1, 0, p.remote.rkey}},
            {.wr_id = 4, .opcode = verbs::WrOpcode::atomic_cmp_and_swp, .sg_list = {&r, 1},
             .atomic = {p.remote.addr, 0, 1, p.remote.rkey}},
        };
        for (const auto& wr : refused) {
            const auto res = p.qp->post_send({&wr, 1});
            if (res.err != verbs::PostErrc::not_agreed || res.bad_wr != &wr)
                throw std::runtime_error(std::string("WR ") + std::to_string(wr.wr_id) + ": " + verbs::to_string(res.err));
        }
        report(std::string("refused: ") + verbs::to_string(verbs::PostErrc::not_agreed));
        if (p.qp->state() != verbs::QpState::rts) throw std::runtime_error("the QP left RTS");
        p.post_send({.wr_id = 5, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&d, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 5);
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
    const auto dirs = read_directions(pcap);
    std::filesystem::remove(pcap);
    INFO(describe(dirs));
    REQUIRE(dirs.size() == 2);
    for (const auto& [port, d] : dirs) {
        CHECK(d.rfc7306 == 0);
        CHECK(d.terminates == 0);
    }
}

TEST_CASE("RFC 7306 on one end only: the other answers Immediate Data with TERMINATE unexpected opcode",
          "[verbs][memif][interop]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.conn.rfc7306 = false;  // as a peer without RFC 7306 (siw, Chelsio)
        p.post_recv(1, 0, 64);
        p.post_recv(2, 64, 64);
        p.serve();
        auto ev = p.wait_event(verbs::CmEventType::disconnected);
        const auto& t = p.qp->terminate_info();
        if (!t || t->received || !(t->code == rdmap::err::o_opcode))
            throw std::runtime_error("server: " + (t ? t->describe() : std::string("no TERMINATE")));
        report("server: " + ev.reason);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.connect();  // rfc7306 on here
        const verbs::Sge d = p.mr->sge(0, 16);
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send_with_imm, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&d, 1}, .imm_data = 7});
        auto ev = p.wait_event(verbs::CmEventType::disconnected);
        const auto& t = p.qp->terminate_info();
        if (!t || !t->received || !(t->code == rdmap::err::o_opcode))
            throw std::runtime_error("client: " + (t ? t->describe() : std::string("no TERMINATE")));
        // The reason says what happened in words, with the control word as it came.
        if (ev.reason.find("unexpected opcode") == std::string::npos || ev.reason.find("control word 0x") == std::string::npos)
            throw std::runtime_error("client's reason: " + ev.reason);
        report("client: " + ev.reason);
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// The initiator's first FPDU against an accept window (verbs/cm.cpp): with `nudge`, a stream that goes quiet
// after its first FPDU gets zero-length WRITEs at delay, 10x, 100x; the responder completes nothing for them
// and the stream stays usable. A stream that keeps talking gets none.
TEST_CASE("first-FPDU guard: a quiet stream is nudged with zero-length WRITEs, a talking one is not",
          "[verbs][memif][interop]") {
    const std::string pcap = "/tmp/" + unique_name("verbs-nudge-") + ".pcap";
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        for (int i = 0; i < 4; ++i) p.post_recv(1 + i, 64 * i, 64);
        p.serve();
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);  // the client's first SEND
        // Quiet for 700 ms: the nudges arrive and must complete nothing.
        std::array<verbs::WorkCompletion, 4> wcs;
        std::size_t extra = 0;
        p.ctx->run_until([&] { extra += p.cq->poll(wcs); return false; }, 700ms);
        if (extra != 0) throw std::runtime_error("the nudges completed something");
        if (p.qp->state() != verbs::QpState::rts) throw std::runtime_error("server QP left RTS");
        const verbs::Sge s = p.mr->sge(1024, 8);
        p.post_send({.wr_id = 9, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 9);
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 2);
        return p.end(0);
    };
    auto client = [&pcap](const PeerConfig& c) {
        PeerConfig cfg = c;
        cfg.port.capture_path = pcap;
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(1, 0, 64);
        p.conn.first_fpdu = {.mode = verbs::FirstFpduGuard::Mode::nudge, .delay = 5ms, .nudges = 3};
        p.connect();
        const verbs::Sge s = p.mr->sge(1024, 8);
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 1);
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);  // after the server's quiet time
        if (p.id->nudges_sent() != 3) throw std::runtime_error("nudges sent: " + std::to_string(p.id->nudges_sent()));
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 2);
        report("nudges: " + std::to_string(p.id->nudges_sent()));
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
    const auto dirs = read_directions(pcap);
    std::filesystem::remove(pcap);
    INFO(describe(dirs));
    REQUIRE(dirs.size() == 2);
    const Direction* cd = nullptr;  // the client's direction: the one with zero-length WRITEs
    for (const auto& [port, d] : dirs)
        if (!d.zero_writes_us.empty()) cd = &d;
    REQUIRE(cd != nullptr);
    REQUIRE(cd->zero_writes_us.size() == 3);
    // 5, 50 and 500 ms after the first FPDU (the CM checks once per millisecond: a few ms late at most).
    const double want[] = {5, 50, 500};
    for (int i = 0; i < 3; ++i) {
        const double at = static_cast<double>(cd->zero_writes_us[i] - cd->first_fpdu_us) / 1000.0;
        INFO("nudge " << i << " at " << at << " ms");
        CHECK(at >= want[i]);
        CHECK(at < want[i] + 60);
    }
}

// The stream talks for longer than two nudge steps (100 ms and 1 s after the first FPDU), so each step finds it
// talking. The first step is 100 ms: until the first reply arrives the stream is quiet, and a nudge then is the
// guard doing its job (under TSan on a busy 2-core host that first round trip once took over 10 ms, the old
// 1 ms guard's second step).
TEST_CASE("first-FPDU guard: a ping-pong that keeps talking is never nudged", "[verbs][memif][interop]") {
    constexpr int kMinRounds = 300;
    constexpr auto kTalk = 1200ms;
    constexpr std::size_t kMsg = 1024;  // the client's message; its first byte 1 = the last round
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        for (int i = 0; i < 4; ++i) p.post_recv(i, 64 * i, 64);
        p.serve();
        for (int i = 0;; ++i) {
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, static_cast<std::uint64_t>(i % 4));
            const bool last = p.buf[64 * static_cast<std::size_t>(i % 4)] == std::byte{1};
            p.post_recv(i % 4, 64 * (i % 4), 64);
            const verbs::Sge s = p.mr->sge(kMsg, 8);
            p.post_send({.wr_id = 100, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}});
            if (last) break;
        }
        return p.end(0);
    };
    auto client = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(0, 0, 64);
        p.conn.first_fpdu = {.mode = verbs::FirstFpduGuard::Mode::nudge, .delay = 100ms, .nudges = 2};
        p.connect();
        const auto t0 = std::chrono::steady_clock::now();
        int rounds = 0;
        for (bool last = false; !last; ++rounds) {
            last = rounds + 1 >= kMinRounds && std::chrono::steady_clock::now() - t0 >= kTalk;
            p.buf[kMsg] = last ? std::byte{1} : std::byte{0};
            const verbs::Sge s = p.mr->sge(kMsg, 8);
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}});
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 0);
            p.post_recv(0, 0, 64);
        }
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        report(std::to_string(rounds) + " rounds in " + std::to_string(ms.count()) + " ms, nudges " +
               std::to_string(p.id->nudges_sent()));
        if (p.id->nudges_sent() != 0) throw std::runtime_error("a talking stream was nudged");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// `hold`: the first FPDU waits the delay after the MPA reply (seen on the wire), and nothing else changes.
TEST_CASE("first-FPDU guard: hold keeps the first FPDU back for the delay", "[verbs][memif][interop]") {
    const std::string pcap = "/tmp/" + unique_name("verbs-hold-") + ".pcap";
    for (const bool p2p : {false, true}) {
        auto server = [](const PeerConfig& cfg) {
            Peer p(cfg, 4096, verbs::access::local_write);
            p.post_recv(1, 0, 64);
            p.serve();
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);
            return p.end(0);
        };
        auto client = [&pcap, p2p](const PeerConfig& c) {
            PeerConfig cfg = c;
            cfg.port.capture_path = pcap;
            Peer p(cfg, 4096, verbs::access::local_write);
            p.conn.first_fpdu = {.mode = verbs::FirstFpduGuard::Mode::hold, .delay = 150ms};
            p.connect(p2p);
            const verbs::Sge s = p.mr->sge(1024, 8);
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&s, 1}});
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 1);
            if (p.id->nudges_sent() != 0) throw std::runtime_error("hold mode nudged");
            return p.end(0);
        };
        check_outcomes(run_pair(server, client));
        const auto dirs = read_directions(pcap);
        std::filesystem::remove(pcap);
        INFO((p2p ? "peer-to-peer" : "plain") << "\n" << describe(dirs));
        REQUIRE(dirs.size() == 2);
        // The client's first FPDU (the SEND, or the RTR) comes >= 150 ms after the responder's MPA reply.
        std::uint64_t reply_us = 0, first_us = 0;
        for (const auto& [port, d] : dirs) {
            if (d.fpdus > 0 && d.first_fpdu_us != 0 && (first_us == 0 || d.first_fpdu_us < first_us)) first_us = d.first_fpdu_us;
            if (port != 0 && d.mpa_frame_us != 0) reply_us = std::max(reply_us, d.mpa_frame_us);  // the reply is the later frame
        }
        const double gap = static_cast<double>(first_us - reply_us) / 1000.0;
        INFO("first FPDU " << gap << " ms after the reply");
        CHECK(gap >= 150);
        CHECK(gap < 1500);
    }
}

// Markers are refused unless asked for (as Linux siw): a request asking for them gets an MPA reject.
TEST_CASE("markers: a request asking for them is rejected by a default responder", "[verbs][memif][interop]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.listener = p.ctx->listen(cfg.tcp_port);  // defaults: markers_tx off
        p.ctx->run_until([] { return false; }, 1s);  // the request is refused inside the CM: no event
        if (auto ev = p.ctx->get_cm_event()) throw std::runtime_error(std::string("event ") + verbs::to_string(ev->type));
        p.disconnected = true;
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.post_recv(9, 0, 64);
        p.id = p.ctx->connect(cfg.peer, cfg.tcp_port, *p.qp, {.markers_rx = true});
        auto ev = p.wait_event(verbs::CmEventType::rejected);
        report("rejected: " + ev.reason);
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::recv, 9);
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// A peer-to-peer responder that answers with an RTR type we did not offer (Linux siw proposes WRITE when
// offered only SEND): RFC 6581 has the initiator TERMINATE with "no matching RTR". siw 6.1 crashes in iw_cm when
// its stream ends before any RTR arrived (verbs/cm.cpp, rtr_before_terminate), so the RTR it asked for goes
// first and the TERMINATE only CmId::kRtrSettle later; the application hears "error" when the TERMINATE is out.
// The responder here is raw TCP, playing siw's reply, recording what arrives and when.
TEST_CASE("no matching RTR: the RTR the responder asked for goes first, the TERMINATE after it, then a FIN",
          "[verbs][memif][interop]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        struct Raw : stack::TcpConnection::Handler, stack::TcpListener::Handler {
            std::unique_ptr<stack::TcpConnection> conn;
            std::vector<std::byte> in;  // everything after the request
            std::size_t request_left = 0;
            bool got_request = false, fin = false, reset = false;
            std::chrono::steady_clock::time_point reply_at{};
            std::vector<std::pair<unsigned, std::chrono::steady_clock::time_point>> fpdus;  // opcode, arrival
            void on_accept(std::unique_ptr<stack::TcpConnection> c) override {
                c->set_handler(this);
                conn = std::move(c);
            }
            void on_receive(stack::TcpConnection& c, stack::RecvBuffer data) override {
                std::vector<std::byte> b(data.size());
                data.copy_to(b);
                in.insert(in.end(), b.begin(), b.end());
                if (!got_request && in.size() >= 20) {
                    const std::size_t len = 20 + ((std::to_integer<std::size_t>(in[18]) << 8) | std::to_integer<std::size_t>(in[19]));
                    if (in.size() < len) return;
                    in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(len));
                    got_request = true;
                    // siw's answer to a P2P request offering only SEND: P2P with a WRITE RTR.
                    mpa::IrdOrd io{.ird = 1, .ord = 1, .peer_to_peer = true, .write_rtr = true};
                    std::array<std::byte, 64> rep{};
                    const std::size_t n = mpa::encode_frame(rep, {.kind = mpa::FrameKind::reply, .ird_ord = &io});
                    c.write(std::span(rep).first(n));
                    c.flush();
                    reply_at = std::chrono::steady_clock::now();
                }
                while (got_request && in.size() >= 4) {  // FPDUs, CRC off: length, ULPDU, pad, 4 CRC bytes
                    const std::size_t ulpdu = (std::to_integer<std::size_t>(in[0]) << 8) | std::to_integer<std::size_t>(in[1]);
                    const std::size_t total = mpa::fpdu_size_unmarked(static_cast<std::uint16_t>(ulpdu));
                    if (in.size() < total) break;
                    fpdus.emplace_back(std::to_integer<unsigned>(in[3]) & 0xf, std::chrono::steady_clock::now());
                    in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(total));
                }
            }
            void on_remote_close(stack::TcpConnection& c) override {
                fin = true;
                c.close();
            }
            void on_error(stack::TcpConnection&, stack::TcpError) override { reset = true; }
        } raw;
        {
            stack::TcpListener l(p.ctx->impl().stack(), cfg.tcp_port, raw);
            p.ctx->run_until([&] { return raw.fin || raw.reset; }, kWait);
            p.ctx->drain(1s);
            raw.conn.reset();
        }
        std::string seen;
        for (const auto& [op, at] : raw.fpdus)
            seen += " opcode " + std::to_string(op) + " at " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(at - raw.reply_at).count()) + " ms";
        report("after the reply:" + seen + (raw.fin ? ", FIN" : "") + (raw.reset ? ", RST" : ""));
        int rc = 0;
        if (raw.fpdus.size() < 2 || raw.fpdus.front().first != 0 || raw.fpdus.back().first != 7) rc = 1;  // RTR .. TERMINATE
        for (std::size_t i = 1; i + 1 < raw.fpdus.size(); ++i)
            if (raw.fpdus[i].first != 0) rc = 1;  // in between: only zero-length WRITEs (nudges)
        if (rc == 0 && raw.fpdus.back().second - raw.fpdus.front().second < verbs::CmId::kRtrSettle - 20ms) rc = 1;
        if (!raw.fin || raw.reset) rc = 1;
        p.disconnected = true;
        return p.end(rc);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.post_recv(9, 0, 64);
        const auto t0 = std::chrono::steady_clock::now();
        p.id = p.ctx->connect(cfg.peer, cfg.tcp_port, *p.qp, {.peer_to_peer = true, .rtr = {.send = true}});
        auto ev = p.wait_event(verbs::CmEventType::error);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        report("error after " + std::to_string(ms.count()) + " ms: " + ev.reason);
        if (ev.reason.find("no matching RTR") == std::string::npos) throw std::runtime_error("reason: " + ev.reason);
        if (ms < verbs::CmId::kRtrSettle) throw std::runtime_error("the event came before the TERMINATE");
        const auto& t = p.qp->terminate_info();
        if (!t || t->received || !(t->code == mpa::kTermNoMatchingRtr)) throw std::runtime_error("no TERMINATE 0x07 sent");
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::recv, 9);
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}
