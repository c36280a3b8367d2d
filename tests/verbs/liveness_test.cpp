// SPDX-License-Identifier: MIT
// Peer death (ConnParam::liveness): a peer killed with SIGKILL while idle or in the middle of a transfer, or
// stopped (SIGSTOP) so that it answers nothing. The survivor must report the disconnect within the documented
// time, with the reason in words, its QP in ERR, the oldest outstanding send WR completing retry_exc_err and
// everything else flushed, its pools back to their start, and then take a new connection. Both threading
// modes (the fixture: tests/verbs/fixture.hpp).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "tests/verbs/fixture.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

namespace {

using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Waits (bounded) for the disconnected event; returns its reason.
std::string wait_disconnect(Peer& p, std::chrono::milliseconds limit) {
    std::optional<verbs::CmEvent> ev;
    p.ctx->run_until([&] { return (ev = p.ctx->get_cm_event()).has_value(); }, limit);
    if (!ev) throw std::runtime_error("no CM event within " + std::to_string(limit.count()) + " ms");
    if (ev->type != verbs::CmEventType::disconnected)
        throw std::runtime_error(std::string("CM event ") + verbs::to_string(ev->type) + " (" + ev->reason + ")");
    p.disconnected = true;
    return ev->reason;
}

// Every completion left on the CQ.
std::vector<verbs::WorkCompletion> drain_cq(Peer& p) {
    std::vector<verbs::WorkCompletion> out;
    std::array<verbs::WorkCompletion, 64> b;
    p.ctx->run_until([&] {
        const std::size_t k = p.cq->poll(b);
        out.insert(out.end(), b.begin(), b.begin() + static_cast<std::ptrdiff_t>(k));
        return false;
    }, 200ms);
    return out;
}

// After the peer's death: a new client connects to the same listener; one SEND each way proves the
// connection works. The dead connection's QP is taken back to INIT for it (err -> reset -> init).
void serve_again(Peer& p) {
    p.id.reset();
    if (!p.ctx->run_until([&] { return p.qp->modify_state(verbs::QpState::reset); }, kWait))
        throw std::runtime_error("the QP did not leave ERR");
    if (!p.qp->modify_state(verbs::QpState::init)) throw std::runtime_error("reset -> init refused");
    p.disconnected = false;
    p.post_recv(50, 0, 64);
    auto ev = p.wait_event(verbs::CmEventType::connect_request);
    p.remote = region_from(ev.private_data);
    p.id = std::move(ev.request);
    const RemoteRegion me = p.local();
    verbs::ConnParam cp = p.conn;
    cp.private_data = as_bytes(me);
    if (!p.id->accept(*p.qp, cp)) throw std::runtime_error("accept refused");
    p.wait_event(verbs::CmEventType::established);
    Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 50);
    const verbs::Sge s = p.mr->sge(64, 16);
    p.post_send({.wr_id = 51, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                 .sg_list = {&s, 1}});
    Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 51);
    report("a new connection after the death works");
}

// The second client comes only once the survivor has seen the death (it creates `ready`): its stack, at the
// dead client's address, answers the survivor's keepalive probes with a reset, which would end the dead
// connection before its liveness did (TSan once made the death that late: the survivor saw a reset at 932 ms).
std::string ready_path() { return "/tmp/" + unique_name("liveness-") + ".ready"; }
void mark_ready(const std::string& ready) { std::ofstream(ready) << "dead\n"; }

int second_client(const PeerConfig& cfg, const std::string& ready) {
    const auto t0 = Clock::now();
    while (!std::ifstream(ready).good()) {
        if (Clock::now() - t0 > 30s) throw std::runtime_error("the survivor never saw the death");
        std::this_thread::sleep_for(10ms);
    }
    std::remove(ready.c_str());
    Peer p(cfg, 4096, kAll);
    p.post_recv(60, 0, 64);
    p.conn.connect_retry = 5s;
    p.connect();
    const verbs::Sge s = p.mr->sge(64, 16);
    p.post_send({.wr_id = 61, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                 .sg_list = {&s, 1}});
    auto wc = p.wait_wc(2);
    for (const auto& w : wc)
        if (w.status != WcStatus::success) throw std::runtime_error("second client: a WR failed");
    return p.end(0);
}

std::vector<ChildOutcome> run_three(const std::function<int(const PeerConfig&)>& server,
                                    const std::function<int(const PeerConfig&)>& client, const std::string& ready) {
    auto [s, c] = memif_pair();
    auto out = run_roles({{"survivor", [&, s = s] { return server(s); }},
                          {"client", [&, c = c] { return client(c); }, 200ms},
                          {"second client", [&, c = c] { return second_client(c, ready); }, 500ms}},
                         90s);
    std::remove(ready.c_str());
    return out;
}

void check_death(const std::vector<ChildOutcome>& out, int client_exit) {
    for (const auto& o : out) {
        INFO(o.name << " exit=" << o.exit_code << (o.timed_out ? " TIMED OUT" : "") << "\n" << o.report);
        CHECK_FALSE(o.timed_out);
        if (o.name == "client") {
            CHECK(o.exit_code == client_exit);
        } else {
            CHECK(o.exit_code == 0);
            CHECK(o.report.find("pools back to start") != std::string::npos);
        }
    }
}

// A client that dies (SIGKILL) right after its established event.
int killed_after_connect(const PeerConfig& cfg) {
    Peer p(cfg, 4096, kAll);
    p.connect();
    ::raise(SIGKILL);
    return 1;
}

}  // namespace

TEST_CASE("a peer killed while idle: keepalive reports it within idle + probes x interval, receives flushed, "
          "a new connection then works", "[verbs][memif][liveness]") {
    const verbs::Liveness live{.keepalive_idle = 300ms, .keepalive_interval = 200ms, .keepalive_probes = 3,
                               .user_timeout = 1000ms};
    const std::string ready = ready_path();
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.conn.liveness = live;
        p.post_recv(1, 0, 64);
        p.post_recv(2, 64, 64);
        p.serve();
        const auto t0 = Clock::now();  // the client dies right after its established event
        const std::string why = wait_disconnect(p, 5s);
        const long long ms = ms_since(t0);
        mark_ready(ready);
        report("disconnected after " + std::to_string(ms) + " ms: " + why);
        if (why.find("peer not responding") == std::string::npos) throw std::runtime_error("reason: " + why);
        if (ms < 300 || ms > (300 + 3 * 200) * 5 / 4 + 300) throw std::runtime_error("not within the keepalive time");
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("QP not in ERR");
        if (p.qp->terminate_info()) throw std::runtime_error("a TERMINATE recorded: " + p.qp->terminate_info()->describe());
        auto wc = drain_cq(p);
        if (wc.size() != 2) throw std::runtime_error(std::to_string(wc.size()) + " completions, wanted 2");
        Peer::expect(wc[0], WcStatus::wr_flush_err, WcOpcode::recv, 1);
        Peer::expect(wc[1], WcStatus::wr_flush_err, WcOpcode::recv, 2);
        serve_again(p);
        return p.end(0);
    };
    check_death(run_three(server, killed_after_connect, ready), 128 + SIGKILL);
}

TEST_CASE("a peer killed with a READ outstanding: the READ completes (retry_exc_err), not lost",
          "[verbs][memif][liveness]") {
    const verbs::Liveness live{.keepalive_idle = 300ms, .keepalive_interval = 200ms, .keepalive_probes = 3,
                               .user_timeout = 1000ms};
    const std::string ready = ready_path();
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.conn.liveness = live;
        p.serve();
        // The client dies right after its established event: the READ goes out and nothing ever comes back, so
        // the receive half never took it from the tx half (it did so only when bytes arrived: the READ was
        // lost, no completion at all).
        const verbs::Sge s = p.mr->sge(0, 64);
        p.post_send({.wr_id = 7, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}, .rdma = {p.remote.addr, p.remote.rkey}});
        const std::string why = wait_disconnect(p, 5s);
        mark_ready(ready);
        report("disconnected: " + why);
        auto wc = drain_cq(p);
        if (wc.size() != 1) throw std::runtime_error(std::to_string(wc.size()) + " completions, wanted the READ's");
        // The cause, as liveness found the death (the second client, whose stack would reset the connection
        // first, comes only after it: run_three).
        Peer::expect(wc[0], WcStatus::retry_exc_err, WcOpcode::rdma_read, 7);
        serve_again(p);
        return p.end(0);
    };
    check_death(run_three(server, killed_after_connect, ready), 128 + SIGKILL);
}

TEST_CASE("a peer killed in the middle of a transfer: the user timeout ends it, the oldest WR retry_exc_err, "
          "the rest flushed, a new connection then works", "[verbs][memif][liveness]") {
    constexpr std::size_t kChunk = 256 * 1024;
    constexpr int kWrites = 32;
    const verbs::Liveness live{.keepalive_idle = 10s, .keepalive_interval = 1s, .keepalive_probes = 3,
                               .user_timeout = 800ms};
    const std::string ready = ready_path();
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, kChunk * kWrites, kAll);
        p.conn.liveness = live;
        p.serve();
        const verbs::Sge go = p.mr->sge(0, 8);
        p.post_send({.wr_id = 100, .opcode = verbs::WrOpcode::send, .sg_list = {&go, 1}});
        for (int i = 0; i < kWrites; ++i) {
            const verbs::Sge s = p.mr->sge(static_cast<std::size_t>(i) * kChunk, kChunk);
            p.post_send({.wr_id = static_cast<std::uint64_t>(i), .opcode = verbs::WrOpcode::rdma_write,
                         .send_flags = verbs::send_flags::signaled, .sg_list = {&s, 1},
                         .rdma = {p.remote.addr + static_cast<std::uint64_t>(i) * kChunk, p.remote.rkey}});
        }
        const auto t0 = Clock::now();
        const std::string why = wait_disconnect(p, 5s);
        const long long ms = ms_since(t0);
        mark_ready(ready);
        report("disconnected after " + std::to_string(ms) + " ms: " + why);
        if (why.find("unacknowledged") == std::string::npos) throw std::runtime_error("reason: " + why);
        if (ms > 800 + 700) throw std::runtime_error("not within the user timeout");
        auto wc = drain_cq(p);
        // WRITEs complete when framed (as siw): those the dead peer's window took succeeded; the first one
        // still queued is the oldest killed (retry_exc_err), every later one flushed; none missing.
        std::size_t i = 0;
        while (i < wc.size() && wc[i].status == WcStatus::success) ++i;
        report(std::to_string(i) + " WRITEs framed before the death, " + std::to_string(wc.size() - i) + " killed");
        if (wc.size() != kWrites) throw std::runtime_error(std::to_string(wc.size()) + " completions");
        if (i == wc.size()) throw std::runtime_error("nothing was outstanding");
        Peer::expect(wc[i], WcStatus::retry_exc_err, WcOpcode::rdma_write, i);
        for (std::size_t k = i + 1; k < wc.size(); ++k) Peer::expect(wc[k], WcStatus::wr_flush_err, WcOpcode::rdma_write, k);
        serve_again(p);
        return p.end(0);
    };
    auto client = [&](const PeerConfig& cfg) {
        Peer p(cfg, kChunk * kWrites, kAll);
        p.post_recv(1, 0, 8);
        p.connect();
        p.wait_wc(1);  // the server's SEND: its WRITEs are on their way
        ::raise(SIGKILL);
        return 1;
    };
    check_death(run_three(server, client, ready), 128 + SIGKILL);
}

TEST_CASE("a peer that stops answering (SIGSTOP), default liveness: reported within 6 s; resumed, it finds "
          "its connection reset", "[verbs][memif][liveness]") {
    const std::string pid_file = "/tmp/" + unique_name("softrdma-stopped-") + ".pid";
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.post_recv(1, 0, 64);
        p.serve();
        const auto t0 = Clock::now();
        std::string why;
        try {
            why = wait_disconnect(p, 10s);
        } catch (...) {
            why = "(none)";
        }
        const long long ms = ms_since(t0);
        pid_t pid = 0;  // resume the client first, whatever happened
        std::ifstream(pid_file) >> pid;
        if (pid <= 0 || ::kill(pid, SIGCONT) != 0) throw std::runtime_error("cannot resume the client");
        report("disconnected after " + std::to_string(ms) + " ms: " + why);
        if (why.find("peer not responding") == std::string::npos) throw std::runtime_error("reason: " + why);
        const verbs::Liveness d{};
        // lwIP counts keepalive time in its timer's ticks, which run late on a loaded machine: up to a quarter
        // more is allowed.
        const long long bound = (d.keepalive_idle + d.keepalive_probes * d.keepalive_interval).count();
        if (ms < d.keepalive_idle.count() || ms > bound * 5 / 4 + 300) throw std::runtime_error("not within the default time");
        Peer::expect(drain_cq(p).at(0), WcStatus::wr_flush_err, WcOpcode::recv, 1);
        p.ctx->run_until([] { return false; }, 500ms);  // the client reads our reset before the memif goes
        return p.end(0);
    };
    auto client = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.post_recv(2, 0, 64);
        p.connect();
        std::ofstream(pid_file) << ::getpid();
        ::raise(SIGSTOP);
        // Resumed: the survivor reset the connection while we were stopped (or, should the reset not reach
        // us before the survivor's memif went, our own keepalive finds it gone).
        const std::string why = wait_disconnect(p, 8s);
        report("resumed client: " + why);
        Peer::expect(drain_cq(p).at(0), WcStatus::wr_flush_err, WcOpcode::recv, 2);
        return p.end(0);
    };
    auto [s, c] = memif_pair();
    auto out = run_roles({{"survivor", [&, s = s] { return server(s); }},
                          {"client", [&, c = c] { return client(c); }, 200ms}},
                         60s);
    std::remove(pid_file.c_str());
    check_outcomes(out);
}
