// SPDX-License-Identifier: MIT
// verbs between two processes over memif (the fixture: tests/verbs/fixture.hpp; every case runs in both threading
// modes). The connection manager: reject with private data, peer-to-peer RTR, unreachable peers, an orderly
// disconnect with data in flight, 1024 connections in one process pair.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/epoll.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include "ddp/header.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/upper.hpp"
#include "mpa/fpdu.hpp"
#include "tests/support/checks.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/tcp_roles.hpp"
#include "stack/tcp.hpp"
#include "tests/verbs/fixture.hpp"
#include "tests/wire/pcap.hpp"
#include <softrdma/verbs.hpp>

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;  // with std::chrono_literals, WcOpcode, WcStatus


TEST_CASE("a CM reject carries the responder's private data to the initiator, whose QP goes ERR -> RESET -> INIT "
          "and connects again",
          "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.listener = p.ctx->listen(cfg.tcp_port);
        auto ev = p.wait_event(verbs::CmEventType::connect_request);
        const char no[] = "no room at the inn";
        if (!ev.request->reject(std::as_bytes(std::span(no)))) throw std::runtime_error("reject refused");
        p.ctx->run_until([] { return false; }, 200ms);
        ev.request.reset();
        // The second request (the same QP, reset and connected again) is accepted; one SEND each way.
        auto again = p.wait_event(verbs::CmEventType::connect_request);
        p.id = std::move(again.request);
        p.post_recv(1, 0, 32);
        verbs::ConnParam cp = p.conn;
        const RemoteRegion me = p.local();
        cp.private_data = as_bytes(me);  // what the fixture's connect() reads
        if (!p.id->accept(*p.qp, cp)) throw std::runtime_error("accept refused");
        p.wait_event(verbs::CmEventType::established);
        std::memcpy(p.buf.data() + 32, "second time lucky", 17);
        const verbs::Sge s = p.mr->sge(32, 17);
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        auto wc = p.wait_wc(2);
        for (const auto& w : wc)
            if (w.status != WcStatus::success) throw std::runtime_error("second connection: a completion failed");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.post_recv(9, 0, 64);
        const RemoteRegion me = p.local();
        p.id = p.ctx->connect(cfg.peer, cfg.tcp_port, *p.qp, {.private_data = as_bytes(me)});
        auto ev = p.wait_event(verbs::CmEventType::rejected);
        const std::string got(reinterpret_cast<const char*>(ev.private_data.bytes.data()), ev.private_data.size);
        report("rejected with: " + got);
        if (got != std::string("no room at the inn", 19)) throw std::runtime_error("private data: " + got);
        // The QP went to ERR; its receive was flushed.
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::recv, 9);
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("QP not in ERR after the reject");
        // ERR -> RESET -> INIT (libibverbs' way back), then the same QP connects again.
        p.ctx->run_until([&] { return p.qp->modify_state(verbs::QpState::reset); }, kWait);
        if (p.qp->state() != verbs::QpState::reset || p.qp->terminate_info())
            throw std::runtime_error(std::string("RESET refused: ") + verbs::to_string(p.qp->state()));
        if (!p.qp->modify_state(verbs::QpState::init)) throw std::runtime_error("INIT refused");
        p.post_recv(10, 0, 32);
        p.connect();
        std::memcpy(p.buf.data() + 32, "and again", 9);
        const verbs::Sge s = p.mr->sge(32, 9);
        p.post_send({.wr_id = 11, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        auto wc = p.wait_wc(2);
        bool got_recv = false;
        for (const auto& w : wc) {
            if (w.status != WcStatus::success) throw std::runtime_error("second connection: a completion failed");
            got_recv = got_recv || (w.opcode == WcOpcode::recv && w.wr_id == 10 && w.byte_len == 17);
        }
        if (!got_recv || std::memcmp(p.buf.data(), "second time lucky", 17) != 0)
            throw std::runtime_error("the server's SEND did not arrive on the reconnected QP");
        report("reconnected after RESET: SEND each way");
        return p.end(0);
    };
    const auto out = run_pair(server, client);
    check_outcomes(out);
    CHECK(out[1].report.find("reconnected after RESET") != std::string::npos);
}

TEST_CASE("peer-to-peer: the RTR lets the responder send first", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(1, 0, 64);
        p.serve();
        std::memcpy(p.buf.data() + 1024, "responder first", 15);
        const verbs::Sge s = p.mr->sge(1024, 15);
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        auto wc = p.wait_wc(2);  // our SEND, then the client's answer
        Peer::expect(wc[0], WcStatus::success, WcOpcode::send, 2);
        Peer::expect(wc[1], WcStatus::success, WcOpcode::recv, 1);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(1, 0, 64);
        p.connect(/*p2p=*/true);
        auto wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 1);
        if (wc[0].byte_len != 15 || std::memcmp(p.buf.data(), "responder first", 15) != 0)
            throw std::runtime_error("responder's SEND content");
        p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 3);
        report("responder sent first after the RTR");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// Without peer-to-peer the responder may not send before the initiator (RFC 5044 section 7.1.2). A server that
// speaks first while its client waits (perftest's ib_write_lat) gets ConnParam::responder_grace: its SEND goes
// that long after the reply. With the grace off it waits for the initiator's first FPDU, then goes.
TEST_CASE("a responder that speaks first without peer-to-peer: sent after the grace, or held for the initiator",
          "[verbs][memif]") {
    for (const bool grace : {true, false}) {
        SECTION(grace ? "grace 30 ms" : "grace off") {
            auto server = [grace](const PeerConfig& cfg) {
                Peer p(cfg, 4096, verbs::access::local_write);
                p.post_recv(1, 0, 64);
                p.conn.responder_grace = grace ? 30ms : 0ms;
                p.serve();
                std::memcpy(p.buf.data() + 1024, "server speaks first", 19);
                const verbs::Sge s = p.mr->sge(1024, 19);
                p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                             .sg_list = {&s, 1}});
                auto wc = p.wait_wc(2);  // our SEND, the client's answer: in either order
                const auto& snd = wc[0].opcode == WcOpcode::send ? wc[0] : wc[1];
                const auto& rcv = wc[0].opcode == WcOpcode::send ? wc[1] : wc[0];
                Peer::expect(snd, WcStatus::success, WcOpcode::send, 2);
                Peer::expect(rcv, WcStatus::success, WcOpcode::recv, 1);
                return p.end(0);
            };
            auto client = [grace](const PeerConfig& cfg) {
                Peer p(cfg, 4096, verbs::access::local_write);
                p.post_recv(1, 0, 64);
                p.connect(/*p2p=*/false);
                const auto established = std::chrono::steady_clock::now();
                std::array<verbs::WorkCompletion, 2> wc;
                std::size_t got = 0;
                // Grace off: nothing may arrive while we stay silent (300 ms); grace on: the SEND comes.
                p.ctx->run_until([&] { return (got = p.cq->poll(wc)) != 0; }, grace ? kWait : 300ms);
                const auto waited = std::chrono::steady_clock::now() - established;
                if (grace) {
                    if (got != 1) throw std::runtime_error("the server's SEND did not come after the grace");
                    // The reply left 30 ms before the SEND could: it cannot arrive much sooner after established.
                    if (waited < 15ms) throw std::runtime_error("the SEND came before the grace was over");
                } else if (got != 0) {
                    throw std::runtime_error("the responder sent before the initiator's first FPDU");
                }
                p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
                if (grace) {
                    Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 1);
                    Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 3);
                } else {  // our first FPDU opened the responder's gate: its SEND follows
                    auto two = p.wait_wc(2);
                    const bool recv_first = two[0].opcode == WcOpcode::recv;
                    Peer::expect(recv_first ? two[0] : two[1], WcStatus::success, WcOpcode::recv, 1);
                    Peer::expect(recv_first ? two[1] : two[0], WcStatus::success, WcOpcode::send, 3);
                }
                if (std::memcmp(p.buf.data(), "server speaks first", 19) != 0) throw std::runtime_error("SEND content");
                report(std::string("server's first SEND ") + (grace ? "after the grace" : "after our first FPDU"));
                return p.end(0);
            };
            check_outcomes(run_pair(server, client));
        }
    }
}

// ConnParam::local_port: the connection leaves from the TCP port asked for (what the drop-in librdmacm needs for a
// port rdma_bind_addr or rdma_resolve_addr gave the id), and each end's CmId shows the connection's endpoints as
// the other end sees them; without it, one of lwIP's ephemeral ports.
TEST_CASE("connect from a chosen TCP port, or an ephemeral one: both ends see the connection's endpoints",
          "[verbs][memif]") {
    constexpr std::uint16_t kChosen = 7391;
    auto endpoints = [](const verbs::CmId& id) {
        return "local=" + std::to_string(id.local_port()) + " peer=" + id.peer_address().str() + ":" +
               std::to_string(id.peer_port());
    };
    for (const bool chosen : {true, false}) {
        auto server = [&](const PeerConfig& cfg) {
            Peer p(cfg, 64, verbs::access::local_write);
            p.serve();
            report("server " + endpoints(*p.id) + " listen=" + std::to_string(cfg.tcp_port));
            return p.end(0);
        };
        auto client = [&](const PeerConfig& cfg) {
            Peer p(cfg, 64, verbs::access::local_write);
            if (chosen) p.conn.local_port = kChosen;
            p.connect();
            report("client " + endpoints(*p.id));
            return p.end(0);
        };
        const auto out = run_pair(server, client);
        check_outcomes(out);
        const auto value = [](const std::string& r, const std::string& key) {
            const auto at = r.find(key + "=");
            return at == std::string::npos ? std::string() : r.substr(at + key.size() + 1, r.find_first_of(" \n", at) - at - key.size() - 1);
        };
        const std::string& sr = out[0].report;
        const std::string& cr = out[1].report;
        INFO(sr << cr);
        const std::string client_port = value(cr, "local");
        if (chosen) CHECK(client_port == std::to_string(kChosen));
        else CHECK(std::stoul(client_port.empty() ? "0" : client_port) >= 49152);  // lwIP's ephemeral range
        // The server sees the client's address and that port; the client sees the server's and its listening port.
        CHECK(value(sr, "peer").ends_with(":" + client_port));
        CHECK(value(sr, "local") == value(sr, "listen"));
        CHECK(value(cr, "peer").ends_with(":" + value(sr, "listen")));
        CHECK(value(sr, "peer").substr(0, value(sr, "peer").find(':')) != "0.0.0.0");
    }
}

TEST_CASE("connect to a port nobody listens on: unreachable, receives flushed", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        // No listener: the client's SYN is refused. Poll until its SYN (after ARP) has come and been answered,
        // then until the client has gone (io closes the link safely whenever it goes).
        const auto& c = p.ctx->impl().stack().counters();
        p.ctx->run_until([&] { return c.rx_frames >= 2 && c.tx_frames >= 2; }, kWait);
        p.ctx->run_until([&] { return !p.ctx->impl().port().link_up(); }, 30s);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.post_recv(5, 0, 64);
        p.id = p.ctx->connect(cfg.peer, cfg.tcp_port, *p.qp, {});
        auto ev = p.wait_event(verbs::CmEventType::unreachable);
        report("unreachable: " + ev.reason);
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::recv, 5);
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("connect_retry: a client that connects before its server listens is refused, tries again, and gets "
          "in once the listener comes; its receive is untouched meanwhile",
          "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        // Refuse the client's SYNs for a while (no listener yet), then listen.
        const auto& c = p.ctx->impl().stack().counters();
        p.ctx->run_until([&] { return c.rx_frames >= 4 && c.tx_frames >= 3; }, kWait);  // ARP + refused SYNs
        p.ctx->run_until([] { return false; }, 300ms);
        p.post_recv(1, 0, 64);
        p.serve();
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.post_recv(5, 0, 64);
        p.conn.connect_retry = 5s;
        const auto t0 = std::chrono::steady_clock::now();
        p.connect();
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        if (waited < 300ms) throw std::runtime_error("established before the server listened");
        if (p.cq->size() != 0) throw std::runtime_error("the refused attempts touched the receive");
        report("established after " + std::to_string(waited.count()) + " ms of refusals");
        const verbs::Sge s = p.mr->sge(0, 8);
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 2);
        return p.end(0);
    };
    const auto out = run_pair(server, client);
    check_outcomes(out);
    CHECK(out[1].report.find("established after") != std::string::npos);
}

TEST_CASE("disconnect right after posting 8 MiB: everything completes, the peer gets it all before the FIN",
          "[verbs][memif]") {
    constexpr std::uint32_t kLen = 1 << 20;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 8 * kLen, kAll);
        p.post_recv(1, 0, 0);
        p.post_recv(2, 0, 0);
        p.serve();
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);  // the SEND after the WRITEs
        if (const auto bad = check_pattern(9, 0, p.buf); bad >= 0)
            throw std::runtime_error("WRITE content differs at " + std::to_string(bad));
        p.wait_event(verbs::CmEventType::disconnected);
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::recv, 2);
        report("all data before the FIN");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 8 * kLen, verbs::access::local_write);
        p.connect();
        fill_pattern(9, 0, p.buf);
        for (std::uint32_t i = 0; i < 8; ++i) {
            const verbs::Sge s = p.mr->sge(i * kLen, kLen);
            p.post_send({.wr_id = i, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&s, 1}, .rdma = {p.remote.addr + i * kLen, p.remote.rkey}});
        }
        p.post_send({.wr_id = 8, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
        p.id->disconnect();
        if (p.qp->state() != verbs::QpState::sqd) throw std::runtime_error("QP not in SQD while draining");
        const verbs::SendWr late{.wr_id = 50, .opcode = verbs::WrOpcode::send};
        if (p.qp->post_send({&late, 1}).err != verbs::PostErrc::invalid_state)
            throw std::runtime_error("post_send in SQD accepted");
        p.wait_event(verbs::CmEventType::disconnected);
        auto wc = p.wait_wc(9);
        for (std::uint32_t i = 0; i < 9; ++i)
            Peer::expect(wc[i], WcStatus::success, i < 8 ? WcOpcode::rdma_write : WcOpcode::send, i);
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("QP not in ERR after disconnect");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("1024 QPs, every queue full: 8 SENDs of 1 KiB each way on each, the ninth refused, all checked", "[verbs][memif][limits]") {
    constexpr std::uint32_t kQps = 1024;
    constexpr std::uint32_t kDepth = 8;     // max_send_wr = max_recv_wr, all posted at once
    constexpr std::uint32_t kLen = 1024;
    constexpr std::uint32_t kMsgs = kQps * kDepth;
    // One CQ (sized by the rule: every WR of every QP), one MR: kLen bytes per receive, then kLen per send.
    // 8 MiB in flight each way at once: far more than lwIP's segment pool holds (sized for 32 busy connections,
    // stack/lwip-port/lwipopts.h), so the send queues wait on TCP (back-pressure), nothing is lost.
    struct Many {
        std::unique_ptr<verbs::Context> ctx;
        stack::PoolUsage baseline;
        std::unique_ptr<verbs::ProtectionDomain> pd;
        std::unique_ptr<verbs::CompletionQueue> cq;
        std::vector<std::byte> buf;
        std::unique_ptr<verbs::MemoryRegion> mr;
        std::vector<std::unique_ptr<verbs::QueuePair>> qps;
        std::vector<std::unique_ptr<verbs::CmId>> ids;
        explicit Many(const PeerConfig& cfg) {
            verbs::ContextConfig cc{.port = cfg.port, .eal = cfg.eal, .ip = cfg.stack.ip, .max_mr = 4, .max_qp = kQps,
                                    .threading = test_threading()};
            ctx = verbs::Context::open(cc);
            baseline = ctx->impl().stack().pool_usage();
            pd = ctx->alloc_pd();
            cq = ctx->create_cq(2 * kMsgs);
            buf.resize(std::size_t{2} * kLen * kMsgs);
            mr = pd->reg_mr(buf, verbs::access::local_write);
            for (std::uint32_t i = 0; i < kQps; ++i) {
                qps.push_back(pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(),
                                             .cap = {.max_send_wr = kDepth, .max_recv_wr = kDepth, .max_inline_data = 0}}));
                std::array<verbs::Sge, kDepth + 1> s;
                std::array<verbs::RecvWr, kDepth + 1> r;
                for (std::uint32_t k = 0; k <= kDepth; ++k) {
                    s[k] = mr->sge(std::size_t{kLen} * (i * kDepth + k % kDepth), kLen);
                    r[k] = {.wr_id = i * kDepth + k, .sg_list = {&s[k], 1}};
                }
                const auto res = qps.back()->post_recv(r);  // one more than the depth: the last is refused
                if (res.err != verbs::PostErrc::queue_full || res.bad_wr != &r[kDepth])
                    throw std::runtime_error(std::string("post_recv past the depth: ") + verbs::to_string(res.err));
            }
        }
        // All kDepth SENDs of QP i in one post (plus one: refused, the queue is full); message k of QP i carries
        // pattern (seed, i * kDepth + k).
        void send(std::uint32_t i, std::uint64_t seed) {
            std::array<verbs::Sge, kDepth + 1> s;
            std::array<verbs::SendWr, kDepth + 1> w;
            for (std::uint32_t k = 0; k <= kDepth; ++k) {
                const std::size_t at = std::size_t{kLen} * (kMsgs + i * kDepth + k % kDepth);
                if (k < kDepth) fill_pattern(seed, std::uint64_t{kLen} * (i * kDepth + k), std::span(buf).subspan(at, kLen));
                s[k] = mr->sge(at, kLen);
                w[k] = {.wr_id = i * kDepth + k, .opcode = verbs::WrOpcode::send, .sg_list = {&s[k], 1}};
            }
            const auto res = qps[i]->post_send(w);
            if (res.err != verbs::PostErrc::queue_full || res.bad_wr != &w[kDepth])
                throw std::runtime_error("post_send " + std::to_string(i) + " past the depth: " + verbs::to_string(res.err));
        }
        // Waits for every receive completion: each QP's in posting order, each message's bytes its own.
        void receive_all(std::uint64_t seed) {
            std::array<verbs::WorkCompletion, 64> wcs;
            std::vector<std::uint32_t> next(kQps, 0);
            std::uint32_t got = 0;
            ctx->run_until([&] {
                const std::size_t n = cq->poll(wcs);
                for (std::size_t k = 0; k < n; ++k) {
                    if (wcs[k].status != WcStatus::success || wcs[k].opcode != WcOpcode::recv || wcs[k].byte_len != kLen) {
                        std::string why;
                        while (auto ev = ctx->get_cm_event()) why += std::string(" [") + verbs::to_string(ev->type) + ": " + ev->reason + "]";
                        report(why);
                        throw std::runtime_error(why + "bad completion on QP " + std::to_string(wcs[k].qp_num) + ": " +
                                                 verbs::to_string(wcs[k].status) + ", opcode " +
                                                 verbs::to_string(wcs[k].opcode) + ", " +
                                                 std::to_string(wcs[k].byte_len) + " bytes, wr_id " +
                                                 std::to_string(wcs[k].wr_id));
                    }
                    const auto id = static_cast<std::uint32_t>(wcs[k].wr_id);
                    if (id % kDepth != next[id / kDepth]++) throw std::runtime_error("receive out of order");
                    if (check_pattern(seed, std::uint64_t{kLen} * id, std::span(buf).subspan(std::size_t{kLen} * id, kLen)) >= 0)
                        throw std::runtime_error("content of message " + std::to_string(id));
                    ++got;
                }
                return got == kMsgs;
            }, 120s);
            if (got != kMsgs) throw std::runtime_error("received " + std::to_string(got) + " of " + std::to_string(kMsgs));
        }
        int end(int rc) {
            for (auto& id : ids)
                if (id) id->disconnect();
            std::uint32_t down = 0;
            ctx->run_until([&] {
                while (auto ev = ctx->get_cm_event())
                    if (ev->type == verbs::CmEventType::disconnected) ++down;
                return down >= kQps;
            }, 30s);
            report("disconnected " + std::to_string(down));
            ctx->run_until([] { return false; }, 200ms);
            if (const auto r = verbs::diagnostics::rx_thread(*ctx))
                report("rx thread frames=" + std::to_string(r->frames) + " dropped=" + std::to_string(r->dropped) +
                       " out_of_order=" + std::to_string(r->out_of_order) + " stalled_turns=" + std::to_string(r->stalled_turns) +
                       " lcore=" + std::to_string(r->lcore) + " held=" + std::to_string(r->held));
            if (cq->overruns() != 0) throw std::runtime_error("CQ overruns");
            const auto t_destroy = std::chrono::steady_clock::now();
            ids.clear();
            // Torn down as a server serving other peers would: polling between batches. With an RX thread each
            // QP's removal is a round trip to it (1.4-6 s for the 1024 under TSan here, 8 ms in a plain build);
            // polling nothing that long left the peer's frames waiting until its user timeout fired (double
            // TSan load, about 1 run in 10). A millisecond of polling every 16 QPs: none in 45 such runs.
            for (std::size_t k = 0; k < qps.size(); ++k) {
                qps[k].reset();
                if (k % 16 == 15) ctx->run_until([] { return false; }, 1ms);
            }
            qps.clear();
            mr.reset();
            report("QPs destroyed in " +
                   std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_destroy).count()) + " s");
            // Every flow is removed with its QP (each removal waits for the RX thread): nothing may stay held.
            if (const auto r = verbs::diagnostics::rx_thread(*ctx); r && r->held != 0) {
                report("rx thread still holds " + std::to_string(r->held) + " frames after every QP went");
                rc = rc == 0 ? 3 : rc;
            }
            return finish_context(*ctx, baseline, rc);
        }
    };
    auto server = [](const PeerConfig& cfg) {
        Many m(cfg);
        auto listener = m.ctx->listen(cfg.tcp_port);
        m.ids.resize(kQps);
        std::uint32_t accepted = 0, established = 0;
        const auto t0 = std::chrono::steady_clock::now();
        m.ctx->run_until([&] {
            while (auto ev = m.ctx->get_cm_event()) {
                if (ev->type == verbs::CmEventType::connect_request) {
                    std::uint32_t i = 0;
                    std::memcpy(&i, ev->private_data.bytes.data(), 4);  // the client's QP index
                    if (i >= kQps || m.ids[i]) throw std::runtime_error("bad request index");
                    if (!ev->request->accept(*m.qps[i], {})) throw std::runtime_error("accept");
                    m.ids[i] = std::move(ev->request);
                    ++accepted;
                } else if (ev->type == verbs::CmEventType::established) {
                    ++established;
                } else {
                    throw std::runtime_error(std::string("server CM event ") + verbs::to_string(ev->type) + ": " + ev->reason);
                }
            }
            return established == kQps;
        }, 60s);
        report("accepted " + std::to_string(accepted) + " in " +
               std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s");
        if (established != kQps) throw std::runtime_error("established " + std::to_string(established));
        m.receive_all(1);                             // every client QP SENDs first (we are the responder)
        for (std::uint32_t i = 0; i < kQps; ++i) m.send(i, 2);
        m.ctx->run_until([] { return false; }, 100ms);
        listener.reset();
        return m.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Many m(cfg);
        std::uint32_t established = 0;
        for (std::uint32_t i = 0; i < kQps; ++i) {
            m.ids.push_back(m.ctx->connect(cfg.peer, cfg.tcp_port, *m.qps[i],
                                           {.private_data = std::as_bytes(std::span(&i, 1))}));
            // A few at a time: the server's listen queue is the accept callback, but SYNs still cost mbufs.
            if (i % 64 == 63)
                m.ctx->run_until([&] {
                    while (auto ev = m.ctx->get_cm_event()) {
                        if (ev->type != verbs::CmEventType::established)
                            throw std::runtime_error(std::string("client CM event ") + verbs::to_string(ev->type) + ": " + ev->reason);
                        ++established;
                    }
                    return established == i + 1;
                }, 30s);
        }
        if (established != kQps) throw std::runtime_error("established " + std::to_string(established));
        const auto t0 = std::chrono::steady_clock::now();
        for (std::uint32_t i = 0; i < kQps; ++i) m.send(i, 1);
        m.receive_all(2);
        report("1024 QPs x 8 x 1 KiB each way in " +
               std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s");
        return m.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("a peer that accepts TCP but never answers MPA: unreachable after the reply time limit", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        // A plain TCP listener (no MPA): takes the connection, ignores the request, closes when the peer does.
        struct Mute : stack::TcpConnection::Handler, stack::TcpListener::Handler {
            std::unique_ptr<stack::TcpConnection> conn;
            bool gone = false;
            void on_accept(std::unique_ptr<stack::TcpConnection> c) override {
                c->set_handler(this);
                conn = std::move(c);
            }
            void on_receive(stack::TcpConnection&, stack::RecvBuffer) override {}
            void on_remote_close(stack::TcpConnection& c) override {
                c.close();
                gone = true;
            }
            void on_error(stack::TcpConnection&, stack::TcpError) override { gone = true; }
        } mute;
        {
            stack::TcpListener l(p.ctx->impl().stack(), cfg.tcp_port, mute);
            p.ctx->run_until([&] { return mute.gone; }, kWait);
            mute.conn.reset();
        }
        p.disconnected = true;
        return p.end(mute.gone ? 0 : 1);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.post_recv(5, 0, 64);
        const auto t0 = std::chrono::steady_clock::now();
        p.id = p.ctx->connect(cfg.peer, cfg.tcp_port, *p.qp, {.mpa_timeout = 500ms});
        auto ev = p.wait_event(verbs::CmEventType::unreachable);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        report("unreachable after " + std::to_string(secs) + " s: " + ev.reason);
        if (secs < 0.45 || secs > 3) throw std::runtime_error("time limit not kept");
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::recv, 5);
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}
