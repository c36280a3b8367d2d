// SPDX-License-Identifier: MIT
// verbs between two processes over memif (the fixture: tests/verbs/fixture.hpp): each child opens its own
// Context (EAL, port, lwIP), connects through the CM, runs its part, disconnects, and ends checking its pools.
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
#include "verbs/verbs.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;
using namespace std::chrono_literals;
using verbs::WcOpcode;
using verbs::WcStatus;


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
        if (const auto rc = p.ctx->rx_thread_counters()) {
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

// Per-layer cost accounting (ContextConfig::layer_cycles, run to completion): a SEND ping-pong spends cycles in
// every layer, and the layers add up to no more than the time the client spent in the library.
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
        const verbs::LayerCycles before = p.ctx->layer_cycles();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kRounds; ++i) {
            const verbs::Sge sge = p.mr->sge(1024, 64);
            p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .sg_list = {&sge, 1}});
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, static_cast<std::uint64_t>(i));
            p.post_recv(i + 4, 0, 64);
        }
        const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        const verbs::LayerCycles d = p.ctx->layer_cycles().since(before);
        report("per round trip:\n" + d.table(kRounds));
        if (d.io == 0 || d.lwip == 0 || d.mpa == 0 || d.ddp_rdmap == 0 || d.verbs == 0)
            throw std::runtime_error("a layer shows no cycles");
        if (static_cast<double>(d.total()) / d.cycles_per_ns > wall_ns * 1.05)
            throw std::runtime_error("layers add up to more than the wall time");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("WRITE then verify, READ into a multi-SGE sink (MPA CRC off and required)", "[verbs][memif]") {
    constexpr std::uint32_t kBytes = 256 << 10;
    const mpa::CrcPolicy crc = GENERATE(mpa::CrcPolicy::off, mpa::CrcPolicy::required);
    INFO("client CRC policy " << static_cast<int>(crc));
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 2 * kBytes, kAll);
        fill_pattern(77, 0, std::span(p.buf).subspan(kBytes, kBytes));  // second half: the READ source
        p.post_recv(1, 0, 0);
        p.serve();
        // The client WRITEs the first half, then SENDs a zero-length "done".
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);
        if (const auto bad = check_pattern(42, 0, std::span(p.buf).first(kBytes)); bad >= 0)
            throw std::runtime_error("WRITE content differs at " + std::to_string(bad));
        report("WRITE verified");
        p.post_recv(2, 0, 0);
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 2);  // the client read everything
        return p.end(0);
    };
    auto client = [crc](const PeerConfig& cfg) {
        Peer p(cfg, 2 * kBytes, verbs::access::local_write);
        p.connect(false, crc);
        // WRITE: gather from 3 SGEs (pattern 42 split unevenly).
        fill_pattern(42, 0, std::span(p.buf).first(kBytes));
        const verbs::Sge w[3] = {p.mr->sge(0, 1000), p.mr->sge(1000, 70000), p.mr->sge(71000, kBytes - 71000)};
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                     .sg_list = w, .rdma = {p.remote.addr, p.remote.rkey}});
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
        auto wc = p.wait_wc(2);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::rdma_write, 1);
        Peer::expect(wc[1], WcStatus::success, WcOpcode::send, 2);
        // READ the server's second half into 3 sink SGEs, in a second registered region for the middle one.
        std::vector<std::byte> other(100000);
        auto mr2 = p.pd->reg_mr(other, verbs::access::local_write);
        std::fill(p.buf.begin() + kBytes, p.buf.end(), std::byte{0});
        const verbs::Sge r[3] = {p.mr->sge(kBytes, 5), mr2->sge(0, 100000), p.mr->sge(kBytes + 5, kBytes - 100005)};
        p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                     .sg_list = r, .rdma = {p.remote.addr + kBytes, p.remote.rkey}});
        wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::rdma_read, 3);
        if (wc[0].byte_len != kBytes) throw std::runtime_error("READ byte_len " + std::to_string(wc[0].byte_len));
        if (check_pattern(77, 0, std::span(p.buf).subspan(kBytes, 5)) >= 0 || check_pattern(77, 5, other) >= 0 ||
            check_pattern(77, 100005, std::span(p.buf).subspan(kBytes + 5, kBytes - 100005)) >= 0)
            throw std::runtime_error("READ content differs");
        report("READ verified");
        p.post_send({.wr_id = 4, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 4);
        mr2.reset();
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("WRITE_WITH_IMM, SEND_WITH_IMM, fetch-add and compare-swap", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        std::uint64_t word = 100;
        std::memcpy(p.buf.data() + 512, &word, 8);  // the atomic target (8-aligned: vector storage is)
        for (int i = 0; i < 4; ++i) p.post_recv(1 + i, 1024 + 256 * i, 256);
        p.serve();
        // WRITE_WITH_IMM: the data at offset 0, then the Immediate Data completion.
        auto wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::recv_rdma_with_imm, 1);
        if (wc[0].imm_data != 0x1122334455667788ull || !(wc[0].wc_flags & verbs::wc_flags::with_imm))
            throw std::runtime_error("WRITE imm");
        if (std::memcmp(p.buf.data(), "written with imm", 16) != 0) throw std::runtime_error("WRITE_WITH_IMM data");
        // SEND_WITH_IMM: one receive completion with the data and the immediate (as verbs applications expect).
        wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 2);
        if (wc[0].byte_len != 13 || std::memcmp(p.buf.data() + 1024 + 256, "sent with imm", 13) != 0)
            throw std::runtime_error("SEND_WITH_IMM data");
        if (wc[0].imm_data != 7 || !(wc[0].wc_flags & verbs::wc_flags::with_imm)) throw std::runtime_error("SEND imm");
        report("immediate data verified");
        // The client's atomics, then its final SEND (on the next receive: SEND_WITH_IMM took one).
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 3);
        std::memcpy(&word, p.buf.data() + 512, 8);
        if (word != 7) throw std::runtime_error("atomic target holds " + std::to_string(word));
        report("atomics verified");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.connect();
        std::memcpy(p.buf.data(), "written with imm", 16);
        std::memcpy(p.buf.data() + 64, "sent with imm", 13);
        const verbs::Sge a = p.mr->sge(0, 16), b = p.mr->sge(64, 13);
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write_with_imm, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&a, 1}, .imm_data = 0x1122334455667788ull, .rdma = {p.remote.addr, p.remote.rkey}});
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send_with_imm, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&b, 1}, .imm_data = 7});
        auto wc = p.wait_wc(2);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::rdma_write, 1);
        Peer::expect(wc[1], WcStatus::success, WcOpcode::send, 2);
        const verbs::Sge r1 = p.mr->sge(256, 8), r2 = p.mr->sge(264, 8);
        p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::atomic_fetch_and_add, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&r1, 1}, .atomic = {p.remote.addr + 512, 5, 0, p.remote.rkey}});
        p.post_send({.wr_id = 4, .opcode = verbs::WrOpcode::atomic_cmp_and_swp, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&r2, 1}, .atomic = {p.remote.addr + 512, 105, 7, p.remote.rkey}});
        wc = p.wait_wc(2);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::fetch_add, 3);
        Peer::expect(wc[1], WcStatus::success, WcOpcode::comp_swap, 4);
        std::uint64_t o1 = 0, o2 = 0;
        std::memcpy(&o1, p.buf.data() + 256, 8);
        std::memcpy(&o2, p.buf.data() + 264, 8);
        if (o1 != 100 || o2 != 105)
            throw std::runtime_error("atomic originals " + std::to_string(o1) + ", " + std::to_string(o2));
        p.post_send({.wr_id = 5, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 5);
        report("atomic originals verified");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("a CM reject carries the responder's private data to the initiator", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.listener = p.ctx->listen(cfg.tcp_port);
        auto ev = p.wait_event(verbs::CmEventType::connect_request);
        const char no[] = "no room at the inn";
        if (!ev.request->reject(std::as_bytes(std::span(no)))) throw std::runtime_error("reject refused");
        p.ctx->run_until([] { return false; }, 200ms);
        ev.request.reset();
        p.disconnected = true;
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
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

namespace {

// The violation cases: the client does something the server must refuse. The server finds `want` (its
// TerminateInfo::cause), sends the TERMINATE the security policy allows (SecurityConfig::opaque_access_errors,
// on by default: every failed access to its memory reads "invalid STag", DDP's for a tagged offence, RDMAP's
// for a READ or atomic request) and goes to ERR with its receives flushed; the client receives that TERMINATE
// and goes to ERR with its receives (and any outstanding send WR) flushed.
// `consumed`: how many of the server's two receives the offence uses first (they complete successfully; the
// rest are flushed). `wrong_pd`: the server advertises a region of another PD. `tagged`: the offence is a
// tagged message (WRITE), not a READ/atomic request.
void violation_case(const std::function<void(Peer&)>& offend, const TermCode want, std::uint32_t server_access,
                    int consumed = 0, bool wrong_pd = false, bool tagged = true) {
    const TermCode wire = rdmap::opaque_access_error(want, tagged);
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, server_access);
        std::vector<std::byte> other(4096);
        auto pd2 = p.ctx->alloc_pd();
        auto mr2 = pd2->reg_mr(other, kAll);
        p.post_recv(1, 0, 64);
        p.post_recv(2, 64, 64);
        p.serve(wrong_pd ? std::optional(RemoteRegion{mr2->addr(), mr2->rkey(), 4096}) : std::nullopt);
        auto wc = p.wait_wc(2);
        for (int i = 0; i < 2; ++i)
            Peer::expect(wc[i], i < consumed ? WcStatus::success : WcStatus::wr_flush_err, WcOpcode::recv, 1 + i);
        p.wait_event(verbs::CmEventType::disconnected);
        const auto& t = p.qp->terminate_info();
        if (!t || t->received) throw std::runtime_error("server sent no TERMINATE");
        report("server: " + t->describe() + ", QP " + verbs::to_string(p.qp->state()));
        if (!(t->cause == want)) throw std::runtime_error("wrong cause " + term_str(t->cause) + ", wanted " + term_str(want));
        if (!(t->code == wire)) throw std::runtime_error("wrong TERMINATE " + term_str(t->code) + ", wanted " + term_str(wire));
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("server QP not in ERR");
        mr2.reset();
        return p.end(0);
    };
    auto client = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(7, 0, 64);
        p.connect();
        offend(p);
        p.wait_event(verbs::CmEventType::disconnected);
        const auto& t = p.qp->terminate_info();
        if (!t || !t->received) throw std::runtime_error("client received no TERMINATE");
        report("client: " + t->describe() + ", QP " + verbs::to_string(p.qp->state()));
        if (!(t->code == wire)) throw std::runtime_error("wrong TERMINATE " + term_str(t->code) + ", wanted " + term_str(wire));
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("client QP not in ERR");
        // Completions: the offending WR (success when framed, as siw), flushed receive, flushed READ.
        std::array<verbs::WorkCompletion, 16> wcs;
        const std::size_t n = p.cq->poll(wcs);
        bool recv_flushed = false, read_flushed = false;
        for (std::size_t i = 0; i < n; ++i) {
            if (wcs[i].wr_id == 7 && wcs[i].status == WcStatus::wr_flush_err) recv_flushed = true;
            if (wcs[i].wr_id == 99 && wcs[i].status == WcStatus::wr_flush_err) read_flushed = true;
        }
        if (!recv_flushed || !read_flushed) throw std::runtime_error("client WRs not flushed");
        // Posting in ERR completes at once with a flush error.
        const verbs::SendWr more{.wr_id = 100, .opcode = verbs::WrOpcode::send};
        if (!p.qp->post_send({&more, 1}).ok()) throw std::runtime_error("post in ERR refused");
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::send, 100);
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// The offending WR, then a READ queued behind it: the server fails on the offence first and never answers
// the READ, so it is outstanding when the TERMINATE arrives and is flushed at the client.
void post_offence_then_read(Peer& p, const verbs::SendWr& bad) {
    p.post_send(bad);
    const verbs::Sge s = p.mr->sge(1024, 16);
    p.post_send({.wr_id = 99, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                 .sg_list = {&s, 1}, .rdma = {p.remote.addr, 0x0}});  // STag 0: never answered anyway
}

}  // namespace

TEST_CASE("WRITE without the remote-write right: TERMINATE access violation, ERR and flushes at both ends",
          "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        rdmap::err::p_access, verbs::access::local_write | verbs::access::remote_read);
}

TEST_CASE("WRITE with a stale key: TERMINATE invalid STag at the peer", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey ^ 0x01u}});
        },
        ddp::err::t_invalid_stag, kAll);
}

TEST_CASE("SEND without a posted receive: TERMINATE no buffer", "[verbs][memif]") {
    // The server posts two receives; the client sends three.
    violation_case(
        [](Peer& p) {
            for (int i = 0; i < 2; ++i)
                p.post_send({.wr_id = 50u + i, .opcode = verbs::WrOpcode::send});
            post_offence_then_read(p, {.wr_id = 52, .opcode = verbs::WrOpcode::send});
        },
        ddp::err::u_no_buffer, kAll, /*consumed=*/2);
}

TEST_CASE("READ without the remote-read right: TERMINATE access violation", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 98, .opcode = verbs::WrOpcode::rdma_read, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        rdmap::err::p_access, verbs::access::local_write | verbs::access::remote_write, 0, false, /*tagged=*/false);
}

TEST_CASE("fetch-add without the remote-atomic right: TERMINATE access violation", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 8);
            post_offence_then_read(p, {.wr_id = 98, .opcode = verbs::WrOpcode::atomic_fetch_and_add,
                                       .sg_list = {&s, 1}, .atomic = {p.remote.addr, 1, 0, p.remote.rkey}});
        },
        rdmap::err::p_access, verbs::access::local_write | verbs::access::remote_write | verbs::access::remote_read, 0,
        false, /*tagged=*/false);
}

TEST_CASE("WRITE above and below the region: TERMINATE base or bounds", "[verbs][memif]") {
    for (const std::int64_t at : {std::int64_t{4096 - 16}, std::int64_t{-8}}) {
        INFO("offset " << at);
        violation_case(
            [at](Peer& p) {
                const verbs::Sge s = p.mr->sge(0, 32);
                post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                           .rdma = {p.remote.addr + static_cast<std::uint64_t>(at), p.remote.rkey}});
            },
            ddp::err::t_base_bounds, kAll);
    }
}

TEST_CASE("WRITE to a region of another PD: TERMINATE STag not associated", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        ddp::err::t_stag_not_assoc, kAll, 0, /*wrong_pd=*/true);
}

TEST_CASE("WRITE to an STag the peer invalidated by SEND_INV: TERMINATE invalid STag", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            p.post_send({.wr_id = 60, .opcode = verbs::WrOpcode::send_with_inv, .invalidate_rkey = p.remote.rkey});
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        ddp::err::t_invalid_stag, kAll | verbs::access::remote_invalidate, /*consumed=*/1);
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

TEST_CASE("connect to a port nobody listens on: unreachable, receives flushed", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        // No listener: the client's SYN is refused. Poll until its SYN (after ARP) has come and been answered,
        // then until the client has gone (io closes the link safely whenever it goes).
        const auto& c = p.ctx->stack().counters();
        p.ctx->run_until([&] { return c.rx_frames >= 2 && c.tx_frames >= 2; }, kWait);
        p.ctx->run_until([&] { return !p.ctx->port().link_up(); }, 30s);
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

TEST_CASE("1 GiB of WRITEs with content check", "[verbs][memif][tsan-slow]") {
    constexpr std::size_t kRegion = 16 << 20;
    constexpr int kWrites = 256;  // 4 MiB each, round the 16 MiB region: 1 GiB
    constexpr std::uint32_t kLen = 4 << 20;
    constexpr int kRounds = kWrites / 4;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, kRegion, kAll);
        for (int i = 0; i < kRounds; ++i) p.post_recv(i, 0, 0);
        p.serve();
        // After every 4 WRITEs the client SENDs a marker; check the region then, repost.
        for (int round = 0; round < kRounds; ++round) {
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, round);
            for (int k = 0; k < 4; ++k) {
                const int i = round * 4 + k;
                if (const auto bad = check_pattern(i, 0, std::span(p.buf).subspan(k * kLen, kLen)); bad >= 0)
                    throw std::runtime_error("WRITE " + std::to_string(i) + " differs at " + std::to_string(bad));
            }
            // Tell the client the region may be written again.
            p.post_send({.wr_id = 100u + round, .opcode = verbs::WrOpcode::send});
        }
        // Copies on the receive path per payload byte (RxCopyStats): the placement copy is the only one, in
        // both modes (with the RX thread it happens there, straight from the mbuf). Whole frames the RX thread
        // copies for lwIP (handshake, MPA negotiation: no RDMA payload) add a few hundred bytes in a GiB.
        const verbs::RxCopyStats cs = p.ctx->rx_copy_stats();
        if (cs.payload_bytes < (std::uint64_t{1} << 30))
            throw std::runtime_error("only " + std::to_string(cs.payload_bytes) + " payload bytes counted");
        const double copies = cs.copies_per_payload_byte();
        if (copies < 1.0 || copies > 1.0001)
            throw std::runtime_error("copies per payload byte " + std::to_string(copies) + ", want 1");
        if (const auto rc = p.ctx->rx_thread_counters(); rc && rc->tcp_payload_placed < (std::uint64_t{1} << 30))
            throw std::runtime_error("the RX thread placed only " + std::to_string(rc->tcp_payload_placed) + " bytes");
        report("1 GiB verified; copies per payload byte " + std::to_string(copies));
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, kRegion, verbs::access::local_write);
        for (int i = 0; i < kRounds; ++i) p.post_recv(i, 0, 0);
        p.connect();
        const auto t0 = std::chrono::steady_clock::now();
        for (int round = 0; round < kRounds; ++round) {
            for (int k = 0; k < 4; ++k) {
                fill_pattern(round * 4 + k, 0, std::span(p.buf).subspan(k * kLen, kLen));
                const verbs::Sge s = p.mr->sge(k * kLen, kLen);
                p.post_send({.wr_id = static_cast<std::uint64_t>(round * 4 + k), .opcode = verbs::WrOpcode::rdma_write,
                             .sg_list = {&s, 1}, .rdma = {p.remote.addr + k * kLen, p.remote.rkey}});
            }
            p.post_send({.wr_id = 1000u + round, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled});
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 1000u + round);
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, round);  // the server checked
        }
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        report("MBps=" + std::to_string(1024.0 * (1 << 20) / secs / 1e6));
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
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

TEST_CASE("every TCP segment carries whole FPDUs (client capture, both directions)", "[verbs][memif]") {
    const std::string pcap = "/tmp/" + unique_name("verbs-fpdu-") + ".pcap";
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 1 << 20, kAll);
        fill_pattern(3, 0, p.buf);
        for (int i = 0; i < 8; ++i) p.post_recv(i, 0, 4096);
        p.serve();
        for (int i = 0; i < 8; ++i) {
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, i);
            const verbs::Sge s = p.mr->sge(0, 3000);  // 3000 bytes back: three FPDUs at EMSS 1460
            p.post_send({.wr_id = 100u + i, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}});
        }
        return p.end(0);
    };
    auto client = [&pcap](const PeerConfig& c) {
        PeerConfig cfg = c;
        cfg.port.capture_path = pcap;
        Peer p(cfg, 1 << 20, verbs::access::local_write);
        for (int i = 0; i < 8; ++i) p.post_recv(i, 4096 * i, 4096);
        p.connect();
        for (int i = 0; i < 8; ++i) {
            // Small SENDs, a 256 KiB WRITE and a 100 KiB READ in flight together, then the echo.
            const verbs::Sge small = p.mr->sge(500000, 10 + 100 * i), big = p.mr->sge(600000, 256 << 10),
                             sink = p.mr->sge(300000, 100000);
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&big, 1},
                         .rdma = {p.remote.addr, p.remote.rkey}});
            p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&sink, 1}, .rdma = {p.remote.addr + 4096, p.remote.rkey}});
            p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::send, .sg_list = {&small, 1}});
            auto wc = p.wait_wc(2);  // the READ and the echo, in either order
            for (const auto& w : wc)
                if (w.status != WcStatus::success) throw std::runtime_error("completion failed");
        }
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));

    // Walk every TCP segment with payload: after each direction's first one (the MPA Request / Reply), a
    // segment must hold whole FPDUs: its length fields chain exactly to its end.
    const auto frames = wire::read_capture(pcap);
    std::filesystem::remove(pcap);
    std::map<std::uint16_t, int> seen;  // source port -> data segments so far
    std::size_t fpdus = 0, segments = 0, cut = 0;
    for (const auto& f : frames) {
        const auto& b = f.bytes;
        if (b.size() < 54 || b[12] != 0x08 || b[13] != 0x00 || b[23] != 6) continue;  // IPv4 TCP only
        const std::size_t ihl = (b[14] & 0x0f) * 4u;
        const std::size_t ip_len = (b[16] << 8) | b[17];
        const std::size_t tcp = 14 + ihl;
        const std::size_t doff = (b[tcp + 12] >> 4) * 4u;
        if (ip_len < ihl + doff || 14 + ip_len > b.size()) continue;
        const std::size_t len = ip_len - ihl - doff;
        if (len == 0) continue;
        const std::uint16_t sport = static_cast<std::uint16_t>((b[tcp] << 8) | b[tcp + 1]);
        if (seen[sport]++ == 0) continue;  // the MPA frame
        ++segments;
        const std::uint8_t* pl = b.data() + tcp + doff;
        std::size_t off = 0;
        while (off + 2 <= len) {
            off += mpa::fpdu_size_unmarked((pl[off] << 8) | pl[off + 1]);
            ++fpdus;
        }
        if (off != len) ++cut;
    }
    INFO(segments << " data segments, " << fpdus << " FPDUs, " << cut << " segments not whole FPDUs");
    CHECK(segments > 400);
    CHECK(cut == 0);
}

TEST_CASE("1024 QPs connected in one process pair, each exchanging a SEND both ways", "[verbs][memif][tsan-slow]") {
    constexpr std::uint32_t kQps = 1024;
    constexpr std::uint32_t kLen = 32;
    // One CQ, one MR (kLen bytes per QP for receives, kLen for sends), small queues: 2 WRs each way.
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
            verbs::ContextConfig cc{.port = cfg.port, .eal = cfg.eal, .stack = cfg.stack, .max_mr = 4, .max_qp = kQps,
                                    .threading = test_threading()};
            ctx = verbs::Context::open(cc);
            baseline = ctx->stack().pool_usage();
            pd = ctx->alloc_pd();
            cq = ctx->create_cq(4 * kQps);
            buf.resize(2 * kLen * kQps);
            mr = pd->reg_mr(buf, verbs::access::local_write);
            for (std::uint32_t i = 0; i < kQps; ++i) {
                qps.push_back(pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(),
                                             .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_inline_data = 0}}));
                const verbs::Sge s = mr->sge(kLen * i, kLen);
                const verbs::RecvWr r{.wr_id = i, .sg_list = {&s, 1}};
                if (!qps.back()->post_recv({&r, 1}).ok()) throw std::runtime_error("post_recv");
            }
        }
        void send(std::uint32_t i) {
            std::memcpy(buf.data() + kLen * (kQps + i), &i, 4);
            const verbs::Sge s = mr->sge(kLen * (kQps + i), kLen);
            const verbs::SendWr w{.wr_id = i, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}};
            if (!qps[i]->post_send({&w, 1}).ok()) throw std::runtime_error("post_send " + std::to_string(i));
        }
        // Waits for kQps receive completions, each carrying its QP's index.
        void receive_all() {
            std::array<verbs::WorkCompletion, 64> wcs;
            std::uint32_t got = 0;
            ctx->run_until([&] {
                const std::size_t n = cq->poll(wcs);
                for (std::size_t k = 0; k < n; ++k) {
                    if (wcs[k].status != WcStatus::success || wcs[k].opcode != WcOpcode::recv)
                        throw std::runtime_error("bad completion on QP " + std::to_string(wcs[k].qp_num));
                    std::uint32_t v = 0;
                    std::memcpy(&v, buf.data() + kLen * wcs[k].wr_id, 4);
                    if (v != wcs[k].wr_id) throw std::runtime_error("content on " + std::to_string(v));
                    ++got;
                }
                return got == kQps;
            }, 60s);
            if (got != kQps) throw std::runtime_error("received " + std::to_string(got) + " of " + std::to_string(kQps));
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
            ids.clear();
            qps.clear();
            mr.reset();
            return finish_checks(ctx->stack(), ctx->port(), baseline, rc);
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
        m.receive_all();                              // every client QP SENDs first (we are the responder)
        for (std::uint32_t i = 0; i < kQps; ++i) m.send(i);
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
        for (std::uint32_t i = 0; i < kQps; ++i) m.send(i);
        m.receive_all();
        report("1024 QPs exchanged");
        return m.end(0);
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
        if (p.ctx->threading_mode() == threading::Mode::run_to_completion) {
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
            const auto& sc = p.ctx->stack().counters();
            throw std::runtime_error("no completion; rx frames " + std::to_string(sc.rx_frames) + ", QP " +
                                     verbs::to_string(p.qp->state()) + ", " + p.ctx->stack().protocol_counters());
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

TEST_CASE("an SRQ shared by two QPs, with its limit event", "[verbs][memif]") {
    auto end_all = [](verbs::Context& ctx, std::vector<std::unique_ptr<verbs::CmId>>& ids) {
        for (auto& id : ids) id->disconnect();
        unsigned down = 0;
        ctx.run_until([&] {
            while (auto ev = ctx.get_cm_event())
                if (ev->type == verbs::CmEventType::disconnected) ++down;
            return down >= ids.size();
        }, kWait);
        ctx.run_until([] { return false; }, 50ms);
        ids.clear();
    };
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
        end_all(*p.ctx, ids);
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
            stack::TcpListener l(p.ctx->stack(), cfg.tcp_port, mute);
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
