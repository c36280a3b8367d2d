// SPDX-License-Identifier: MIT
// detail::Engine: what a verbs::Context is (internal to verbs). It owns the packet path (io port, lwIP stack, the
// RX thread when configured), the MR table, the QPs with TX work, the CM's ids and events, and runs the polling
// turn. The other internals talk to it through the methods below; applications only through Context.
//
// Lifetime: shared. The Context holds it, and so does every object made from it that touches it when it goes
// (PDs, MRs, SRQs, QPs, CM ids and listeners): the application may destroy them in any order. Destroying the
// Context close()s the engine: connections still in use are reset (those already ending get their FIN within
// close_linger), every QP goes to ERR with its work flushed, listeners stop, and the packet path (port, stack,
// RX thread) is released. What the application still holds then stays safe to use and to destroy: posts
// complete with flush errors, control calls that need the network throw Error ("the Context is closed").
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include <boost/lockfree/spsc_queue.hpp>

#include "io/port.hpp"
#include "stack/stack.hpp"
#include "threading/rx_thread.hpp"
#include "verbs/memory.hpp"
#include <softrdma/diagnostics.hpp>
#include <softrdma/verbs.hpp>

namespace softrdma::stack {
class TcpConnection;
}

namespace softrdma::verbs::detail {

class Qp;
class Conn;
class Listener;

class Engine : public std::enable_shared_from_this<Engine> {
public:
    explicit Engine(const ContextConfig& cfg);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    const ContextConfig& config() const noexcept { return cfg_; }
    io::Port& port() noexcept { return *port_; }
    const io::Port& port() const noexcept { return *port_; }
    stack::Stack& stack() noexcept { return *stack_; }
    const stack::Stack& stack() const noexcept { return *stack_; }
    MemoryTable& memory() noexcept { return mem_; }
    // Payload still sent from application memory goes into its TX chunks (stack::FillBook); nothing once closed.
    void settle_fills() noexcept {
        if (stack_) stack_->settle_fills();
    }
    // The RX thread (nullptr when running to completion).
    threading::RxThread* rx_thread() noexcept { return rx_.get(); }

    // Ends everything that needs the packet path, then releases it (see Lifetime above). Idempotent.
    void close() noexcept;
    bool closed() const noexcept { return closed_; }
    // Throws Error("<what>: the Context is closed") once closed.
    void check_open(const char* what) const;

    unsigned poll() noexcept;
    void flush() noexcept;  // Context::flush
    // The calling thread runs the engine from now (the drop-in libraries serialize threads with their lock).
    void adopt_thread() noexcept {
        if (stack_) stack_->take_ownership();
    }
    bool run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

    // ---- QPs ----
    std::uint32_t new_pd_handle() noexcept { return next_pd_++; }
    // A QP number and a place among max_qp; throws Error when full. The QP lists itself once built (track_qp).
    std::uint32_t add_qp();
    void track_qp(Qp* qp) noexcept;
    void remove_qp(Qp* qp) noexcept;
    // TX work: the QP's pump runs in the next poll turn (once, however often it is asked).
    void schedule_tx(Qp* qp) noexcept;
    // RX thread mode: a flow id per QP whose connection the RX thread follows, and the doorbell on which the
    // RX thread names flows with new receive events. -1 when none is free.
    int alloc_flow(Qp* qp) noexcept;
    void free_flow(int id) noexcept;
    boost::lockfree::spsc_queue<std::uint16_t>* doorbell() noexcept { return doorbell_.get(); }
    void push_async(const AsyncEvent& e) noexcept;
    std::atomic<std::uint64_t>& placed_bytes() noexcept { return placed_bytes_; }
    std::uint64_t& framed_bytes() noexcept { return framed_bytes_; }

    // Layer accounting (ContextConfig::layer_cycles; application thread); the pointers are null when off.
    struct Prof {
        std::uint64_t ep_rx = 0, framer = 0, proto_rx = 0, proto_tx = 0, lwip_tx = 0, poll = 0, api = 0;
        std::uint64_t rx_drain = 0;  // handing the RX thread's frames to lwIP (RX-thread mode)
    };
    Prof* prof() noexcept { return cfg_.layer_cycles ? &prof_ : nullptr; }

    // ---- CM ----
    void add_conn(Conn* c);  // live connections: their timers run in the poll stage
    void remove_conn(Conn* c) noexcept;
    void add_listener(Listener* l);  // listening: stopped by close()
    void remove_listener(Listener* l) noexcept;
    void adopt(std::unique_ptr<CmId> orphan);  // an accepted connection before its connect_request
    std::unique_ptr<CmId> release_orphan(const Conn* c);  // nullptr if not an orphan
    void push_event(CmEvent ev);
    void drop_events(const CmId* id) noexcept;
    void forget_listener(const CmListener* l) noexcept;  // events and orphans no longer name it
    void cm_work() noexcept { cm_work_ = true; }  // a connection has work for the next poll stage
    // A TCP connection accepted on a listener: admitted (a new CmId, orphan until its request) or refused
    // (SecurityConfig).
    void new_request(CmListener& listener, std::unique_ptr<stack::TcpConnection> conn);
    // SecurityConfig bookkeeping (control path): per host, connections pending and access errors caused.
    void note_access_error(std::uint32_t ip_be);
    void pending_done(std::uint32_t ip_be) noexcept;

    // ---- the Context API's rest ----
    std::optional<CmEvent> get_cm_event();
    int cm_fd() const noexcept { return cm_efd_; }
    bool prepare_sleep() noexcept;
    int wake_fd() const noexcept { return wake_efd_; }
    std::optional<AsyncEvent> get_async_event() noexcept;
    std::uint64_t async_dropped() const noexcept { return async_dropped_; }
    RxCopyStats rx_copy_stats() const noexcept;
    TxCopyStats tx_copy_stats() const noexcept;
    std::optional<threading::RxCounters> rx_thread_counters() const noexcept;
    LayerCycles layer_cycles() const noexcept;
    std::uint64_t refused_connections() const noexcept { return refused_connections_; }
    bool has_events() const noexcept { return !events_.empty(); }

private:
    void pump_tx() noexcept;  // the TX part of a turn
    unsigned poll_turn() noexcept;
    struct PeerRecord {
        unsigned pending = 0;
        unsigned errors = 0;
        std::chrono::steady_clock::time_point window_start{};
    };
    PeerRecord& peer_record(std::uint32_t ip_be);

    ContextConfig cfg_;
    std::unique_ptr<io::Port> port_;
    // Declared between the port and the stack: the RX thread stops before the stack goes (the destructor
    // stops it first), and its slots outlive the stack, whose pbufs may still reference them.
    std::unique_ptr<threading::RxThread> rx_;
    std::unique_ptr<stack::Stack> stack_;
    MemoryTable mem_;
    Prof prof_;
    std::atomic<std::uint64_t> placed_bytes_{0};  // RxCopyStats::payload_bytes (either thread, relaxed)
    std::uint64_t framed_bytes_{0};               // TxCopyStats::payload_bytes (the application thread's)
    // RX thread mode: flow ids and the doorbell. Sizing: max_qp each, allocated at open; a flow is on the
    // doorbell at most once (RxEventRing's `rung` flag), so it never overflows.
    std::vector<Qp*> flows_;
    std::vector<std::uint16_t> flow_free_;
    std::unique_ptr<boost::lockfree::spsc_queue<std::uint16_t>> doorbell_;
    std::uint32_t next_pd_{1};
    std::uint32_t next_qpn_{1};
    std::uint32_t qp_count_{0};
    std::vector<Qp*> qps_;               // every QP (close() takes them to ERR); capacity max_qp, reserved at open
    std::vector<Listener*> listeners_;   // control path
    bool closed_{false};
    std::vector<Qp*> tx_list_;           // QPs with TX work; capacity 2 x max_qp, reserved at open
    std::vector<Conn*> conns_;           // live connections (timers); control path
    std::deque<CmEvent> events_;         // control path
    std::vector<std::unique_ptr<CmId>> orphans_;  // accepted TCP connections before their connect_request
    int cm_efd_{-1};
    int wake_efd_{-1};                   // RX thread -> sleeping application thread (prepare_sleep)
    std::atomic<bool> want_wake_{false};
    bool slept_{false};                  // prepare_sleep() said yes: drain wake_efd_ at the next poll
    // Async events come from the data path: a ring allocated at open. Sizing: one per armed SRQ limit in
    // flight; 64 covers an application that does not read them for a while, beyond that they are counted.
    std::array<AsyncEvent, 64> async_{};
    std::size_t async_head_{0};
    std::size_t async_count_{0};
    std::uint64_t async_dropped_{0};
    bool cm_work_{false};                // a connection has work for the poll stage
    std::uint64_t next_timer_tsc_{0};
    std::unordered_map<std::uint32_t, PeerRecord> peers_;
    unsigned pending_total_{0};
    std::uint64_t refused_connections_{0};
};

}  // namespace softrdma::verbs::detail
