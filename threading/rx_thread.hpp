// SPDX-License-Identifier: MIT
// The dedicated RX thread (threading::Mode::rx_thread): polls one io::Port, copies each received frame once
// into a frame buffer ("slot") the application side owns, returns the mbuf to DPDK at once, and passes the
// slot to the application thread through a bounded lock-free SPSC ring. The application thread hands each
// slot to lwIP without another copy and gives it back through a second SPSC ring when lwIP frees it.
//
//   RX thread                               application thread
//   rx_burst -> copy into slot ------------> drain(): slot -> lwIP (zero-copy pbuf) -> MPA/DDP/RDMAP
//            <- free slot ring <------------ release(slot) when lwIP frees the pbuf
//
// Threads: the RX thread is the only one calling Port::rx_burst and the only consumer of the free ring and
// producer of the frame ring; the application thread (the one that constructed this object) is the only
// consumer of the frame ring and producer of the free ring. Nothing else is shared; no locks, no lwIP call
// and no allocation on the RX thread after start.
// Memory: all slots and both rings are allocated in the constructor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>

#include <boost/lockfree/spsc_queue.hpp>

#include "io/port.hpp"
#include "threading/config.hpp"

namespace softrdma::threading {

struct RxCounters {
    std::uint64_t frames = 0;         // frames handed to the application side
    std::uint64_t bytes_copied = 0;   // bytes the RX thread copied (whole frames)
    std::uint64_t tcp_payload_copied = 0;  // of which TCP payload (IPv4 frames)
    std::uint64_t dropped = 0;        // frames larger than a slot (cannot happen below the port's MTU)
    std::uint64_t stalled_turns = 0;  // turns the RX thread did not poll because no slot or ring room was free
};

class RxThread {
public:
    // Allocates the slots and rings and starts the thread. `port` must outlive this object.
    RxThread(io::Port& port, const ThreadingConfig& cfg);
    // Stops the thread (stop()) and frees the slots: nothing may still reference them (see stop()).
    ~RxThread();
    RxThread(const RxThread&) = delete;
    RxThread& operator=(const RxThread&) = delete;

    // Stops and joins the RX thread; frames it had not handed over stay in the ring and are dropped by
    // discard_pending(). Slots lwIP still holds stay valid until this object is destroyed.
    void stop() noexcept;

    // ---- application thread ----------------------------------------------------------------------------
    struct Frame {
        std::byte* data;
        std::uint32_t len;
        std::uint32_t slot;  // give back with release() once the frame's bytes are no longer referenced
    };
    // Hands up to `max` received frames to `f(const Frame&)`, oldest first; returns how many. Ownership: from
    // the call on, the slot is the application side's until release(slot).
    template <class F>
    unsigned drain(unsigned max, F&& f) {
        unsigned n = 0;
        Desc d;
        while (n < max && ring_.pop(d)) {
            f(Frame{slot_data(d.slot), d.len, d.slot});
            ++n;
        }
        return n;
    }
    // Gives a slot back to the RX thread. Ownership: the RX thread's from here.
    void release(std::uint32_t slot) noexcept { free_.push(slot); }  // never full: holds every slot
    // Drops frames still queued (teardown).
    void discard_pending() noexcept;

    RxCounters counters() const noexcept;
    std::uint32_t slot_size() const noexcept { return slot_size_; }
    unsigned slots() const noexcept { return nslots_; }

private:
    struct Desc {
        std::uint32_t slot;
        std::uint32_t len;
    };
    void run() noexcept;
    bool deliver(rte_mbuf* m) noexcept;
    std::byte* slot_data(std::uint32_t slot) noexcept { return mem_.get() + std::size_t{slot} * slot_size_; }

    io::Port& port_;
    ThreadingConfig cfg_;
    std::uint32_t slot_size_;
    unsigned nslots_;
    std::unique_ptr<std::byte[]> mem_;
    // Sizing rule: both rings hold every slot, so neither can overflow (a slot is in at most one of them).
    boost::lockfree::spsc_queue<Desc> ring_;            // RX thread -> application: filled slots
    boost::lockfree::spsc_queue<std::uint32_t> free_;  // application -> RX thread: empty slots
    std::atomic<bool> stop_{false};
    // Written by the RX thread only (relaxed); read by anyone.
    std::atomic<std::uint64_t> frames_{0}, bytes_copied_{0}, tcp_payload_{0}, dropped_{0}, stalled_{0};
    std::thread thread_;
};

}  // namespace softrdma::threading
