// SPDX-License-Identifier: MIT
// detail::Conn and detail::Listener: what a verbs::CmId and a verbs::CmListener are (internal to verbs).
//
// A Conn owns one TCP connection from connect/accept to its close, and runs what is not the RDMA stream:
// TCP setup, MPA negotiation (mpa::Initiator / mpa::Responder), the initiator's first-FPDU guard and the
// close. It holds the TCP callbacks only while negotiating: at RDMA mode it hands the connection to the QP
// (Qp::start_stream), whose stream takes them, and takes them back when the stream ends. From the QP it hears
// only the stream's end (stream_closed_by_peer, stream_error, stream_failed, qp_gone); events go to the
// engine's CM channel. Control path: allocates.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpa/negotiation.hpp"
#include "stack/tcp.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::verbs::detail {

class Engine;
class Qp;

class Conn {
public:
    // Responder: a TCP connection accepted on a listener, negotiating with the listener's defaults.
    Conn(Engine& engine, CmListener& listener, const ConnParam& defaults, std::unique_ptr<stack::TcpConnection> tcp);
    // Initiator: TCP connect, then MPA negotiation for `qp` (checked by Context::connect).
    Conn(Engine& engine, stack::Ipv4 addr, std::uint16_t port, QueuePair& qp, const ConnParam& param);
    ~Conn();
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;

    // The handle the application holds, named in this connection's events (set by CmId's constructor).
    void set_handle(CmId* h) noexcept { handle_ = h; }

    // ---- the API (CmId) ----
    bool accept(QueuePair& qp, const ConnParam& param);
    bool reject(std::span<const std::byte> private_data);
    void disconnect();
    void abort();
    const mpa::PrivateData& peer_private_data() const noexcept { return peer_pd_; }
    QueuePair* qp() noexcept { return qp_handle_; }
    bool connected() const noexcept { return phase_ == Phase::rdma; }
    unsigned nudges_sent() const noexcept { return nudges_sent_; }
    const std::string& peer() const noexcept { return peer_; }
    stack::Ipv4 peer_address() const noexcept { return stack::Ipv4{peer_ip_be_}; }
    std::uint16_t peer_port() const noexcept { return peer_port_; }
    std::uint16_t local_port() const noexcept { return local_port_; }

    // ---- the QP's interface: its stream ended ----
    void stream_closed_by_peer();            // FIN
    void stream_error(stack::TcpError e);    // the connection is gone (reset, timeout)
    void stream_failed();                    // the QP is in ERR and its TERMINATE is out: close
    void qp_gone() noexcept;                 // the QP is being destroyed while connected: abort
    // The QP goes back to RESET (QueuePair::modify_state): it leaves a connection that has ended (the CmId
    // keeps closing it in order, and no longer names the QP). False while the connection is still in use.
    bool qp_leaves() noexcept;
    bool closed() const noexcept { return phase_ == Phase::closed; }

    // ---- the engine's interface ----
    // The Context is closing (Engine::close): a connection still in use is reset and its QP flushed (no
    // event); then, after the linger, drop_tcp() lets go of the TCP connection before the stack goes.
    void close_for_context() noexcept;
    void drop_tcp() noexcept;
    // Poll stage: negotiation time limits, the first-FPDU guard, a deferred TERMINATE, a drain, a pending close.
    void service(mpa::Clock::time_point now);
    // Done: closed, and the FIN (if any) handed to TCP. An orphan in this state is dropped.
    bool finished() const noexcept { return phase_ == Phase::closed && !close_pending_; }
    // Pending (SecurityConfig): accepted by TCP, MPA request not in yet; the oldest such is evicted when full.
    bool evictable() const noexcept { return pending_ && phase_ == Phase::negotiating; }
    void evict();
    void forget_listener(const CmListener* l) noexcept {
        if (listener_ == l) listener_ = nullptr;
    }

private:
    struct TcpHandler;
    enum class Phase : std::uint8_t { connecting, negotiating, request, rdma, closed };

    void on_tcp_connected();
    void on_tcp_receive(stack::RecvBuffer data);
    void on_tcp_sent();
    void on_tcp_remote_close();
    void on_tcp_error(stack::TcpError e);
    void write_negotiation_output();
    void check_outcome();
    // RDMA mode: the TCP connection and its callbacks go to the QP's stream.
    void go_rdma(const mpa::Agreed& agreed);
    // The stream is over: the callbacks come back here (the QP may go before this connection has closed).
    void take_back_tcp() noexcept;
    void guard_first_fpdu(mpa::Clock::time_point now);
    bool rtr_before_terminate(TermCode code, CmEventType type);
    // Ends the connection: QP to err (flush), TCP closed in the poll stage, event (unless quiet).
    // `first`: what the oldest outstanding send WR completes with (the rest flush).
    void finish(CmEventType type, const std::string& reason, bool quiet = false,
                WcStatus first = WcStatus::wr_flush_err);
    // ConnParam::liveness: the peer stopped answering. The stream ends (retry_exc_err), TCP is reset.
    void peer_dead(const std::string& why);
    void check_user_timeout(mpa::Clock::time_point now);
    void emit(CmEventType type, const std::string& reason = {});
    void leave_pending() noexcept;
    void unbind_qp() noexcept;
    void note_endpoints();  // peer_, peer_ip_be_, peer_port_, local_port_ from the TCP connection

    std::shared_ptr<Engine> keep_engine_;  // first: goes last (the id may outlive the Context)
    Engine& engine_;
    CmId* handle_{nullptr};
    std::unique_ptr<TcpHandler> handler_;
    std::unique_ptr<stack::TcpConnection> tcp_;
    std::optional<mpa::Initiator> ini_;
    std::optional<mpa::Responder> resp_;
    std::vector<std::byte> pd_copy_;  // our request private data, kept for the negotiator
    Phase phase_{Phase::connecting};
    bool initiator_{false};
    Qp* qp_{nullptr};
    QueuePair* qp_handle_{nullptr};
    CmListener* listener_{nullptr};
    mpa::PrivateData peer_pd_{};
    std::string peer_;           // "a.b.c.d:port", set when TCP connects
    std::uint32_t peer_ip_be_{0};
    std::uint16_t peer_port_{0};   // host order, with peer_
    std::uint16_t local_port_{0};  // ours: ConnParam::local_port for an initiator until TCP connects, then TCP's
    bool pending_{false};        // counted in the engine's pending connections (responder, before its request)
    bool stream_owned_{false};   // the QP's stream holds the TCP callbacks
    bool draining_{false};       // disconnect(): waiting for the QP's send queue to reach TCP
    mpa::Clock::time_point drain_deadline_{};
    bool quiet_close_{false};    // the event was already given (initiator failure with TERMINATE)
    std::uint16_t ird_{0};
    std::uint16_t ord_{0};
    bool close_pending_{false};  // close TCP in the poll stage (after this turn's RecvBuffer reopened the window)
    bool rfc7306_{false};        // ConnParam::rfc7306 of our side (connect, or accept)
    // First-FPDU guard (initiator in RDMA mode; cm.cpp "The accept window"), and the responder's grace.
    FirstFpduGuard guard_{};
    std::chrono::milliseconds responder_grace_{0};  // ConnParam::responder_grace, set by accept()
    bool guarding_{false};
    std::optional<mpa::Clock::time_point> first_tx_at_;  // when our first FPDU reached TCP
    mpa::Clock::time_point last_tx_seen_{};              // last poll stage that saw our TX advance
    std::uint64_t tx_seen_{0};
    unsigned nudges_sent_{0};
    unsigned nudge_step_{0};
    mpa::Clock::time_point hold_until_{};
    // ConnParam::connect_retry: where to connect again, until when, and the next attempt (set when refused).
    stack::Ipv4 addr_{};
    std::uint16_t port_{0};
    mpa::Clock::time_point retry_until_{};
    std::optional<mpa::Clock::time_point> retry_at_;
    ProtoStatus deferred_term_;  // rtr_before_terminate(): the TERMINATE, due at deferred_until_
    mpa::Clock::time_point deferred_until_{};
    std::optional<std::pair<CmEventType, std::string>> fail_event_;  // its event, given when it is out
    // Dead-peer detection (ConnParam::liveness of our side): keepalive is lwIP's; the user timeout is timed
    // here from the poll stage: the oldest unacknowledged sequence number and since when it has been.
    Liveness liveness_{};
    std::optional<std::uint32_t> una_;
    mpa::Clock::time_point una_since_{};
    mpa::Clock::time_point last_check_{};
};

class Listener {
public:
    Listener(Engine& engine, std::uint16_t port, const ConnParam& defaults);
    ~Listener();
    Listener(const Listener&) = delete;
    Listener& operator=(const Listener&) = delete;
    void set_handle(CmListener* h) noexcept { handle_ = h; }
    std::uint16_t port() const noexcept { return port_; }
    const ConnParam& defaults() const noexcept { return defaults_; }
    // The Context is closing: stop listening before the stack goes.
    void close_for_context() noexcept { tcp_.reset(); }

private:
    struct Acceptor;
    std::shared_ptr<Engine> keep_engine_;
    Engine& engine_;
    CmListener* handle_{nullptr};
    std::uint16_t port_;
    ConnParam defaults_;
    std::unique_ptr<Acceptor> acceptor_;
    std::unique_ptr<stack::TcpListener> tcp_;
};

}  // namespace softrdma::verbs::detail
