// SPDX-License-Identifier: MIT
// Time and figures for rdma_perf: the TSC (invariant on every x86 this runs on; calibrated once against
// steady_clock), perftest's latency statistics, and bandwidth from completion timestamps.
#pragma once

#include <x86intrin.h>

#include <cstdint>
#include <optional>
#include <span>

namespace softrdma::perf {

inline std::uint64_t tsc() noexcept { return __rdtsc(); }

// TSC ticks per microsecond, measured over ~50 ms against steady_clock. Call once, before forking.
double calibrate_tsc();

// Cache line round trip between cores `a` and `b` in ns (median of 5 batches of 10000): two threads pinned
// there pass a counter back and forth. Every payload byte crosses between the two processes' cores (memif's
// ring), so this bounds what the host lets memif and kernel TCP do; on the VM this was developed on it
// measured ~0.65 us in the spells when every figure ran 3-5x lower, so a run says which kind of spell it
// had. nullopt when a core cannot be pinned or the pair takes over 2 s (the cores are busy). Call before
// forking (it starts and joins its own threads; the caller's affinity is untouched).
std::optional<double> core_round_trip_ns(unsigned a, unsigned b);

// perftest's latency columns, in microseconds.
struct LatStats {
    std::uint32_t bytes{0};
    std::uint32_t iterations{0};
    double t_min{0}, t_max{0}, t_typical{0}, t_avg{0}, t_stdev{0}, p99{0}, p999{0};
};

// `ticks`: one sample per timed iteration (sorted in place); each divided by `divisor` (2 for half round
// trip) and converted with `ticks_per_us`. t_typical is the median (perftest: the middle sample), the
// percentiles are nearest-rank.
LatStats lat_stats(std::uint32_t bytes, std::span<std::uint64_t> ticks, double divisor, double ticks_per_us);

struct BwStats {
    std::uint32_t bytes{0};
    std::uint32_t iterations{0};
    double bw_peak_mib{0}, bw_avg_mib{0}, msg_rate_mpps{0};
    // Warmup messages not yet completed when the first timed one was posted (rdma_perf waits: 0).
    std::uint32_t warmup_in_flight{0};
};

// `marks`: (messages completed so far, TSC) at every signaled completion of the timed part, in order,
// starting with (0, time the first timed message was posted). Average: all timed messages over first to
// last mark. Peak: the best rate over any window of consecutive marks spanning at least 1/16 of the run's
// messages (perftest's peak is a per-message best case; a window says what the link sustained).
struct Mark {
    std::uint64_t msgs;
    std::uint64_t tsc;
};
BwStats bw_stats(std::uint32_t bytes, std::uint32_t iterations, std::span<const Mark> marks, double ticks_per_us);

}  // namespace softrdma::perf
