// SPDX-License-Identifier: MIT
// verbs between two processes over memif (the fixture: tests/verbs/fixture.hpp; every case runs in both threading
// modes). Waiting and accounting: CQ notification (solicited only), the CM fd, sleeping in epoll with the RX
// thread, per-layer cycle accounting.
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


// Per-layer cost accounting (ContextConfig::layer_cycles): a SEND ping-pong spends cycles in every layer, and
// the layers add up to no more than the time the client spent in the library. In RX-thread mode (suite
// verbs_rx_thread) the RX thread's turns show too: in the driver, placing in the QP's receive half (its SENDs
// are placed there after the handover) and forwarding, no more than the wall time either.
TEST_CASE("layer cycle accounting: a ping-pong shows every layer", "[verbs][memif]") {
    constexpr int kRounds = 2000;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        for (int i = 0; i < 4; ++i) p.post_recv(i, 0, 64);
        p.serve();
        for (int i = 0; i < kRounds; ++i) {
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, static_cast<std::uint64_t>(i));
            p.post_recv(i + 4, 0, 64);
            const verbs::Sge sge = p.mr->sge(1024, 64);
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .sg_list = {&sge, 1}});
        }
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        PeerConfig c = cfg;
        c.stack.count_cycles = true;  // Peer turns it into ContextConfig::layer_cycles
        Peer p(c, 4096, verbs::access::local_write);
        for (int i = 0; i < 4; ++i) p.post_recv(i, 0, 64);
        p.connect();
        const verbs::LayerCycles before = verbs::diagnostics::layer_cycles(*p.ctx);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kRounds; ++i) {
            const verbs::Sge sge = p.mr->sge(1024, 64);
            p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .sg_list = {&sge, 1}});
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, static_cast<std::uint64_t>(i));
            p.post_recv(i + 4, 0, 64);
        }
        const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        const verbs::LayerCycles d = verbs::diagnostics::layer_cycles(*p.ctx).since(before);
        report("per round trip:\n" + d.table(kRounds));
        if (d.io == 0 || d.lwip == 0 || d.mpa == 0 || d.ddp_rdmap == 0 || d.verbs == 0)
            throw std::runtime_error("a layer shows no cycles");
        if (static_cast<double>(d.total()) / d.cycles_per_ns > wall_ns * 1.05)
            throw std::runtime_error("layers add up to more than the wall time");
        const bool rx_thread = verbs::diagnostics::rx_thread(*p.ctx).has_value();
        if (rx_thread && (d.rx_io == 0 || d.rx_place == 0 || d.rx_forward == 0))
            throw std::runtime_error("an RX thread layer shows no cycles");
        if (!rx_thread && d.rx_total() != 0) throw std::runtime_error("RX thread cycles without an RX thread");
        if (static_cast<double>(d.rx_total()) / d.cycles_per_ns > wall_ns * 1.05)
            throw std::runtime_error("the RX thread's layers add up to more than the wall time");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("solicited-only CQ notification: a plain SEND does not fire it, SEND_SE does; CM fd", "[verbs][memif]") {
    auto readable = [](int fd) {
        pollfd p{fd, POLLIN, 0};
        return ::poll(&p, 1, 0) == 1;
    };
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        for (int i = 0; i < 3; ++i) p.post_recv(i, 64 * i, 64);
        p.listener = p.ctx->listen(cfg.tcp_port);
        // The CM fd is readable exactly while events are queued.
        p.ctx->run_until([&] { return readable(p.ctx->cm_fd()); }, kWait);
        if (!readable(p.ctx->cm_fd())) throw std::runtime_error("CM fd not readable with a request queued");
        auto ev = p.wait_event(verbs::CmEventType::connect_request);
        p.remote = region_from(ev.private_data);
        p.id = std::move(ev.request);
        const RemoteRegion me = p.local();
        if (!p.id->accept(*p.qp, {.private_data = as_bytes(me)})) throw std::runtime_error("accept");
        p.wait_event(verbs::CmEventType::established);
        if (readable(p.ctx->cm_fd())) throw std::runtime_error("CM fd readable with no event queued");

        // The client sends its next message only after our unsignaled "go" (no completion here).
        const verbs::SendWr go{.opcode = verbs::WrOpcode::send};
        p.cq->req_notify(/*solicited_only=*/true);
        p.wait_wc(1);  // the plain SEND: completes, no event
        if (readable(p.cq->fd()) || p.cq->get_event()) throw std::runtime_error("event for an unsolicited SEND");
        p.post_send(go);
        p.wait_wc(1);  // SEND_SE
        if (!readable(p.cq->fd()) || !p.cq->get_event()) throw std::runtime_error("no event for SEND_SE");
        if (readable(p.cq->fd())) throw std::runtime_error("event not consumed");
        p.cq->req_notify(/*solicited_only=*/false);
        p.post_send(go);
        p.wait_wc(1);  // a plain SEND again: any completion fires now
        if (!p.cq->get_event()) throw std::runtime_error("no event for the next completion");
        report("notifications as asked");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(10, 0, 64);
        p.post_recv(11, 0, 64);
        p.connect();
        for (int i = 0; i < 3; ++i) {
            p.post_send({.wr_id = static_cast<std::uint64_t>(i), .opcode = verbs::WrOpcode::send,
                         .send_flags = i == 1 ? verbs::send_flags::solicited : 0u});
            if (i < 2) Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 10u + i);  // "go"
        }
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// Sleeping instead of polling: with the RX thread the application may sleep in epoll on wake_fd() (next to its
// CQ's fd) and the arriving SEND wakes it; in run-to-completion mode prepare_sleep() always says "poll".
TEST_CASE("sleep in epoll until a SEND arrives (RX thread wakes the application)", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(1, 0, 64);
        p.serve();
        if (p.ctx->threading_mode() == ThreadingMode::run_to_completion) {
            if (p.ctx->prepare_sleep()) throw std::runtime_error("prepare_sleep() said yes in run-to-completion mode");
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);
            return p.end(0);
        }
        const int ep = epoll_create1(EPOLL_CLOEXEC);
        epoll_event ev{.events = EPOLLIN, .data = {.fd = p.ctx->wake_fd()}};
        epoll_ctl(ep, EPOLL_CTL_ADD, p.ctx->wake_fd(), &ev);
        ev.data.fd = p.cq->fd();
        epoll_ctl(ep, EPOLL_CTL_ADD, p.cq->fd(), &ev);
        p.cq->req_notify(false);
        int sleeps = 0, woken = 0;
        std::array<verbs::WorkCompletion, 4> wc;
        std::size_t n = 0;
        const auto until = std::chrono::steady_clock::now() + kWait;
        while (n == 0 && std::chrono::steady_clock::now() < until) {
            while (p.ctx->poll() != 0) {
            }
            n = p.cq->poll(wc);
            if (n != 0) break;
            if (!p.ctx->prepare_sleep()) continue;  // something pending: poll again
            ++sleeps;
            epoll_event out[2];
            const int k = epoll_wait(ep, out, 2, 50);  // TCP's timers run inside poll(): a short timeout
            for (int i = 0; i < k; ++i)
                if (out[i].data.fd == p.ctx->wake_fd()) ++woken;
        }
        ::close(ep);
        if (n == 0) {
            const auto& sc = p.ctx->impl().stack().counters();
            throw std::runtime_error("no completion; rx frames " + std::to_string(sc.rx_frames) + ", QP " +
                                     verbs::to_string(p.qp->state()) + ", " + p.ctx->impl().stack().protocol_counters());
        }
        Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 1);
        report("slept " + std::to_string(sleeps) + " times, woken by the RX thread " + std::to_string(woken));
        if (sleeps == 0 || woken == 0) throw std::runtime_error("never slept or never woken");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.connect();
        p.ctx->run_until([] { return false; }, 300ms);  // the server goes to sleep meanwhile
        const verbs::Sge sge = p.mr->sge(0, 64);
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&sge, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 1);
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}
