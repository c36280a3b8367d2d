// SPDX-License-Identifier: MIT
#include "bench/perf/output.hpp"

#include <unistd.h>

#include <stdexcept>
#include <string>

namespace softrdma::perf {

void print_banner(std::FILE* f, const WireParams& p, const Options& o, bool memif_zero_copy) {
    const bool half = p.kind == Kind::lat && (p.test == Test::send || p.test == Test::write);
    const bool large = o.large_segments;
    std::fprintf(f, "# rdma_perf %s %s | mtu %u | threading %s | crc %s | TCP segments %s%s | %s\n", to_string(p.test),
                 to_string(p.kind), o.mtu, o.threading.c_str(), o.crc ? "required" : "off",
                 large ? "up to 64 KiB on memif (large segments)" : "MTU-sized",
                 memif_zero_copy ? " | memif zero-copy client" : o.mode == Mode::local ? " | memif copying" : "",
                 o.mode == Mode::local ? "local: two processes over memif" : "remote");
    // Busy-polling figures depend on having the cores: say how loaded the machine was.
    if (std::FILE* la = std::fopen("/proc/loadavg", "r")) {
        double l1 = 0, l5 = 0;
        if (std::fscanf(la, "%lf %lf", &l1, &l5) == 2)
            std::fprintf(f, "# load average %.2f (1 min) %.2f (5 min) on %ld cpus at start\n", l1, l5,
                         ::sysconf(_SC_NPROCESSORS_ONLN));
        std::fclose(la);
    }
    // And what crossing between the two cores costs on this host right now (varies 3-5x on a shared VM).
    if (o.mode == Mode::local)
        std::fprintf(f, "# cache line round trip between the two cores (%s): %s\n", o.cpu.empty() ? "0,1" : o.cpu.c_str(),
                     o.core_rtt_ns ? (std::to_string(static_cast<long>(*o.core_rtt_ns + 0.5)) + " ns").c_str()
                                   : "not measured (a core could not be pinned or is busy)");
    if (p.kind == Kind::lat)
        std::fprintf(f, "# latency: %s; every message's content is checked at the first and last timed message\n",
                     half ? "half round trip (ping-pong / 2)" : "full round trip");
    else
        std::fprintf(f, "# tx depth %u, signaled every %u (cq-mod), rx depth %u, outstanding READ/atomic %u, "
                        "inline <= %u B\n",
                     p.depth, p.cq_mod, p.rx_depth, p.outs, p.inline_size);
}

void print_header(std::FILE* f, Kind k) {
    std::fprintf(f, "%s\n", k == Kind::lat ? kLatHeader : kBwHeader);
    std::fflush(f);
}

void print_row(std::FILE* f, const LatStats& s) {
    std::fprintf(f, "%-7u %-12u %-11.2f %-11.2f %-15.2f %-11.2f %-13.2f %-19.2f %.2f\n", s.bytes, s.iterations,
                 s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p999);
    std::fflush(f);
}

void print_row(std::FILE* f, const BwStats& s) {
    std::fprintf(f, "%-7u %-12u %-17.2f %-20.2f %.6f\n", s.bytes, s.iterations, s.bw_peak_mib, s.bw_avg_mib,
                 s.msg_rate_mpps);
    std::fflush(f);
}

void write_json(const std::string& path, const WireParams& p, const Options& o, const std::vector<LatStats>& lat,
                const std::vector<BwStats>& bw) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + path);
    std::fprintf(f, "{\"tool\":\"rdma_perf\",\"test\":\"%s\",\"kind\":\"%s\",\"threading\":\"%s\",\"mtu\":%u,"
                    "\"core_rtt_ns\":%s,\"results\":[",
                 to_string(p.test), to_string(p.kind), o.threading.c_str(), static_cast<unsigned>(o.mtu),
                 o.core_rtt_ns ? std::to_string(*o.core_rtt_ns).c_str() : "null");
    const char* sep = "";
    for (const LatStats& s : lat) {
        std::fprintf(f, "%s{\"bytes\":%u,\"iterations\":%u,\"t_min_us\":%.3f,\"t_max_us\":%.3f,"
                        "\"t_typical_us\":%.3f,\"t_avg_us\":%.3f,\"t_stdev_us\":%.3f,\"p99_us\":%.3f,"
                        "\"p999_us\":%.3f}",
                     sep, s.bytes, s.iterations, s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p999);
        sep = ",";
    }
    for (const BwStats& s : bw) {
        std::fprintf(f, "%s{\"bytes\":%u,\"iterations\":%u,\"bw_peak_mib_s\":%.3f,\"bw_avg_mib_s\":%.3f,"
                        "\"msg_rate_mpps\":%.6f,\"warmup_in_flight\":%u}",
                     sep, s.bytes, s.iterations, s.bw_peak_mib, s.bw_avg_mib, s.msg_rate_mpps, s.warmup_in_flight);
        sep = ",";
    }
    std::fprintf(f, "]}\n");
    if (std::fclose(f) != 0) throw std::runtime_error("cannot write " + path);
}

}  // namespace softrdma::perf
