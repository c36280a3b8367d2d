// SPDX-License-Identifier: MIT
// The two-process fixture of the verbs suites: one Peer per process (Context, PD, CQ, QP, one MR) over memif,
// connected through the CM, in the threading mode SOFTRDMA_TEST_THREADING names ("rx_thread", else run to
// completion; meson runs each suite once per mode). Every wait is bounded; a child that hangs is killed by
// run_roles at its deadline; every role ends checking that lwIP's pools and DPDK's mempool are back to their
// starting counts (tests/support/tcp_roles.cpp: finish_checks()).
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/checks.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/tcp_roles.hpp"
#include "verbs/engine.hpp"  // white-box: the stack and port behind a Context (impl())
#include <softrdma/diagnostics.hpp>
#include <softrdma/verbs.hpp>

namespace softrdma::test::verbs_fixture {

using namespace std::chrono_literals;
using verbs::WcOpcode;
using verbs::WcStatus;

inline constexpr auto kWait = 10s;

// finish_checks for a role that opened a verbs Context: waits through the Context (with an RX thread, only it
// takes received frames to lwIP).
inline int finish_context(verbs::Context& ctx, const stack::PoolUsage& baseline, int rc) {
    return finish_checks(ctx.impl().stack(), ctx.impl().port(), baseline, rc,
                         [&ctx](const std::function<bool()>& done, std::chrono::milliseconds t) {
                             return ctx.run_until(done, t);
                         });
}

// The threading mode of this run (meson's suites 'verbs' and 'verbs_rx_thread').
inline threading::ThreadingConfig test_threading() {
    threading::ThreadingConfig t;
    const char* m = std::getenv("SOFTRDMA_TEST_THREADING");
    if (m != nullptr && std::string_view(m) == "rx_thread") t.mode = ThreadingMode::rx_thread;
    // Two processes with two threads each on a 2-core machine: an idle RX thread sleeps rather than spin,
    // so the application threads get the cores.
    t.rx_idle = {.spin_turns = 64, .then = IdlePolicy::Then::sleep, .sleep = 50us};
    return t;
}

// TCP checksums on in every Peer made from here on (memif leaves them off by default; both ends must agree):
// set before forking the roles.
inline bool g_checksums_on = false;
inline bool g_checksums_off = false;  // both sides off, whatever the port (set before the pair starts)
// ContextConfig::large_segments for the Peers of the next run (set in the parent before the roles fork);
// the library's default unless a test says otherwise.
inline const bool kDefaultLargeSegments = verbs::ContextConfig{}.large_segments;
inline bool g_large_segments = kDefaultLargeSegments;

// What each side tells the other in its MPA private data: one region.
struct RemoteRegion {
    std::uint64_t addr{0};
    std::uint32_t rkey{0};
    std::uint32_t length{0};
};

inline std::span<const std::byte> as_bytes(const RemoteRegion& r) { return {reinterpret_cast<const std::byte*>(&r), sizeof r}; }
inline RemoteRegion region_from(const PrivateData& pd) {
    RemoteRegion r;
    if (pd.size != sizeof r) throw std::runtime_error("private data of " + std::to_string(pd.size) + " bytes");
    std::memcpy(&r, pd.bytes.data(), sizeof r);
    return r;
}

inline std::string term_str(const TermCode& c) {
    return "layer=" + std::to_string(static_cast<int>(c.layer)) + " etype=" + std::to_string(c.etype) +
           " ecode=" + std::to_string(c.ecode);
}

// A memif client that copies through memif's ring instead of the default zero-copy (cases about what the
// copying client sends from the application's memory: stack::FillBook).
inline PeerConfig memif_copying(PeerConfig cfg) {
    cfg.port.memif_zero_copy = false;
    return cfg;
}

// One side: context, PD, CQ, QP, a buffer registered as one MR.
struct Peer {
    const PeerConfig cfg;  // a copy: callers may pass a temporary (a derived config)
    std::unique_ptr<verbs::Context> ctx;
    stack::PoolUsage baseline;
    std::unique_ptr<verbs::ProtectionDomain> pd;
    std::unique_ptr<verbs::CompletionQueue> cq;
    std::unique_ptr<verbs::QueuePair> qp;
    std::vector<std::byte> buf;
    std::unique_ptr<verbs::MemoryRegion> mr;
    std::unique_ptr<verbs::CmListener> listener;
    std::unique_ptr<verbs::CmId> id;
    bool disconnected = false;
    RemoteRegion remote{};
    // What serve() accepts with / connect() asks for, besides our region as private data. RFC 7306 on: both
    // ends are softrdma (the case without it has its own test).
    verbs::ConnParam conn{.responder_resources = 16, .initiator_depth = 16, .rfc7306 = true};

    Peer(const PeerConfig& c, std::size_t bytes, std::uint32_t access) : cfg(c) {
        verbs::ContextConfig cc;
        cc.port = cfg.port;
        cc.eal = cfg.eal;
        cc.ip = cfg.stack.ip;
        cc.max_mr = 64;
        cc.max_qp = 8;
        if (g_checksums_on) cc.tcp_checksums = verbs::ContextConfig::Checksums::on;
        if (g_checksums_off) cc.tcp_checksums = verbs::ContextConfig::Checksums::off;
        cc.large_segments = g_large_segments;
        // A capture needs run-to-completion mode.
        cc.layer_cycles = cfg.stack.count_cycles;
        if (cfg.port.capture_path.empty()) cc.threading = test_threading();
        ctx = verbs::Context::open(cc);
        baseline = ctx->impl().stack().pool_usage();
        pd = ctx->alloc_pd();
        cq = ctx->create_cq(512);
        qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 128, .max_recv_wr = 128}});
        buf.resize(bytes);
        mr = pd->reg_mr(buf, access);
    }

    RemoteRegion local() const {
        return {mr->addr(), mr->rkey(), static_cast<std::uint32_t>(mr->length())};
    }

    verbs::CmEvent wait_event(verbs::CmEventType want) {
        auto ev = ctx->wait_cm_event(kWait);
        if (!ev) throw std::runtime_error(std::string("no CM event (wanted ") + verbs::to_string(want) + ")");
        if (ev->type == verbs::CmEventType::disconnected) disconnected = true;
        if (ev->type != want)
            throw std::runtime_error(std::string("CM event ") + verbs::to_string(ev->type) + " (" + ev->reason +
                                     "), wanted " + verbs::to_string(want));
        return std::move(*ev);
    }

    // Server: listen, take the request, accept with our region (or `advert`) in the private data.
    void serve(std::optional<RemoteRegion> advert = std::nullopt) {
        listener = ctx->listen(cfg.tcp_port);
        auto ev = wait_event(verbs::CmEventType::connect_request);
        remote = region_from(ev.private_data);
        id = std::move(ev.request);
        const RemoteRegion me = advert.value_or(local());
        verbs::ConnParam cp = conn;
        cp.private_data = as_bytes(me);
        if (!id->accept(*qp, cp)) throw std::runtime_error("accept refused");
        wait_event(verbs::CmEventType::established);
    }
    // Client: connect with our region, wait for established, read the server's region.
    void connect(bool p2p = false, CrcPolicy crc = CrcPolicy::off) {
        const RemoteRegion me = local();
        verbs::ConnParam cp = conn;
        cp.private_data = as_bytes(me);
        cp.peer_to_peer = p2p;
        cp.crc = crc;
        id = ctx->connect(cfg.peer, cfg.tcp_port, *qp, cp);
        auto ev = wait_event(verbs::CmEventType::established);
        remote = region_from(ev.private_data);
    }

    void post_recv(std::uint64_t wr_id, std::size_t offset, std::uint32_t len) {
        const verbs::Sge sge = mr->sge(offset, len);
        const verbs::RecvWr wr{.wr_id = wr_id, .sg_list = {&sge, 1}};
        const auto r = qp->post_recv({&wr, 1});
        if (!r.ok()) throw std::runtime_error(std::string("post_recv: ") + verbs::to_string(r.err));
    }
    void post_send(const verbs::SendWr& wr) {
        const auto r = qp->post_send({&wr, 1});
        if (!r.ok()) throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
    }

    // Polls until n completions or the time limit; throws on a short count.
    std::vector<verbs::WorkCompletion> wait_wc(std::size_t n, std::chrono::milliseconds limit = kWait) {
        std::vector<verbs::WorkCompletion> out;
        std::array<verbs::WorkCompletion, 16> batch;
        ctx->run_until(
            [&] {
                const std::size_t k = cq->poll(std::span(batch).first(std::min(batch.size(), n - out.size())));
                out.insert(out.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(k));
                return out.size() >= n;
            },
            limit);
        if (out.size() < n)
            throw std::runtime_error("completions: " + std::to_string(out.size()) + " of " + std::to_string(n) +
                                     ", QP " + verbs::to_string(qp->state()));
        return out;
    }
    static void expect(const verbs::WorkCompletion& wc, WcStatus st, WcOpcode op, std::uint64_t wr_id) {
        if (wc.status != st || wc.opcode != op || wc.wr_id != wr_id)
            throw std::runtime_error("completion wr_id " + std::to_string(wc.wr_id) + " status " +
                                     verbs::to_string(wc.status) + " opcode " + std::to_string(static_cast<int>(wc.opcode)) +
                                     ", wanted wr_id " + std::to_string(wr_id) + " " + verbs::to_string(st) +
                                     " opcode " + std::to_string(static_cast<int>(op)));
    }

    // Orderly end, then the pool check. Waits (bounded) for the disconnected event.
    // overruns_expected: a case that overran its CQ on purpose (and checked the count itself).
    int end(int rc, bool overruns_expected = false) {
        if (id && !disconnected) {
            id->disconnect();
            ctx->run_until([&] {
                while (auto ev = ctx->get_cm_event())
                    if (ev->type == verbs::CmEventType::disconnected) disconnected = true;
                return disconnected;
            }, kWait);
        }
        ctx->run_until([] { return false; }, 50ms);  // the peer's FIN and our last ACKs
        if (cq->overruns() != 0 && !overruns_expected) {
            report("CQ overruns: " + std::to_string(cq->overruns()));
            rc = rc == 0 ? 4 : rc;
        }
        id.reset();
        listener.reset();
        qp.reset();
        mr.reset();
        return finish_context(*ctx, baseline, rc);
    }
};

inline std::vector<ChildOutcome> run_pair(const std::function<int(const PeerConfig&)>& server,
                                   const std::function<int(const PeerConfig&)>& client) {
    auto [s, c] = memif_pair();
    return run_roles({{"server", [&, s = s] { return server(s); }},
                      {"client", [&, c = c] { return client(c); }, 200ms}},
                     90s);
}

inline constexpr std::uint32_t kAll = verbs::access::local_write | verbs::access::remote_write |
                               verbs::access::remote_read | verbs::access::remote_atomic;

// Cases with QPs of their own besides the Peer's: disconnects every id, waits (bounded) for their disconnected
// events and the last ACKs, and drops the ids.
inline void disconnect_all(verbs::Context& ctx, std::vector<std::unique_ptr<verbs::CmId>>& ids) {
    for (auto& id : ids) id->disconnect();
    std::size_t down = 0;
    ctx.run_until([&] {
        while (auto ev = ctx.get_cm_event())
            if (ev->type == verbs::CmEventType::disconnected) ++down;
        return down >= ids.size();
    }, kWait);
    ctx.run_until([] { return false; }, 50ms);
    ids.clear();
}

// Throws naming the first WR that did not succeed.
inline void expect_ok(const std::vector<verbs::WorkCompletion>& wcs) {
    for (const auto& w : wcs)
        if (w.status != WcStatus::success)
            throw std::runtime_error("WR " + std::to_string(w.wr_id) + ": " + verbs::to_string(w.status));
}

}  // namespace softrdma::test::verbs_fixture
