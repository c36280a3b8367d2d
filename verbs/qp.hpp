// SPDX-License-Identifier: MIT
// detail::Qp: what a verbs::QueuePair is (internal to verbs). Posting (send slots, posted receives), the verbs
// state, and the QP's stream once in RDMA mode: its receive half (qp_rx.hpp) and transmit half (qp_tx.hpp),
// the same in both threading modes. What differs between the modes is only where the receive half runs and so
// how its events travel: on this thread the QP is its event sink and applies each event at once; handed over to
// the RX thread (on_marker) its sink is the ring the QP drains when the doorbell names it. The sink is switched
// at the handover and back at detach_rx(), never tested per frame.
//
// At RDMA mode the stream takes the TCP connection's callbacks (StreamHandler): received bytes go straight to
// the receive half, never through the connection manager; the CM keeps setup, close and errors, and talks to
// the QP only through the "connection manager's interface" below.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "mpa/negotiation.hpp"
#include "rdmap/endpoint.hpp"
#include "stack/tcp.hpp"
#include "verbs/qp_rx.hpp"
#include "verbs/qp_tx.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::verbs::detail {

class Engine;
class Conn;
class Cq;
class Srq;

class Qp final : private rdmap::Upper, private RxEventSink {
public:
    Qp(const std::shared_ptr<Engine>& engine, std::uint32_t pd, const QpInitAttr& attr, std::uint32_t qp_num);
    ~Qp() override;
    Qp(const Qp&) = delete;
    Qp& operator=(const Qp&) = delete;

    // ---- the API (QueuePair) ----
    PostResult<SendWr> post_send(std::span<const SendWr> wrs) noexcept;
    PostResult<RecvWr> post_recv(std::span<const RecvWr> wrs) noexcept;
    bool modify_state(QpState s) noexcept;
    QpState state() const noexcept { return state_; }
    std::uint32_t qp_num() const noexcept { return qp_num_; }
    const std::optional<TerminateInfo>& terminate_info() const noexcept { return term_; }
    const QpCap& cap() const noexcept { return cap_; }
    std::uint32_t pd() const noexcept { return pd_; }
    Engine& engine() noexcept { return engine_; }

    // ---- the connection manager's interface ----
    // Connecting: INIT and no connection yet.
    bool connectable() const noexcept { return state_ == QpState::init && conn_ == nullptr; }
    // The CM owns this QP's connection from here (INIT -> RTR while MPA runs).
    void bind(Conn& conn) noexcept;
    // The CM lets go (its CmId is going): the QP keeps no pointer to it.
    void unbind() noexcept { conn_ = nullptr; }
    bool bound_to(const Conn* c) const noexcept { return conn_ == c; }
    // With an RX thread: it follows the TCP connection from now (initiator: before the MPA request is sent).
    void watch(stack::TcpConnection& tcp) noexcept;
    struct StreamParams {
        bool initiator = false;
        bool rfc7306 = false;
        bool hold_first = false;  // FirstFpduGuard::Mode::hold: the first FPDU waits for release_first_fpdu()
    };
    // RDMA mode (control path: allocates): both halves from the agreement, RTS, the TCP callbacks taken.
    void start_stream(stack::TcpConnection& tcp, const mpa::Agreed& agreed, const StreamParams& p);
    // Bytes of the stream that came in the same delivery as the MPA frame (before the callbacks were ours).
    void deliver_early(std::span<const std::byte> bytes) noexcept { deliver(bytes); }
    // The initiator's TERMINATE for a reply it cannot use (MPA code), through the tx half's choke point.
    void fail_stream(TermCode code) noexcept;
    // The stream ended without a protocol error (FIN, reset, our close, a dead peer): everything flushed,
    // nothing sent. `first`: what the oldest outstanding send WR completes with (retry_exc_err: a dead peer).
    void end_stream(WcStatus first = WcStatus::wr_flush_err) noexcept;
    // Orderly disconnect: no new sends (SQD); tx_idle() once what was queued has reached TCP.
    void begin_drain() noexcept;
    bool tx_idle() const noexcept { return !tx_.started() || tx_.idle(tcp_); }
    // The failed-negotiation path refuses posts while it sends the RTR first (cm.cpp, rtr_before_terminate).
    void refuse_posts() noexcept { state_ = QpState::rtr; }
    // The first-FPDU guard's tools (the CM decides when, cm.cpp "The accept window"): a zero-length RDMA WRITE
    // to STag 1 behind whatever is queued (no completion; false if the send queue is full or there is no
    // stream), the end of a hold, and what tells whether the peer's receive path is live.
    bool post_nudge() noexcept;
    void release_first_fpdu() noexcept;
    std::uint64_t tx_written() const noexcept { return tx_.written(); }
    bool peer_spoke() const noexcept { return rx_started_; }
    std::uint64_t tx_written_when_peer_spoke() const noexcept { return tx_at_rx_start_; }

    // ---- the engine's interface ----
    // The Context is closing: ERR with everything flushed, the RX thread's hold released, no TCP any more.
    void close_for_context() noexcept;
    // TX: moves whole FPDUs to TCP while TCP takes them (from the poll turn's TX stage).
    void tx_pump() noexcept;
    bool in_tx_list{false};
    // RX thread mode: events the receive half queued (cheap check: one load), and applying them.
    bool events_pending() const noexcept { return ring_ && ring_->pending(); }
    void drain_events() noexcept;
    // RX thread mode: every byte forwarded before the handover has reached the receive half: the RX thread
    // takes it over; a segment after a hole lost its payload: ACK now (the peer's fast retransmit).
    void on_marker() noexcept;
    void on_gap() noexcept;

private:
    // The stream's TCP callbacks in RDMA mode. `placed_elsewhere`: the RX thread places this stream's payload
    // and lwIP's bytes are stand-ins (set at the handover, so no per-segment test of the mode).
    struct StreamHandler final : stack::TcpConnection::Handler {
        Qp& qp;
        bool placed_elsewhere;
        StreamHandler(Qp& q, bool elsewhere) : qp(q), placed_elsewhere(elsewhere) {}
        void on_receive(stack::TcpConnection&, stack::RecvBuffer data) override;
        void on_sent(stack::TcpConnection&, std::size_t) override;
        void on_remote_close(stack::TcpConnection&) override;
        void on_error(stack::TcpConnection&, stack::TcpError e) override;
    };

    // rdmap::Upper of the tx half (the receive half has its own: qp_rx.hpp).
    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access access) override;
    rdmap::MemError recv_begin(std::uint32_t) override { return rdmap::MemError::no_receive; }  // tx: never asked
    rdmap::Mem recv_place(std::uint32_t, std::uint32_t, std::size_t) override { return {.err = rdmap::MemError::bounds}; }
    rdmap::MemError invalidate(std::uint32_t) override { return rdmap::MemError::invalid_stag; }
    bool source_alive(std::uint64_t wr_id) override;
    void on_completion(const rdmap::Completion& c) override;
    void on_terminate(const rdmap::TermReport& t) override;
    void on_request_sent(const rdmap::OrqEntry& e) override;
    // RxEventSink while the receive half runs on this thread: each event applied at once.
    void emit(const RxEvent& e) noexcept override { apply(e); }
    void apply(const RxEvent& e) noexcept;

    void deliver(std::span<const std::byte> bytes) noexcept;
    void schedule_tx() noexcept;
    void note_rx_start() noexcept;
    void enter_error() noexcept;
    void note_terminate(const TerminateInfo& t) noexcept;
    void flush_rq() noexcept;
    // Takes the receive half back from the RX thread (bounded wait) and stops it: what it held is flushed.
    void detach_rx() noexcept;
    std::uint32_t alloc_slot() noexcept;
    void free_slot(std::uint32_t slot) noexcept;
    void complete_send(std::uint32_t slot, WcStatus st) noexcept;
    // Every completion of this QP goes through here: a CQ's first lost completion becomes its cq_err event.
    void complete(Cq& cq, const WorkCompletion& wc) noexcept;
    PostErrc check_sge(const Sge& s, bool need_write, std::span<std::byte>& out, Lease& lease) const noexcept;
    PostResult<SendWr> post_send_inner(std::span<const SendWr> wrs) noexcept;
    PostResult<RecvWr> post_recv_inner(std::span<const RecvWr> wrs) noexcept;

    // A send WR from post to completion; the tx endpoint's wr_id is the slot index.
    struct SqSlot {
        std::uint64_t wr_id{0};
        WcOpcode opcode{WcOpcode::send};
        bool signaled{false};
        std::uint32_t byte_len{0};
        SinkList sink{};  // READ sink list / atomic result (the receive half gets a copy with the request)
        std::array<Lease, kMaxSge> src{};  // SEND/WRITE: the leases of the SGEs' regions (source_alive)
        std::uint8_t nsrc{0};
        std::uint32_t next_free{0};
    };

    // The engine, the CQs and the SRQ this QP uses, held so that their handles (and the Context) may go first
    // (declared first: they go last, after everything here that may still touch them).
    std::shared_ptr<Engine> keep_engine_;
    std::shared_ptr<Cq> keep_send_cq_;
    std::shared_ptr<Cq> keep_recv_cq_;
    std::shared_ptr<Srq> keep_srq_;
    Engine& engine_;
    std::uint32_t pd_;
    Cq& send_cq_;
    Cq& recv_cq_;
    QpCap cap_;
    bool sig_all_;
    std::uint32_t qp_num_;
    QpState state_{QpState::reset};
    std::optional<TerminateInfo> term_;
    // What the next send WR flushed completes with instead of wr_flush_err (a received TERMINATE's cause, a
    // dead peer): taken once, by the oldest.
    std::optional<WcStatus> fail_status_;
    Conn* conn_{nullptr};
    stack::TcpConnection* tcp_{nullptr};  // the stream's, while in RDMA mode (owned by the CM)
    Srq* srq_{nullptr};

    // Sizing: one SqSlot per max_send_wr (every outstanding send WR holds one until its completion), a free
    // list through next_free; inline payload max_inline_data bytes per slot.
    std::vector<SqSlot> sq_;
    std::uint32_t sq_free_{0};
    std::uint32_t sq_used_{0};
    std::uint64_t lost_slot_{~std::uint64_t{0}};  // the SEND/WRITE whose source was deregistered (loc_prot_err)
    std::vector<std::byte> inline_buf_;
    RecvQueue recv_;  // max_recv_wr slots (the SRQ's when shared)

    // The receive half: owned here, run here or on the RX thread. Held by pointer so that a receive half the RX
    // thread would not give back (detach_rx) can be left alive rather than freed under it.
    std::unique_ptr<RxHalf> rx_;
    TxHalf tx_;
    std::unique_ptr<RxEventRing> ring_;  // RX thread mode: the receive half's events; null run to completion
    std::unique_ptr<StreamHandler> handler_;
    std::atomic<std::uint32_t> answered_{0};  // inbound requests the tx half answered (tx -> rx endpoint)
    int flow_{-1};                // the engine's flow id while the RX thread follows this QP's connection
    bool handed_over_{false};     // the RX thread places this stream
    bool rx_started_{false};
    std::uint64_t tx_at_rx_start_{0};
    bool closing_{false};         // teardown in progress: an endpoint error now is not a protocol error
};

}  // namespace softrdma::verbs::detail
