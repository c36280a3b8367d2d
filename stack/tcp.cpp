// SPDX-License-Identifier: MIT
#include "stack/tcp.hpp"

#include <rte_cycles.h>

#include <algorithm>
#include <stdexcept>

#include "stack/lwip_includes.hpp"

namespace softrdma::stack {
namespace {

// The retransmission timeout a new connection starts from. lwIP seeds its RTT variance with 3 s (pcb->sv, in
// slow ticks of TCP_SLOW_INTERVAL) and each RTT sample takes only a quarter of it off, so for its first dozen
// round trips a lost segment waited 2.3 s and more for its retransmission (tests/verbs/rawtcp.py's
// window-shrink case measured 2.26 s). RFC 6298 (2.2) after the first sample: RTO = SRTT + max(G, 4 RTTVAR)
// with RTTVAR = R/2, i.e. about the clock granularity on a LAN. We restart the variance when the connection is
// established so that the RTO starts at Linux's minimum (200 ms) and lwIP's estimator goes on from there, down
// to a few ticks as round trips are measured (as it already went in long connections).
constexpr std::chrono::milliseconds kInitialRto{200};

// Once established (nothing written yet; called once per connection): a large-segment connection's send buffer
// (kLargeSendBuffer).
// lwIP gives each pcb TCP_SND_BUF, takes what tcp_write queues from it and adds back what is acknowledged, so
// the extra stays with the connection. Its segments stay few (16 of 64 KiB; TCP_SND_QUEUELEN still bounds
// small ones), as does the zero-copy FIFO (kTxChunks).
constexpr std::uint32_t kMtu9000Mss = 8960;
static_assert(TcpConnection::kLargeSendBuffer > TCP_SND_BUF);
void size_send_buffer(tcp_pcb* pcb) noexcept {
    if (pcb->mss > kMtu9000Mss)
        pcb->snd_buf = static_cast<tcpwnd_size_t>(pcb->snd_buf + (TcpConnection::kLargeSendBuffer - TCP_SND_BUF));
}

void seed_rto(tcp_pcb* pcb, std::chrono::milliseconds rto = kInitialRto) noexcept {
    pcb->sv = static_cast<s16_t>(rto.count() / TCP_SLOW_INTERVAL);
    pcb->rto = static_cast<s16_t>((pcb->sa >> 3) + pcb->sv);
}

// A SYN unanswered is sent again after this long: RFC 6298's initial RTO (2.1) and Linux's, where lwIP's is 3 s.
// lwIP does not back off in SYN_SENT, so a connect tries every second until its deadline (stack::connect, 5 s
// by default): five SYNs where there were two (a SYN or its ARP request lost while the peer's port came up).
constexpr std::chrono::milliseconds kSynRto{1000};

}  // namespace

// lwIP must hear ERR_ABRT from a callback in which the pcb was aborted, and the wrapper must not touch a
// connection the handler destroyed. Callbacks do not nest (lwIP is single-threaded and raw-API callbacks
// are not re-entered), so one record suffices.
struct CallbackScope {
    static inline tcp_pcb* pcb = nullptr;
    static inline TcpConnection* conn = nullptr;
    static inline bool aborted = false;    // the pcb is gone: tell lwIP ERR_ABRT
    static inline bool destroyed = false;  // the TcpConnection object is gone
    CallbackScope(tcp_pcb* p, TcpConnection* c) noexcept {
        pcb = p;
        conn = c;
        aborted = destroyed = false;
    }
    ~CallbackScope() { pcb = nullptr, conn = nullptr; }
    err_t result() const noexcept { return aborted ? ERR_ABRT : ERR_OK; }
};

const char* to_string(TcpError e) noexcept {
    switch (e) {
    case TcpError::refused: return "connection refused (no listener on that port)";
    case TcpError::reset: return "connection reset by peer";
    case TcpError::timed_out: return "timed out (no answer from the peer)";
    case TcpError::aborted: return "aborted locally";
    case TcpError::closed: return "connection closed";
    }
    return "unknown";
}

// ---- RecvBuffer -------------------------------------------------------------------------------------

RecvBuffer& RecvBuffer::operator=(RecvBuffer&& o) noexcept {
    if (this != &o) {
        release();
        conn_ = o.conn_;
        chain_ = o.chain_;
        o.chain_ = nullptr;
    }
    return *this;
}

std::size_t RecvBuffer::size() const noexcept { return chain_ != nullptr ? chain_->tot_len : 0; }
pbuf* RecvBuffer::next(pbuf* p) noexcept { return p->next; }
std::span<const std::byte> RecvBuffer::segment(pbuf* p) noexcept {
    return {static_cast<const std::byte*>(p->payload), p->len};
}

std::size_t RecvBuffer::copy_to(std::span<std::byte> out, std::size_t offset) const noexcept {
    if (chain_ == nullptr || offset >= chain_->tot_len) return 0;
    const auto n = std::min<std::size_t>(out.size(), chain_->tot_len - offset);
    return pbuf_copy_partial(chain_, out.data(), static_cast<u16_t>(n), static_cast<u16_t>(offset));
}

void RecvBuffer::release() noexcept {
    if (chain_ == nullptr) return;
    const std::size_t n = chain_->tot_len;
    pbuf_free(chain_);  // returns the mbufs (RxPbuf free hook)
    chain_ = nullptr;
    if (conn_ != nullptr) conn_->consumed(n);
}

// ---- TcpConnection ----------------------------------------------------------------------------------

TcpConnection::TcpConnection(Stack& stack, tcp_pcb* pcb, Handler* handler, bool connected) noexcept
    : stack_(stack), pcb_(pcb), handler_(handler), connected_(connected) {}

TcpConnection::~TcpConnection() {
    if (pcb_ != nullptr) abort();
    release_tx_chunks(true);
    if (chunk_queued_) stack_.leave_chunk_queue(this);
    if (tabled_) stack_.unlist_connection(this);
    if (ack_deferred_) stack_.cancel_ack(this);
    if (CallbackScope::conn == this) CallbackScope::destroyed = true;
}

std::uint32_t TcpConnection::stretch_bytes() const noexcept {
    return std::min<std::uint32_t>(kStretchSegments * static_cast<std::uint32_t>(tcp_mss(pcb_)), kStretchMaxBytes);
}

bool TcpConnection::send_deferred_ack(std::uint64_t tsc, std::uint64_t delay_tsc) noexcept {
    if (pcb_ != nullptr && (pcb_->flags & TF_ACK_DELAY) != 0) {
        const bool due = tsc == 0 || rx_unacked_ >= stretch_bytes() ||
                         tsc - owed_since_tsc_ >= delay_tsc;
        if (!due) return false;
        tcp_ack_now(pcb_);
        tcp_output(pcb_);
    }
    ack_deferred_ = false;
    rx_unacked_ = 0;
    return true;
}

void TcpConnection::attach() noexcept {
    tcp_arg(pcb_, this);
    tcp_recv(pcb_, &TcpConnection::on_recv_cb);
    tcp_sent(pcb_, &TcpConnection::on_sent_cb);
    tcp_err(pcb_, &TcpConnection::on_err_cb);
    tcp_poll(pcb_, &TcpConnection::on_poll_cb, 5);  // every 5 slow ticks (100 ms): connect deadline
    tcp_nagle_disable(pcb_);                        // RDMA messages go out at once
}

void TcpConnection::detach() noexcept {
    tcp_arg(pcb_, nullptr);
    tcp_recv(pcb_, nullptr);
    tcp_sent(pcb_, nullptr);
    tcp_err(pcb_, nullptr);
    tcp_poll(pcb_, nullptr, 0);
}

std::size_t TcpConnection::write_flags(std::span<const std::byte> data, std::uint8_t flags) noexcept {
    stack_.assert_owner();
    if (pcb_ == nullptr) return 0;
    std::size_t done = 0;
    while (done < data.size()) {
        // tcp_write takes at most 64 KiB - 1 per call, and at most the free send buffer. A copy goes in pieces
        // of at most TCP_COPY_WRITE_MAX: lwIP allocates one pbuf per piece from the heap pools (lwippools.h),
        // whose largest holds that much; with large segments (MSS 64 KiB) one call would ask for more.
        const std::size_t cap = (flags & TCP_WRITE_FLAG_COPY) != 0 ? TCP_COPY_WRITE_MAX : 0xffff;
        const std::size_t n = std::min<std::size_t>({data.size() - done, tcp_sndbuf(pcb_), cap});
        if (n == 0 || tcp_write(pcb_, data.data() + done, static_cast<u16_t>(n), flags) != ERR_OK) break;
        done += n;
    }
    if ((flags & TCP_WRITE_FLAG_COPY) != 0) stack_.count_tx_copy_in(done);
    return done;
}

std::size_t TcpConnection::write(std::span<const std::byte> data) noexcept {
    return write_flags(data, TCP_WRITE_FLAG_COPY);
}
std::size_t TcpConnection::write_ref(std::span<const std::byte> data) noexcept { return write_flags(data, 0); }

std::span<std::byte> TcpConnection::tx_buffer(std::size_t max, std::size_t fresh_start) noexcept {
    tx_wait_ = false;
    io::TxArena* arena = stack_.port().tx_arena();
    if (arena == nullptr || pcb_ == nullptr || tx_staged() != 0) return {};
    max = std::min(max, io::TxArena::kUsable);
    if (tx_count_ != 0) {
        TxChunk& tail = tx_chunks_[(tx_head_ + tx_count_ - 1) % kTxChunks];
        if (io::TxArena::kUsable - tx_staged_end_ >= max) return arena->bytes(tail.id).subspan(tx_staged_end_, max);
    }
    // A fresh chunk is wanted. Past this connection's share of the arena while the peer still has bytes of ours
    // to acknowledge: wait for those ACKs (on_sent) to free chunks, not copy (io::TxArena::share).
    const bool in_flight = !nothing_in_flight();
    if (in_flight && tx_count_ >= std::min(kTxChunks, arena->share())) {
        tx_wait_ = true;
        return {};
    }
    if (tx_count_ == kTxChunks) return {};
    // None free, or others waiting first: join the chunk queue (on_tx_room when one is set aside for us). With
    // nothing in flight, only while the arena still gives chunks back; else copy (Stack::chunks_stuck).
    if (!stack_.may_take_chunk(*this)) {
        if (in_flight || !stack_.chunks_stuck()) {
            stack_.queue_for_chunk(this);
            tx_wait_ = true;
        } else {
            stack_.leave_chunk_queue(this);
        }
        return {};
    }
    const std::int32_t id = arena->acquire();
    if (id < 0) return {};
    stack_.took_chunk(this);
    if (tx_count_ == 0) arena->add_holder();
    tx_chunks_[(tx_head_ + tx_count_++) % kTxChunks] = TxChunk{id, 0, false};
    fresh_start = std::min<std::size_t>(fresh_start & ~std::size_t{63}, 4032);
    tx_pushed_end_ = tx_staged_end_ = fresh_start;  // lwIP is handed bytes from here on
    return arena->bytes(id).subspan(fresh_start, std::min(max, io::TxArena::kUsable - fresh_start));
}

std::size_t TcpConnection::tx_push() noexcept {
    if (tx_staged() == 0 || pcb_ == nullptr) return 0;
    TxChunk& tail = tx_chunks_[(tx_head_ + tx_count_ - 1) % kTxChunks];
    const std::size_t n =
        write_ref(stack_.port().tx_arena()->bytes(tail.id).subspan(tx_pushed_end_, tx_staged()));
    if (n != 0) {
        tx_pushed_end_ += n;
        tail.end_seq = pcb_->snd_lbb;
        tail.pushed = true;
    }
    return n;
}

void TcpConnection::release_tx_chunks(bool all) noexcept {
    if (tx_count_ == 0) return;
    io::TxArena* arena = stack_.port().tx_arena();
    struct LastGoes {  // the arena's holder count follows this connection's first and last chunk
        io::TxArena* arena;
        const unsigned& count;
        ~LastGoes() {
            if (count == 0) arena->remove_holder();
        }
    } last_goes{arena, tx_count_};
    const std::uint32_t acked = pcb_ != nullptr ? pcb_->lastack : 0;
    while (tx_count_ != 0) {
        TxChunk& c = tx_chunks_[tx_head_];
        if (!all) {
            if (!c.pushed || static_cast<std::int32_t>(acked - c.end_seq) < 0) break;
            if (tx_count_ == 1 && tx_staged() != 0) break;  // the newest still holds bytes to send
        }
        arena->release(c.id);
        tx_head_ = (tx_head_ + 1) % kTxChunks;
        --tx_count_;
    }
    if (tx_count_ == 0) tx_pushed_end_ = tx_staged_end_ = 0;
}

std::size_t TcpConnection::send_space() const noexcept { return pcb_ != nullptr ? tcp_sndbuf(pcb_) : 0; }

std::uint16_t TcpConnection::mss() const noexcept { return pcb_ != nullptr ? tcp_mss(pcb_) : 0; }

TcpConnection::FlowInfo TcpConnection::flow_info() const noexcept {
    if (pcb_ == nullptr) return {};
    return FlowInfo{pcb_->remote_ip.addr, pcb_->remote_port, pcb_->local_port, pcb_->rcv_nxt};
}

void TcpConnection::ack_now() noexcept {
    stack_.assert_owner();
    if (pcb_ == nullptr) return;
    tcp_ack_now(pcb_);
    tcp_output(pcb_);
}

bool TcpConnection::tx_segment_boundary() const noexcept { return pcb_ != nullptr && pcb_->unsent == nullptr; }
bool TcpConnection::nothing_in_flight() const noexcept {
    return pcb_ != nullptr && pcb_->unsent == nullptr && pcb_->unacked == nullptr;
}

void TcpConnection::flush() noexcept {
    stack_.assert_owner();
    if (pcb_ != nullptr) tcp_output(pcb_);
}

void TcpConnection::set_keepalive(std::chrono::milliseconds idle, std::chrono::milliseconds interval,
                                  unsigned probes) noexcept {
    stack_.assert_owner();
    if (pcb_ == nullptr) return;
    ip_set_option(pcb_, SOF_KEEPALIVE);
    pcb_->keep_idle = static_cast<u32_t>(idle.count());
    pcb_->keep_intvl = static_cast<u32_t>(interval.count());
    pcb_->keep_cnt = probes;
}

std::optional<std::uint32_t> TcpConnection::oldest_unacked() const noexcept {
    if (pcb_ == nullptr || (pcb_->unacked == nullptr && !window_closed())) return std::nullopt;
    return pcb_->lastack;
}

bool TcpConnection::window_closed() const noexcept {
    return pcb_ != nullptr && pcb_->unsent != nullptr && pcb_->persist_backoff > 0;
}

static_assert(static_cast<u8_t>(TcpPriority::expendable) == TCP_PRIO_MIN);
static_assert(static_cast<u8_t>(TcpPriority::normal) == TCP_PRIO_NORMAL);
static_assert(static_cast<u8_t>(TcpPriority::vital) == TCP_PRIO_MAX);

void TcpConnection::set_priority(TcpPriority p) noexcept {
    stack_.assert_owner();
    if (pcb_ != nullptr) tcp_setprio(pcb_, static_cast<u8_t>(p));
}

bool TcpConnection::close() noexcept {
    stack_.assert_owner();
    if (pcb_ == nullptr) return true;
    tcp_setprio(pcb_, static_cast<u8_t>(TcpPriority::expendable));
    detach();
    // An open connection gets our FIN with its receive side left open: what the peer still sends until its own
    // FIN (a segment already on its way, a first-FPDU nudge) is acknowledged and dropped by lwIP (tcp_recv_null:
    // no receive callback after detach). tcp_close() would instead answer such a segment with a reset, which
    // purges what we still had to send: the peer would lose the tail of our stream. The pcb then ends as
    // every closed pcb does (TIME_WAIT, or reset); one whose peer never closes stays in FIN_WAIT_2 at the lowest
    // priority, the first lwIP reuses when it needs a pcb.
    const bool open = pcb_->state == ESTABLISHED || pcb_->state == CLOSE_WAIT || pcb_->state == SYN_RCVD;
    if ((open ? tcp_shutdown(pcb_, 0, 1) : tcp_close(pcb_)) != ERR_OK) {  // no memory for the FIN: still ours
        attach();
        return false;
    }
    // lwIP owns the pcb from here and frees it when the close completes. Staged bytes never reached it (dropped);
    // the chunks holding bytes it took go to the Stack until they are acknowledged, and get what is still sent
    // from application memory now (FillBook: the application may reuse its buffers once the QP is closed).
    tx_drop_staged();
    stack_.settle_fills();
    release_tx_chunks(false);
    if (tx_count_ != 0) {
        std::array<std::int32_t, kTxChunks> ids{};
        std::uint32_t end_seq = 0;
        unsigned n = 0;
        for (; tx_count_ != 0; --tx_count_, tx_head_ = (tx_head_ + 1) % kTxChunks) {
            const TxChunk& c = tx_chunks_[tx_head_];
            ids[n++] = c.id;
            if (c.pushed) end_seq = c.end_seq;
        }
        stack_.port().tx_arena()->remove_holder();  // the Stack holds them from here (not a share of its own)
        stack_.adopt_tx_chunks(pcb_, std::span<const std::int32_t>(ids).first(n), end_seq);
    }
    pcb_ = nullptr;
    return true;
}

void TcpConnection::abort() noexcept {
    stack_.assert_owner();
    if (pcb_ == nullptr) return;
    detach();  // no error callback for our own abort
    if (CallbackScope::pcb == pcb_) CallbackScope::aborted = true;
    tcp_abort(pcb_);  // sends RST and frees the pcb
    pcb_ = nullptr;
    release_tx_chunks(true);  // lwIP freed its references with the pcb (frames in flight hold their own)
}

void TcpConnection::consumed(std::size_t bytes) noexcept {
    if (pcb_ == nullptr) return;
    while (bytes != 0) {
        const auto n = static_cast<u16_t>(std::min<std::size_t>(bytes, 0xffff));
        tcp_recved(pcb_, n);
        bytes -= n;
    }
}

err_t TcpConnection::on_recv_cb(void* arg, tcp_pcb* pcb, pbuf* p, err_t) {
    auto* self = static_cast<TcpConnection*>(arg);
    if (self == nullptr) {  // detached: drop
        if (p != nullptr) {
            tcp_recved(pcb, p->tot_len);
            pbuf_free(p);
        }
        return ERR_OK;
    }
    CallbackScope scope(pcb, self);
    if (p == nullptr) {
        self->handler_->on_remote_close(*self);
    } else {
        // Ownership of p passes to the handler inside the RecvBuffer (so we return ERR_OK, or ERR_ABRT if
        // the handler aborted: lwIP frees nothing of p either way).
        const std::uint32_t len = p->tot_len;
        self->handler_->on_receive(*self, RecvBuffer(self, p));
        if (!scope.destroyed && self->pcb_ != nullptr) {
            // Stretch ACKs. lwIP acknowledges every second in-order segment at once (tcp_ack sets TF_ACK_NOW,
            // tcp_input sends it after this callback), and a poll turn often takes one segment: an ACK frame
            // per one or two segments, each a tcp_input at the sender (0.89 ACKs per data frame measured for
            // 64 KiB WRITEs). The ACK is owed as a delayed one instead: it goes as soon as it covers
            // kStretchSegments full segments, else at the end of the first poll turn after it has waited
            // Stack::kAckDelayUs, or before the engine sleeps, unless data going out first carries it. One ACK
            // per 8 segments: ~0.13 per data frame. Out-of-order segments never come here: their duplicate
            // ACKs (the sender's fast retransmit) still leave at once. The sender's slow start counts bytes
            // acknowledged, not ACKs (on_sent_cb).
            if (self->rx_unacked_ == 0) self->owed_since_tsc_ = rte_get_timer_cycles();
            self->rx_unacked_ += len;
            if (self->rx_unacked_ >= self->stretch_bytes()) {
                tcp_ack_now(pcb);  // due: tcp_input sends it when this callback returns
                self->rx_unacked_ = 0;
                return scope.result();
            }
            if ((pcb->flags & TF_ACK_NOW) != 0) {
                tcp_clear_flags(pcb, TF_ACK_NOW);
                tcp_set_flags(pcb, TF_ACK_DELAY);
            }
            if (!self->ack_deferred_) {
                self->ack_deferred_ = true;
                self->stack_.defer_ack(self);
            }
        }
    }
    return scope.result();
}

err_t TcpConnection::on_sent_cb(void* arg, tcp_pcb* pcb, u16_t len) {
    // Slow start by bytes acknowledged (RFC 3465 without its per-ACK limit L, as Linux does): lwIP grows cwnd
    // by at most 2 MSS per ACK, which stretch ACKs (ours, or a kernel receiver's after GRO) would turn from
    // doubling every round trip into 2 MSS per round trip. Not after a retransmission timeout (TF_RTO:
    // lwIP's 1-MSS rule stands). lwIP has already added its part for this ACK.
    if (pcb->cwnd < pcb->ssthresh && (pcb->flags & TF_RTO) == 0 && len > 2u * pcb->mss) {
        const u32_t grown = static_cast<u32_t>(pcb->cwnd) + (len - 2u * pcb->mss);
        pcb->cwnd = static_cast<tcpwnd_size_t>(std::min<u32_t>(grown, pcb->ssthresh));
    }
    auto* self = static_cast<TcpConnection*>(arg);
    if (self == nullptr) return ERR_OK;
    self->release_tx_chunks(false);
    CallbackScope scope(pcb, self);
    self->handler_->on_sent(*self, len);
    return scope.result();
}

err_t TcpConnection::on_connected_cb(void* arg, tcp_pcb* pcb, err_t) {
    auto* self = static_cast<TcpConnection*>(arg);
    if (self == nullptr) return ERR_OK;
    CallbackScope scope(pcb, self);
    self->connected_ = true;
    seed_rto(pcb);
    size_send_buffer(pcb);
    self->stack_.list_connection(self);
    self->handler_->on_connected(*self);
    return scope.result();
}

err_t TcpConnection::on_poll_cb(void* arg, tcp_pcb* pcb) {
    auto* self = static_cast<TcpConnection*>(arg);
    if (self == nullptr || self->connected_ || std::chrono::steady_clock::now() < self->connect_deadline_)
        return ERR_OK;
    CallbackScope scope(pcb, self);
    self->abort();
    self->handler_->on_error(*self, TcpError::timed_out);
    return ERR_ABRT;
}

void TcpConnection::on_err_cb(void* arg, err_t err) {
    auto* self = static_cast<TcpConnection*>(arg);
    if (self == nullptr) return;
    self->pcb_ = nullptr;  // lwIP has freed it already
    self->release_tx_chunks(true);
    TcpError e;
    if (err == ERR_RST) e = self->connected_ ? TcpError::reset : TcpError::refused;
    else if (err == ERR_CLSD) e = TcpError::reset;
    else e = TcpError::timed_out;  // ERR_ABRT from lwIP's timers: retransmissions or SYNs gave up
    self->handler_->on_error(*self, e);
}

std::unique_ptr<TcpConnection> connect(Stack& stack, Ipv4 address, std::uint16_t port,
                                       TcpConnection::Handler& handler, std::chrono::milliseconds timeout,
                                       std::uint16_t local_port) {
    stack.assert_owner();
    tcp_pcb* pcb = tcp_new_ip_type(IPADDR_TYPE_V4);
    if (pcb == nullptr) throw std::runtime_error("lwIP: no free TCP pcb (MEMP_NUM_TCP_PCB in lwipopts.h)");
    std::unique_ptr<TcpConnection> conn(new TcpConnection(stack, pcb, &handler, false));
    conn->connect_deadline_ = std::chrono::steady_clock::now() + timeout;
    seed_rto(pcb, kSynRto);
    conn->attach();
    if (local_port != 0) {
        // A connection of ours that ended on this port may still be in TIME_WAIT (a connect tried again from
        // the same port): lwIP lets a SOF_REUSEADDR pcb bind beside it.
        ip_set_option(pcb, SOF_REUSEADDR);
        if (tcp_bind(pcb, IP4_ADDR_ANY, local_port) != ERR_OK) {
            conn->abort();
            throw std::runtime_error("TCP port " + std::to_string(local_port) + " is already in use");
        }
    }
    ip_addr_t ip;
    ip_addr_set_ip4_u32(&ip, address.be);
    if (const err_t e = tcp_connect(pcb, &ip, port, &TcpConnection::on_connected_cb); e != ERR_OK) {
        conn->abort();
        throw std::runtime_error("lwIP: cannot connect to " + address.str() + ":" + std::to_string(port) +
                                 " (err " + std::to_string(e) + ")");
    }
    return conn;
}

// ---- TcpListener ------------------------------------------------------------------------------------

TcpListener::TcpListener(Stack& stack, std::uint16_t port, Handler& handler) : stack_(stack), handler_(handler) {
    stack.assert_owner();
    tcp_pcb* pcb = tcp_new_ip_type(IPADDR_TYPE_V4);
    if (pcb == nullptr) throw std::runtime_error("lwIP: no free TCP pcb");
    // Its accepted connections inherit the option: a new listener on this port may come while they live.
    ip_set_option(pcb, SOF_REUSEADDR);
    if (tcp_bind(pcb, IP4_ADDR_ANY, port) != ERR_OK) {
        tcp_close(pcb);
        throw std::runtime_error("TCP port " + std::to_string(port) + " is already in use");
    }
    err_t err = ERR_OK;
    pcb_ = tcp_listen_with_backlog_and_err(pcb, TCP_DEFAULT_LISTEN_BACKLOG, &err);  // frees pcb, returns a listen pcb
    if (pcb_ == nullptr) {
        tcp_close(pcb);
        throw std::runtime_error(err == ERR_USE ? "TCP port " + std::to_string(port) + " already has a listener"
                                                : "lwIP: no free listen pcb (MEMP_NUM_TCP_PCB_LISTEN)");
    }
    tcp_arg(pcb_, this);
    tcp_accept(pcb_, &TcpListener::on_accept_cb);
}

TcpListener::~TcpListener() {
    if (pcb_ != nullptr) {
        tcp_arg(pcb_, nullptr);
        tcp_close(pcb_);
    }
}

err_t TcpListener::on_accept_cb(void* arg, tcp_pcb* pcb, err_t err) {
    auto* self = static_cast<TcpListener*>(arg);
    if (self == nullptr || pcb == nullptr || err != ERR_OK) return ERR_VAL;
    std::unique_ptr<TcpConnection> conn(new TcpConnection(self->stack_, pcb, nullptr, true));
    seed_rto(pcb);
    size_send_buffer(pcb);
    conn->attach();
    self->stack_.list_connection(conn.get());
    CallbackScope scope(pcb, conn.get());
    self->handler_.on_accept(std::move(conn));  // dropping it aborts: scope then says ERR_ABRT
    return scope.result();
}

}  // namespace softrdma::stack
