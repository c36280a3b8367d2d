// SPDX-License-Identifier: MIT
// verbs between two processes over memif (the fixture: tests/verbs/fixture.hpp; every case runs in both threading
// modes). SEND/RECV between two processes: ping-pong, a burst across the RX thread's handover, a shared receive
// queue and its limit event.
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
#include <softrdma/diagnostics.hpp>
#include <softrdma/verbs.hpp>

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;  // with std::chrono_literals, WcOpcode, WcStatus


TEST_CASE("SEND/RECV ping-pong", "[verbs][memif]") {
    constexpr int kRounds = 200;
    constexpr std::uint32_t kLen = 64;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64 << 10, verbs::access::local_write);
        for (int i = 0; i < 8; ++i) p.post_recv(1000 + i, kLen * i, kLen);
        p.serve();
        int next_recv = 8;
        for (int i = 0; i < kRounds; ++i) {
            auto wc = p.wait_wc(1);
            Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 1000 + i);
            if (wc[0].byte_len != kLen) throw std::runtime_error("ping length " + std::to_string(wc[0].byte_len));
            const std::size_t at = kLen * (i % 8);
            if (check_pattern(i, 0, std::span(p.buf).subspan(at, kLen)) >= 0) throw std::runtime_error("ping content");
            // Echo the ping from where it landed (pattern i), then repost that receive.
            const verbs::Sge sge = p.mr->sge(at + 32768, kLen);
            std::memcpy(p.buf.data() + at + 32768, p.buf.data() + at, kLen);
            p.post_send({.wr_id = 5000u + i, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&sge, 1}});
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 5000u + i);
            p.post_recv(1000 + next_recv, at, kLen);
            ++next_recv;
        }
        report("server echoed " + std::to_string(kRounds));
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64 << 10, verbs::access::local_write);
        p.post_recv(1, 0, kLen);
        p.connect();
        for (int i = 0; i < kRounds; ++i) {
            fill_pattern(i, 0, std::span(p.buf).subspan(1024, kLen));
            const verbs::Sge sge = p.mr->sge(1024, kLen);
            // Every other ping inline and unsignaled: its buffer is free at once and it completes silently.
            const bool inl = i % 2 == 1;
            p.post_send({.wr_id = 10u + i,
                         .opcode = verbs::WrOpcode::send,
                         .send_flags = inl ? verbs::send_flags::inline_data : verbs::send_flags::signaled,
                         .sg_list = {&sge, 1}});
            auto wcs = p.wait_wc(inl ? 1 : 2);
            const auto& recv = wcs.back();
            if (!inl) {
                const auto& snd = wcs.front().opcode == WcOpcode::send ? wcs.front() : wcs.back();
                Peer::expect(snd, WcStatus::success, WcOpcode::send, 10u + i);
            }
            const auto& r = wcs.front().opcode == WcOpcode::recv ? wcs.front() : recv;
            Peer::expect(r, WcStatus::success, WcOpcode::recv, 1 + i);
            if (r.byte_len != kLen || check_pattern(i, 0, std::span(p.buf).first(kLen)) >= 0)
                throw std::runtime_error("pong content, round " + std::to_string(i));
            p.post_recv(2 + i, 0, kLen);
        }
        report("client got " + std::to_string(kRounds) + " pongs");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// Context::flush() puts what was posted on the wire without polling for input: the frame goes out (the port's
// TX count moves, RX does not), the SEND completes (framed), and the peer receives it.
TEST_CASE("Context::flush sends what was posted and receives nothing", "[verbs][memif]") {
    constexpr std::uint32_t kLen = 256;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64 << 10, verbs::access::local_write);
        p.post_recv(1, 0, kLen);
        p.serve();
        const auto wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 1);
        if (wc[0].byte_len != kLen || check_pattern(3, 0, std::span(p.buf).first(kLen)) >= 0)
            throw std::runtime_error("flushed SEND: wrong length or content");
        const verbs::Sge sge = p.mr->sge(0, kLen);  // echoed back from where it landed
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&sge, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 2);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 64 << 10, verbs::access::local_write);
        p.post_recv(1, 4096, kLen);
        p.connect();
        fill_pattern(3, 0, std::span(p.buf).first(kLen));
        const verbs::Sge sge = p.mr->sge(0, kLen);
        p.post_send({.wr_id = 9, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&sge, 1}});
        const StackCounters before = verbs::diagnostics::stack(*p.ctx);
        const PortCounters port_before = verbs::diagnostics::port(*p.ctx);
        p.ctx->flush();
        const StackCounters after = verbs::diagnostics::stack(*p.ctx);
        const PortCounters port_after = verbs::diagnostics::port(*p.ctx);
        if (after.tx_frames == before.tx_frames || port_after.tx_packets == port_before.tx_packets)
            throw std::runtime_error("flush sent no frame");
        if (after.rx_frames != before.rx_frames) throw std::runtime_error("flush received frames");
        std::array<verbs::WorkCompletion, 2> wc;
        if (p.cq->poll(wc) != 1) throw std::runtime_error("the flushed SEND has not completed");
        Peer::expect(wc[0], WcStatus::success, WcOpcode::send, 9);
        const auto echo = p.wait_wc(1);
        Peer::expect(echo[0], WcStatus::success, WcOpcode::recv, 1);
        if (echo[0].byte_len != kLen || check_pattern(3, 0, std::span(p.buf).subspan(4096, kLen)) >= 0)
            throw std::runtime_error("echo content");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// A burst from the responder the moment the initiator's first FPDU opens its gate (RFC 5044 section 7.1.2):
// with the RX thread, the initiator's stream is handed over around then; bytes that arrive before the handover
// are processed on the application thread, the rest on the RX thread; none may be lost, doubled or reordered.
TEST_CASE("a burst right after the first FPDU: every message arrives across the handover", "[verbs][memif]") {
    constexpr int kMsgs = 96;
    constexpr std::uint32_t kLen = 1024;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 256 << 10, verbs::access::local_write);
        p.post_recv(7, 0, kLen);
        p.post_recv(8, 0, kLen);
        p.serve();
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 7);  // the initiator's first FPDU
        for (int i = 0; i < kMsgs; ++i) {
            fill_pattern(i, 0, std::span(p.buf).subspan(i * kLen, kLen));
            const verbs::Sge sge = p.mr->sge(i * kLen, kLen);
            p.post_send({.wr_id = 100u + i, .opcode = verbs::WrOpcode::send,
                         .send_flags = i + 1 == kMsgs ? verbs::send_flags::signaled : 0u, .sg_list = {&sge, 1}});
        }
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 100u + kMsgs - 1);
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 8);  // the client checked them all
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 256 << 10, verbs::access::local_write);
        for (int i = 0; i < kMsgs; ++i) p.post_recv(i, i * kLen, kLen);
        p.connect();
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send});  // zero-length: opens the responder's gate
        std::vector<verbs::WorkCompletion> wcs;
        while (wcs.size() < kMsgs)
            for (const auto& wc : p.wait_wc(1))
                if (wc.opcode == WcOpcode::recv) wcs.push_back(wc);  // the SEND's own completion is unsignaled
        for (int i = 0; i < kMsgs; ++i) {
            Peer::expect(wcs[i], WcStatus::success, WcOpcode::recv, i);
            if (wcs[i].byte_len != kLen || check_pattern(i, 0, std::span(p.buf).subspan(i * kLen, kLen)) >= 0)
                throw std::runtime_error("message " + std::to_string(i) + " content");
        }
        std::string how = "run to completion";
        if (const auto rc = verbs::diagnostics::rx_thread(*p.ctx)) {
            if (rc->tcp_payload_placed == 0) throw std::runtime_error("the RX thread placed nothing");
            how = "RX thread placed " + std::to_string(rc->tcp_payload_placed) + " bytes, " +
                  std::to_string(rc->tcp_payload_copied) + " copied as whole frames";
        }
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 2);
        report(std::to_string(kMsgs) + " messages in order; " + how);
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("an SRQ shared by two QPs, with its limit event", "[verbs][memif]") {
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        auto srq = p.pd->create_srq({.max_wr = 16});
        std::unique_ptr<verbs::QueuePair> qps[2];
        for (auto& q : qps) q = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get(), .srq = srq.get()});
        for (int i = 0; i < 8; ++i) {
            const verbs::Sge s = p.mr->sge(64 * i, 64);
            const verbs::RecvWr r{.wr_id = 100u + i, .sg_list = {&s, 1}};
            if (!srq->post_recv({&r, 1}).ok()) throw std::runtime_error("srq post_recv");
        }
        const verbs::RecvWr direct{.wr_id = 1};
        if (qps[0]->post_recv({&direct, 1}).err != verbs::PostErrc::invalid_state)
            throw std::runtime_error("post_recv on a QP with an SRQ accepted");
        srq->arm_limit(4);
        p.listener = p.ctx->listen(cfg.tcp_port);
        std::vector<std::unique_ptr<verbs::CmId>> ids;
        for (int i = 0; i < 2; ++i) {
            auto ev = p.wait_event(verbs::CmEventType::connect_request);
            if (!ev.request->accept(*qps[i], {})) throw std::runtime_error("accept");
            ids.push_back(std::move(ev.request));
            p.wait_event(verbs::CmEventType::established);
        }
        if (p.ctx->get_async_event()) throw std::runtime_error("async event before the limit");
        auto wc = p.wait_wc(6);  // 3 SENDs from each client QP
        std::set<std::uint32_t> qpns, ids_seen;
        for (const auto& w : wc) {
            if (w.status != WcStatus::success || w.opcode != WcOpcode::recv || w.byte_len != 2)
                throw std::runtime_error("bad SRQ completion");
            qpns.insert(w.qp_num);
            ids_seen.insert(static_cast<std::uint32_t>(w.wr_id));
        }
        if (qpns.size() != 2 || qpns.count(qps[0]->qp_num()) != 1 || ids_seen.size() != 6 || *ids_seen.begin() != 100)
            throw std::runtime_error("completions not from both QPs / WRs not taken in order");
        const auto ae = p.ctx->get_async_event();
        if (!ae || ae->type != verbs::AsyncEventType::srq_limit_reached || ae->srq != srq.get())
            throw std::runtime_error("no SRQ limit event");
        if (p.ctx->get_async_event() || srq->posted() != 2 || srq->limit() != 0)
            throw std::runtime_error("limit event not once / posted count");
        report("SRQ: 6 receives over 2 QPs, limit event at 3 < 4");
        disconnect_all(*p.ctx, ids);
        for (auto& q : qps) q.reset();
        srq.reset();
        p.disconnected = true;
        return p.end(0);
    };
    auto client = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        std::unique_ptr<verbs::QueuePair> qps[2];
        std::vector<std::unique_ptr<verbs::CmId>> ids;
        for (auto& q : qps) {
            q = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get()});
            ids.push_back(p.ctx->connect(cfg.peer, cfg.tcp_port, *q, {}));
            p.wait_event(verbs::CmEventType::established);
        }
        for (int k = 0; k < 3; ++k)
            for (auto& q : qps) {
                const verbs::Sge s = p.mr->sge(0, 2);
                const verbs::SendWr w{.wr_id = 1, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}};
                if (!q->post_send({&w, 1}).ok()) throw std::runtime_error("post_send");
            }
        // Until the server disconnects.
        unsigned down = 0;
        p.ctx->run_until([&] {
            while (auto ev = p.ctx->get_cm_event())
                if (ev->type == verbs::CmEventType::disconnected) ++down;
            return down >= 2;
        }, kWait);
        if (down != 2) throw std::runtime_error("server did not disconnect");
        ids.clear();
        for (auto& q : qps) q.reset();
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}
