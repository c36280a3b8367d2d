// SPDX-License-Identifier: MIT
// A bad link (io fault injection, PortConfig::faults): 1 % of the frames in each direction dropped, 1 %
// duplicated, 1 % reordered, 1 % delayed, 1 % corrupted, under a mix of WRITE, READ and SEND with every byte
// checked. Nothing may be lost or corrupted and every work request must complete successfully: TCP repairs
// the losses (the checksums, on with faults, catch the corruption). Both threading modes (the fixture).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "tests/verbs/fixture.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

namespace {

constexpr std::size_t kRegion = 4u << 20;   // WRITE and READ size per round
constexpr std::size_t kSend = 64u << 10;    // SEND size
constexpr int kSends = 16;                  // per round
// Layout of each side's buffer: [write area][read area][send area][control]
constexpr std::size_t kWriteAt = 0, kReadAt = kRegion, kSendAt = 2 * kRegion, kCtlAt = kSendAt + kSends * kSend;
constexpr std::size_t kBytes = kCtlAt + 64;
// Recovering from a loss can take TCP several retransmission timeouts (lwIP has no SACK).
constexpr std::chrono::milliseconds kLong{60000};

// `mib` (SOFTRDMA_FAULT_TEST_MIB: more by hand, less in scripts/test's sanitizer pass).
std::uint64_t total_mib(std::uint64_t mib) {
    const char* e = std::getenv("SOFTRDMA_FAULT_TEST_MIB");
    return e != nullptr ? std::min<std::uint64_t>(mib, std::strtoull(e, nullptr, 10)) : mib;
}
int rounds(std::uint64_t mib) {
    const std::uint64_t per_round = (2 * kRegion + kSends * kSend) >> 20;  // 9 MiB
    return static_cast<int>((total_mib(mib) + per_round - 1) / per_round);
}

std::string faults_line(const char* dir, const FaultCounters& f) {
    return std::string(dir) + " dropped " + std::to_string(f.dropped) + " duplicated " + std::to_string(f.duplicated) +
           " reordered " + std::to_string(f.reordered) + " delayed " + std::to_string(f.delayed) + " corrupted " +
           std::to_string(f.corrupted);
}

// The run: `mib` of the mix at `mtu`; `zero_copy`: the client must have sent from TX chunks (io/tx_arena.hpp).
// The segments are large (ContextConfig::large_segments: 64 KiB frames dropped, duplicated, reordered, delayed
// and corrupted whole), in both threading modes.
void run_faults(std::uint64_t mib, std::uint16_t mtu, bool zero_copy) {
    const int n = rounds(mib);
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, kBytes, kAll);
        // A round's receives are posted before the client may send them (the previous round's word).
        auto post_round = [&p] {
            for (int i = 0; i < kSends; ++i) p.post_recv(100 + i, kSendAt + i * kSend, kSend);
            p.post_recv(99, kCtlAt, 8);
        };
        post_round();
        p.serve();
        for (int r = 0; r < n; ++r) {
            // The client's WRITE, then its SENDs; the control SEND says the WRITE has landed (DDP in order).
            auto wc = p.wait_wc(kSends + 1, kLong);
            expect_ok(wc);
            if (check_pattern(3 * r, 0, std::span(p.buf).subspan(kWriteAt, kRegion)) >= 0)
                throw std::runtime_error("round " + std::to_string(r) + ": WRITE content");
            if (check_pattern(3 * r + 1, 0, std::span(p.buf).subspan(kSendAt, kSends * kSend)) >= 0)
                throw std::runtime_error("round " + std::to_string(r) + ": SEND content");
            // The READ area for the client, then word that it is ready.
            fill_pattern(3 * r + 2, 0, std::span(p.buf).subspan(kReadAt, kRegion));
            if (r + 1 < n) post_round();
            else p.post_recv(98, kCtlAt, 8);  // the client's last word: it has read everything
            const verbs::Sge s = p.mr->sge(kCtlAt + 8, 8);
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&s, 1}});
            expect_ok(p.wait_wc(1, kLong));
        }
        expect_ok(p.wait_wc(1, kLong));
        return p.end(0);
    };
    auto client = [&](const PeerConfig& base) {
        PeerConfig cfg = base;
        // Every frame crosses this side's port once: TX for what we send, RX for what we receive.
        cfg.port.faults.rx = cfg.port.faults.tx = {.drop = 0.01, .duplicate = 0.01, .reorder = 0.01, .delay = 0.01,
                                                   .corrupt = 0.01};
        cfg.port.faults.seed = 12345;
        Peer p(cfg, kBytes, kAll);
        p.connect();
        if (!p.ctx->impl().port().faults_on()) throw std::runtime_error("fault injection is off");
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < n; ++r) {
            p.post_recv(1, kCtlAt + 8, 8);  // the server's "READ area ready"
            fill_pattern(3 * r, 0, std::span(p.buf).subspan(kWriteAt, kRegion));
            fill_pattern(3 * r + 1, 0, std::span(p.buf).subspan(kSendAt, kSends * kSend));
            const verbs::Sge w = p.mr->sge(kWriteAt, kRegion);
            p.post_send({.wr_id = 10, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&w, 1}, .rdma = {p.remote.addr + kWriteAt, p.remote.rkey}});
            for (int i = 0; i < kSends; ++i) {
                const verbs::Sge s = p.mr->sge(kSendAt + i * kSend, kSend);
                p.post_send({.wr_id = static_cast<std::uint64_t>(20 + i), .opcode = verbs::WrOpcode::send,
                             .send_flags = verbs::send_flags::signaled, .sg_list = {&s, 1}});
            }
            const verbs::Sge c = p.mr->sge(kCtlAt, 8);
            p.post_send({.wr_id = 11, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&c, 1}});
            expect_ok(p.wait_wc(kSends + 3, kLong));  // WRITE, SENDs, control, and the server's word
            const verbs::Sge rd = p.mr->sge(kReadAt, kRegion);
            p.post_send({.wr_id = 12, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&rd, 1}, .rdma = {p.remote.addr + kReadAt, p.remote.rkey}});
            expect_ok(p.wait_wc(1, kLong));
            if (check_pattern(3 * r + 2, 0, std::span(p.buf).subspan(kReadAt, kRegion)) >= 0)
                throw std::runtime_error("round " + std::to_string(r) + ": READ content");
        }
        const verbs::Sge c = p.mr->sge(kCtlAt, 8);
        p.post_send({.wr_id = 13, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&c, 1}});
        expect_ok(p.wait_wc(1, kLong));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const auto rx = p.ctx->impl().port().rx_fault_counters(), tx = p.ctx->impl().port().tx_fault_counters();
        report(std::to_string(n) + " rounds, " + std::to_string(n * 9) + " MiB checked in " + std::to_string(secs) +
               " s; " + faults_line("rx", rx) + "; " + faults_line("tx", tx));
        for (const FaultCounters& f : {rx, tx})
            if (f.dropped == 0 || f.duplicated == 0 || f.reordered == 0 || f.delayed == 0 || f.corrupted == 0)
                throw std::runtime_error("a fault was never injected");
        const io::TxArena* arena = p.ctx->impl().port().tx_arena();
        const std::uint64_t chunks = arena != nullptr ? arena->acquired() : 0;
        if (zero_copy && chunks == 0) throw std::runtime_error("no TX chunk was used: zero-copy transmit was off");
        return p.end(0);  // the pools, TX chunks included, back to their start
    };
    g_checksums_on = true;  // the server too: a corrupted frame must be caught either way
    g_large_segments = true;
    auto [s, c] = memif_pair(mtu);
    const LossyLink lossy;  // the server's TIME_WAIT answers the client's resent FIN too
    const auto out = run_roles({{"server", [&, s = s] { return server(s); }},
                                {"client", [&, c = c] { return client(c); }, 200ms}},
                               240s);
    g_checksums_on = false;
    g_large_segments = kDefaultLargeSegments;
    check_outcomes(out);
    for (const auto& o : out) WARN(o.name << ": " << o.report);
}

}  // namespace

TEST_CASE("1 % of every fault in both directions over 256 MiB of WRITE, READ and SEND: every byte arrives, "
          "every WR succeeds", "[verbs][memif][faults][tsan-slow]") {
    run_faults(256, 1500, true);
}

// Jumbo frames, zero-copy transmit in both modes (FPDUs framed in TX chunks; each frame a header mbuf and the
// chunk's bytes; retransmissions read the same chunk bytes, corruption happens in a copy of the frame); large
// segments in both modes.
TEST_CASE("MTU 9000: 1 % of every fault in both directions over 72 MiB of WRITE, READ and SEND",
          "[verbs][memif][faults][tsan-slow]") {
    run_faults(72, 9000, true);
}
