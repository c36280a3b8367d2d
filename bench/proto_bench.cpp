// SPDX-License-Identifier: MIT
// proto_bench: the protocol layers on bytes, one core, no I/O.
//
//  (a) RX of 64 KiB RDMA WRITEs: an FPDU stream built by rdmap::Endpoint over mpa::FpduTx (CRC on, EMSS 1448
//      and 8948, i.e. MSS 1460 and 8960 with TCP timestamps), fed in EMSS-byte "segments" through
//      mpa::Deframer into a receiving rdmap::Endpoint, which checks the CRC while copying (crc32c_copy) into a
//      registered 64 KiB region. Figures in payload GB/s; memcpy of the same bytes for scale.
//  (b) raw CRC32c over 64 KiB, hardware (SSE4.2) and software (slice-by-8), and the fused copy + CRC that
//      placement uses, in pieces the size of an FPDU payload.
//  (c) 64-byte SENDs: build (post + pull_tx) and parse (Deframer into an Endpoint with posted receives), in
//      Mops/s, with CRC.
// Each figure is the median of 7 runs, timed in this thread's CPU time (so "per core" even on a shared
// machine; caches and memory bandwidth are still shared); the whole program takes a few seconds.
#include <time.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "mpa/crc32c.hpp"
#include "mpa/deframer.hpp"
#include "mpa/fpdu.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"

using namespace softrdma;

namespace {

constexpr int kRuns = 7;
constexpr std::size_t kMessage = 64 * 1024;
constexpr std::uint32_t kStag = 1;

// CPU time of this thread: the figures are per core even when other processes share the machine.
double thread_seconds() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Median CPU seconds of kRuns calls of `run`; `setup` (untimed) runs before each.
double median_seconds(const std::function<void()>& setup, const std::function<void()>& run) {
    std::array<double, kRuns> t{};
    for (double& s : t) {
        setup();
        const double start = thread_seconds();
        run();
        s = thread_seconds() - start;
    }
    std::nth_element(t.begin(), t.begin() + kRuns / 2, t.end());
    return t[kRuns / 2];
}

// The upper layer of the benchmark: one 64 KiB region under kStag, and an endless supply of 64-byte receives.
class BenchUpper final : public rdmap::Upper {
public:
    std::vector<std::byte> region = std::vector<std::byte>(kMessage);
    std::array<std::byte, 64> recv_buf{};

    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access) override {
        if (stag != kStag || to > region.size() || len > region.size() - to) return {.err = rdmap::MemError::bounds};
        return {region.data() + to, len, rdmap::MemError::none};
    }
    rdmap::MemError recv_begin(std::uint32_t) override { return rdmap::MemError::none; }
    rdmap::Mem recv_place(std::uint32_t, std::uint32_t mo, std::size_t len) override {
        if (mo >= recv_buf.size()) return {.err = rdmap::MemError::bounds};
        return {recv_buf.data() + mo, std::min(len, recv_buf.size() - mo), rdmap::MemError::none};
    }
    rdmap::MemError invalidate(std::uint32_t) override { return rdmap::MemError::none; }
    void on_completion(const rdmap::Completion&) override {}
    void on_terminate(const rdmap::TermReport&) override { terminated = true; }
    bool terminated{false};
};

// A sending endpoint with its framing, as one connection's TX side.
struct Sender {
    explicit Sender(std::uint32_t emss, std::uint32_t sq_depth)
        : tx(mpa::FpduTxConfig{.crc = true, .markers = false, .emss = emss}), framer(tx),
          ep(rdmap::Role::tx, upper, framer, rdmap::Config{sq_depth, 16, 16}) {}
    BenchUpper upper;
    mpa::FpduTx tx;
    rdmap::FpduFramer framer;
    rdmap::Endpoint ep;

    // Writes everything the endpoint has to send into wire[used..], advancing `used`; the caller sized `wire`.
    void drain(std::vector<std::byte>& wire, std::size_t& used) {
        while (const std::size_t n = ep.pull_tx(std::span(wire).subspan(used))) used += n;
    }
};

// A receiving endpoint fed through the deframer, CRC on.
struct Receiver {
    Receiver() : ep(rdmap::Role::rx, upper, rdmap::no_framer(), rdmap::Config{}), deframer(mpa::DeframerConfig{.crc = true}) {}
    BenchUpper upper;
    rdmap::Endpoint ep;  // the receive half, as a QP's (a TERMINATE would go to a tx endpoint: a clean run sends none)
    mpa::Deframer<rdmap::Endpoint> deframer;

    // Feeds `wire` in `segment`-byte pieces; false on any protocol error.
    bool feed(std::span<const std::byte> wire, std::size_t segment) {
        for (std::size_t at = 0; at < wire.size(); at += segment)
            if (rdmap::receive(deframer, ep, wire.subspan(at, std::min(segment, wire.size() - at)))) return false;
        return !upper.terminated;
    }
};

// `messages` WRITEs make a stream small enough to stay in this core's caches (as freshly received segments
// are); each run feeds it `passes` times. WRITEs carry no sequence state, so one receiver takes it again.
void bench_write_rx(std::uint32_t emss, std::size_t messages, int passes) {
    std::vector<std::byte> source(kMessage);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 31 + 7);

    Sender s(emss, static_cast<std::uint32_t>(messages));
    for (std::size_t i = 0; i < messages; ++i) {
        rdmap::WorkRequest wr{.wr_id = i, .op = rdmap::WrOp::write, .signaled = false, .remote_stag = kStag};
        wr.sgl[0] = source;
        wr.num_sge = 1;
        s.ep.post(wr);
    }
    std::vector<std::byte> wire(messages * (kMessage + kMessage / 16));
    std::size_t used = 0;
    s.drain(wire, used);
    wire.resize(used);
    const double payload = static_cast<double>(messages * kMessage) * passes;
    const double wire_bytes = static_cast<double>(wire.size()) * passes;

    std::unique_ptr<Receiver> rx;
    bool ok = true;
    const double t = median_seconds([&] { rx = std::make_unique<Receiver>(); }, [&] {
        for (int p = 0; p < passes; ++p) ok = rx->feed(wire, emss) && ok;
    });
    ok = ok && rx->upper.region == source;

    // For scale: plain memcpy of the same segments' payload into the 64 KiB target.
    std::vector<std::byte> sink(kMessage);
    const double t_copy = median_seconds([] {}, [&] {
        for (int p = 0; p < passes; ++p)
            for (std::size_t at = 0; at < wire.size(); at += emss) {
                const std::size_t n = std::min<std::size_t>(emss, wire.size() - at);
                std::memcpy(sink.data() + at % (kMessage - emss + 1), wire.data() + at, n);
            }
    });
    const std::size_t fpdus_per_message = (wire.size() / messages + emss - 1) / emss;
    std::printf("  EMSS %4u (MULPDU %4zu, %2zu FPDUs per message): %5.2f GB/s payload, %5.2f GB/s wire, %4.0f ns per "
                "FPDU%s   [memcpy of the same segments: %5.2f GB/s]\n",
                emss, s.tx.mulpdu(), fpdus_per_message, payload / t / 1e9, wire_bytes / t / 1e9,
                t * 1e9 / (static_cast<double>(fpdus_per_message * messages) * passes),
                ok ? "" : "  ** PROTOCOL ERROR **", wire_bytes / t_copy / 1e9);
}

// CRC over a 64 KiB buffer in `piece`-byte calls (one call per FPDU payload in the placement path); with
// `copy`, the fused copy + CRC that placement uses.
void bench_crc() {
    std::vector<std::byte> buf(kMessage), dst(kMessage);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::byte>(i * 131 + 3);
    constexpr int kRounds = 1000;  // 64 MiB per run
    std::uint32_t sum = 0;
    auto rate = [&](bool hw, bool copy, std::size_t piece) {
        const double t = median_seconds([] {}, [&] {
            for (int r = 0; r < kRounds; ++r)
                for (std::size_t at = 0; at + piece <= buf.size(); at += piece) {
                    const std::byte* p = buf.data() + at;
                    sum += copy ? (hw ? mpa::crc32c_copy_hw : mpa::crc32c_copy_sw)(mpa::kCrc32cInit, dst.data() + at, p, piece)
                                : (hw ? mpa::crc32c_update_hw : mpa::crc32c_update_sw)(mpa::kCrc32cInit, p, piece);
                }
        });
        return static_cast<double>(kRounds) * (buf.size() / piece * piece) / t / 1e9;
    };
    for (bool hw : {true, false}) {
        const char* name = hw ? "hw (sse4.2)     " : "sw (slice-by-8) ";
        if (hw && !mpa::crc32c_hw_available()) {
            std::printf("  %s: not available on this CPU\n", name);
            continue;
        }
        std::printf("  %s: %5.2f GB/s over 64 KiB; fused copy + CRC: %5.2f GB/s in 1442-byte, %5.2f GB/s in "
                    "8942-byte pieces\n",
                    name, rate(hw, false, kMessage), rate(hw, true, 1442), rate(hw, true, 8942));
    }
    std::printf("  crc32c_update dispatches to %s (sum of results %08x)\n", mpa::crc32c_impl_name(), sum);
}

void bench_small_sends() {
    constexpr std::size_t kSends = 200'000;
    constexpr std::uint32_t kBatch = 1024;  // SQ depth: post a batch, then pull it to the wire
    std::array<std::byte, 64> payload{};
    std::vector<std::byte> wire(kSends * 128);
    std::size_t used = 0;

    std::unique_ptr<Sender> tx;
    const double t_build = median_seconds(
        [&] {
            tx = std::make_unique<Sender>(1448, kBatch);
            used = 0;
        },
        [&] {
            for (std::size_t done = 0; done < kSends; done += kBatch) {
                for (std::uint32_t i = 0; i < kBatch; ++i) {
                    rdmap::WorkRequest wr{.wr_id = i, .op = rdmap::WrOp::send, .signaled = false};
                    wr.sgl[0] = payload;
                    wr.num_sge = 1;
                    tx->ep.post(wr);
                }
                tx->drain(wire, used);
            }
        });
    wire.resize(used);

    std::unique_ptr<Receiver> rx;
    bool ok = true;
    const double t_parse = median_seconds([&] { rx = std::make_unique<Receiver>(); },
                                          [&] { ok = rx->feed(wire, 1448) && ok; });
    std::printf("  build (post + pull_tx): %6.2f Mops/s, %zu wire bytes per SEND\n", kSends / t_build / 1e6,
                wire.size() / kSends);
    std::printf("  parse (deframe + CRC + place): %6.2f Mops/s%s\n", kSends / t_parse / 1e6,
                ok ? "" : "  ** PROTOCOL ERROR **");
}

}  // namespace

int main() {
    std::printf("proto_bench: one core, medians of %d runs in thread CPU time\n", kRuns);
    std::printf("(a) 64 KiB RDMA WRITEs, CRC on: deframe + CRC check + placement\n");
    bench_write_rx(1448, 8, 128);
    bench_write_rx(8948, 8, 128);
    std::printf("(b) CRC32c over 64 KiB\n");
    bench_crc();
    std::printf("(c) 64-byte SENDs, CRC on\n");
    bench_small_sends();
    return 0;
}
