// SPDX-License-Identifier: MIT
// Resource limits between two processes over memif (the fixture: tests/verbs/fixture.hpp; both threading
// modes): what happens when an application or a workload reaches a bound. Each bound gives a clear error or
// back-pressure, never a crash or a silent loss:
//   - a CQ too small for its QPs' completions: the surplus is counted and a cq_err async event names the CQ;
//   - send, receive and shared receive queues full: the WR past the depth is refused (queue_full, bad_wr),
//     and the queue takes WRs again once completions free it;
//   - more READs and atomics posted than the negotiated ORD: they wait for credits, the peer never sees more
//     than its IRD;
//   - a port with a small mbuf pool: frames wait or are resent, every byte arrives.
// (1024 QPs each with full queues: tests/verbs/cm_test.cpp.)
#include <catch2/catch.hpp>

#include <cstring>
#include <stdexcept>

#include "tests/support/checks.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/tcp_roles.hpp"
#include "tests/verbs/fixture.hpp"
#include <softrdma/diagnostics.hpp>
#include <softrdma/verbs.hpp>

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

TEST_CASE("a CQ smaller than its completions: the surplus is counted, one cq_err event names the CQ and the QP, "
          "the connection goes on", "[verbs][memif][limits]") {
    constexpr int kSends = 16;
    constexpr std::uint32_t kCqe = 4;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        // A CQ of 4 entries for a QP that will have 16 receives complete before the application polls.
        p.qp.reset();
        p.cq = p.ctx->create_cq(kCqe);
        p.qp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get(),
                                .cap = {.max_send_wr = 4, .max_recv_wr = kSends}});
        for (int i = 0; i < kSends; ++i) p.post_recv(static_cast<std::uint64_t>(i), 64u * static_cast<unsigned>(i), 64);
        p.serve();
        // Not polling the CQ: wait until every SEND has arrived (the overrun count says so).
        p.ctx->run_until([&] { return p.cq->overruns() >= kSends - kCqe; }, kWait);
        if (p.cq->overruns() != kSends - kCqe)
            throw std::runtime_error("overruns " + std::to_string(p.cq->overruns()));
        // The first four are there, in order; the rest were lost, not written over them.
        std::array<verbs::WorkCompletion, 8> wcs;
        const std::size_t n = p.cq->poll(wcs);
        if (n != kCqe) throw std::runtime_error("polled " + std::to_string(n));
        for (std::size_t i = 0; i < n; ++i) Peer::expect(wcs[i], WcStatus::success, WcOpcode::recv, i);
        int cq_errs = 0;
        while (auto ev = p.ctx->get_async_event()) {
            if (ev->type != verbs::AsyncEventType::cq_err) throw std::runtime_error("async event " + ev->describe());
            if (ev->cq != p.cq.get() || ev->qp_num != p.qp->qp_num())
                throw std::runtime_error("cq_err names another CQ or QP: " + ev->describe());
            if (ev->describe().find("CQ overrun") == std::string::npos) throw std::runtime_error(ev->describe());
            report(ev->describe());
            ++cq_errs;
        }
        if (cq_errs != 1) throw std::runtime_error("cq_err events: " + std::to_string(cq_errs));
        // The data of every SEND was placed: the loss is of completions, which the event reported.
        for (int i = 0; i < kSends; ++i)
            if (check_pattern(static_cast<std::uint64_t>(i), 0, std::span(p.buf).subspan(64u * static_cast<unsigned>(i), 64)) >= 0)
                throw std::runtime_error("SEND " + std::to_string(i) + " content");
        if (p.qp->state() != verbs::QpState::rts) throw std::runtime_error("QP left RTS");
        return p.end(0, /*overruns_expected=*/true);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.connect();
        for (int i = 0; i < kSends; ++i) {
            fill_pattern(static_cast<std::uint64_t>(i), 0, std::span(p.buf).subspan(64u * static_cast<unsigned>(i), 64));
            const verbs::Sge s = p.mr->sge(64u * static_cast<unsigned>(i), 64);
            p.post_send({.wr_id = static_cast<std::uint64_t>(i), .opcode = verbs::WrOpcode::send,
                         .send_flags = verbs::send_flags::signaled, .sg_list = {&s, 1}});
        }
        expect_ok(p.wait_wc(kSends));
        p.wait_event(verbs::CmEventType::disconnected);  // the server disconnects once it has checked its QP
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("full send, receive and shared receive queues refuse the WR past their depth and take WRs again once "
          "completions free them", "[verbs][memif][limits]") {
    constexpr std::uint32_t kDepth = 8;
    constexpr std::uint32_t kMsgs = kDepth + 2;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64 * 1024, kAll);
        p.qp.reset();
        p.qp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get(),
                                .cap = {.max_send_wr = kDepth, .max_recv_wr = kDepth}});
        // Receive queue: a chain of depth + 2 is posted up to the depth and stops at the first WR past it.
        std::vector<verbs::Sge> sges;
        for (std::uint32_t i = 0; i < kMsgs; ++i) sges.push_back(p.mr->sge(64u * i, 64));
        std::vector<verbs::RecvWr> rws;
        for (std::uint32_t i = 0; i < kMsgs; ++i) rws.push_back({.wr_id = i, .sg_list = {&sges[i], 1}});
        auto r = p.qp->post_recv(rws);
        if (r.err != verbs::PostErrc::queue_full || r.bad_wr != &rws[kDepth])
            throw std::runtime_error(std::string("RQ past its depth: ") + verbs::to_string(r.err));
        // A shared receive queue of the same depth: the same.
        auto srq = p.pd->create_srq({.max_wr = kDepth});
        r = srq->post_recv(rws);
        if (r.err != verbs::PostErrc::queue_full || r.bad_wr != &rws[kDepth] || srq->posted() != kDepth)
            throw std::runtime_error(std::string("SRQ past its depth: ") + verbs::to_string(r.err));
        srq.reset();
        p.serve();
        // The client's first kDepth SENDs take every receive; then there is room for the last two.
        auto wc = p.wait_wc(kDepth);
        for (std::uint32_t i = 0; i < kDepth; ++i) Peer::expect(wc[i], WcStatus::success, WcOpcode::recv, i);
        r = p.qp->post_recv(std::span(rws).subspan(kDepth));
        if (!r.ok()) throw std::runtime_error(std::string("RQ after completions: ") + verbs::to_string(r.err));
        const verbs::Sge go = p.mr->sge(4096, 8);
        p.post_send({.wr_id = 100, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&go, 1}});
        wc = p.wait_wc(3);
        std::uint32_t recvs = 0;
        for (const auto& w : wc) {
            if (w.status != WcStatus::success) throw std::runtime_error(verbs::to_string(w.status));
            if (w.opcode == WcOpcode::recv) {
                if (w.wr_id != kDepth + recvs) throw std::runtime_error("receive out of order");
                ++recvs;
            }
        }
        if (recvs != 2) throw std::runtime_error("late receives " + std::to_string(recvs));
        for (std::uint32_t i = 0; i < kMsgs; ++i)
            if (check_pattern(i, 0, std::span(p.buf).subspan(64u * i, 64)) >= 0)
                throw std::runtime_error("SEND " + std::to_string(i) + " content");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64 * 1024, kAll);
        p.qp.reset();
        p.qp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get(),
                                .cap = {.max_send_wr = kDepth, .max_recv_wr = kDepth}});
        p.post_recv(1000, 4096, 8);  // the server's "room again"
        p.connect();
        std::vector<verbs::Sge> sges;
        for (std::uint32_t i = 0; i < kMsgs; ++i) {
            fill_pattern(i, 0, std::span(p.buf).subspan(64u * i, 64));
            sges.push_back(p.mr->sge(64u * i, 64));
        }
        std::vector<verbs::SendWr> wrs;
        for (std::uint32_t i = 0; i < kMsgs; ++i)
            wrs.push_back({.wr_id = i, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                           .sg_list = {&sges[i], 1}});
        // Send queue: the chain stops at the first WR past the depth; the ones before it are on their way.
        auto r = p.qp->post_send(wrs);
        if (r.err != verbs::PostErrc::queue_full || r.bad_wr != &wrs[kDepth])
            throw std::runtime_error(std::string("SQ past its depth: ") + verbs::to_string(r.err));
        auto wc = p.wait_wc(kDepth + 1);  // kDepth SENDs and the server's word (either order)
        std::uint32_t sends = 0;
        for (const auto& w : wc) {
            if (w.status != WcStatus::success) throw std::runtime_error(verbs::to_string(w.status));
            if (w.opcode == WcOpcode::send) {
                if (w.wr_id != sends) throw std::runtime_error("send completion out of order");
                ++sends;
            }
        }
        if (sends != kDepth) throw std::runtime_error("sends " + std::to_string(sends));
        r = p.qp->post_send(std::span(wrs).subspan(kDepth));
        if (!r.ok()) throw std::runtime_error(std::string("SQ after completions: ") + verbs::to_string(r.err));
        wc = p.wait_wc(2);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::send, kDepth);
        Peer::expect(wc[1], WcStatus::success, WcOpcode::send, kDepth + 1);
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("READs and atomics beyond the negotiated ORD wait for credits: 64 posted at once with ORD 1, every "
          "one answered, no TERMINATE", "[verbs][memif][limits]") {
    constexpr std::uint32_t kReads = 32, kLen = 4096;
    constexpr std::size_t kCounterAt = kReads * kLen, kSinkAt = kCounterAt + 64;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 256 * 1024, kAll);
        p.conn.responder_resources = 1;  // IRD 1: a second READ in flight would be refused with a TERMINATE
        p.conn.initiator_depth = 1;
        fill_pattern(7, 0, std::span(p.buf).first(kCounterAt));
        p.post_recv(1, kSinkAt, 8);  // the client's "done"
        p.serve();
        expect_ok(p.wait_wc(1, 30s));
        std::uint64_t counter = 0;
        std::memcpy(&counter, p.buf.data() + kCounterAt, 8);
        if (counter != kReads) throw std::runtime_error("counter " + std::to_string(counter));
        if (p.qp->terminate_info()) throw std::runtime_error(p.qp->terminate_info()->describe());
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 256 * 1024, kAll);
        p.conn.responder_resources = 1;
        p.conn.initiator_depth = 1;
        p.connect();
        // One post: READ i and fetch-add i alternating, 64 WRs against an ORD of 1.
        std::vector<verbs::Sge> sges;
        sges.reserve(2 * kReads);
        std::vector<verbs::SendWr> wrs;
        for (std::uint32_t i = 0; i < kReads; ++i) {
            sges.push_back(p.mr->sge(std::size_t{i} * kLen, kLen));
            wrs.push_back({.wr_id = 2 * i, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                           .sg_list = {&sges.back(), 1}, .rdma = {p.remote.addr + std::uint64_t{i} * kLen, p.remote.rkey}});
            sges.push_back(p.mr->sge(kSinkAt + 8u * i, 8));
            wrs.push_back({.wr_id = 2 * i + 1, .opcode = verbs::WrOpcode::atomic_fetch_and_add,
                           .send_flags = verbs::send_flags::signaled, .sg_list = {&sges.back(), 1},
                           .atomic = {.remote_addr = p.remote.addr + kCounterAt, .compare_add = 1, .rkey = p.remote.rkey}});
        }
        const auto r = p.qp->post_send(wrs);
        if (!r.ok()) throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
        const auto wc = p.wait_wc(2 * kReads, 30s);
        for (std::uint32_t i = 0; i < 2 * kReads; ++i)
            Peer::expect(wc[i], WcStatus::success, i % 2 == 0 ? WcOpcode::rdma_read : WcOpcode::fetch_add, i);
        if (check_pattern(7, 0, std::span(p.buf).first(kCounterAt)) >= 0) throw std::runtime_error("READ content");
        // The atomics ran one after another: the old values are 0, 1, 2, ...
        for (std::uint32_t i = 0; i < kReads; ++i) {
            std::uint64_t old = 0;
            std::memcpy(&old, p.buf.data() + kSinkAt + 8u * i, 8);
            if (old != i) throw std::runtime_error("fetch-add " + std::to_string(i) + " returned " + std::to_string(old));
        }
        if (p.qp->terminate_info()) throw std::runtime_error(p.qp->terminate_info()->describe());
        const verbs::Sge done = p.mr->sge(kSinkAt + 8u * kReads, 8);
        p.post_send({.wr_id = 99, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&done, 1}});
        expect_ok(p.wait_wc(1));
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("a port with a small mbuf pool at both ends: 64 MiB of WRITE, READ and SEND arrive intact "
          "(frames wait for mbufs or are resent)", "[verbs][memif][limits]") {
    constexpr std::size_t kRegion = 4u << 20, kRounds = 8;
    constexpr std::size_t kSendAt = 2 * kRegion, kSend = 64 * 1024, kCtlAt = kSendAt + 4 * kSend;
    // 255 mbufs for a port whose rings take 128 each way: the pool, not the rings, is the bound.
    auto small = [](PeerConfig cfg) {
        cfg.port.mbufs = 255;
        cfg.port.rx_descriptors = 128;
        cfg.port.tx_descriptors = 128;
        return cfg;
    };
    auto server = [&](const PeerConfig& base) {
        const PeerConfig cfg = small(base);
        Peer p(cfg, kCtlAt + 64, kAll);
        for (int i = 0; i < 4; ++i) p.post_recv(10 + static_cast<unsigned>(i), kSendAt + i * kSend, kSend);
        p.serve();
        for (std::size_t r = 0; r < kRounds; ++r) {
            // The client's WRITE and four SENDs of this round.
            expect_ok(p.wait_wc(4, 60s));
            if (check_pattern(2 * r, 0, std::span(p.buf).first(kRegion)) >= 0)
                throw std::runtime_error("WRITE content, round " + std::to_string(r));
            if (check_pattern(2 * r + 1, 0, std::span(p.buf).subspan(kSendAt, 4 * kSend)) >= 0)
                throw std::runtime_error("SEND content, round " + std::to_string(r));
            if (r + 1 < kRounds)
                for (int i = 0; i < 4; ++i) p.post_recv(10 + static_cast<unsigned>(i), kSendAt + i * kSend, kSend);
            else
                p.post_recv(99, kCtlAt, 8);
            fill_pattern(1000 + r, 0, std::span(p.buf).subspan(kRegion, kRegion));  // what the client READs
            const verbs::Sge go = p.mr->sge(kCtlAt + 8, 8);
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&go, 1}});
            expect_ok(p.wait_wc(1, 60s));
        }
        expect_ok(p.wait_wc(1, 60s));  // the client has read the last round
        const auto port = verbs::diagnostics::port(*p.ctx);
        report("server: " + std::to_string(p.ctx->impl().port().mbufs_in_use()) + " mbufs in use, tx refused " +
               std::to_string(port.tx_refused));
        return p.end(0);
    };
    auto client = [&](const PeerConfig& base) {
        const PeerConfig cfg = small(base);
        Peer p(cfg, kCtlAt + 64, kAll);
        p.connect();
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t r = 0; r < kRounds; ++r) {
            p.post_recv(2, kCtlAt + 8, 8);
            fill_pattern(2 * r, 0, std::span(p.buf).first(kRegion));
            fill_pattern(2 * r + 1, 0, std::span(p.buf).subspan(kSendAt, 4 * kSend));
            const verbs::Sge w = p.mr->sge(0, kRegion);
            p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&w, 1}, .rdma = {p.remote.addr, p.remote.rkey}});
            for (int i = 0; i < 4; ++i) {
                const verbs::Sge s = p.mr->sge(kSendAt + i * kSend, kSend);
                p.post_send({.wr_id = 4, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                             .sg_list = {&s, 1}});
            }
            expect_ok(p.wait_wc(6, 60s));  // WRITE, SENDs, the server's word
            const verbs::Sge rd = p.mr->sge(kRegion, kRegion);
            p.post_send({.wr_id = 5, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&rd, 1}, .rdma = {p.remote.addr + kRegion, p.remote.rkey}});
            expect_ok(p.wait_wc(1, 60s));
            if (check_pattern(1000 + r, 0, std::span(p.buf).subspan(kRegion, kRegion)) >= 0)
                throw std::runtime_error("READ content, round " + std::to_string(r));
        }
        const verbs::Sge c = p.mr->sge(kCtlAt, 8);
        p.post_send({.wr_id = 6, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&c, 1}});
        expect_ok(p.wait_wc(1, 60s));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const auto port = verbs::diagnostics::port(*p.ctx);
        const auto st = verbs::diagnostics::stack(*p.ctx);
        report("client: " + std::to_string(kRounds * 2 * kRegion >> 20) + " MiB of WRITE/READ + SENDs in " +
               std::to_string(secs) + " s with 255 mbufs; tx refused " + std::to_string(port.tx_refused) +
               ", stack tx dropped " + std::to_string(st.tx_dropped) + ", deferred " +
               std::to_string(st.tx_deferred) + ", rx dropped " + std::to_string(st.rx_dropped));
        return p.end(0);
    };
    auto out = run_pair(server, client);
    check_outcomes(out);
    for (const auto& o : out) WARN(o.name << ": " << o.report);
}
