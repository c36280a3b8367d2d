// SPDX-License-Identifier: MIT
// A lone message goes out straight from registered memory (stack::Stack::defer_fill, run to completion over
// memif): each frame takes the payload from the application's buffer and the TX chunk is filled after the send,
// so lwIP can resend from the chunk. The server's port drops 3 % of what it receives, so TCP resends; the client
// overwrites each WRITE's source as soon as the WRITE completes (before the peer has acknowledged it), so a
// resend that read the application's buffer, or a chunk left unfilled, shows as wrong bytes at the server. The
// sizes cover an FPDU in three gathered pieces, odd lengths, and a message larger than the send buffer (its
// tail framed after the first part was acknowledged, from a chunk filled before lwIP sent it). READ responses
// go the same way (the client answers the server's READs).
#include <catch2/catch.hpp>

#include <cstring>
#include <stdexcept>

#include "tests/verbs/fixture.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

namespace {

constexpr std::size_t kSizes[] = {4096, 100001, 65536, 131075, (1u << 20) + 7};
constexpr std::size_t kMax = 2u << 20;
// Each side's buffer: [WRITE source / target][READ source / sink][control]
constexpr std::size_t kWriteAt = 0, kReadAt = kMax, kCtlAt = 2 * kMax, kBytes = kCtlAt + 64;
constexpr int kRounds = 25;
constexpr std::chrono::milliseconds kLong{30000};

void expect_ok(const std::vector<verbs::WorkCompletion>& wcs) {
    for (const auto& w : wcs)
        if (w.status != WcStatus::success)
            throw std::runtime_error("WR " + std::to_string(w.wr_id) + ": " + verbs::to_string(w.status));
}

}  // namespace

TEST_CASE("a lone message is sent from registered memory, resent from the TX chunk: every byte arrives",
          "[verbs][memif][faults][tsan-slow]") {
    auto server = [](const PeerConfig& base) {
        PeerConfig cfg = base;
        cfg.port.faults.rx = {.drop = 0.03};
        cfg.port.faults.seed = 4242;
        Peer p(cfg, kBytes, kAll);
        p.post_recv(1, kCtlAt, 8);
        p.serve();
        for (int r = 0; r < kRounds; ++r) {
            const std::size_t len = kSizes[r % std::size(kSizes)];
            expect_ok(p.wait_wc(1, kLong));  // the client's word: its WRITE is in (DDP keeps order)
            if (const auto bad = check_pattern(2 * r, 0, std::span(p.buf).subspan(kWriteAt, len)); bad >= 0)
                throw std::runtime_error("round " + std::to_string(r) + ": WRITE of " + std::to_string(len) +
                                         " bytes differs at " + std::to_string(bad));
            const verbs::Sge rd = p.mr->sge(kReadAt, static_cast<std::uint32_t>(len));
            p.post_send({.wr_id = 10, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&rd, 1}, .rdma = {p.remote.addr + kReadAt, p.remote.rkey}});
            expect_ok(p.wait_wc(1, kLong));
            if (const auto bad = check_pattern(2 * r + 1, 0, std::span(p.buf).subspan(kReadAt, len)); bad >= 0)
                throw std::runtime_error("round " + std::to_string(r) + ": READ of " + std::to_string(len) +
                                         " bytes differs at " + std::to_string(bad));
            std::memset(p.buf.data(), 0, 2 * kMax);
            p.post_recv(1, kCtlAt, 8);
            const verbs::Sge s = p.mr->sge(kCtlAt + 8, 8);
            p.post_send({.wr_id = 11, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&s, 1}});
            expect_ok(p.wait_wc(1, kLong));
        }
        const FaultCounters f = p.ctx->impl().port().rx_fault_counters();
        report("dropped " + std::to_string(f.dropped) + " received frames");
        if (f.dropped == 0) throw std::runtime_error("no frame was dropped");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, kBytes, kAll);
        p.connect();
        std::uint64_t payload = 0;
        for (int r = 0; r < kRounds; ++r) {
            const std::size_t len = kSizes[r % std::size(kSizes)];
            payload += 2 * len;
            p.post_recv(2, kCtlAt + 8, 8);
            fill_pattern(2 * r, 0, std::span(p.buf).subspan(kWriteAt, len));
            fill_pattern(2 * r + 1, 0, std::span(p.buf).subspan(kReadAt, len));
            // Three pieces, cut at odd places: FPDUs gathering from two or three.
            const auto a = static_cast<std::uint32_t>(len / 3 + 1), b = static_cast<std::uint32_t>(2 * len / 3 + 3);
            const verbs::Sge w[3] = {p.mr->sge(kWriteAt, a), p.mr->sge(kWriteAt + a, b - a),
                                     p.mr->sge(kWriteAt + b, static_cast<std::uint32_t>(len - b))};
            p.post_send({.wr_id = 20, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {w, 3}, .rdma = {p.remote.addr + kWriteAt, p.remote.rkey}});
            expect_ok(p.wait_wc(1, kLong));
            std::memset(p.buf.data() + kWriteAt, 0xAB, len);  // completed: ours again, acknowledged or not
            const verbs::Sge c = p.mr->sge(kCtlAt, 8);
            p.post_send({.wr_id = 21, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&c, 1}});
            expect_ok(p.wait_wc(2, kLong));  // our word, and the server's: it has checked and read
        }
        const StackCounters sc = verbs::diagnostics::stack(*p.ctx);
        report("sent from the source " + std::to_string(sc.tx_from_source) + " of " + std::to_string(payload) +
               " payload bytes");
        // Run to completion over memif: framed in place, so lone messages go from the source; with the RX thread
        // segments are MTU-sized and copied (nothing framed in place at MTU 1500).
        if (test_threading().mode == ThreadingMode::run_to_completion ? sc.tx_from_source < payload / 4
                                                                      : sc.tx_from_source != 0)
            throw std::runtime_error("sent from the source: " + std::to_string(sc.tx_from_source) + " bytes");
        return p.end(0);
    };
    auto [s, c] = memif_pair();
    g_checksums_off = true;  // the server's drops make its checksums automatic-on; nothing here corrupts
    const auto out = run_roles({{"server", [&, s = s] { return server(s); }},
                                {"client", [&, c = c] { return client(c); }, 200ms}},
                               180s);
    g_checksums_off = false;
    check_outcomes(out);
    for (const auto& o : out) WARN(o.name << ": " << o.report);
}
