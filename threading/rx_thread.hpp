// SPDX-License-Identifier: MIT
// The dedicated RX thread (threading::Mode::rx_thread). It polls one io::Port and returns every mbuf to
// DPDK within the turn that received it. For each frame it either
//   - copies the whole frame into a frame buffer ("slot") the application side owns (ARP, handshakes, MPA
//     negotiation, any connection not handed over), or
//   - for a connection handed over to it (a QP in RDMA mode): checks the TCP sequence, gives the in-order
//     TCP payload to the connection's FlowSink, which places it (the one copy: the MPA/DDP/RDMAP receive
//     path writes it straight into registered memory or a posted receive), and passes only the headers on,
//     so lwIP on the application thread still keeps TCP's sequence, ACK and window state.
// The application thread gives slots to lwIP without another copy and returns them through a second ring.
//
//   RX thread                                    application thread
//   rx_burst -> whole frame into a slot ------->  drain(): slot -> lwIP (zero-copy pbuf)
//            -> FlowSink (placement), headers -->  drain(): headers -> lwIP (payload stands in, see Stack)
//            <- free slots <---------------------  release(slot) when lwIP frees the pbuf
//            <- commands (watch/handover/go/remove) from the application thread
//
// Handing a connection over without losing or doubling a byte: watch(rcv_nxt) makes the RX thread follow the
// connection from the application's receive position, forwarding only in-order payload (a segment after a gap
// is forwarded without its payload, and the application sends a duplicate ACK so the peer resends the gap),
// so lwIP's rcv_nxt and the RX thread's stay equal. Once placing, a segment after a gap also goes to lwIP
// without its payload, but its mbuf is kept (bounded, see kHeld) and placed, its headers then forwarded with
// the payload standing in, as soon as the gap is filled; a frame with a bad IP (or, when verified, TCP)
// checksum is dropped before anything is placed, as lwIP would drop it. handover(sink) stops forwarding: the connection's frames
// are held (as mbufs, bounded) and a marker goes into the frame ring; when the application reaches the marker,
// lwIP has delivered every forwarded byte, and go() lets the RX thread place from exactly there.
//
// Threads: the RX thread alone calls Port::rx_burst, consumes the free and command rings, produces the frame
// ring and calls FlowSinks; the application thread (the one that constructed this object) does the rest. No
// locks, no lwIP call and no allocation on the RX thread after start.
// Memory: slots, rings and the flow table are allocated in the constructor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include <boost/lockfree/spsc_queue.hpp>

#include "io/port.hpp"
#include "threading/config.hpp"

namespace softrdma::threading {

// Receives a handed-over connection's in-order TCP payload, on the RX thread (between go() and the end of
// remove()). The bytes are borrowed for the call (they are in an mbuf the RX thread frees afterwards).
class FlowSink {
public:
    virtual void rx_payload(std::span<const std::byte> bytes) noexcept = 0;

protected:
    ~FlowSink() = default;
};

// A connection's identity seen from this host (one local address): remote address, remote and local port.
inline std::uint64_t flow_key(std::uint32_t remote_ip_be, std::uint16_t remote_port, std::uint16_t local_port) {
    return std::uint64_t{remote_ip_be} << 32 | std::uint64_t{remote_port} << 16 | local_port;
}

using RxCounters = softrdma::RxThreadCounters;  // <softrdma/diagnostics.hpp>

class RxThread {
public:
    // Allocates slots, rings and a flow table for `max_flows` connections and starts the thread. `port` must
    // outlive this object. `verify_tcp_checksums`: drop TCP segments whose checksum is wrong (lwIP does not
    // check them in this mode); false where the link cannot corrupt frames and the peer sends none.
    RxThread(io::Port& port, const ThreadingConfig& cfg, unsigned max_flows, bool verify_tcp_checksums = true);
    ~RxThread();
    RxThread(const RxThread&) = delete;
    RxThread& operator=(const RxThread&) = delete;

    // Stops and joins the RX thread (held frames are freed). Slots lwIP still holds stay valid until this
    // object is destroyed.
    void stop() noexcept;

    // ---- application thread ----------------------------------------------------------------------------
    enum class Kind : std::uint8_t {
        frame,    // a whole frame in the slot
        headers,  // the frame's headers; its TCP payload (payload_len bytes) went to the flow's sink
        gap,      // the frame's headers with the payload dropped (after a gap): send a duplicate ACK
        marker,   // the flow reached its handover point (no slot): call go()
    };
    struct Frame {
        Kind kind;
        std::byte* data;           // slot bytes (not for marker)
        std::uint32_t len;
        std::uint32_t payload_len;  // headers: TCP payload lwIP must count
        std::uint32_t slot;
        std::uint16_t flow;         // gap, marker: the flow id given to watch()
    };
    // Hands up to `max` items to `f(const Frame&)`, oldest first; returns how many. Ownership: the slot is
    // the application side's until release(slot).
    template <class F>
    unsigned drain(unsigned max, F&& f) {
        unsigned n = 0;
        Desc d;
        while (n < max && ring_.pop(d)) {
            f(Frame{d.kind, d.kind == Kind::marker ? nullptr : slot_data(d.slot), d.len, d.payload_len, d.slot, d.flow});
            ++n;
        }
        return n;
    }
    // Gives a slot back to the RX thread. Ownership: the RX thread's from here.
    void release(std::uint32_t slot) noexcept {  // never full: each ring holds every slot of its kind
        if (slot < nslots_) free_.push(slot);
        else large_free_.push(slot);
    }

    // Connection hand-over (see the header comment). `flow` is the caller's id, < max_flows, unique among live
    // flows. Each call queues a command; false if the command ring stayed full for a second (not expected:
    // it holds four commands per flow).
    bool watch(std::uint16_t flow, std::uint64_t key, std::uint32_t rcv_nxt) noexcept;
    bool handover(std::uint16_t flow, FlowSink* sink) noexcept;
    bool go(std::uint16_t flow) noexcept;
    // Forgets the flow; `done` becomes true (release) once the RX thread will not touch its sink again.
    bool remove(std::uint16_t flow, std::atomic<bool>& done) noexcept;
    // Sleeping instead of polling: the application thread sets `*flag` (true) and sleeps on `fd` (an eventfd);
    // when the RX thread next hands anything over, it clears the flag and writes `fd` once. Set before use,
    // from the application thread; both outlive this object's thread.
    void set_wakeup(std::atomic<bool>* flag, int fd) noexcept {
        wake_flag_.store(flag, std::memory_order_release);
        wake_fd_ = fd;
    }
    // True when frames are waiting for drain() (application thread).
    bool pending() const noexcept { return ring_.read_available() != 0; }
    // Waits until the RX thread has finished any work it was doing when called (two loop turns), so memory
    // it might have been writing can be reused. Bounded (1 s); false if the thread did not move.
    bool quiesce() const noexcept;

    RxCounters counters() const noexcept;
    unsigned max_flows() const noexcept { return max_flows_; }
    // Layer accounting (ContextConfig::layer_cycles): from the next loop turn on, turns that received frames
    // add their cycles to RxCounters::cycles_io / cycles_place / cycles_forward. Any thread.
    void count_cycles(bool on) noexcept { count_cycles_.store(on, std::memory_order_relaxed); }

private:
    struct Desc {
        std::uint32_t slot{0};
        std::uint32_t len{0};
        std::uint32_t payload_len{0};
        std::uint16_t flow{0};
        Kind kind{Kind::frame};
    };
    struct Cmd {
        enum class Op : std::uint8_t { watch, handover, go, remove } op{Op::watch};
        std::uint16_t flow{0};
        std::uint32_t seq{0};
        std::uint64_t key{0};
        FlowSink* sink{nullptr};
        std::atomic<bool>* done{nullptr};
    };
    // Frames of one flow held between handover() and go(). Sizing rule: what a peer sends in one application
    // turn after the MPA reply (a few frames); beyond it frames are dropped unacknowledged and TCP resends.
    // In place state the same array keeps segments that arrived after a hole (out of order), to be placed
    // once the hole is filled, as lwIP's out-of-sequence queue does run to completion: the peer then resends
    // only the lost segment (lwIP has no SACK: without this it resends everything after the hole, one
    // retransmission timeout at a time). At most kOooTotal such frames over all flows (the mbuf pool's
    // margin, io/port.cpp kStackHeldFrames); beyond it their payload is dropped as before.
    static constexpr unsigned kHeld = 64;
    static constexpr unsigned kOooTotal = 512;
    // With large frames (memif, large segments) each held frame is a 64 KiB mbuf of the port's RX pool, which
    // reserves 256 for frames held outside its ring (io/port.cpp, kLargeRxHeld): out-of-order ones take at
    // most half, so the frame that fills the hole always finds an mbuf to arrive in.
    static constexpr unsigned kOooLarge = 128;
    // Whole large frames for connections not handed over (forward state: the peer's first large segments
    // can arrive before the handover) go into large slots (a small slot holds an MTU-sized frame or a large
    // one's headers). Sizing rule: one memif ring of large frames (2^5: io/port.cpp memif_log2_ring), 2 MiB;
    // beyond it such a frame is dropped unacknowledged and TCP resends it.
    static constexpr unsigned kLargeSlots = 32;
    struct Flow {
        enum class State : std::uint8_t { unused, forward, hold, place } state{State::unused};
        std::uint64_t key{0};
        std::uint32_t rcv_nxt{0};
        FlowSink* sink{nullptr};
        unsigned nheld{0};
        std::array<rte_mbuf*, kHeld> held{};
    };

    void run() noexcept;
    bool push_cmd(const Cmd& c) noexcept;
    void do_commands() noexcept;
    void process(rte_mbuf* m) noexcept;
    void place_held(Flow& fl, std::uint16_t id) noexcept;
    void forward_copy(const rte_mbuf* m, std::uint32_t tcp_payload) noexcept;
    void forward_headers(const std::byte* frame, std::uint32_t hdr_len, std::uint32_t payload_len, Kind kind,
                         std::uint16_t flow) noexcept;
    Flow* find(std::uint64_t key, std::uint16_t* id) noexcept;
    void index_insert(std::uint64_t key, std::uint16_t id) noexcept;
    void index_erase(std::uint64_t key) noexcept;
    std::byte* slot_data(std::uint32_t slot) noexcept {
        return slot < nslots_ ? mem_.get() + std::size_t{slot} * slot_size_
                              : large_mem_.get() + std::size_t{slot - nslots_} * large_size_;
    }
    static void add(std::atomic<std::uint64_t>& c, std::uint64_t n) noexcept {
        c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);  // one writer: no RMW
    }
    static void sub(std::atomic<std::uint64_t>& c, std::uint64_t n) noexcept {
        c.store(c.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
    }

    io::Port& port_;
    ThreadingConfig cfg_;
    std::uint32_t slot_size_;
    unsigned nslots_;
    std::uint32_t large_size_;  // large slots (numbered from nslots_ on): 0 and none without large frames
    unsigned nlarge_;
    unsigned ooo_cap_;          // kOooTotal, or kOooLarge with large frames
    unsigned max_flows_;
    bool verify_tcp_;
    std::unique_ptr<std::byte[]> mem_;
    std::unique_ptr<std::byte[]> large_mem_;
    // Sizing rules: the frame ring holds every slot (small and large) plus one marker per flow; each free ring
    // every slot of its kind; the command ring four commands per flow (watch, handover, go, remove). None can
    // overflow.
    boost::lockfree::spsc_queue<Desc> ring_;            // RX thread -> application
    boost::lockfree::spsc_queue<std::uint32_t> free_;  // application -> RX thread: empty slots
    boost::lockfree::spsc_queue<std::uint32_t> large_free_;  // the same for large slots
    boost::lockfree::spsc_queue<Cmd> cmd_;             // application -> RX thread
    // RX thread only.
    std::vector<Flow> flows_;                // by flow id
    std::vector<std::uint32_t> index_;       // open addressing on key: flow id + 1, 0 = empty
    std::unique_ptr<std::byte[]> linear_;    // one chained frame made contiguous
    std::atomic<bool> stop_{false};
    std::atomic<std::int32_t> lcore_{-1};  // RxThreadCounters::lcore (set once, before the first poll)
    std::atomic<bool> count_cycles_{false};
    bool counting_ = false;                 // count_cycles_ as this turn read it (RX thread only)
    std::uint64_t place_cycles_ = 0;        // this turn's, in the QPs' receive halves (RX thread only)
    std::atomic<std::uint64_t> epoch_{0};    // loop turns
    std::atomic<std::atomic<bool>*> wake_flag_{nullptr};
    int wake_fd_{-1};
    void wake() noexcept;
    // Written by the RX thread only (relaxed); read by anyone.
    unsigned ooo_held_{0};  // frames kept after a hole, all flows (RX thread only)
    std::atomic<std::uint64_t> frames_{0}, bytes_copied_{0}, tcp_copied_{0}, tcp_placed_{0}, dropped_{0}, ooo_{0},
        stalled_{0}, held_{0}, cyc_io_{0}, cyc_place_{0}, cyc_forward_{0};
    std::thread thread_;
};

}  // namespace softrdma::threading
