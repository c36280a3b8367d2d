// SPDX-License-Identifier: MIT
#include "threading/rx_thread.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <system_error>

namespace softrdma::threading {

void pin_this_thread(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (core >= 0) {
        CPU_SET(static_cast<unsigned>(core), &set);
    } else {
        const unsigned n = std::max(1u, std::thread::hardware_concurrency());
        for (unsigned c = 0; c < n && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
    }
    if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0)
        throw std::system_error(rc, std::generic_category(),
                                "threading: cannot pin a thread to core " + std::to_string(core));
}

namespace {
// Slot size: the port's largest single-mbuf frame, rounded up to a cache line so slots do not share lines.
std::uint32_t slot_bytes(const io::Port& port) { return (port.mbuf_data_room() + 63u) & ~63u; }
// TCP payload bytes of an Ethernet + IPv4 + TCP frame (0 for anything else): for the copy counters only.
std::uint32_t tcp_payload_len(const std::byte* f, std::uint32_t len) noexcept {
    auto u8 = [f](std::uint32_t i) { return std::to_integer<std::uint32_t>(f[i]); };
    if (len < 14 + 20 || u8(12) != 0x08 || u8(13) != 0x00 || u8(23) != 6) return 0;
    const std::uint32_t ihl = (u8(14) & 0x0fu) * 4u;
    const std::uint32_t total = u8(16) << 8 | u8(17);
    if (len < 14 + ihl + 20 || total < ihl + 20) return 0;
    const std::uint32_t doff = (u8(14 + ihl + 12) >> 4) * 4u;
    return total >= ihl + doff ? total - ihl - doff : 0;
}
}  // namespace

RxThread::RxThread(io::Port& port, const ThreadingConfig& cfg)
    : port_(port),
      cfg_(cfg),
      slot_size_(slot_bytes(port)),
      nslots_(std::max(64u, cfg.rx_slots)),
      mem_(new std::byte[std::size_t{nslots_} * slot_size_]),
      ring_(nslots_),
      free_(nslots_) {
    for (std::uint32_t s = 0; s < nslots_; ++s) free_.push(s);
    // The thread is pinned from inside (an std::thread inherits the creator's affinity, which DPDK's EAL set
    // to the application's lcore): a failure to pin ends the thread before it polls, so check it here.
    std::atomic<int> pinned{0};  // 0 pending, 1 ok, -1 failed
    thread_ = std::thread([this, &pinned] {
        try {
            pin_this_thread(cfg_.rx_core);
            pinned.store(1, std::memory_order_release);
        } catch (...) {
            pinned.store(-1, std::memory_order_release);
            return;
        }
        run();
    });
    while (pinned.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    if (pinned.load(std::memory_order_acquire) < 0) {
        thread_.join();
        throw std::system_error(EINVAL, std::generic_category(),
                                "threading: cannot pin the RX thread to core " + std::to_string(cfg.rx_core));
    }
}

RxThread::~RxThread() {
    stop();
    discard_pending();
}

void RxThread::stop() noexcept {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
}

void RxThread::discard_pending() noexcept {
    Desc d;
    while (ring_.pop(d)) free_.push(d.slot);
}

RxCounters RxThread::counters() const noexcept {
    return RxCounters{frames_.load(std::memory_order_relaxed), bytes_copied_.load(std::memory_order_relaxed),
                      tcp_payload_.load(std::memory_order_relaxed), dropped_.load(std::memory_order_relaxed), stalled_.load(std::memory_order_relaxed)};
}

// Copies one frame into a free slot and queues it. Ownership: `m` is ours (from rx_burst) and is freed
// here, whatever happens; the slot goes from the free ring to the frame ring (the application's).
bool RxThread::deliver(rte_mbuf* m) noexcept {
    bool ok = false;
    if (m->pkt_len <= slot_size_) {
        std::uint32_t slot = 0;
        if (free_.pop(slot)) {  // run() checked there is one for every frame of the burst
            std::byte* dst = slot_data(slot);
            std::uint32_t off = 0;
            for (const rte_mbuf* seg = m; seg != nullptr; seg = seg->next) {
                std::memcpy(dst + off, rte_pktmbuf_mtod(seg, const void*), seg->data_len);
                off += seg->data_len;
            }
            if (const std::uint32_t tp = tcp_payload_len(dst, off); tp != 0)
                tcp_payload_.store(tcp_payload_.load(std::memory_order_relaxed) + tp, std::memory_order_relaxed);
            ring_.push(Desc{slot, off});  // never full: it has room for every slot
            frames_.store(frames_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
            bytes_copied_.store(bytes_copied_.load(std::memory_order_relaxed) + off, std::memory_order_relaxed);
            ok = true;
        }
    }
    if (!ok) dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    rte_pktmbuf_free(m);  // the mbuf goes back to the pool at once: its bytes live on in the slot
    return ok;
}

void RxThread::run() noexcept {
    constexpr unsigned kBurst = 32;
    rte_mbuf* burst[kBurst];
    unsigned idle = 0;
    while (!stop_.load(std::memory_order_acquire)) {
        // Poll only as many frames as there are free slots: when the application side holds them all, frames
        // wait in the NIC's ring (and beyond it are dropped there; TCP resends), never in the RX thread.
        const auto room = static_cast<unsigned>(std::min<std::size_t>(free_.read_available(), kBurst));
        unsigned got = 0;
        if (room == 0) {
            stalled_.store(stalled_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        } else {
            got = port_.rx_burst(std::span<rte_mbuf*>(burst, room));
            for (unsigned i = 0; i < got; ++i) deliver(burst[i]);
        }
        if (got != 0) {
            idle = 0;
            continue;
        }
        if (++idle <= cfg_.rx_idle.spin_turns) continue;
        switch (cfg_.rx_idle.then) {
        case IdlePolicy::Then::spin: break;
        case IdlePolicy::Then::yield: sched_yield(); break;
        case IdlePolicy::Then::sleep: std::this_thread::sleep_for(cfg_.rx_idle.sleep); break;
        }
    }
}

}  // namespace softrdma::threading
