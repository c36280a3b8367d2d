// SPDX-License-Identifier: MIT
// A small C++ wrapper over lwIP's raw TCP API: listen/accept, connect, write with back-pressure, receive
// with pbuf ownership written down, orderly close, abort, and errors reported once. MPA sits on this.
//
// Threads: every call, and every Handler callback, happens on the Stack's owner thread (see stack.hpp).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "stack/stack.hpp"

struct tcp_pcb;
struct pbuf;

namespace softrdma::stack {

enum class TcpError {
    refused,       // the peer answered our SYN with RST: nothing listens on that port
    reset,         // the peer reset (aborted) an established connection
    timed_out,     // connect: no answer within the connect timeout; or retransmissions gave up
    aborted,       // aborted locally (abort(), or lwIP ran out of memory for the connection)
    closed,        // write on a connection that is closed or closing
};
const char* to_string(TcpError e) noexcept;

class TcpConnection;

// Received bytes: a chain of lwIP pbufs (each usually one Ethernet frame's TCP payload, straight from the
// DPDK mbuf, no copy). Ownership: the RecvBuffer owns the pbuf chain. Destroying it (or release()) frees
// the pbufs — returning their mbufs to DPDK — and reopens the TCP receive window by size(). Move it to
// keep the bytes longer; it must not outlive its TcpConnection.
class RecvBuffer {
public:
    RecvBuffer() = default;
    RecvBuffer(TcpConnection* conn, pbuf* chain) noexcept : conn_(conn), chain_(chain) {}
    RecvBuffer(RecvBuffer&& o) noexcept : conn_(o.conn_), chain_(o.chain_) { o.chain_ = nullptr; }
    RecvBuffer& operator=(RecvBuffer&& o) noexcept;
    ~RecvBuffer() { release(); }

    std::size_t size() const noexcept;
    // Calls f(std::span<const std::byte>) for each contiguous piece, in order.
    template <class F>
    void for_each_segment(F&& f) const {
        for (pbuf* p = chain_; p != nullptr; p = next(p)) f(segment(p));
    }
    // Copies bytes [offset, offset+out.size()) out; returns the count copied.
    std::size_t copy_to(std::span<std::byte> out, std::size_t offset = 0) const noexcept;
    void release() noexcept;

private:
    static pbuf* next(pbuf* p) noexcept;
    static std::span<const std::byte> segment(pbuf* p) noexcept;
    TcpConnection* conn_ = nullptr;
    pbuf* chain_ = nullptr;
};

// Which connections lwIP may sacrifice when its PCB pool runs out: a new connection (a SYN on a listener, at
// `normal`) kills the oldest connection of a LOWER priority (lwIP's tcp_alloc -> tcp_kill_prio), after
// TIME_WAIT, LAST_ACK and CLOSING ones. So connections still being set up (`expendable`) give way to new
// ones, and connections carrying sessions (`vital`) are never taken: a flood of idle connections cannot shut
// out new clients or hurt running sessions for longer than it takes to cycle through the pool.
enum class TcpPriority : std::uint8_t { expendable = 1, normal = 64, vital = 127 };

class TcpConnection {
public:
    // Callbacks, on the owner thread. A handler may call abort() (or destroy the connection) inside any
    // callback; the wrapper tells lwIP (ERR_ABRT).
    struct Handler {
        virtual ~Handler() = default;
        virtual void on_connected(TcpConnection&) {}
        // New bytes, in order. Ownership of the bytes passes to the handler with `data`. Keep them only for the
        // call: they may be a memif client's ring buffer, lent until they are freed (io::Port::borrowed), and
        // every later ring slot waits behind them.
        virtual void on_receive(TcpConnection&, RecvBuffer data) = 0;
        // `bytes` more of what we wrote were acknowledged: room to write again.
        virtual void on_sent(TcpConnection&, std::size_t /*bytes*/) {}
        // A TX chunk is set aside for this connection, which waited for one (tx_waiting() in the Stack's chunk
        // queue): frame again now, in this engine turn (the chunk is kept for it until the next turn).
        virtual void on_tx_room(TcpConnection& c) { on_sent(c, 0); }
        // The peer closed its sending side (FIN): no more data will arrive.
        virtual void on_remote_close(TcpConnection&) {}
        // The connection is gone (lwIP has already freed its state); called once, never after close().
        virtual void on_error(TcpConnection&, TcpError) {}
    };

    ~TcpConnection();  // aborts (RST) if still open: call close() first for an orderly end
    TcpConnection(const TcpConnection&) = delete;
    TcpConnection& operator=(const TcpConnection&) = delete;

    void set_handler(Handler* h) noexcept { handler_ = h; }

    // Copies up to data.size() bytes into lwIP's send buffer; returns how many it took. Fewer than asked
    // (even 0) means the send buffer or queue is full: write the rest after on_sent(). Nothing is sent
    // until flush() (or lwIP's own output after an ACK or timer), so several writes make one segment.
    // If it takes nothing while send_space() > 0, lwIP's shared heap or segment pool is exhausted by other
    // connections: no on_sent() may follow for this one, so try again on a later poll turn.
    std::size_t write(std::span<const std::byte> data) noexcept;
    // Zero-copy: lwIP references `data` instead of copying. Ownership: the bytes must stay valid and
    // unchanged until on_sent() has acknowledged them (acks come in write order).
    std::size_t write_ref(std::span<const std::byte> data) noexcept;
    std::size_t send_space() const noexcept;
    void flush() noexcept;
    // The send buffer (bytes written and not yet acknowledged) of a connection whose segments are larger than
    // an MTU 9000 one (memif's large segments, StackConfig::large_segments), set when it is established; other
    // connections keep lwIP's TCP_SND_BUF (256 KiB). 256 KiB is four large segments, ~10 us of a 25 GB/s
    // stream: the receiver's placement copies ran short of it (bench/RESULTS.md, "A send buffer of 1 MiB for large
    // segments"). Why not for every connection: lwipopts.h, TCP_SND_BUF.
    static constexpr std::uint32_t kLargeSendBuffer = 1024 * 1024;

    // ---- zero-copy transmit (the port's TX arena, io/tx_arena.hpp) ----
    // Room to build the next bytes to send in place: `max` bytes (at most io::TxArena::kUsable) at the tail of
    // this connection's TX chunk, or of a fresh chunk when the current one has less left. Empty when the port
    // has no arena, the connection holds its share of the arena (io::TxArena::share), no chunk is free or
    // others wait for one first (the Stack's chunk queue: FIFO, on_tx_room() when one is set aside for it), or
    // bytes are still staged (push them first): wait when tx_waiting() says so, else send with write() -- with
    // nothing in flight, only when the arena has given back no chunk for a millisecond (Stack::chunks_stuck).
    // `fresh_start`: where in a fresh chunk to begin (a multiple of 64 below 4 KiB, base::unaliased_start; the
    // bytes before it are never sent); chunks are 64 KiB-aligned, so it sets the bytes' page offsets.
    std::span<std::byte> tx_buffer(std::size_t max, std::size_t fresh_start = 0) noexcept;
    // The last tx_buffer() said empty because this connection holds its share of the arena with bytes in
    // flight (on_sent() comes when ACKs free its chunks), or waits in the chunk queue (on_tx_room() or
    // on_sent()): frame nothing now. Otherwise an empty tx_buffer() means: send with write() (a copy).
    bool tx_waiting() const noexcept { return tx_wait_; }
    // The first `n` bytes of the last tx_buffer() hold bytes to send: they are staged.
    void tx_commit(std::size_t n) noexcept { tx_staged_end_ += n; }
    // Hands staged bytes to lwIP by reference (no copy); returns how many it took. Fewer than staged: the send
    // buffer or segment queue is full; push again after on_sent(). Ownership: a chunk stays this connection's
    // until the peer has acknowledged every byte of it that lwIP took (released as ACKs arrive); after close()
    // the Stack keeps the chunks until then (or until the connection is reset or aborted).
    std::size_t tx_push() noexcept;
    std::size_t tx_staged() const noexcept { return tx_staged_end_ - tx_pushed_end_; }
    void tx_drop_staged() noexcept { tx_staged_end_ = tx_pushed_end_; }
    // Effective MSS of the connection (TCP payload octets per segment, both sides' MSS options applied);
    // 0 when closed. MPA sizes its FPDUs from it (RFC 5044 MULPDU).
    std::uint16_t mss() const noexcept;
    // True when lwIP holds no unsent segment for this connection: the next write() starts a new segment
    // (lwIP appends a write to a partly filled unsent segment otherwise). MPA writes whole FPDUs only then,
    // so no FPDU is cut across two segments.
    bool tx_segment_boundary() const noexcept;
    // Nothing sent and unacknowledged, nothing queued unsent: the link is quiet (a lone message starts now).
    bool nothing_in_flight() const noexcept;

    // Detects a peer that vanished while this side only receives (nothing to retransmit, so TCP alone
    // would wait forever): after `idle` without traffic, probe every `interval`; after `probes` unanswered
    // probes the connection ends with on_error(timed_out).
    void set_keepalive(std::chrono::milliseconds idle, std::chrono::milliseconds interval, unsigned probes) noexcept;
    // Where the peer holds our stream up: the sequence number of the oldest byte sent and not yet acknowledged,
    // or, with nothing in flight, of the next byte to send while the peer's receive window is too small for it
    // (lwIP's persist state: zero-window probes); nullopt when nothing waits on the peer.
    std::optional<std::uint32_t> oldest_unacked() const noexcept;
    // The peer's receive window keeps our next segment out (persist state).
    bool window_closed() const noexcept;
    // lwIP's priority for this connection (TcpPriority); new ones start at normal.
    void set_priority(TcpPriority p) noexcept;

    // Orderly close of both directions (FIN). The connection object may be destroyed right after; lwIP
    // finishes the close on its own (at priority expendable: done from our side). Returns false if lwIP had no
    // memory to queue the FIN (try again).
    bool close() noexcept;
    // Abortive close (RST); no on_error callback follows.
    void abort() noexcept;

    bool open() const noexcept { return pcb_ != nullptr; }
    // The connection's identity and receive position, for an RX thread that follows its segments.
    struct FlowInfo {
        std::uint32_t remote_ip_be = 0;
        std::uint16_t remote_port = 0;  // host order
        std::uint16_t local_port = 0;   // host order
        std::uint32_t rcv_nxt = 0;      // next sequence number expected from the peer
    };
    FlowInfo flow_info() const noexcept;
    // Sends an ACK now (a duplicate ACK when a segment was out of order: the peer's fast retransmit).
    void ack_now() noexcept;
    bool established() const noexcept { return pcb_ != nullptr && connected_; }
    Stack& stack() noexcept { return stack_; }

private:
    friend class Stack;
    friend struct CallbackScope;
    friend class TcpListener;
    friend class RecvBuffer;
    friend std::unique_ptr<TcpConnection> connect(Stack&, Ipv4, std::uint16_t, TcpConnection::Handler&,
                                                  std::chrono::milliseconds, std::uint16_t);
    TcpConnection(Stack& stack, tcp_pcb* pcb, Handler* handler, bool connected) noexcept;
    void attach() noexcept;
    void detach() noexcept;
    void consumed(std::size_t bytes) noexcept;
    // Sends the delayed ACK this connection owes if it is due: it covers kStretchSegments full segments, or
    // it has waited `delay_tsc` since the first byte it covers arrived (tsc 0: due now). Returns true when
    // nothing is owed any more (sent now, or already carried by data or lwIP's timer).
    bool send_deferred_ack(std::uint64_t tsc, std::uint64_t delay_tsc) noexcept;
    std::size_t write_flags(std::span<const std::byte> data, std::uint8_t flags) noexcept;
    static signed char on_recv_cb(void* arg, tcp_pcb* pcb, pbuf* p, signed char err);
    static signed char on_sent_cb(void* arg, tcp_pcb* pcb, std::uint16_t len);
    static signed char on_connected_cb(void* arg, tcp_pcb* pcb, signed char err);
    static signed char on_poll_cb(void* arg, tcp_pcb* pcb);
    static void on_err_cb(void* arg, signed char err);
    // TX chunks: release those the peer has acknowledged (all of them: `all`, when lwIP holds none any more).
    void release_tx_chunks(bool all) noexcept;

    Stack& stack_;
    tcp_pcb* pcb_;
    Handler* handler_;
    bool connected_;
    bool ack_deferred_ = false;  // in the Stack's end-of-turn ACK list
    // Stretch ACKs: bytes received since our last ACK, and when the first of them came (TSC).
    // At most this many bytes: a quarter of a large-segment sender's send buffer (kLargeSendBuffer, 1 MiB); 8
    // of its 64 KiB segments would be half of it, and it would run dry between ACKs.
    static constexpr unsigned kStretchSegments = 8;
    static constexpr std::uint32_t kStretchMaxBytes = 256 * 1024;
    std::uint32_t stretch_bytes() const noexcept;
    std::uint32_t rx_unacked_ = 0;
    std::uint64_t owed_since_tsc_ = 0;
    std::chrono::steady_clock::time_point connect_deadline_{};
    // Zero-copy transmit: this connection's TX chunks, oldest first (a FIFO in chunks_[tx_head_ ..]); each
    // with the sequence number just past the last byte lwIP took from it. Sizing: the largest send buffer
    // (kLargeSendBuffer, 1 MiB) spans 17 chunks, + the one being filled, + the oldest still partly
    // unacknowledged: 19 (static_assert below); a full FIFO makes tx_buffer() say empty (tx_waiting() with bytes
    // in flight, else copy).
    struct TxChunk {
        std::int32_t id = -1;
        std::uint32_t end_seq = 0;
        bool pushed = false;  // lwIP took at least one byte of it
    };
    static constexpr unsigned kTxChunks = 20;
    static_assert(kTxChunks >= (kLargeSendBuffer + io::TxArena::kUsable - 1) / io::TxArena::kUsable + 2);
    std::array<TxChunk, kTxChunks> tx_chunks_{};
    unsigned tx_head_ = 0, tx_count_ = 0;
    bool tx_wait_ = false;  // tx_waiting()
    // The Stack's connection table (Stack::established): the next in this connection's bucket, and whether it
    // is listed (from on_connected / accept until the destructor).
    TcpConnection* table_next_ = nullptr;
    std::uint32_t table_bucket_ = 0;  // its key's bucket, taken when listed (the pcb may be gone at the end)
    bool tabled_ = false;
    // The Stack's chunk queue (waiters for a TX chunk, oldest first): links, and the Stack's turn in which a
    // chunk was set aside for this connection (Stack::grant_turn_; 0: none).
    TcpConnection* chunk_prev_ = nullptr;
    TcpConnection* chunk_next_ = nullptr;
    bool chunk_queued_ = false;
    std::uint64_t chunk_grant_ = 0;
    // In the newest chunk: bytes lwIP took, and the end of the staged ones (tx_pushed_end_ <= tx_staged_end_).
    std::size_t tx_pushed_end_ = 0, tx_staged_end_ = 0;
};

inline constexpr std::chrono::milliseconds kConnectTimeout{5000};  // connect()'s default: SYN retries end then

// Opens a connection; the handler hears on_connected() or on_error(refused / timed_out). From `local_port` when
// not 0 (else one of lwIP's ephemeral ports, TCP_LOCAL_PORT_RANGE_START and up).
// Throws std::runtime_error only when lwIP cannot even start (no pcb free, no route, `local_port` taken).
std::unique_ptr<TcpConnection> connect(Stack& stack, Ipv4 address, std::uint16_t port,
                                       TcpConnection::Handler& handler,
                                       std::chrono::milliseconds timeout = kConnectTimeout,
                                       std::uint16_t local_port = 0);

class TcpListener {
public:
    struct Handler {
        virtual ~Handler() = default;
        // A new connection. Ownership: the handler takes `conn` and must set its handler before returning;
        // dropping it resets the connection.
        virtual void on_accept(std::unique_ptr<TcpConnection> conn) = 0;
    };
    // Listens on `port` of the stack's address. Throws std::runtime_error if the port is taken.
    TcpListener(Stack& stack, std::uint16_t port, Handler& handler);
    ~TcpListener();
    TcpListener(const TcpListener&) = delete;
    TcpListener& operator=(const TcpListener&) = delete;

private:
    static signed char on_accept_cb(void* arg, tcp_pcb* pcb, signed char err);
    Stack& stack_;
    tcp_pcb* pcb_ = nullptr;
    Handler& handler_;
};

}  // namespace softrdma::stack
