// SPDX-License-Identifier: MIT
#include "io/faults.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include <rte_cycles.h>

namespace softrdma::io {

// The counters are written by the one thread bursting this direction and read by any (diagnostics, the soak's
// once-a-second check): relaxed atomic stores and loads, no locked add (see Port::rx_fault_counters).
static inline void bump(std::uint64_t& c) noexcept { __atomic_store_n(&c, c + 1, __ATOMIC_RELAXED); }

namespace {

std::uint64_t threshold(double rate) {
    if (!(rate > 0.0)) return 0;
    if (rate >= 1.0) return ~std::uint64_t{0};
    return static_cast<std::uint64_t>(std::ldexp(rate, 64));
}

}  // namespace

FaultConfig parse_faults(const std::string& text) {
    FaultConfig f;
    std::size_t at = 0;
    while (at < text.size()) {
        std::size_t end = text.find(',', at);
        if (end == std::string::npos) end = text.size();
        const std::string item = text.substr(at, end - at);
        at = end + 1;
        if (item.empty()) continue;
        const std::size_t eq = item.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("faults: '" + item + "' is not KEY=VALUE");
        const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
        char* rest = nullptr;
        const double v = std::strtod(val.c_str(), &rest);
        if (val.empty() || rest == nullptr || *rest != '\0' || !(v >= 0.0))
            throw std::invalid_argument("faults: '" + item + "': not a non-negative number");
        auto rate = [&](double& r) {
            if (v > 1.0) throw std::invalid_argument("faults: '" + item + "': a rate is at most 1");
            r = v;
        };
        if (key == "all") {
            for (FaultRates* d : {&f.rx, &f.tx})
                for (double* r : {&d->drop, &d->duplicate, &d->reorder, &d->delay, &d->corrupt}) rate(*r);
        } else if (key == "rx_drop") rate(f.rx.drop);
        else if (key == "rx_duplicate") rate(f.rx.duplicate);
        else if (key == "rx_reorder") rate(f.rx.reorder);
        else if (key == "rx_delay") rate(f.rx.delay);
        else if (key == "rx_corrupt") rate(f.rx.corrupt);
        else if (key == "tx_drop") rate(f.tx.drop);
        else if (key == "tx_duplicate") rate(f.tx.duplicate);
        else if (key == "tx_reorder") rate(f.tx.reorder);
        else if (key == "tx_delay") rate(f.tx.delay);
        else if (key == "tx_corrupt") rate(f.tx.corrupt);
        else if (key == "delay_us") f.delay = std::chrono::microseconds(static_cast<long long>(v));
        else if (key == "seed") f.seed = static_cast<std::uint64_t>(v);
        else throw std::invalid_argument("faults: unknown key '" + key + "'");
    }
    return f;
}

FaultInjector::FaultInjector(const FaultRates& r, std::chrono::microseconds delay, std::uint64_t seed,
                             rte_mempool* pool, FaultCounters& counters)
    : drop_(threshold(r.drop)),
      dup_(threshold(r.duplicate)),
      reorder_(threshold(r.reorder)),
      delay_(threshold(r.delay)),
      corrupt_(threshold(r.corrupt)),
      delay_tsc_(static_cast<std::uint64_t>(delay.count()) * rte_get_timer_hz() / 1000000u),
      state_(seed == 0 ? 0x9E3779B97F4A7C15ull : seed),
      pool_(pool),
      counters_(counters) {}

FaultInjector::~FaultInjector() {
    for (std::size_t i = 0; i < count_; ++i) rte_pktmbuf_free(held_[(head_ + i) % kHeld].m);
}

std::uint64_t FaultInjector::next() noexcept {  // xorshift64*
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
}

// One bit flipped anywhere past the Ethernet header: the IP header checksum or the TCP checksum (where it is
// computed) must catch it, the MPA CRC too where negotiated. A chained frame (zero-copy transmit: its payload
// is the sender's TX chunk, which TCP retransmits from) is corrupted in a copy, never in place: the damage is
// the wire's, not the sender's memory. Returns the frame to send on (m, or its copy; m freed then).
rte_mbuf* FaultInjector::corrupt(rte_mbuf* m) noexcept {
    if (m->nb_segs > 1) {
        rte_mbuf* c = rte_pktmbuf_copy(m, pool_, 0, UINT32_MAX);
        if (c == nullptr) return m;  // no mbuf for the copy: sent undamaged
        rte_pktmbuf_free(m);
        m = c;  // direct mbufs of our pool from here: damaged in place
    }
    const std::uint32_t len = m->pkt_len;
    if (len <= 14) return m;
    std::uint32_t at = 14 + static_cast<std::uint32_t>(next() % (len - 14));
    rte_mbuf* seg = m;
    while (at >= seg->data_len && seg->next != nullptr) {
        at -= seg->data_len;
        seg = seg->next;
    }
    rte_pktmbuf_mtod(seg, std::uint8_t*)[at] ^= static_cast<std::uint8_t>(1u << (next() % 8));
    bump(counters_.corrupted);
    return m;
}

void FaultInjector::requeue(std::span<rte_mbuf* const> frames) noexcept {
    const std::size_t k = std::min(frames.size(), kHeld - count_);
    for (std::size_t i = frames.size(); i-- > k;) rte_pktmbuf_free(frames[i]);  // the latest: lost, as on a full link
    for (std::size_t i = k; i-- > 0;) {  // pushed in front, last first
        head_ = (head_ + kHeld - 1) % kHeld;
        held_[head_] = Held{frames[i], 0};
        ++count_;
    }
}

bool FaultInjector::hold(rte_mbuf* m, std::uint64_t due) noexcept {
    if (count_ == kHeld) return false;
    held_[(head_ + count_) % kHeld] = Held{m, due};
    ++count_;
    return true;
}

std::uint16_t FaultInjector::apply(std::span<rte_mbuf*> buf, std::uint16_t n) noexcept {
    // The arrivals, copied aside: the output reuses buf.
    std::array<rte_mbuf*, 512> in;
    const std::size_t k = std::min<std::size_t>(n, in.size());
    for (std::size_t i = 0; i < k; ++i) in[i] = buf[i];
    for (std::size_t i = k; i < n; ++i) rte_pktmbuf_free(buf[i]);  // beyond any burst size in use
    std::size_t out = 0;
    const std::uint64_t now = rte_get_timer_cycles();
    // Held frames now due go first (in the order they were held: a later one waits behind an earlier one).
    while (count_ != 0 && held_[head_].due <= now && out < buf.size()) {
        buf[out++] = held_[head_].m;
        head_ = (head_ + 1) % kHeld;
        --count_;
    }
    for (std::size_t i = 0; i < k; ++i) {
        rte_mbuf* m = in[i];
        if (hit(drop_)) {
            rte_pktmbuf_free(m);
            bump(counters_.dropped);
            continue;
        }
        if (hit(corrupt_)) m = corrupt(m);
        if (hit(delay_) && hold(m, now + delay_tsc_)) {
            bump(counters_.delayed);
            continue;
        }
        if (hit(reorder_) && hold(m, now)) {  // goes out at the next burst, behind what follows it in this one
            bump(counters_.reordered);
            continue;
        }
        if (out == buf.size()) {  // no room (held frames filled it): keep it for the next burst
            if (!hold(m, now)) {
                rte_pktmbuf_free(m);  // nowhere to keep it: lost, as on a full link
                bump(counters_.dropped);
            }
            continue;
        }
        buf[out++] = m;
        if (hit(dup_) && out < buf.size()) {
            if (rte_mbuf* c = rte_pktmbuf_copy(m, pool_, 0, UINT32_MAX)) {
                buf[out++] = c;
                bump(counters_.duplicated);
            }
        }
    }
    return static_cast<std::uint16_t>(out);
}

}  // namespace softrdma::io
