// SPDX-License-Identifier: MIT
// lwIP bound to an io::Port: one netif (Ethernet, ARP, IPv4 with a static address), lwIP's timers driven
// from the polling loop, and the RX/TX frame hand-off between DPDK mbufs and lwIP pbufs.
//
// Threads: lwIP is single-threaded. The thread that constructs the Stack owns it (and so every TCP object
// of this process): only it may call poll(), connect(), listen() or any TcpConnection method. Debug builds
// assert this. With an RX thread (threading/), that thread polls the io::Port and hands frames in through
// input_external() / input_headers(); lwIP itself stays on the owner thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/idle.hpp"
#include "io/port.hpp"
#include "stack/fill_book.hpp"

struct netif;
struct pbuf;
struct tcp_pcb;

namespace softrdma::stack {

using softrdma::Ipv4;  // <softrdma/config.hpp>
using softrdma::IpConfig;
using softrdma::StackCounters;  // <softrdma/diagnostics.hpp>

struct StackConfig {
    IpConfig ip{};
    // Idle policy of run_until() (a turn with nothing received or sent is idle): spin 256 turns, then yield
    // the core on each further idle turn. Yielding lets two busy processes share a small machine; spinning
    // (IdlePolicy::spin_only()) gives the lowest latency when each has its own core.
    IdlePolicy idle{};
    // true: poll() does not read the port; frames arrive through input_external() (the RX thread's copies),
    // and TCP/IP checksums are still checked by lwIP.
    bool rx_external = false;
    // TCP checksums, generated and checked in software. Off only where nothing can corrupt a frame and the
    // peer agrees (memif between two softrdma processes: shared memory); IP header checksums stay.
    bool tcp_checksums = true;
    // Cost accounting: cycles in the driver calls (rx/tx burst) and in poll()/flush_tx() as a whole.
    bool count_cycles = false;
    // Large segments (a port with large_frames(); with rx_external the RX thread takes them, see
    // threading/rx_thread.hpp): TCP segments of up to kLargeSegmentMss bytes go over the link as one frame, as
    // the kernel's veth carries GSO/GRO super-frames. The netif MTU is then kLargeSegmentMtu and the SYN
    // advertises that MSS; a peer that advertises less (large segments off, another memif application) gets
    // segments of its size. Protocols
    // above size their frames for the segment (verbs: FPDUs of up to 32672 bytes, two per segment). Ignored on
    // other backends.
    bool large_segments = false;
};

// Large segments: TCP payload bytes per segment (lwipopts.h TCP_MSS): within a TX chunk (io::TxArena::kUsable), and
// the whole frame (+ 54 bytes of headers) within a 64-byte aligned memif buffer of 65472 bytes and within one RX
// mbuf (io::Port::kLargeRxFrame, 65407: a frame received whole, not as a chain).
inline constexpr std::uint32_t kLargeSegmentMss = 65344;
inline constexpr std::uint32_t kLargeSegmentMtu = kLargeSegmentMss + 40;

struct StackCycles {
    std::uint64_t io = 0;     // inside rx_burst / tx_burst
    std::uint64_t total = 0;  // inside poll() and flush_tx(), io and the receive callbacks included, and the
                              // driver calls made outside them (lwIP's output, called by a QP's flush, sending
                              // a frame from its source or draining a full queue: count_io)
};

// lwIP pool and heap usage, for leak checks: every test ends by comparing against its start.
struct PoolUsage {
    std::vector<std::pair<std::string, std::uint32_t>> pools;  // (name, objects in use)
    std::uint32_t heap_used = 0;
    std::uint32_t mbufs_in_use = 0;
    std::uint32_t driver_slack = 0;  // mbufs a driver may keep between two uses (io::Port::driver_held())
    // "" when equal, else what differs, e.g. "TCP_PCB 1 -> 2; mbufs 1534 -> 1540".
    std::string diff(const PoolUsage& later) const;
};


class TcpConnection;
class TcpListener;

class Stack {
public:
    // Binds lwIP to `port` (which must outlive the Stack). Only one Stack per process (lwIP is global).
    Stack(io::Port& port, const StackConfig& cfg);
    ~Stack();
    Stack(const Stack&) = delete;
    Stack& operator=(const Stack&) = delete;

    // One turn of the polling loop: RX burst -> lwIP input, lwIP timers, TX flush. Returns the number of
    // frames received (0 = idle turn).
    unsigned poll() noexcept;
    // Polls until `done()` is true or `timeout` passes; returns done(). Idle policy: spin, then yield the
    // core after a run of idle turns (two busy processes share 2 cores on small machines).
    bool run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

    // A received frame that is not an mbuf (StackConfig::rx_external): `data[0..len)` is handed to lwIP without
    // a copy. Ownership: the bytes stay valid until `release(ctx, cookie)` is called, which happens on this
    // thread when lwIP frees the frame (at once on a drop). Owner thread only.
    using ReleaseFn = void (*)(void* ctx, std::uint32_t cookie) noexcept;
    void input_external(std::byte* data, std::uint32_t len, ReleaseFn release, void* ctx,
                        std::uint32_t cookie) noexcept;
    // Same for a frame whose TCP payload was already consumed elsewhere (placed by the RX thread): `data` holds
    // the Ethernet, IP and TCP headers (`len` bytes) and lwIP sees `payload_len` more bytes of a shared
    // read-only zero area in their place, so its sequence and window state advance as if it had them. The
    // connection's receive handler must ignore those bytes (it knows, see verbs' handover).
    void input_headers(std::byte* data, std::uint32_t len, std::uint32_t payload_len, ReleaseFn release, void* ctx,
                       std::uint32_t cookie) noexcept;

    // Sends the frames lwIP produced so far (poll() does this at its end).
    void flush_tx() noexcept;

    // Frees connections lingering in TIME_WAIT (and so their pool objects): at shutdown and in tests.
    void purge_time_wait() noexcept;
    // Number of lwIP TCP pcbs that are active (neither listening nor in TIME_WAIT).
    unsigned active_pcbs() const noexcept;
    // Number in TIME_WAIT (still answering a peer's retransmitted FIN).
    unsigned time_wait_pcbs() const noexcept;
    // What this side still owes its peers without any connection needing it: frames queued for the driver (it
    // refused them: the ring to the peer is full), ACKs lwIP could not even queue for connections in TIME_WAIT,
    // and delayed ACKs not yet due. Whoever ends the stack (a closing Context, a test) polls until this is 0
    // first: purging TIME_WAIT or tearing the port down drops them, and a peer whose FIN goes unanswered stays
    // in CLOSING or LAST_ACK resending it to nobody.
    unsigned owed_output() const noexcept;
    // Bytes the active connections have queued (written, not yet acknowledged by their peers), summed: what a
    // closing Context watches to tell a slow but progressing close from a stuck one.
    std::uint64_t queued_bytes() const noexcept;

    PoolUsage pool_usage() const;
    // One line per active pcb (state, ports, bytes queued and in flight, retransmissions, window): for a test
    // that finds a connection still open when it should have ended.
    std::string describe_active_pcbs() const;
    // lwIP's TCP/IP counters in one line (xmit, recv, drop, memerr, checksum and protocol errors).
    std::string protocol_counters() const;
    const StackCounters& counters() const noexcept { return counters_; }
    // TcpConnection::write: lwIP copied `n` bytes out of the caller's buffer (TxCopyStats).
    void count_tx_copy_in(std::size_t n) noexcept { counters_.tx_copied_in += n; }
    const StackCycles& cycles() const noexcept { return cycles_; }
    // Forgets cycles counted since `earlier` (an idle polling turn is waiting, not work).
    void rewind_cycles(const StackCycles& earlier) noexcept { cycles_ = earlier; }
    io::Port& port() noexcept { return port_; }
    Ipv4 address() const noexcept { return cfg_.ip.address; }

    // Debug builds: aborts unless called on the owner thread.
    void assert_owner() const noexcept;
    // The calling thread owns the stack from now (a caller that serializes threads itself, e.g. the drop-in
    // libibverbs' lock, hands it over at each call).
    void take_ownership() noexcept { owner_ = std::this_thread::get_id(); }

    // A connection owes a delayed ACK (stretch ACKs: TcpConnection::on_recv_cb). poll() sends it at the end of
    // the first turn it is due in (TcpConnection::send_deferred_ack), not after lwIP's 10 ms delayed-ACK tick.
    void defer_ack(TcpConnection* conn) noexcept;
    // Sends every delayed ACK still owed, due or not (before the owner thread sleeps: nothing would send them).
    void send_owed_acks() noexcept;
    void cancel_ack(TcpConnection* conn) noexcept;

    // Connections by their pcb's addresses (remote IPv4, remote port, local port), for taken_at_once: a frame's
    // pcb without walking lwIP's list of active pcbs, whose length is the number of connections (at 256 QPs
    // streaming the walk took ~20 % of a memif server's time). A connection is listed from the moment it is
    // established (TcpConnection::on_connected_cb, TcpListener::on_accept_cb) until its destructor; lookups
    // check the listed connection's pcb, so one whose pcb is gone is simply not found. Sizing rule: buckets
    // at least lwIP's pcb count (MEMP_NUM_TCP_PCB, 1088): chains of one or two.
    void list_connection(TcpConnection* c) noexcept;
    void unlist_connection(TcpConnection* c) noexcept;
    const tcp_pcb* established(std::uint32_t remote_ip_be, std::uint16_t remote_port, std::uint16_t local_port) const noexcept;
    static constexpr std::size_t kConnBuckets = 2048;

    // The chunk queue: connections waiting for a TX chunk of the port's arena (TcpConnection::tx_buffer), first
    // come first served. When chunks come back, poll() sets one aside for each waiter at the head, for one
    // turn, and wakes it (Handler::on_tx_room); a connection not at the head takes none while anyone waits. So
    // past the arena's size (192 chunks, io::TxArena::share) streaming connections take turns instead of the
    // unlucky ones copying every segment (ib_write_bw -q 256 copied 22-26 % of its bytes through lwIP and into
    // mbufs). When the arena gives back no chunk for kChunkStuckMs (every chunk held by connections whose
    // peers stopped acknowledging), waiters with nothing in flight copy instead (chunks_stuck()).
    // No allocation: the queue is linked through the connections themselves.
    bool may_take_chunk(const TcpConnection& c) const noexcept;
    void queue_for_chunk(TcpConnection* c) noexcept;
    void leave_chunk_queue(TcpConnection* c) noexcept;
    void took_chunk(TcpConnection* c) noexcept;
    bool chunks_stuck() const noexcept { return chunks_stuck_; }
    static constexpr std::uint64_t kChunkStuckMs = 1;

    // TX chunks of a connection closed with bytes lwIP still references (TcpConnection::close): the Stack holds
    // them until the peer acknowledges `end_seq` (the sequence number past the last of those bytes), the pcb is
    // reset or gives up, or the Stack ends (which aborts such pcbs first). Control path (allocates a record).
    void adopt_tx_chunks(tcp_pcb* pcb, std::span<const std::int32_t> chunks, std::uint32_t end_seq);

    // Deferred payload: transmit straight from the application's memory; the TX chunk gets the bytes only if
    // they must outlive the source's loan. A framer framing in place in a TX chunk may leave an FPDU's payload
    // out (mpa::FpduTx::write_deferred) and say here where it belongs (`dst`, chunk memory) and where it is now
    // (`src`): a FillBook record. Every frame lwIP sends with those bytes — the first send, a resend, a segment
    // the window held back — takes them straight from `src` (attached to the frame, which memif copies into its
    // ring inside tx_burst: link_output calls it at once for such a frame; if the frame has to wait for the ring
    // the record is settled first and the frame sent from the chunk). A record ends when the peer acknowledges
    // its chunk (nothing copied: the usual case in a stream) or when settled (FillBook: the loan of `src` ends
    // at the completion the application polls, an MR's deregistration, the connection's close; lwIP's persist
    // timer reads segment bytes, so the Stack settles before it runs with a window closed). Ownership: `src`
    // is borrowed until its record ends. Only where the driver copies in tx_burst and holds nothing, and lwIP
    // reads no payload (memif, no fault injection, no capture, no TCP checksums, not the RX thread's stack):
    // can_defer_fill(). Caller: fill_room() != 0 first (when 0, copy it yourself).
    bool can_defer_fill() const noexcept { return defer_fill_ok_; }
    void defer_fill(std::byte* dst, const std::byte* src, std::uint32_t len) noexcept { fills_->add(dst, src, len); }
    // Records defer_fill() still takes (0 when off).
    unsigned fill_room() noexcept { return defer_fill_ok_ ? fills_->room() : 0; }
    // Copies every outstanding deferred byte into its chunk (see FillBook): the sources are the application's
    // again after this.
    void settle_fills() noexcept { fills_->settle(); }
    // The book, for the completion queues that settle it (they may outlive the Stack: it is emptied at its end).
    const std::shared_ptr<FillBook>& fill_book() const noexcept { return fills_; }

private:
    friend struct StackAccess;
    static signed char netif_init(netif* nif);
    // Layer accounting: inside poll() or flush_tx(), whose time goes into StackCycles::total whole.
    bool timed_ = false;
    void count_io(std::uint64_t d) noexcept {
        cycles_.io += d;
        if (!timed_) cycles_.total += d;
    }
    bool defer_fill_ok_ = false;
    rte_mbuf_ext_shared_info foreign_shinfo_{};  // the extbuf of mbufs carrying deferred bytes (freed in tx_burst)
    bool overlaps_fill(const pbuf* p) const noexcept;
    void fill_overlapping(const pbuf* p) noexcept;
    bool send_deferred(pbuf* p, io::TxArena& arena, rte_mbuf* head) noexcept;
    bool chain_deferred(rte_mbuf* head, pbuf* p, io::TxArena& arena, std::uint32_t& attached,
                        std::uint32_t& deferred) noexcept;
    static signed char link_output(netif* nif, pbuf* p);
    bool any_persisting() const noexcept;
    struct TxOrphan {
        Stack* stack;
        tcp_pcb* pcb;
        std::uint32_t end_seq;
        std::vector<std::int32_t> chunks;
    };
    static signed char orphan_sent(void* arg, tcp_pcb* pcb, std::uint16_t len);
    static void orphan_err(void* arg, signed char err);
    // Releases the orphan's chunks and forgets it; `pcb_alive`: its callbacks are cleared first.
    void drop_orphan(TxOrphan* o, bool pcb_alive) noexcept;
    std::vector<std::unique_ptr<TxOrphan>> orphans_;
    bool chain_payload(rte_mbuf* head, pbuf* p, io::TxArena& arena, std::uint32_t& attached) noexcept;
    bool copy_chain(rte_mbuf* head, pbuf* p) noexcept;
    // Zero-copy transmit: payload pieces shorter than this are copied into the header mbuf instead.
    static constexpr std::uint16_t kCopyBreak = 256;
    void input(rte_mbuf* m) noexcept;
    bool taken_at_once(const rte_mbuf* m) noexcept;
    void deliver(pbuf* p) noexcept;
    void drop_tx_queue() noexcept;
    void resend_refused_acks() noexcept;
    void reorder_unsent() noexcept;

    io::Port& port_;
    bool large_segments_ = false;
    StackConfig cfg_;
    std::unique_ptr<netif> netif_;
    std::thread::id owner_;
    std::shared_ptr<FillBook> fills_;  // made at construction (setup path)
    // lwIP's timers run at most once per millisecond; the check is one TSC read and compare per turn.
    std::uint64_t next_timer_tsc_ = 0;
    std::uint64_t tsc_per_ms_ = 1;
    // TX queue: frames lwIP produced, waiting for room in the driver's ring (a FIFO). Ownership: the
    // Stack's until tx_burst accepts them; after that the driver's. Sizing rule: absorbs a burst of one
    // full send window at MSS 1460 (256 KiB / 1460 = 180 frames) from several connections at once while
    // the peer is descheduled; beyond it frames are dropped and TCP resends them.
    static constexpr unsigned kTxQueue = 1024;
    rte_mbuf* tx_queue_[kTxQueue] = {};
    unsigned tx_head_ = 0;  // next frame to hand to the driver
    unsigned tx_tail_ = 0;  // one past the last queued frame (tx_head_ <= tx_tail_ <= kTxQueue)
    std::uint64_t refusals_seen_ = 0;  // counters_.tx_deferred when no pcb still owed a refused ACK
    StackCounters counters_;
    StackCycles cycles_;
    void flush_tx_inner() noexcept;
    // Connections owing a delayed ACK (TcpConnection::send_deferred_ack says when it is due). Sizing rule: one
    // entry per connection receiving at once, 128; when full, a connection is ACKed at once instead.
    static constexpr unsigned kAckPending = 128;
    // The longest an ACK is held back for more segments to cover (stretch ACKs).
    static constexpr std::uint64_t kAckDelayUs = 20;
    std::uint64_t ack_delay_tsc_ = 1;
    TcpConnection* ack_pending_[kAckPending] = {};
    unsigned ack_count_ = 0;
    static std::size_t conn_bucket(std::uint32_t remote_ip_be, std::uint16_t remote_port, std::uint16_t local_port) noexcept;
    std::array<TcpConnection*, kConnBuckets> conn_table_{};
    // The chunk queue (may_take_chunk): its ends, the turn number grants are made in (a grant lasts until the
    // next poll), chunks set aside this turn and not yet taken, and when a chunk last came back (or nobody
    // waited).
    void wake_chunk_waiters(std::uint64_t tsc) noexcept;
    TcpConnection* chunk_head_ = nullptr;
    TcpConnection* chunk_tail_ = nullptr;
    std::uint64_t grant_turn_ = 1;
    std::uint32_t grants_ = 0;
    std::uint64_t freed_seen_ = 0;
    std::uint64_t chunk_progress_tsc_ = 0;
    bool chunks_stuck_ = false;
};

}  // namespace softrdma::stack
