// SPDX-License-Identifier: MIT
// Benchmark (build/bench/mpa_deframe_bench): deframe + CRC + placement of 64 KiB messages sent as
// MULPDU-sized FPDUs (EMSS 1448, tagged header 14, 1428 payload octets each) fed in 1448-octet segments, with a
// plain handler (deframer CRCs each chunk, handler memcpy's it) and a fusing handler (crc32c_copy). Reports
// payload GB/s per core of thread CPU time, so that other load on the machine does not skew it.
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "mpa/deframer.hpp"
#include "mpa/fpdu.hpp"

using namespace softrdma::mpa;
using softrdma::ProtoStatus;

namespace {

double cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Plain {
    std::byte* target = nullptr;
    std::size_t off = 0;
    std::size_t ulpdu_header_length(std::uint16_t) { return 14; }
    ProtoStatus on_ulpdu_header(std::span<const std::byte>, std::size_t) { return std::nullopt; }
    ProtoStatus on_ulpdu_payload(std::span<const std::byte> b) {
        std::memcpy(target + off, b.data(), b.size());
        off = (off + b.size()) % 65536;
        return std::nullopt;
    }
    ProtoStatus on_ulpdu_end() { return std::nullopt; }
};
struct Fused : Plain {
    ProtoStatus on_ulpdu_payload_crc(std::span<const std::byte> b, std::uint32_t& crc) {
        crc = crc32c_copy(crc, target + off, b.data(), b.size());
        off = (off + b.size()) % 65536;
        return std::nullopt;
    }
};

template <class H>
double run(const std::vector<std::byte>& wire, std::size_t seg, bool crc, std::size_t payload) {
    std::vector<std::byte> target(65536 + 2048);
    H h;
    h.target = target.data();
    constexpr int kIter = 100;
    const double t0 = cpu_seconds();
    for (int i = 0; i < kIter; ++i) {
        Deframer<H> d({crc, false, 0});
        for (std::size_t o = 0; o < wire.size(); o += seg)
            if (d.feed(std::span(wire.data() + o, std::min(seg, wire.size() - o)), h)) return 0;
    }
    return static_cast<double>(payload) * kIter / (cpu_seconds() - t0) / 1e9;
}

}  // namespace

int main() {
    std::printf("crc32c implementation: %s\n", crc32c_impl_name());
    for (bool crc : {true, false}) {
        FpduTx tx({crc, false, 1448});
        std::vector<std::byte> wire, hdr(14), msg(65536, std::byte{0x5a});
        std::size_t payload = 0;
        const std::size_t per = tx.mulpdu() - hdr.size();
        for (int m = 0; m < 16; ++m) {
            for (std::size_t o = 0; o < msg.size(); o += per) {
                const std::size_t k = std::min(per, msg.size() - o);
                std::vector<std::byte> out(tx.wire_size(hdr.size() + k));
                tx.write(out, hdr, std::span<const std::byte>(msg.data() + o, k));
                wire.insert(wire.end(), out.begin(), out.end());
                payload += k;
            }
        }
        std::printf("crc %-3s: plain %.2f GB/s, fused copy+crc %.2f GB/s (1448-octet segments); plain, 64 KiB feeds %.2f GB/s\n",
                    crc ? "on" : "off", run<Plain>(wire, 1448, crc, payload), run<Fused>(wire, 1448, crc, payload),
                    run<Plain>(wire, 65536, crc, payload));
    }
    return 0;
}
