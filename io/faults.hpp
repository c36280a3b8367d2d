// SPDX-License-Identifier: MIT
// Fault injection between the driver and everything above it (PortConfig::faults, or the environment variable
// SOFTRDMA_FAULTS): frames dropped, duplicated, reordered, delayed or corrupted at given rates, on RX and TX,
// as a bad link would. For tests and soak runs; off by default, and then free (the port tests one pointer per
// burst and never reaches this code).
//
// One injector per direction, used only by that direction's burst thread (as the burst itself). No allocation
// after construction: held frames (delayed, or waiting to be overtaken) sit in a fixed ring of kHeld entries;
// when it is full a frame goes on unharmed. Ownership: a frame the injector holds is its own (freed by the
// destructor if never released); a dropped frame is freed here; a duplicate is a copy from the port's pool.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include <rte_mbuf.h>

#include <softrdma/config.hpp>
#include <softrdma/diagnostics.hpp>

namespace softrdma::io {

// "rx_drop=0.01,tx_corrupt=0.01,delay_us=300,seed=7" (every key of FaultConfig; "all=0.01" sets the ten
// rates). Throws std::invalid_argument naming the bad item.
FaultConfig parse_faults(const std::string& text);

class FaultInjector {
public:
    static constexpr std::size_t kHeld = 256;

    FaultInjector(const FaultRates& rates, std::chrono::microseconds delay, std::uint64_t seed, rte_mempool* pool,
                  FaultCounters& counters);
    ~FaultInjector();
    FaultInjector(const FaultInjector&) = delete;
    FaultInjector& operator=(const FaultInjector&) = delete;

    // Frames [0, n) of `buf` arrived (or are to be sent); rewrites `buf` with what goes on: held frames now due
    // first, then the arrivals less the dropped and held ones, plus duplicates. Returns the count, at most
    // buf.size() (what does not fit stays held, or, for a duplicate, is not made).
    std::uint16_t apply(std::span<rte_mbuf*> buf, std::uint16_t n) noexcept;
    // Frames the driver refused, in order: held, first out at the next apply() (before those held already);
    // freed past kHeld.
    void requeue(std::span<rte_mbuf* const> frames) noexcept;
    // Frames held now.
    std::size_t held() const noexcept { return count_; }

private:
    bool hit(std::uint64_t threshold) noexcept { return threshold != 0 && next() < threshold; }
    std::uint64_t next() noexcept;
    rte_mbuf* corrupt(rte_mbuf* m) noexcept;
    bool hold(rte_mbuf* m, std::uint64_t due) noexcept;

    struct Held {
        rte_mbuf* m{nullptr};
        std::uint64_t due{0};  // TSC
    };
    std::uint64_t drop_, dup_, reorder_, delay_, corrupt_;  // rate x 2^64 (0: never)
    std::uint64_t delay_tsc_;
    std::uint64_t state_;
    rte_mempool* pool_;
    FaultCounters& counters_;
    std::array<Held, kHeld> held_{};
    std::size_t head_{0};
    std::size_t count_{0};
};

}  // namespace softrdma::io
