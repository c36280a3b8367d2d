// SPDX-License-Identifier: MIT
// One DPDK Ethernet port with one RX and one TX queue, behind a small interface. The backend (memif,
// af_packet, ring, or a real device) is chosen at run time from PortConfig.
//
// Threads (one RX queue, one TX queue):
// - rx_burst() is called by one thread at a time (e.g. a dedicated RX thread) and tx_burst() by one thread
//   at a time (possibly another). Their counters are written only by that direction's thread. Nothing here
//   touches lwIP.
// - Each burst passes a gate: an atomic "busy" flag of its direction, then the port's "open" flag, both
//   seq_cst (no lock, no allocation). Once the link goes down or close() begins, the gate is shut and bursts
//   return 0 without entering the driver (tx frames stay with the caller, counted as tx_refused).
// - close() may run on any thread, even while other threads still poll: it shuts the gate and waits (up to
//   1 s) for bursts in flight to leave. The Port object itself must outlive every thread that calls it.
// - alloc(), link_up(), mbufs_in_use(), device_stats(): any thread.
// - memif: a control thread per port ("sr-link-<port>") watches the link every millisecond; see close() and
//   io/memif_guard.cpp for why DPDK 22.11's memif needs it.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <pthread.h>
#include <span>
#include <string>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <softrdma/config.hpp>
#include <softrdma/diagnostics.hpp>

#include "base/tsan.hpp"
#include "io/eal.hpp"
#include "io/error.hpp"
#include "io/memif_guard.hpp"
#include "io/tx_arena.hpp"

namespace softrdma::io {

class PcapWriter;
class FaultInjector;

// The configuration and counters are the API's (<softrdma/config.hpp>, <softrdma/diagnostics.hpp>).
using softrdma::Backend;
using softrdma::MacAddress;
using softrdma::PortConfig;
using softrdma::PortCounters;

class Port {
public:
    ~Port();
    Port(const Port&) = delete;
    Port& operator=(const Port&) = delete;

    // Receives up to out.size() frames. Ownership: each returned mbuf now belongs to the caller, who must
    // rte_pktmbuf_free() it (or hand it on, saying who frees it). As a memif zero-copy client, that mbuf is the
    // one the driver had lent the peer, which wrote the frame into it; the driver lends it a fresh one.
    // Returns 0 once the link is down or the port is closing (see Threads).
    std::uint16_t rx_burst(std::span<rte_mbuf*> out) noexcept {
        std::uint16_t n = 0;
        rx_busy_.store(true);  // seq_cst, before reading open_: pairs with shut_gate()
        if (open_.load()) [[likely]] {
            if (rx_faults_) [[unlikely]] n = rx_faulty(out);
            else n = driver_rx(out.data(), static_cast<std::uint16_t>(out.size()));
            if (n != 0) {
                // The sender's writes (the peer's answer to what this process sent; on a ring pair inside one
                // process, the frame itself) happen before anything here reads them (base/tsan.hpp).
                wire_acquire(this);
                account_rx(out.first(n));
            }
        }
        rx_busy_.store(false, std::memory_order_release);
        return n;
    }
    // Queues frames for transmission. Ownership: the first `return value` mbufs now belong to the driver;
    // the rest stay with the caller (retry or free). As a memif zero-copy client the driver keeps them (and the
    // TX chunks they reference) until the peer has read them, and frees them in a later tx_burst. Once the link is down or the port is closing, none are
    // taken (see Threads).
    std::uint16_t tx_burst(std::span<rte_mbuf*> frames) noexcept {
        std::uint16_t n = 0;
        tx_busy_.store(true);  // seq_cst, before reading open_: pairs with shut_gate()
        if (open_.load()) [[likely]] {
            if (capture_) [[unlikely]] capture_tx(frames);  // before the driver may free them
            if (tx_faults_) [[unlikely]] {
                account_tx(frames, static_cast<std::uint16_t>(frames.size()));  // all taken (see FaultConfig)
                tx_faulty(frames);
                tx_busy_.store(false, std::memory_order_release);
                return static_cast<std::uint16_t>(frames.size());
            }
            n = driver_tx(frames.data(), static_cast<std::uint16_t>(frames.size()));
        }
        account_tx(frames, n);
        tx_busy_.store(false, std::memory_order_release);
        return n;
    }

    // Fault injection (PortConfig::faults): on or not, what was done per direction, and frames held back now
    // (they count as mbufs in use). tx_release_held(): sends held TX frames that are due (the stack calls it
    // when it has nothing else to send).
    bool faults_on() const noexcept { return rx_faults_ != nullptr; }
    // From any thread (the RX thread bursts RX while the application reads them): relaxed atomic loads.
    FaultCounters rx_fault_counters() const noexcept { return load(rx_fault_counters_); }
    FaultCounters tx_fault_counters() const noexcept { return load(tx_fault_counters_); }
    std::size_t faults_held() const noexcept;
    void tx_release_held() noexcept {
        if (tx_faults_) [[unlikely]] tx_burst({});
    }
    // Lets the driver free what the peer has finished reading without sending anything: a memif zero-copy
    // client's driver keeps sent frames (and the TX chunks they reference) until a later tx_burst, so with
    // nothing to send those chunks would stay out of the arena (stack::Stack wakes its chunk waiters with this
    // when the arena is empty). No effect on other drivers. Same thread as tx_burst, through the same gate.
    void reclaim_tx() noexcept {
        if (!memif_zero_copy_ || own_server_path_) return;
        tx_busy_.store(true);  // seq_cst, before reading open_: pairs with shut_gate()
        rte_mbuf* none[1];
        if (open_.load()) [[likely]] rte_eth_tx_burst(port_id_, 0, none, 0);  // frees, queues nothing
        tx_busy_.store(false, std::memory_order_release);
    }

    enum class CloseResult {
        clean,         // stopped and closed; the device is gone, the mbuf pool holds what it held before
        left_to_exit,  // could not be closed safely (see close()); released at process exit
    };
    // Ordered teardown, whether or not the peer is still there: shut the burst gate and wait for bursts in
    // flight, then (memif) let DPDK's interrupt thread alone finish the link's disconnect, then stop, close
    // and remove the device. Idempotent; the destructor calls it. left_to_exit (with a log line saying why)
    // when a burst is still inside the driver after 1 s or the driver's disconnect does not finish within
    // 5 s: then nothing is unmapped under anyone, and the process exit releases the port.
    CloseResult close() noexcept;
    bool closed() const noexcept { return closed_; }
    // For error messages: link state, memif driver state and what DPDK's interrupt thread is doing.
    std::string driver_state() const;
    // Times the link went down under this port (the peer left) while it was open.
    unsigned link_losses() const noexcept { return link_losses_.load(std::memory_order_relaxed); }
    // memif client: attempts to connect again after the server left (Port::watch_link).
    unsigned relinks() const noexcept { return relinks_.load(std::memory_order_relaxed); }
    // memif, closing: times the device's refusal of new connections was found lost to the driver's own writes
    // of its flags and set again (close(), finish_memif_link).
    unsigned refusals_restored() const noexcept { return refusals_restored_.load(std::memory_order_relaxed); }

    // Borrowed receive (PortConfig::memif_borrow_rx; io::detail::MemifServerPath): on or not, whether frame `m`
    // has a borrowed segment, and unborrow(): a copy of it in an mbuf of the RX pool, `m` freed (its ring slot
    // goes back to the client), for a frame that would be kept (lwIP's out-of-order queue). Ownership: `m`
    // taken; the copy is the caller's; null when no mbuf is left (the frame is gone: TCP resends it).
    // Same thread as rx_burst.
    bool borrowing() const noexcept { return own_server_path_ && server_path_.borrowing(); }
    static bool borrowed(const rte_mbuf* m) noexcept;
    rte_mbuf* unborrow(rte_mbuf* m) noexcept;
    // Frames borrowed so far, and those not yet freed (any thread; relaxed).
    std::uint64_t frames_borrowed() const noexcept { return own_server_path_ ? server_path_.frames_borrowed() : 0; }
    std::uint32_t borrowed_out() const noexcept { return own_server_path_ ? server_path_.borrowed_out() : 0; }

    // The stack has nothing to do this turn: a memif server with its own path takes the client's next posted
    // buffers for writing (PortConfig::memif_pre_own; MemifServerPath::pre_own), kPreOwnLines lines a call, so
    // an idle turn stays short. No effect otherwise. Same thread as tx_burst, through the same gate (it reads
    // the client's ring and buffers, which a disconnect unmaps).
    void idle() noexcept {
        if (!pre_own_) return;
        tx_busy_.store(true);  // seq_cst, before reading open_: pairs with shut_gate()
        if (open_.load()) [[likely]] server_path_.pre_own(kPreOwnLines);
        tx_busy_.store(false, std::memory_order_release);
    }
    // Sizing: an idle turn is ~0.1-0.2 us; 16 prefetches add ~10 ns to it, and a 5 us wait for the peer (a 32 KiB
    // round trip's half) takes 32 KiB or more.
    static constexpr unsigned kPreOwnLines = 16;

    // An mbuf from this port's pool (nullptr when the pool is empty). Ownership: the caller's.
    rte_mbuf* alloc() noexcept { return rte_pktmbuf_alloc(pool_); }
    rte_mempool* pool() const noexcept { return pool_; }
    // Zero-copy transmit chunks (PortConfig::tx_zero_copy); null when off or the driver cannot chain mbufs.
    // Used by the thread that calls tx_burst (see TxArena).
    TxArena* tx_arena() noexcept { return tx_arena_.get(); }
    const TxArena* tx_arena() const noexcept { return tx_arena_.get(); }
    // Mbufs currently out of the pools (in rings, held by the stack, or in flight), for leak checks; both pools
    // with large frames.
    unsigned mbufs_in_use() const noexcept;
    unsigned mbufs_total() const noexcept;
    // The largest frame one RX mbuf holds with large frames (the most an mbuf's 16-bit data room allows): each
    // received frame of up to this size lands whole in one mbuf of the RX pool (see rx_pool_).
    static constexpr std::uint32_t kLargeRxFrame = UINT16_MAX - RTE_PKTMBUF_HEADROOM;

    std::uint16_t id() const noexcept { return port_id_; }
    const std::string& name() const noexcept { return name_; }
    const MacAddress& mac() const noexcept { return mac_; }
    std::uint16_t mtu() const noexcept { return mtu_; }
    // Frames up to 64 KiB fit the link whole (memif with PortConfig::memif_large_frames).
    bool large_frames() const noexcept { return large_frames_; }
    bool is_memif() const noexcept { return memif_; }
    // memif zero-copy client (PortConfig::memif_zero_copy, with hugepages): the peer reads what we send from our
    // own memory, so every TX mbuf's data must lie in DPDK's memory (no payload attached from application
    // memory), and the driver keeps up to driver_held() mbufs (a ring of RX buffers given to the peer, a ring of
    // sent frames it has not read yet) out of the pools.
    bool memif_zero_copy() const noexcept { return memif_zero_copy_; }
    unsigned driver_held() const noexcept { return driver_held_; }
    // Most mbufs one TX frame may have: the memif zero-copy client's ring size (each mbuf takes a descriptor, and
    // the driver refuses a frame the ring could never hold, every time), else DPDK's limit for a chain.
    unsigned tx_max_segments() const noexcept { return tx_max_segments_; }
    bool capturing() const noexcept { return capture_ != nullptr; }
    // Largest frame (Ethernet header + MTU) one mbuf of pool() holds without chaining (TX; RX too unless large
    // frames, whose RX mbufs hold kLargeRxFrame).
    std::uint32_t mbuf_data_room() const noexcept;
    bool link_up() const noexcept;
    // A snapshot, from any thread: the RX fields are written by the RX burst's thread (relaxed atomic stores,
    // read with relaxed loads here), the TX fields by the TX burst's thread (exact from that thread).
    PortCounters counters() const noexcept {
        PortCounters c = counters_tx_view();
        c.rx_packets = __atomic_load_n(&counters_.rx_packets, __ATOMIC_RELAXED);
        c.rx_bytes = __atomic_load_n(&counters_.rx_bytes, __ATOMIC_RELAXED);
        if (own_server_path_) {
            c.peer_faults = server_path_.peer_faults();
            c.rx_borrowed = server_path_.frames_borrowed();
            c.rx_borrowed_out = server_path_.borrowed_out();
            c.tx_pre_owned = server_path_.pre_owned();
        }
        return c;
    }
    // The driver's own statistics (imissed, ierrors, rx_nombuf...).
    rte_eth_stats device_stats() const noexcept;
    // Flushes the capture file (if any) to disk.
    void flush_capture() noexcept;

private:
    friend std::unique_ptr<Port> open_port(const PortConfig&, const EalConfig&);
    friend std::array<std::unique_ptr<Port>, 2> open_ring_pair(const PortConfig&, const PortConfig&,
                                                               const EalConfig&);
    Port(std::uint16_t port_id, std::string name, const PortConfig& cfg, bool memif_zero_copy = false);
    void check_zero_copy_memory() const;
    void start(const PortConfig& cfg);
    void wait_link(std::chrono::milliseconds timeout);
    void attach_guard(const PortConfig& cfg);
    bool leave_memif_socket() noexcept;  // port.cpp, "memif devices per socket name"
    void open_gate(std::chrono::steady_clock::time_point deadline);
    bool shut_gate(std::chrono::milliseconds limit) noexcept;
    static void* watch_link_main(void* self) noexcept;
    void watch_link() noexcept;
    void stop_watcher() noexcept;
    CloseResult finish_memif_link() noexcept;
    void account_rx(std::span<rte_mbuf* const> frames) noexcept;
    static FaultCounters load(const FaultCounters& c) noexcept {
        return FaultCounters{.dropped = __atomic_load_n(&c.dropped, __ATOMIC_RELAXED),
                             .duplicated = __atomic_load_n(&c.duplicated, __ATOMIC_RELAXED),
                             .reordered = __atomic_load_n(&c.reordered, __ATOMIC_RELAXED),
                             .delayed = __atomic_load_n(&c.delayed, __ATOMIC_RELAXED),
                             .corrupted = __atomic_load_n(&c.corrupted, __ATOMIC_RELAXED)};
    }
    PortCounters counters_tx_view() const noexcept {
        return PortCounters{.tx_packets = counters_.tx_packets, .tx_bytes = counters_.tx_bytes,
                            .tx_refused = counters_.tx_refused};
    }
    void account_tx(std::span<rte_mbuf* const> frames, std::uint16_t sent) noexcept;
    void capture_tx(std::span<rte_mbuf* const> frames) noexcept;
    std::uint16_t rx_faulty(std::span<rte_mbuf*> out) noexcept;
    // The driver's receive, or the memif server's own (MemifServerPath).
    std::uint16_t driver_rx(rte_mbuf** out, std::uint16_t want) noexcept {
        if (own_server_path_) return server_path_.rx(out, want);
        return rte_eth_rx_burst(port_id_, 0, out, want);
    }
    // The driver's transmit, or the memif server's own. DPDK 22.11's memif zero-copy transmit checks for a free
    // ring slot only before each group of four frames (eth_memif_tx_zc's unrolled loop, "n_free > 4"), and each
    // further segment of a frame on its own: with chained frames (ours have 2 or more segments) the group's next frame can find the ring
    // full, and its first segment then takes the slot of a frame still in flight before the driver gives up on
    // it. The driver later frees our mbuf from that slot while we still hold it (a chain cut short: a crash or
    // a truncated frame) and never frees the one it displaced. Offered at most four at a time, the driver never
    // enters that loop.
    std::uint16_t driver_tx(rte_mbuf** frames, std::uint16_t count) noexcept {
        if (own_server_path_) return server_path_.tx(frames, count);
        if (!memif_zero_copy_) [[likely]]
            return rte_eth_tx_burst(port_id_, 0, frames, count);
        std::uint16_t n = 0;
        while (n < count) {
            const auto want = static_cast<std::uint16_t>(std::min<unsigned>(count - n, 4));
            const std::uint16_t k = rte_eth_tx_burst(port_id_, 0, frames + n, want);
            n = static_cast<std::uint16_t>(n + k);
            if (k < want) break;
        }
        return n;
    }
    void tx_faulty(std::span<rte_mbuf*> frames) noexcept;

    std::uint16_t port_id_;
    std::string name_;
    rte_mempool* pool_ = nullptr;
    // Large frames only: the RX queue's own pool of kLargeRxFrame mbufs (sizing rule in port.cpp); otherwise
    // null and RX takes its mbufs from pool_.
    rte_mempool* rx_pool_ = nullptr;
    MacAddress mac_{};
    std::uint16_t mtu_ = 1500;
    bool started_ = false;
    bool memif_ = false;
    bool memif_client_ = false;
    bool memif_reconnect_ = false;  // PortConfig::memif_reconnect (clients only)
    std::string memif_socket_;  // memif: PortConfig::memif_socket
    bool large_frames_ = false;
    bool memif_zero_copy_ = false;
    bool own_server_path_ = false;  // a memif server moving frames itself (server_path_), set before the gate opens
    unsigned driver_held_ = 0;
    unsigned tx_max_segments_ = 0;
    bool vdev_ = false;  // created on DPDK's vdev bus: removed from it when closed, so it can be opened again
    std::string device_name_;  // DPDK's device behind the port
    bool closed_ = false;
    CloseResult close_result_ = CloseResult::clean;
    // The burst gate (see Threads). open_: bursts may enter the driver; written by the control side only
    // (start, the link watcher, close). rx_busy_/tx_busy_: a burst of that direction is between its gate
    // and its return; each written only by its direction's thread. Separate cache lines: two writers.
    std::atomic<bool> open_{false};
    alignas(64) std::atomic<bool> rx_busy_{false};
    alignas(64) std::atomic<bool> tx_busy_{false};
    alignas(64) std::atomic<unsigned> link_losses_{0};
    std::atomic<unsigned> relinks_{0};
    std::atomic<unsigned> refusals_restored_{0};
    // memif only: the driver's control-channel lock, held while the gate may be open (memif_guard.hpp), and
    // the control thread that watches the link. Control side only.
    detail::MemifGuard guard_;
    detail::MemifServerPath server_path_;  // memif server, PortConfig::memif_own_server_path
    bool pre_own_ = false;                 // idle() pre-owns (PortConfig::memif_pre_own, PREFETCHW, own path)
    pthread_t watcher_{};
    bool watcher_running_ = false;
    std::atomic<bool> stop_watcher_{false};
    PortCounters counters_;
    std::unique_ptr<PcapWriter> capture_;
    // After the device is stopped (which frees the frames its TX ring still held) it may go.
    std::unique_ptr<TxArena> tx_arena_;
    // Fault injection (null when off): each used by its direction's burst thread only.
    std::unique_ptr<FaultInjector> rx_faults_;
    std::unique_ptr<FaultInjector> tx_faults_;
    FaultCounters rx_fault_counters_{};
    FaultCounters tx_fault_counters_{};
    // Refused frames are a suffix the caller offers again: remember them so the capture records each once.
    const rte_mbuf* refused_head_ = nullptr;
    std::size_t refused_count_ = 0;
};

// Starts the EAL if this process has not yet (the port's device is added to `eal.vdevs`), then configures,
// starts and waits for the link of one port. Throws io::Error with a message naming the fix on bad config,
// missing hugepages (when required), a device DPDK cannot create, or a peer that never appears.
std::unique_ptr<Port> open_port(const PortConfig& port, const EalConfig& eal = {});

// Two ports inside this process wired back to back through rte_rings (net_ring): what one sends, the
// other receives. For tests of io itself. Each port has its own config (MTU, capture file...).
std::array<std::unique_ptr<Port>, 2> open_ring_pair(const PortConfig& a, const PortConfig& b,
                                                    const EalConfig& eal = {});

// "02:00:00:00:00:01"-style text for logs.
std::string to_string(const MacAddress& mac);

}  // namespace softrdma::io
