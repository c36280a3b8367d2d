// SPDX-License-Identifier: MIT
// Payload goes out straight from registered memory (stack::Stack::defer_fill, stack::FillBook; run to completion
// over memif, the client copying through memif's ring: a zero-copy client frames into TX chunks): each frame,
// first send or resend, takes it from the application's buffer, and the TX chunk gets it only if the buffer's
// loan ends before the peer acknowledges it.
// First case, lone messages: the server's port drops 3 % of what it receives, so TCP resends; the client
// overwrites each WRITE's source as soon as its completion is polled (before the peer has acknowledged it), so
// a resend that read the overwritten buffer, or a chunk left unfilled, shows as wrong bytes at the server. The
// sizes cover an FPDU in three gathered pieces, odd lengths, and a message larger than the send buffer (its
// tail framed after the first part was acknowledged). READ responses go the same way (the client answers the
// server's READs).
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

// The server of both cases: its port drops 3 % of what it receives (seeded), so TCP resends.
PeerConfig dropping(const PeerConfig& base, std::uint64_t seed) {
    PeerConfig cfg = base;
    cfg.port.faults.rx = {.drop = 0.03};
    cfg.port.faults.seed = seed;
    return cfg;
}

// Ends the server: some frame must have been dropped, or the case tested no resend.
int end_dropping(Peer& p) {
    const FaultCounters f = p.ctx->impl().port().rx_fault_counters();
    report("dropped " + std::to_string(f.dropped) + " received frames");
    if (f.dropped == 0) throw std::runtime_error("no frame was dropped");
    return p.end(0);
}

// Runs the two roles over a memif pair, TCP checksums off on both (the server's drops make its checksums
// automatic-on; nothing here corrupts).
template <class Server, class Client>
void run_with_drops(Server server, Client client) {
    auto [s, c] = memif_pair();
    g_checksums_off = true;
    const LossyLink lossy;  // the client's TIME_WAIT answers the server's resent FIN too
    const auto out = run_roles({{"server", [&, s = s] { return server(s); }},
                                {"client", [&, c = c] { return client(c); }, 200ms}},
                               180s);
    g_checksums_off = false;
    check_outcomes(out);
    for (const auto& o : out) WARN(o.name << ": " << o.report);
}

}  // namespace

TEST_CASE("a lone message is sent and resent from registered memory through 3 % drops, every byte checked",
          "[verbs][memif][faults][tsan-slow]") {
    auto server = [](const PeerConfig& base) {
        Peer p(dropping(base, 4242), kBytes, kAll);
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
        return end_dropping(p);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(memif_copying(cfg), kBytes, kAll);
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
        // Over memif (large segments in either threading mode): framed in place, so lone messages go from the
        // source.
        if (sc.tx_from_source < payload / 4)
            throw std::runtime_error("sent from the source: " + std::to_string(sc.tx_from_source) + " bytes");
        return p.end(0);
    };
    run_with_drops(server, client);
}

// A stream goes out from registered memory too, and its sources are lent until the application can take them
// back (stack::FillBook): the client posts groups of WRITEs back to back (unsignaled but the last), with 3 % of
// the server's received frames dropped so TCP resends long after the first send; the moment a group's
// completion is polled it overwrites every source of the group (the completion must have settled what the peer
// had not acknowledged into the TX chunks). In each group one WRITE comes from a second MR that is
// deregistered as soon as the completion is queued, before it is polled, and its buffer overwritten at once
// (deregistration settles); then a burst of inline WRITEs on a 16-deep send queue, so each slot's inline
// buffer is written again while its earlier bytes may still be unacknowledged (inline payload is copied at
// framing, never sent from the slot). Every byte is checked at the server. Checked by hand: fails with the
// poll's settle removed (2 of 2 runs), the deregistration's (2 of 2), or inline payload deferred (4 of 4).
namespace {

constexpr std::size_t kSlot = 64 * 1024 + 5;            // odd: FPDUs not aligned to the slots
constexpr std::size_t kSlots = 24;                      // one group: ~1.5 MiB, six send buffers
constexpr std::size_t kInline = 3000;                   // an inline WRITE's length (above DeferringFramer::kDeferMin)
constexpr std::size_t kInlines = 64;                    // inline WRITEs a group, after the slots
constexpr std::size_t kInlineAt = (kSlots + 1) * kSlot; // where they land
constexpr std::size_t kCtl = kInlineAt + kInlines * kInline;  // the control word
constexpr std::size_t kStreamBytes = kCtl + 64;
constexpr int kGroups = 16;
// Slot s of group g carries pattern seed g * 1000 + s (slot kSlots is the second MR's); inline j, g * 1000 + 100 + j.
std::uint64_t seed(int g, std::size_t s) { return static_cast<std::uint64_t>(g) * 1000 + s; }

}  // namespace

TEST_CASE("a stream is sent from registered memory, lent until its completion is polled, every byte checked",
          "[verbs][memif][faults][tsan-slow]") {
    auto server = [](const PeerConfig& base) {
        Peer p(dropping(base, 777), kStreamBytes, kAll);
        p.post_recv(1, kCtl, 8);
        p.serve();
        for (int g = 0; g < kGroups; ++g) {
            expect_ok(p.wait_wc(1, kLong));  // the client's word: its group is in (DDP keeps order)
            for (std::size_t s = 0; s < kSlots + 1 + kInlines; ++s) {
                const bool in = s > kSlots;
                const std::size_t at = in ? kInlineAt + (s - kSlots - 1) * kInline : s * kSlot;
                const std::uint64_t sd = in ? seed(g, 100 + (s - kSlots - 1)) : seed(g, s);
                if (const auto bad = check_pattern(sd, 0, std::span(p.buf).subspan(at, in ? kInline : kSlot)); bad >= 0)
                    throw std::runtime_error("group " + std::to_string(g) + " slot " + std::to_string(s) +
                                             ": differs at byte " + std::to_string(bad));
            }
            std::memset(p.buf.data(), 0, kCtl);
            p.post_recv(1, kCtl, 8);
            const verbs::Sge c = p.mr->sge(kCtl, 8);
            p.post_send({.wr_id = 11, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&c, 1}});
            expect_ok(p.wait_wc(1, kLong));
        }
        return end_dropping(p);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(memif_copying(cfg), kStreamBytes, kAll);
        // Inline WRITEs of kInline bytes: a QP that takes them.
        verbs::QpCap cap;
        cap.max_send_wr = 16;  // inline buffers reused within the unacknowledged window
        cap.max_recv_wr = 128;
        cap.max_inline_data = static_cast<std::uint32_t>(kInline);
        p.qp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get(), .cap = cap});
        p.connect();
        std::vector<std::byte> other(kSlot);
        std::vector<std::byte> inline_src(kInline);
        std::uint64_t payload = 0;
        for (int g = 0; g < kGroups; ++g) {
            p.post_recv(2, kCtl, 8);
            for (std::size_t s = 0; s < kSlots; ++s) fill_pattern(seed(g, s), 0, std::span(p.buf).subspan(s * kSlot, kSlot));
            fill_pattern(seed(g, kSlots), 0, std::span(other));
            auto mr2 = p.pd->reg_mr(other, verbs::access::local_write);
            // The second MR's WRITE first, signaled: its completion is queued long before the group's ends.
            const verbs::Sge o = mr2->sge(0, static_cast<std::uint32_t>(kSlot));
            p.post_send({.wr_id = 30, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&o, 1}, .rdma = {p.remote.addr + kSlots * kSlot, p.remote.rkey}});
            if (!p.ctx->run_until([&] { return p.cq->size() > 0; }, kLong))
                throw std::runtime_error("group " + std::to_string(g) + ": no completion for the second MR's WRITE");
            mr2.reset();                                           // deregistered, its completion not polled yet
            std::memset(other.data(), 0xCD, other.size());          // and its memory the application's again
            // Posts `wr`, waiting for a free send-queue slot (unsignaled WRs give theirs back as they are sent).
            auto post = [&](const verbs::SendWr& wr) {
                for (const auto t0 = std::chrono::steady_clock::now();;) {
                    const auto r = p.qp->post_send({&wr, 1});
                    if (r.ok()) return;
                    if (r.err != verbs::PostErrc::queue_full || std::chrono::steady_clock::now() - t0 > kLong)
                        throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
                    p.ctx->poll();
                }
            };
            for (std::size_t s = 0; s < kSlots; ++s) {
                const verbs::Sge w = p.mr->sge(s * kSlot, static_cast<std::uint32_t>(kSlot));
                post({.wr_id = 40 + s, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&w, 1},
                      .rdma = {p.remote.addr + s * kSlot, p.remote.rkey}});
            }
            for (std::size_t j = 0; j < kInlines; ++j) {  // copied into the slot's buffer at post time
                fill_pattern(seed(g, 100 + j), 0, std::span(inline_src));
                const verbs::Sge i{.addr = reinterpret_cast<std::uint64_t>(inline_src.data()),
                                   .length = static_cast<std::uint32_t>(kInline), .lkey = 0};
                post({.wr_id = 90, .opcode = verbs::WrOpcode::rdma_write,
                      .send_flags = verbs::send_flags::inline_data |
                                    (j + 1 == kInlines ? verbs::send_flags::signaled : 0u),
                      .sg_list = {&i, 1}, .rdma = {p.remote.addr + kInlineAt + j * kInline, p.remote.rkey}});
            }
            expect_ok(p.wait_wc(2, kLong));  // the second MR's WRITE and the group's last
            std::memset(p.buf.data(), 0xAB, kSlots * kSlot);  // completed: every source is ours again
            payload += (kSlots + 1) * kSlot + kInlines * kInline;
            const verbs::Sge c = p.mr->sge(kCtl, 8);
            p.post_send({.wr_id = 21, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&c, 1}});
            expect_ok(p.wait_wc(2, kLong));  // our word, and the server's: it has checked the group
        }
        const StackCounters sc = verbs::diagnostics::stack(*p.ctx);
        report("framed without payload " + std::to_string(sc.tx_fill_deferred) + " of " + std::to_string(payload) +
               " payload bytes, copied into TX chunks later " + std::to_string(sc.tx_fill_copied));
        // Most of a stream is acknowledged before its sources' loan ends: never copied on our side (both
        // threading modes).
        if (sc.tx_fill_deferred < payload / 2 || sc.tx_fill_copied > sc.tx_fill_deferred / 2)
            throw std::runtime_error("deferred " + std::to_string(sc.tx_fill_deferred) + ", copied " +
                                     std::to_string(sc.tx_fill_copied));
        return p.end(0);
    };
    run_with_drops(server, client);
}
