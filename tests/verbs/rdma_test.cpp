// SPDX-License-Identifier: MIT
// verbs between two processes over memif (the fixture: tests/verbs/fixture.hpp; every case runs in both threading
// modes). RDMA WRITE and READ, RFC 7306 immediate data and atomics, a 1 GiB transfer, and whole FPDUs per TCP
// segment on the wire.
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


TEST_CASE("WRITE then verify, READ into a multi-SGE sink (MPA CRC off and required)", "[verbs][memif]") {
    constexpr std::uint32_t kBytes = 256 << 10;
    const CrcPolicy crc = GENERATE(CrcPolicy::off, CrcPolicy::required);
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

TEST_CASE("1 GiB of WRITEs with content check", "[verbs][memif]") {
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
        const verbs::RxCopyStats cs = verbs::diagnostics::rx_copies(*p.ctx);
        if (cs.payload_bytes < (std::uint64_t{1} << 30))
            throw std::runtime_error("only " + std::to_string(cs.payload_bytes) + " payload bytes counted");
        const double copies = cs.copies_per_payload_byte();
        if (copies < 1.0 || copies > 1.0001)
            throw std::runtime_error("copies per payload byte " + std::to_string(copies) + ", want 1");
        if (const auto rc = verbs::diagnostics::rx_thread(*p.ctx); rc && rc->tcp_payload_placed < (std::uint64_t{1} << 30))
            throw std::runtime_error("the RX thread placed only " + std::to_string(rc->tcp_payload_placed) + " bytes");
        report("1 GiB verified; copies per payload byte " + std::to_string(copies));
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(memif_copying(cfg), kRegion, verbs::access::local_write);
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
        // Copies on the transmit path per payload byte (TxCopyStats). Run to completion, large segments (the
        // default) frame in place in TX chunks, and over memif without CRC (the client copying through memif's
        // ring, not zero-copy: memif_copying) the FPDUs are framed without their
        // payload, which each frame takes from the source (stack::FillBook): a byte is copied into its chunk only
        // if unacknowledged when the round's completion is polled (the last of its 4 MiB: well under a quarter;
        // lwIP copies the MPA request, a few dozen bytes). The same with an RX thread (large segments and the
        // transmit path are the application thread's in both modes).
        const verbs::TxCopyStats ts = verbs::diagnostics::tx_copies(*p.ctx);
        const StackCounters sc = verbs::diagnostics::stack(*p.ctx);
        const double tx = ts.copies_per_payload_byte();
        if (ts.payload_bytes < (std::uint64_t{1} << 30) || tx > 0.25 || sc.tx_fill_deferred < ts.payload_bytes * 9 / 10)
            throw std::runtime_error("TX: " + std::to_string(ts.payload_bytes) + " payload bytes framed (" +
                                     std::to_string(sc.tx_fill_deferred) + " without payload), " + std::to_string(tx) +
                                     " copies per payload byte, want under 0.25");
        report("MBps=" + std::to_string(1024.0 * (1 << 20) / secs / 1e6) + "; TX copies per payload byte " +
               std::to_string(ts.copies_per_payload_byte()) + " (in " + std::to_string(sc.tx_copied_in) + ", out " +
               std::to_string(sc.tx_copied_out) + ", framed " + std::to_string(ts.payload_bytes) + ")");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

namespace {

// Runs the FPDU-alignment exchange below with ContextConfig::large_segments = `large` and walks the client's
// capture; returns (data segments, FPDUs, segments not whole FPDUs, largest FPDU).
struct SegmentWalk {
    std::size_t segments = 0, fpdus = 0, cut = 0, largest_fpdu = 0;
};
SegmentWalk walk_fpdu_exchange(bool large) {
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
    g_large_segments = large;
    const auto outcome = run_pair(server, client);
    g_large_segments = kDefaultLargeSegments;
    check_outcomes(outcome);

    // Walk every TCP segment with payload: after each direction's first one (the MPA Request / Reply), a
    // segment must hold whole FPDUs: its length fields chain exactly to its end.
    const auto frames = wire::read_capture(pcap);
    std::filesystem::remove(pcap);
    std::map<std::uint16_t, int> seen;  // source port -> data segments so far
    SegmentWalk w;
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
        ++w.segments;
        const std::uint8_t* pl = b.data() + tcp + doff;
        std::size_t off = 0;
        while (off + 2 <= len) {
            const std::size_t fpdu = mpa::fpdu_size_unmarked((pl[off] << 8) | pl[off + 1]);
            w.largest_fpdu = std::max(w.largest_fpdu, fpdu);
            off += fpdu;
            ++w.fpdus;
        }
        if (off != len) ++w.cut;
    }
    return w;
}

}  // namespace
TEST_CASE("every TCP segment carries whole FPDUs (client capture, both directions)", "[verbs][memif]") {
    // MTU-sized segments (large segments off): one batch of FPDUs per segment.
    const SegmentWalk w = walk_fpdu_exchange(false);
    INFO(w.segments << " data segments, " << w.fpdus << " FPDUs, " << w.cut << " segments not whole FPDUs");
    CHECK(w.segments > 400);
    CHECK(w.cut == 0);
    CHECK(w.largest_fpdu <= 1460);
}

TEST_CASE("large segments: up to 64 KiB of whole FPDUs per segment, FPDUs of up to 32672 bytes",
          "[verbs][memif]") {
    const SegmentWalk w = walk_fpdu_exchange(true);
    INFO(w.segments << " data segments, " << w.fpdus << " FPDUs, " << w.cut << " segments not whole FPDUs, largest FPDU "
                    << w.largest_fpdu);
    CHECK(w.cut == 0);
    // Both modes (the server has no capture, so in the RX-thread suite it runs with an RX thread, which takes
    // large segments too): MULPDU from half the segment (verbs/qp_tx.hpp, TxHalf::fpdu_limit): two FPDUs of
    // up to 32672 bytes per 64 KiB segment (a quiet link's first batch: one), far fewer than at 1460 bytes.
    CHECK(w.largest_fpdu > 8960);
    CHECK(w.largest_fpdu <= 32672);
    CHECK(w.fpdus >= w.segments);
    CHECK(w.segments > 40);
}
