// SPDX-License-Identifier: MIT
// Internal to io/: what io::Port does inside DPDK 22.11's memif driver. MemifGuard keeps the driver from
// unmapping a connection's shared memory while this process may still be inside rx/tx burst on it (what the
// driver does and why this is needed: memif_guard.cpp; how io::Port uses it: port.cpp, Port::watch_link and
// Port::close). MemifServerPath is a memif server's receive and transmit, done by the port itself.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct rte_mbuf;
struct rte_mempool;

namespace softrdma::io::detail {

struct MemifRingHead;  // io/memif_layout.hpp
struct MemifDesc;

// DPDK 22.11's memif driver leaves a server socket's listener behind when the last device on the socket goes
// (memif_guard.cpp, "A server socket's listener"). Called before that device stops, under the lock that
// serialises memif devices' probes and closes per socket (port.cpp): takes the listener from the driver. False
// when it could not (logged).
bool retire_memif_listener(const std::string& socket, const std::string& port) noexcept;

// A connection DPDK 22.11's memif server accepted and then gave up on (its HELLO could not be sent: the client
// had left) keeps its interrupt callback, which makes the interrupt thread panic at its next epoll rebuild
// (memif_guard.cpp, "Connections the listener gave up on"). Listeners wrapped so far in this process (0 at a
// server's open: the wrapping is not in effect, and port.cpp warns), and such callbacks removed so far.
unsigned memif_listeners_wrapped() noexcept;
std::uint64_t memif_channels_dropped() noexcept;
// Connections a server socket's listener accepted that no device took, ended when the socket's last device
// closed (retire_memif_listener): their client sees the end; an INIT of theirs after the driver freed the socket
// would have had the interrupt thread follow the freed socket. Then the listener's own interrupt source goes and
// its number (`listener`'s, holding the listener or `replacement`) is closed. Counted so far in this process:
// connections ended, the driver's state of those freed, listeners closed.
unsigned end_untaken_channels(int listener, int replacement) noexcept;
std::uint64_t memif_channels_ended() noexcept;
std::uint64_t memif_channels_freed() noexcept;
std::uint64_t memif_listeners_closed() noexcept;

// Whether two descriptors name the same open file (device and inode); false if either is not open.
bool same_file(int a, int b) noexcept;

// What port.cpp asked the driver for, to recognise the driver's private state.
struct MemifExpect {
    std::string socket;
    bool server = true;
    unsigned id = 0;
    std::uint16_t buffer_size = 0;
    std::uint8_t log2_ring_size = 0;
    bool zero_copy = false;          // a zero-copy client: find the queues whose lent mbufs reclaim_lent() returns
    const void* rx_pool = nullptr;   // the RX queue's mempool
};

// The memif driver's control-channel lock, held by io::Port for as long as the data path may touch the
// shared memory. memif_disconnect() is the only code in the driver that unmaps it, and it takes this lock
// first (after marking the link down), so while we hold it, nothing is unmapped.
//
// Threads: every call comes from the control side of one Port (its link watcher thread, or close() after
// the watcher stopped): never two at once. None of them blocks.
class MemifGuard {
public:
    // Finds the driver's private state of started port `port_id` and checks that it is the DPDK 22.11 layout
    // this file knows (version, names, queues, id, role, socket, ring sizes). False, with the reason in `why`,
    // when not: then no other call may be made.
    bool attach(std::uint16_t port_id, const std::string& name, const MemifExpect& expect, std::string& why);
    bool attached() const noexcept { return pmd_ != nullptr; }

    // Takes the lock if free (the driver holds it only briefly, inside memif_disconnect).
    bool try_hold() noexcept;
    void release() noexcept;
    bool held() const noexcept { return held_; }

    // Only while held: refuses new connections (server) and shuts the control channel's socket down, so the
    // driver's interrupt thread, and only it, runs the disconnect once release() lets it through. Returns
    // whether there was a channel to shut.
    bool shut_channel() noexcept;
    // No disconnect work left: no control channel and the connection parameters cleared (the last thing
    // memif_disconnect does after unmapping).
    bool settled() const noexcept;
    // The driver state settled() looks at, for error messages.
    std::string describe() const;

    // Zero-copy client only, with the burst gate shut and the lock held since the link came up (so the
    // driver's disconnect, if under way, waits for us and the rings are mapped): gives the mbufs the driver
    // lent out back to their pools (RX buffers posted to the peer, sent frames it had not finished with), as
    // DPDK 22.11's disconnect does not. No effect when attach() did not recognise the queues (it then says
    // why and attached() still holds).
    void reclaim_lent() noexcept;
    // Zero-copy client, closing or about to connect again (PortConfig::memif_reconnect), once settled(): frees
    // the driver's arrays of lent mbufs, which it allocates per connection and never frees.
    void release_lent_arrays() noexcept;
    // Whether the device still refuses connections: shut_channel() set that bit, but the driver's disconnect
    // rewrites the same word without atomics on the interrupt thread, so it can be lost (Port::close checks).
    bool refusing() const noexcept;
    // After the port stopped, right before rte_eth_dev_close: frees the TX queue's interrupt instance, which
    // DPDK 22.11's memif_tx_queue_release leaves behind (its RX twin frees its own): ~27 KiB of DPDK's heap
    // per port closed. Nothing when attach() did not find the queue.
    void free_tx_interrupt() noexcept;

private:
    void* pmd_ = nullptr;  // the driver's struct pmd_internals (see memif_guard.cpp)
    void* tx_queue_ = nullptr;  // the driver's struct memif_queue for TX (any role)
    const void* dev_ = nullptr;  // zero-copy client: its struct rte_eth_dev, and its queues (struct memif_queue)
    void* txq_ = nullptr;
    void* rxq_ = nullptr;
    bool held_ = false;
};

// A memif server's receive and transmit in place of the driver's, on the driver's own queues and rings (the
// same state, so either can run any burst). DPDK 22.11's memif server always copies frames between the
// client's ring buffers and its mbufs, with rte_memcpy compiled for SSE4.2 in Debian's build; this copies with
// the C library's memcpy (AVX-512 / rep movsb here): 128-256 KiB SEND round trips 15-24 % shorter, 8 MiB
// WRITEs 13 % faster (bench/RESULTS.md, "The memif server's own copies"). And it trusts nothing the client wrote: every
// descriptor is checked against the client's regions before a byte is read or written (the driver reads and
// writes wherever a descriptor points), as are the ring indexes; a frame the client described outside its
// memory, or larger than 64 KiB, is dropped and counted (peer_faults()).
//
// Lifetimes: as the driver's. It reads the regions' mapping on each call; the port's burst gate and MemifGuard
// keep that mapping in place while a call runs. Each received frame is copied into mbufs of the RX queue's pool
// (ownership: the caller's, as from rx_burst) and its ring slots given back before the call returns; each
// frame sent is copied into the client's buffers and freed (ownership: taken, as by tx_burst).
// Threads: rx() from the port's one RX thread, tx() from its one TX thread, as the driver's bursts.
// Interrupt mode (the receiver asked for an eventfd signal, which io::Port never does): the driver's burst runs.
class MemifServerPath {
public:
    // For a memif server whose MemifGuard::attach succeeded (so the layout is the one memif_layout.hpp
    // knows): finds its queues and checks them (one each way, this port's, client-to-server for RX). False,
    // with the reason in `why`, when not: then the driver's bursts stay in use. `wire_token`: the port's token
    // for base/tsan.hpp's wire annotations (see rx() and tx()).
    bool attach(std::uint16_t port_id, const std::string& name, const void* wire_token, std::string& why);
    bool attached() const noexcept { return rxq_ != nullptr; }

    std::uint16_t rx(rte_mbuf** out, std::uint16_t want) noexcept;
    std::uint16_t tx(rte_mbuf** frames, std::uint16_t count) noexcept;

    // Pre-owning (PortConfig::memif_pre_own): while this process waits, takes for writing (prefetchw) the lines
    // of the buffers the client has posted for our next frames, up to `max_lines` lines a call and kPreOwnMax
    // bytes ahead of the last frame sent, in ring order from the next slot tx() fills. Those lines were last
    // read by the client's core (it placed the frames we sent before); without this, tx()'s copy into them
    // waits for each to be taken from that core, on the critical path of a reply. A hint only: nothing is
    // written, a posted buffer outside the client's memory is skipped (buffer_of), a broken ring index ends the
    // walk (tx() counts those faults, this does not). The copy of a 32 KiB reply 2.0 -> 1.1 us; SEND half round
    // trip, memif, slow spell, medians of 4 interleaved rounds (bench/RESULTS.md, "Taking the client's buffers
    // before the reply"): 32 KiB 5.70 -> 5.28 us, 256 KiB 22.3 -> 21.2 us, 64 B and streams unchanged.
    // Threads: tx()'s thread (the walk's position is tx()'s state). Caller: base::cpu_has_prefetchw().
    void pre_own(unsigned max_lines) noexcept;
    // Sizing: the largest frame the stack sends (a 64 KiB TCP segment); lines further ahead would be taken from
    // the client long before they are written, or evicted first.
    static constexpr std::uint32_t kPreOwnMax = 64 * 1024;
    // Bytes of posted buffers pre-owned so far (any thread; relaxed).
    std::uint64_t pre_owned() const noexcept { return __atomic_load_n(&pre_owned_, __ATOMIC_RELAXED); }

    // Borrowed receive (PortConfig::memif_borrow_rx). A frame of kBorrowMin bytes or more is not copied: it
    // arrives as a copy of its first kHeaderCopy bytes (every header lwIP reads and rewrites in place, in memory
    // of ours), then per descriptor an external buffer over the rest (kBorrowPiece bytes or more; smaller rests
    // are copied), in this process's own mapping of the client's region (a lease, mapped at link-up from the
    // region's file descriptor, so a borrowed frame stays readable after the driver unmaps at a disconnect). Its
    // ring slot goes back to the client when the mbuf is freed (the free callback; slots in ring order), not at
    // the end of the call.
    // Ownership: as rx()'s; whoever frees the last segment gives the slot back. Threads: every borrowed frame
    // must be freed on the thread that calls rx() (run to completion: the stack frees them in its turn), and
    // none may be kept long (a held slot holds every later one: see Port::unborrow, used for segments lwIP
    // would queue out of order).
    // Control side (the port's link watcher, open_gate, close), with the gate shut and the driver's lock held:
    // enable_borrowing once after attach(), link_up() at each connection, link_down() when it ends, reap()
    // now and then (unmaps leases whose frames all came back).
    void enable_borrowing(rte_mempool* header_pool, unsigned log2_ring);
    void link_up() noexcept;
    void link_down() noexcept;
    void reap() noexcept;
    // Borrowed frames not yet freed (any thread; relaxed).
    std::uint32_t borrowed_out() const noexcept;
    bool borrowing() const noexcept { return header_pool_ != nullptr; }
    std::uint64_t frames_borrowed() const noexcept { return __atomic_load_n(&borrowed_, __ATOMIC_RELAXED); }
    // Whether `m` (one segment) is a borrowed frame's external buffer.
    static bool borrowed(const rte_mbuf* m) noexcept;
    static constexpr std::uint32_t kBorrowMin = 4096;
    static constexpr std::uint32_t kHeaderCopy = 256;  // >= Ethernet 14 + IPv4 60 + TCP 60, a few cache lines
    static constexpr std::uint32_t kBorrowPiece = 1024;  // a descriptor's bytes borrowed from this many on
    struct Lease;  // memif_guard.cpp
    MemifServerPath();
    ~MemifServerPath();
    MemifServerPath(const MemifServerPath&) = delete;
    MemifServerPath& operator=(const MemifServerPath&) = delete;

    // Frames dropped because the client described them outside its shared memory (or too long, or with too
    // many descriptors), plus ring indexes it set to impossible values and rings it placed outside its
    // regions (each counted once while it lasts); from any thread (relaxed loads).
    std::uint64_t peer_faults() const noexcept {
        return __atomic_load_n(&rx_faults_, __ATOMIC_RELAXED) + __atomic_load_n(&tx_faults_, __ATOMIC_RELAXED);
    }

    // Largest frame taken (Ethernet frames of IPv4 packets are smaller); a larger one is a peer fault.
    static constexpr std::uint32_t kMaxFrame = 65535;
    // Most descriptors one received frame may span: a 64 KiB frame in 2 KiB buffers takes 32.
    static constexpr unsigned kMaxDescs = 64;

private:
    void fault(std::uint64_t& counter) noexcept { __atomic_store_n(&counter, counter + 1, __ATOMIC_RELAXED); }
    // Queue q's ring while connected, or null: not connected, not mapped yet, or placed outside its region
    // (a fault, counted once while it lasts through `bad_ring`).
    MemifRingHead* connected_ring(void* q, std::uint64_t& faults, bool& bad_ring) noexcept;
    // The server-to-client ring as tx() and pre_own() read it: the buffers the client has posted and we have
    // not filled, [tail, head).
    struct Posted {
        MemifRingHead* ring = nullptr;
        MemifDesc* descs = nullptr;
        std::uint16_t size = 0, mask = 0, tail = 0, head = 0;
        std::uint16_t count() const noexcept { return static_cast<std::uint16_t>(head - tail); }
    };
    enum class PostedState : std::uint8_t {
        none,    // not connected (or the ring lies outside its region: counted by connected_ring)
        driver,  // the client wants interrupts: the driver's tx signals them
        ok,
        bad      // more posted than the ring holds: the caller decides whether it is a fault
    };
    PostedState posted(Posted& w) noexcept;
    static void mark_done(Lease& l, std::uint16_t from, std::uint16_t to) noexcept;
    rte_mbuf* borrow(Lease& l, const MemifDesc* d, const std::byte* const* src, const std::uint32_t* len, unsigned k,
                     std::uint16_t slot, std::uint32_t total) noexcept;

    std::uint16_t port_id_ = 0;
    const void* wire_token_ = nullptr;
    void* pmd_ = nullptr;            // the driver's struct pmd_internals
    void* process_private_ = nullptr;  // its struct pmd_process_private: the mapped regions
    void* rxq_ = nullptr;            // struct memif_queue: client-to-server
    void* txq_ = nullptr;            // server-to-client
    std::uint64_t rx_faults_ = 0;    // written by rx() only
    std::uint64_t tx_faults_ = 0;    // written by tx() only
    std::uint32_t rx_bad_head_ = ~0u;  // an impossible ring head, counted once until it changes
    std::uint32_t tx_bad_head_ = ~0u;
    bool rx_bad_ring_ = false;  // the ring lies outside its region, counted once until it does not
    bool tx_bad_ring_ = false;
    // Borrowed receive: the pool of the two mbufs a borrowed frame takes (null: borrowing off), two leases
    // (the connection's, and one whose frames may still be out after a disconnect), the one rx() uses (null:
    // copy; written by the control side while the gate is shut, read by rx() inside it).
    rte_mempool* header_pool_ = nullptr;
    std::unique_ptr<Lease> leases_[2];
    Lease* current_ = nullptr;
    std::uint64_t borrowed_ = 0;  // frames borrowed, written by rx() only
    // pre_own()'s walk, tx()'s thread only: the slot and the offset in its buffer it goes on from, and the bytes
    // it has taken since tx() last filled a buffer (which restarts it at the new tail).
    std::uint16_t own_slot_ = 0;
    std::uint32_t own_off_ = 0;
    std::uint32_t own_ahead_ = 0;
    std::uint64_t pre_owned_ = 0;  // written by pre_own() only
};

}  // namespace softrdma::io::detail
