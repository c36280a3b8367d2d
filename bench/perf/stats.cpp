// SPDX-License-Identifier: MIT
#include "bench/perf/stats.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <thread>

#include "threading/config.hpp"

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

std::optional<double> core_round_trip_ns(unsigned a, unsigned b) {
    using clk = std::chrono::steady_clock;
    constexpr std::uint64_t kTrips = 10000;
    constexpr std::size_t kBatches = 5;
    struct alignas(64) Line {
        std::atomic<std::uint64_t> v{0};
    };
    Line ping, pong;  // each on its own line: the round trip moves two lines, as a request and its answer would
    std::atomic<bool> stop{false};
    std::atomic<int> pinned{0};
    auto pin = [](unsigned cpu) {
        if (cpu > static_cast<unsigned>(std::numeric_limits<int>::max())) return false;  // (-1 would mean all)
        try {
            threading::pin_this_thread(static_cast<int>(cpu));
            return true;
        } catch (const std::exception&) {
            return false;
        }
    };
    std::array<double, kBatches> ns{};
    bool ok = false;
    std::thread echo([&] {
        if (!pin(b)) {
            stop.store(true);
            return;
        }
        pinned.fetch_add(1);
        for (std::uint64_t i = 1; i <= kTrips * kBatches; ++i) {
            while (ping.v.load(std::memory_order_acquire) != i)
                if (stop.load(std::memory_order_relaxed)) return;
            pong.v.store(i, std::memory_order_release);
        }
    });
    std::thread lead([&] {
        if (!pin(a)) {
            stop.store(true);
            return;
        }
        pinned.fetch_add(1);
        const auto give_up = clk::now() + std::chrono::seconds(2);  // ~0.03 s here, ~0.15 s under TSan
        while (pinned.load() < 2)
            if (stop.load() || clk::now() >= give_up) return stop.store(true);
        std::uint64_t i = 0;
        for (std::size_t batch = 0; batch < kBatches; ++batch) {
            const auto t0 = clk::now();
            for (std::uint64_t k = 0; k < kTrips; ++k) {
                ping.v.store(++i, std::memory_order_release);
                // Spinning with a time check every 4096 polls: a descheduled partner must not hang us.
                for (std::uint32_t spins = 1; pong.v.load(std::memory_order_acquire) != i; ++spins)
                    if ((spins & 4095) == 0 && clk::now() >= give_up) return stop.store(true);
            }
            ns[batch] = std::chrono::duration<double, std::nano>(clk::now() - t0).count() / kTrips;
        }
        ok = true;
    });
    lead.join();
    echo.join();
    if (!ok) return std::nullopt;
    std::sort(ns.begin(), ns.end());
    return ns[kBatches / 2];
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
