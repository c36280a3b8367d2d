// SPDX-License-Identifier: MIT
#include "bench/perf/stats.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace softrdma::perf {

double calibrate_tsc() {
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    const std::uint64_t c0 = tsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t1 = clk::now();
    const std::uint64_t c1 = tsc();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    return static_cast<double>(c1 - c0) / us;
}

LatStats lat_stats(std::uint32_t bytes, std::span<std::uint64_t> ticks, double divisor, double ticks_per_us) {
    LatStats s;
    s.bytes = bytes;
    s.iterations = static_cast<std::uint32_t>(ticks.size());
    if (ticks.empty()) return s;
    std::sort(ticks.begin(), ticks.end());
    const double k = 1.0 / (divisor * ticks_per_us);
    const std::size_t n = ticks.size();
    auto us = [&](std::size_t i) { return static_cast<double>(ticks[i]) * k; };
    auto rank = [&](double p) {  // nearest rank: the smallest sample with at least p of them at or below
        const auto r = static_cast<std::size_t>(std::ceil(p * static_cast<double>(n)));
        return std::min(n - 1, r == 0 ? 0 : r - 1);
    };
    s.t_min = us(0);
    s.t_max = us(n - 1);
    s.t_typical = us(n / 2);
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += us(i);
    s.t_avg = sum / static_cast<double>(n);
    double var = 0;
    for (std::size_t i = 0; i < n; ++i) var += (us(i) - s.t_avg) * (us(i) - s.t_avg);
    s.t_stdev = std::sqrt(var / static_cast<double>(n));
    s.p99 = us(rank(0.99));
    s.p999 = us(rank(0.999));
    return s;
}

BwStats bw_stats(std::uint32_t bytes, std::uint32_t iterations, std::span<const Mark> marks, double ticks_per_us) {
    BwStats s;
    s.bytes = bytes;
    s.iterations = iterations;
    if (marks.size() < 2) return s;
    constexpr double kMiB = 1024.0 * 1024.0;
    auto rate = [&](const Mark& a, const Mark& b, double& mib, double& mpps) {
        const double us = static_cast<double>(b.tsc - a.tsc) / ticks_per_us;
        const double msgs = static_cast<double>(b.msgs - a.msgs);
        if (us <= 0) return false;
        mpps = msgs / us;                                   // messages per microsecond = millions per second
        mib = msgs * bytes / kMiB / (us * 1e-6);
        return true;
    };
    rate(marks.front(), marks.back(), s.bw_avg_mib, s.msg_rate_mpps);
    s.bw_peak_mib = s.bw_avg_mib;
    const std::uint64_t span_min = std::max<std::uint64_t>(1, (marks.back().msgs - marks.front().msgs) / 16);
    std::size_t j = 0;
    for (std::size_t i = 0; i < marks.size(); ++i) {
        j = std::max(j, i + 1);
        while (j < marks.size() && marks[j].msgs - marks[i].msgs < span_min) ++j;
        if (j >= marks.size()) break;
        double mib = 0, mpps = 0;
        if (rate(marks[i], marks[j], mib, mpps)) s.bw_peak_mib = std::max(s.bw_peak_mib, mib);
    }
    return s;
}

}  // namespace softrdma::perf
