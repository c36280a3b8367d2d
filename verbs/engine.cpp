// SPDX-License-Identifier: MIT
// detail::Engine: opening the packet path, the polling turn (RX hand-over from the RX thread or lwIP's own RX,
// TX of every QP with work, CM timers), the CM's event channel, the per-host limits of SecurityConfig, the
// statistics; and the Context handle.
#include "verbs/engine.hpp"

#include <pthread.h>
#include <sched.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <iterator>

#include <rte_cycles.h>

#include "base/cycles.hpp"
#include "base/log.hpp"
#include "stack/tcp.hpp"
#include "verbs/cm.hpp"
#include "verbs/cq.hpp"
#include "verbs/qp.hpp"

namespace softrdma::verbs::detail {

Engine::Engine(const ContextConfig& cfg) : cfg_(cfg), mem_(cfg.max_mr == 0 || cfg.max_mr >= (1u << 24) ? 1 : cfg.max_mr) {
    if (cfg.max_mr == 0 || cfg.max_mr >= (1u << 24)) throw Error("ContextConfig::max_mr must be 1 .. 2^24-1");
    const bool rx_thread = cfg.threading.mode == threading::Mode::rx_thread;
    if (rx_thread && !cfg.port.capture_path.empty())
        throw Error("ContextConfig: a capture file needs run-to-completion mode (RX and TX would share the writer)");
    if (rx_thread && cfg.max_qp > 65535) throw Error("ContextConfig: the RX thread follows at most 65535 connections (max_qp)");
    io::PortConfig pcfg = cfg.port;
    pcfg.memif_large_frames = pcfg.memif_large_frames || cfg.large_segments;
    // Borrowed frames must be freed on the thread that receives them (run to completion); the RX thread holds
    // frames across a handover.
    if (rx_thread) pcfg.memif_borrow_rx = false;
    port_ = io::open_port(pcfg, cfg.eal);
    if (cfg.threading.app_core >= 0) threading::pin_this_thread(cfg.threading.app_core);
    stack::StackConfig scfg;
    scfg.ip = cfg.ip;
    scfg.rx_external = rx_thread;
    scfg.count_cycles = cfg.layer_cycles;
    // (automatic: on where something may corrupt a frame: a real link, or fault injection)
    scfg.tcp_checksums = cfg.tcp_checksums == ContextConfig::Checksums::on ||
                         (cfg.tcp_checksums == ContextConfig::Checksums::automatic &&
                          (cfg.port.backend != io::Backend::memif || port_->faults_on()));
    scfg.large_segments = cfg.large_segments;  // (the Stack applies it on memif only)
    stack_ = std::make_unique<stack::Stack>(*port_, scfg);
    if (rx_thread) {
        flows_.assign(cfg.max_qp, nullptr);
        flow_free_.reserve(cfg.max_qp);
        for (std::uint32_t i = cfg.max_qp; i-- > 0;) flow_free_.push_back(static_cast<std::uint16_t>(i));
        doorbell_ = std::make_unique<boost::lockfree::spsc_queue<std::uint16_t>>(cfg.max_qp);
        rx_ = std::make_unique<threading::RxThread>(*port_, cfg.threading, cfg.max_qp, scfg.tcp_checksums);
        rx_->count_cycles(cfg.layer_cycles);
    }
    // Sizing: a QP is listed at most once, but during a TX pass the QPs already taken off may list themselves
    // again behind the ones being served: 2 x max_qp, so push_back never allocates.
    tx_list_.reserve(2 * static_cast<std::size_t>(cfg.max_qp));
    qps_.reserve(cfg.max_qp);
    conns_.reserve(cfg.max_qp);
    wake_efd_ = make_eventfd("Context::open");
    cm_efd_ = make_eventfd("Context::open");  // last: nothing after it throws
    if (rx_) rx_->set_wakeup(&want_wake_, wake_efd_);
}

Engine::~Engine() {
    close();
    ::close(cm_efd_);
    ::close(wake_efd_);
}

void Engine::close() noexcept {
    if (closed_) return;
    // Connections still in use are reset (their QPs flushed, in ERR); those already ending in order keep their
    // FIN. No events: nobody reads them any more.
    for (std::size_t i = 0; i < conns_.size(); ++i) conns_[i]->close_for_context();
    // Connections still closing (data and our FIN not yet acknowledged, the peer's FIN not yet answered) need
    // polling to finish; a process that stops polling leaves its peer waiting, and a connection reset here
    // loses what it still had to send. Bounded by kStallWindows x close_linger without progress: while the peers
    // keep acknowledging (fewer bytes queued or fewer connections than a window ago) the wait goes on, up to
    // kLingerWindows x close_linger in all (1024 connections with full send queues end in order). One window
    // without progress is not enough to give up: a segment lost to a full TX ring comes back only after TCP's
    // retransmission timeout, which backs off past a window (seen: a slow peer, 1024 connections closing).
    constexpr int kLingerWindows = 20;
    constexpr int kStallWindows = 3;
    int stalled = 0;
    for (int w = 0; w < kLingerWindows && cfg_.close_linger.count() > 0; ++w) {
        const unsigned pcbs = stack_->active_pcbs();
        const std::uint64_t queued = stack_->queued_bytes();
        if (run_until([this] { return stack_->active_pcbs() == 0; }, cfg_.close_linger)) break;
        const bool progress = stack_->active_pcbs() < pcbs || stack_->queued_bytes() < queued;
        stalled = progress ? 0 : stalled + 1;
        if (stalled == kStallWindows) break;  // no progress for that long: give up
    }
    // The last ACKs (of the peers' FINs, for connections now in TIME_WAIT) may still wait for room in the ring
    // to a slow peer: they go with the stack below, and that peer would stay in CLOSING or LAST_ACK. One more
    // window for them (none if the peer is gone: the link is down).
    if (cfg_.close_linger.count() > 0)
        run_until([this] { return stack_->owed_output() == 0 || !port_->link_up(); }, cfg_.close_linger);
    // From here nothing may reach lwIP or the port after they go: every TCP object is released now.
    for (Listener* l : listeners_) l->close_for_context();
    for (std::size_t i = 0; i < conns_.size(); ++i) conns_[i]->drop_tcp();
    for (Qp* qp : qps_) qp->close_for_context();  // ERR, all flushed, the RX thread lets go of its receive half
    if (rx_) rx_->stop();  // then: nothing polls the port while the rest goes
    // Connect requests nobody took, and accepted connections before their request. Moved out first: their
    // ids, going, call back into drop_events / release_orphan on these (now empty) lists.
    std::deque<CmEvent> events = std::move(events_);
    std::vector<std::unique_ptr<CmId>> orphans = std::move(orphans_);
    events_.clear();
    orphans_.clear();
    events.clear();
    orphans.clear();
    drain_fd(cm_efd_);
    tx_list_.clear();
    stack_.reset();
    rx_.reset();
    port_.reset();
    closed_ = true;
}

void Engine::check_open(const char* what) const {
    if (closed_) throw Error(std::string(what) + ": the Context is closed");
}

// ---- QPs ----------------------------------------------------------------------------------------------------

std::uint32_t Engine::add_qp() {
    if (qp_count_ >= cfg_.max_qp) throw Error("create_qp: ContextConfig::max_qp reached");
    ++qp_count_;
    return next_qpn_++;
}

void Engine::track_qp(Qp* qp) noexcept { qps_.push_back(qp); }  // capacity max_qp: reserved at open

void Engine::remove_qp(Qp* qp) noexcept {
    if (qp != nullptr && qp->in_tx_list) std::replace(tx_list_.begin(), tx_list_.end(), qp, static_cast<Qp*>(nullptr));
    if (qp != nullptr) std::erase(qps_, qp);
    --qp_count_;
}

void Engine::schedule_tx(Qp* qp) noexcept {
    if (qp->in_tx_list || closed_) return;
    qp->in_tx_list = true;
    tx_list_.push_back(qp);  // capacity reserved at open (see the constructor)
}

int Engine::alloc_flow(Qp* qp) noexcept {
    if (flow_free_.empty()) return -1;
    const std::uint16_t id = flow_free_.back();
    flow_free_.pop_back();
    flows_[id] = qp;
    return id;
}

void Engine::free_flow(int id) noexcept {
    if (id < 0) return;
    flows_[static_cast<std::size_t>(id)] = nullptr;
    flow_free_.push_back(static_cast<std::uint16_t>(id));  // capacity max_qp: reserved at open
}

void Engine::push_async(const AsyncEvent& e) noexcept {
    if (async_count_ == async_.size()) {
        ++async_dropped_;
        return;
    }
    async_[(async_head_ + async_count_) % async_.size()] = e;
    ++async_count_;
}

std::optional<AsyncEvent> Engine::get_async_event() noexcept {
    if (async_count_ == 0) return std::nullopt;
    const AsyncEvent e = async_[async_head_];
    async_head_ = (async_head_ + 1) % async_.size();
    --async_count_;
    return e;
}

// ---- the polling turn ---------------------------------------------------------------------------------------

namespace {
void release_rx_slot(void* rx, std::uint32_t slot) noexcept { static_cast<threading::RxThread*>(rx)->release(slot); }
}  // namespace

unsigned Engine::poll() noexcept {
    if (cfg_.layer_cycles) {
        // Only turns that did work count: an idle turn is waiting for the peer, which no layer should carry.
        const stack::StackCycles st = stack_->cycles();
        const Prof pr = prof_;
        const std::uint64_t sent = stack_->counters().tx_frames;
        const std::uint64_t t0 = cycles_now();
        const unsigned frames = poll_turn();
        if (frames == 0 && stack_->counters().tx_frames == sent) {
            stack_->rewind_cycles(st);
            prof_ = pr;
        } else {
            prof_.poll += cycles_now() - t0;
        }
        return frames;
    }
    return poll_turn();
}

unsigned Engine::poll_turn() noexcept {
    unsigned frames = 0;
    const std::uint64_t sent = stack_->counters().tx_frames;
    // What the application posted since the last turn goes out first, before this turn's receive work (a
    // ping-pong's reply would otherwise wait for an idle receive poll: 0.1-0.2 us measured). Posts made
    // together still go out together: the turn's end already pumped everything earlier.
    if (!tx_list_.empty()) flush();
    if (rx_) {
        if (slept_) {  // awake again: whether the RX thread woke us or epoll timed out
            slept_ = false;
            want_wake_.store(false, std::memory_order_relaxed);
            drain_fd(wake_efd_);
        }
        // Frames the RX thread copied: each slot goes to lwIP without a copy and comes back to the RX thread
        // through release_rx_slot when lwIP frees it. Sizing: 256 per turn bounds the turn's length.
        using Kind = threading::RxThread::Kind;
        const std::uint64_t t0 = cfg_.layer_cycles ? cycles_now() : 0;
        frames = rx_->drain(256, [this](const threading::RxThread::Frame& f) {
            switch (f.kind) {
            case Kind::frame: stack_->input_external(f.data, f.len, &release_rx_slot, rx_.get(), f.slot); break;
            case Kind::headers:  // payload already placed by the RX thread: lwIP counts stand-in bytes
                // What placing it produced (completions, a TERMINATE) comes first, in stream order with TCP's
                // view of the same bytes (a FIN right behind a TERMINATE must not overtake it).
                if (Qp* qp = flows_[f.flow]; qp != nullptr && qp->events_pending()) qp->drain_events();
                stack_->input_headers(f.data, f.len, f.payload_len, &release_rx_slot, rx_.get(), f.slot);
                break;
            case Kind::gap:  // a segment after a hole, payload dropped: lwIP sees its headers, the peer a dup ACK
                stack_->input_external(f.data, f.len, &release_rx_slot, rx_.get(), f.slot);
                if (Qp* qp = flows_[f.flow]) qp->on_gap();
                break;
            case Kind::marker:  // every byte forwarded before the handover has reached the QP: let the RX thread go
                if (Qp* qp = flows_[f.flow]) qp->on_marker();
                break;
            }
        });
        // Handing frames to lwIP (and on to the receive callbacks, which count themselves): the stack's.
        if (cfg_.layer_cycles) prof_.rx_drain += cycles_now() - t0;
        // QPs whose receive half produced events (completions, inbound requests, TERMINATEs).
        std::uint16_t id = 0;
        while (doorbell_->pop(id))
            if (Qp* qp = flows_[id]) qp->drain_events();
    }
    frames += stack_->poll();  // RX (run to completion): lwIP callbacks -> the QP's stream (or the CM during setup)
    pump_tx();
    // CM: pending closes at once, negotiation time limits once per millisecond. The check is one TSC read
    // (a steady_clock read costs ~50 ns on a VM: a quarter of an idle turn).
    if (const std::uint64_t tsc = rte_get_timer_cycles(); cm_work_ || tsc >= next_timer_tsc_) {
        const auto now = mpa::Clock::now();
        cm_work_ = false;
        next_timer_tsc_ = tsc + std::max<std::uint64_t>(1, rte_get_timer_hz() / 1000);
        for (std::size_t i = 0; i < conns_.size(); ++i) conns_[i]->service(now);
        std::erase_if(orphans_, [](const std::unique_ptr<CmId>& id) { return id->impl().finished(); });
    }
    stack_->flush_tx();
    // Nothing came in and nothing went out: time the port may spend getting ready for the next frame (a memif
    // server takes the client's next buffers for writing: io::Port::idle).
    if (frames == 0 && stack_->counters().tx_frames == sent) port_->idle();
    return frames;
}

void Engine::pump_tx() noexcept {
    // Every QP with work, once. A QP that stays blocked schedules itself again.
    const std::size_t n = tx_list_.size();
    for (std::size_t i = 0; i < n; ++i) {
        Qp* qp = tx_list_[i];
        if (qp == nullptr) continue;  // destroyed while listed
        qp->in_tx_list = false;
        qp->tx_pump();
    }
    tx_list_.erase(tx_list_.begin(), tx_list_.begin() + static_cast<std::ptrdiff_t>(n));
}

void Engine::flush() noexcept {
    pump_tx();
    stack_->flush_tx();
}

bool Engine::run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    Idler idle(cfg_.idle);
    for (;;) {
        if (done()) return true;
        if (std::chrono::steady_clock::now() >= deadline) return false;
        idle.after(poll() != 0);
    }
}

bool Engine::prepare_sleep() noexcept {
    if (!rx_) return false;
    // Stretch ACKs still held for more segments go now: asleep, nothing would send them.
    stack_->send_owed_acks();
    stack_->flush_tx();
    want_wake_.store(true, std::memory_order_seq_cst);
    // After raising the flag: anything already handed over (or queued as a CM event, or TCP work due) means no
    // sleep. What the RX thread hands over from now on wakes us.
    if (rx_->pending() || !doorbell_->empty() || !events_.empty() || !tx_list_.empty() || cm_work_) {
        want_wake_.store(false, std::memory_order_relaxed);
        return false;
    }
    slept_ = true;
    return true;
}

// ---- CM -----------------------------------------------------------------------------------------------------

void Engine::add_conn(Conn* c) { conns_.push_back(c); }

void Engine::remove_conn(Conn* c) noexcept { std::erase(conns_, c); }

void Engine::add_listener(Listener* l) { listeners_.push_back(l); }

void Engine::remove_listener(Listener* l) noexcept { std::erase(listeners_, l); }

void Engine::adopt(std::unique_ptr<CmId> orphan) { orphans_.push_back(std::move(orphan)); }

std::unique_ptr<CmId> Engine::release_orphan(const Conn* c) {
    const auto it = std::find_if(orphans_.begin(), orphans_.end(),
                                 [c](const std::unique_ptr<CmId>& p) { return &p->impl() == c; });
    if (it == orphans_.end()) return nullptr;
    std::unique_ptr<CmId> id = std::move(*it);
    orphans_.erase(it);
    return id;
}

void Engine::push_event(CmEvent ev) {
    if (closed_) return;  // nobody reads them any more (and a request's id must not hold the engine)
    events_.push_back(std::move(ev));
    signal_fd(cm_efd_);
}

void Engine::drop_events(const CmId* id) noexcept {
    std::erase_if(events_, [id](const CmEvent& e) { return e.id == id && !e.request; });
    if (events_.empty()) drain_fd(cm_efd_);
}

void Engine::forget_listener(const CmListener* l) noexcept {
    for (auto& o : orphans_) o->impl().forget_listener(l);
    for (auto& ev : events_) {
        if (ev.listener == l) ev.listener = nullptr;
        if (ev.request) ev.request->impl().forget_listener(l);
    }
}

std::optional<CmEvent> Engine::get_cm_event() {
    if (events_.empty()) return std::nullopt;
    CmEvent e = std::move(events_.front());
    events_.pop_front();
    if (events_.empty()) drain_fd(cm_efd_);
    return e;
}

// ---- limits on what a host may hold (SecurityConfig; README "Security") ---------------------------------------

Engine::PeerRecord& Engine::peer_record(std::uint32_t ip_be) {
    // Hosts with nothing pending and no error in the window are forgotten once the book grows; its size is
    // bounded by the hosts that hold pending connections (at most max_pending) plus those under penalty.
    if (peers_.size() > 4096) {
        const auto now = std::chrono::steady_clock::now();
        std::erase_if(peers_, [&](const auto& kv) {
            return kv.second.pending == 0 && now - kv.second.window_start >= cfg_.security.access_error_window;
        });
    }
    return peers_[ip_be];
}

// A stream of this host drew a TERMINATE for a failed access to our memory: one more in its window.
void Engine::note_access_error(std::uint32_t ip_be) {
    if (cfg_.security.max_access_errors_per_peer == 0) return;
    PeerRecord& r = peer_record(ip_be);
    const auto now = std::chrono::steady_clock::now();
    if (r.errors == 0 || now - r.window_start >= cfg_.security.access_error_window) {
        r.errors = 0;
        r.window_start = now;
    }
    if (++r.errors == cfg_.security.max_access_errors_per_peer)
        log::warn("{} caused {} access errors within {} s: its new connections are refused for that long",
                     stack::Ipv4{ip_be}.str(), r.errors, cfg_.security.access_error_window.count());
}

void Engine::pending_done(std::uint32_t ip_be) noexcept {
    if (auto it = peers_.find(ip_be); it != peers_.end() && it->second.pending > 0) --it->second.pending;
    if (pending_total_ > 0) --pending_total_;
}

void Engine::new_request(CmListener& l, std::unique_ptr<stack::TcpConnection> conn) {
    const SecurityConfig& sec = cfg_.security;
    const std::uint32_t ip = conn->flow_info().remote_ip_be;
    const auto now = std::chrono::steady_clock::now();
    PeerRecord& rec = peer_record(ip);
    // A host that keeps failing accesses to our memory (guessing STags) gets no new connection for a while.
    const bool penalized = sec.max_access_errors_per_peer != 0 && rec.errors >= sec.max_access_errors_per_peer &&
                           now - rec.window_start < sec.access_error_window;
    if (penalized || (sec.max_pending_per_peer != 0 && rec.pending >= sec.max_pending_per_peer)) {
        const stack::TcpConnection::FlowInfo fi = conn->flow_info();
        log::debug("connection from {}:{} reset at accept ({})", stack::Ipv4{fi.remote_ip_be}.str(),
                      fi.remote_port, penalized ? "too many access errors" : "too many pending connections from it");
        ++refused_connections_;
        conn->abort();
        return;
    }
    if (sec.max_pending != 0 && pending_total_ >= sec.max_pending) {
        // Full: the oldest connection still in MPA setup makes room (a request the application holds is its
        // own to answer); none: the newcomer is refused.
        const auto oldest = std::find_if(orphans_.begin(), orphans_.end(),
                                         [](const std::unique_ptr<CmId>& o) { return o->impl().evictable(); });
        ++refused_connections_;
        if (oldest == orphans_.end()) {
            conn->abort();
            return;
        }
        (*oldest)->impl().evict();
    }
    auto id = std::make_unique<CmId>(std::make_unique<Conn>(*this, l, l.impl().defaults(), std::move(conn)));
    ++peer_record(ip).pending;
    ++pending_total_;
    adopt(std::move(id));
}

// ---- statistics ---------------------------------------------------------------------------------------------

std::optional<threading::RxCounters> Engine::rx_thread_counters() const noexcept {
    if (!rx_) return std::nullopt;
    return rx_->counters();
}

RxCopyStats Engine::rx_copy_stats() const noexcept {
    const std::uint64_t placed = placed_bytes_.load(std::memory_order_relaxed);
    RxCopyStats s{.payload_bytes = placed, .copied_bytes = placed};
    if (rx_) s.copied_bytes += rx_->counters().tcp_payload_copied;
    return s;
}

TxCopyStats Engine::tx_copy_stats() const noexcept {
    const StackCounters& c = stack_->counters();
    // The gather copy moves each framed payload byte once, but for those framed without it (sent from their source:
    // stack::FillBook), which count only if they were copied into their chunk later; lwIP's and the frame's copies
    // are counted as made.
    const std::uint64_t gathered = framed_bytes_ - std::min(framed_bytes_, c.tx_fill_deferred) + c.tx_fill_copied;
    return TxCopyStats{.payload_bytes = framed_bytes_, .copied_bytes = gathered + c.tx_copied_in + c.tx_copied_out};
}

LayerCycles Engine::layer_cycles() const noexcept {
    const stack::StackCycles& st = stack_->cycles();
    LayerCycles l;
    l.cycles_per_ns = static_cast<double>(rte_get_tsc_hz()) / 1e9;
    l.io = st.io;
    // Receive callbacks (the protocol's RX) run inside the stack's poll, or inside the drain of what the RX
    // thread handed over: what is left of both is lwIP's.
    const std::uint64_t stack_total = st.total + prof_.rx_drain;
    const std::uint64_t stack_rest = stack_total - std::min(stack_total, st.io + prof_.proto_rx);
    l.lwip = stack_rest + prof_.lwip_tx;
    l.mpa = (prof_.proto_rx - std::min(prof_.proto_rx, prof_.ep_rx)) + prof_.framer;
    l.ddp_rdmap = prof_.ep_rx + (prof_.proto_tx - std::min(prof_.proto_tx, prof_.framer));
    const std::uint64_t inner = stack_total + prof_.proto_tx + prof_.lwip_tx;
    l.verbs = (prof_.poll - std::min(prof_.poll, inner)) + prof_.api;
    if (rx_) {
        const threading::RxCounters c = rx_->counters();
        l.rx_io = c.cycles_io;
        l.rx_place = c.cycles_place;
        l.rx_forward = c.cycles_forward;
    }
    return l;
}

}  // namespace softrdma::verbs::detail

// ==== the handles =============================================================================================

namespace softrdma::verbs {

LayerCycles LayerCycles::since(const LayerCycles& e) const noexcept {
    LayerCycles d = *this;
    d.io -= e.io;
    d.lwip -= e.lwip;
    d.mpa -= e.mpa;
    d.ddp_rdmap -= e.ddp_rdmap;
    d.verbs -= e.verbs;
    d.rx_io -= e.rx_io;
    d.rx_place -= e.rx_place;
    d.rx_forward -= e.rx_forward;
    return d;
}

std::string LayerCycles::table(std::uint64_t messages) const {
    const double n = static_cast<double>(std::max<std::uint64_t>(messages, 1));
    std::string out = "layer        cycles/msg    ns/msg   share\n";
    // One block of rows, each with its share of the block's last row (its total).
    auto block = [&](std::initializer_list<std::pair<const char*, std::uint64_t>> rows) {
        const double all = static_cast<double>(std::max<std::uint64_t>(std::data(rows)[rows.size() - 1].second, 1));
        for (const auto& [name, c] : rows) {
            char line[96];
            std::snprintf(line, sizeof line, "%-10s %12.0f %9.1f %6.1f%%\n", name, static_cast<double>(c) / n,
                          static_cast<double>(c) / n / cycles_per_ns, 100.0 * static_cast<double>(c) / all);
            out += line;
        }
    };
    block({{"io", io}, {"lwip", lwip}, {"mpa+crc", mpa}, {"ddp/rdmap", ddp_rdmap}, {"verbs", verbs}, {"total", total()}});
    if (rx_total() == 0) return out;
    out += "RX thread (apart from the total above)\n";
    block({{"rx io", rx_io}, {"rx place", rx_place}, {"rx forward", rx_forward}, {"rx total", rx_total()}});
    return out;
}

namespace {
// One Context per process: it owns the process's DPDK environment, which cannot start twice.
enum : int { kNoContext, kContextOpen, kContextClosed };
std::atomic<int> g_context{kNoContext};
}  // namespace

std::unique_ptr<Context> Context::open(const ContextConfig& cfg) { return std::make_unique<Context>(cfg); }

Context::Context(const ContextConfig& cfg) {
    int state = kNoContext;
    if (!g_context.compare_exchange_strong(state, kContextOpen))
        throw Error(state == kContextOpen
                        ? "a second Context in this process: softrdma runs one Context per process (it owns the "
                          "process's DPDK port and TCP/IP stack); share the one you have (it serves any number of "
                          "PDs, QPs and connections)"
                        : "this process already had a Context: DPDK's environment cannot start twice in one "
                          "process, so a Context cannot be opened again after one was closed; open it once and "
                          "keep it, or use a process per Context");
    // A failed open leaves the calling thread as it found it (DPDK or app_core may have pinned it by then).
    cpu_set_t affinity;
    CPU_ZERO(&affinity);
    const bool saved = pthread_getaffinity_np(pthread_self(), sizeof affinity, &affinity) == 0;
    try {
        impl_ = std::make_shared<detail::Engine>(cfg);
    } catch (...) {
        if (saved) pthread_setaffinity_np(pthread_self(), sizeof affinity, &affinity);
        g_context = io::eal_started() ? kContextClosed : kNoContext;
        throw;
    }
}

Context::~Context() {
    impl_->close();  // what the application still holds keeps the engine (closed) alive: see engine.hpp
    impl_.reset();
    g_context = kContextClosed;
}

std::unique_ptr<ProtectionDomain> Context::alloc_pd() {
    return std::make_unique<ProtectionDomain>(impl_, impl_->new_pd_handle());
}

std::unique_ptr<CompletionQueue> Context::create_cq(std::uint32_t cqe) {
    if (cqe == 0) throw Error("create_cq: cqe must be > 0");
    return std::make_unique<CompletionQueue>(std::make_shared<detail::Cq>(cqe, impl_->stack().fill_book()));
}

unsigned Context::poll() noexcept { return impl_->poll(); }
void Context::flush() noexcept { impl_->flush(); }
bool Context::run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    return impl_->run_until(done, timeout);
}
std::optional<CmEvent> Context::get_cm_event() { return impl_->get_cm_event(); }
bool Context::has_cm_event() const noexcept { return impl_->has_events(); }
int Context::cm_fd() const noexcept { return impl_->cm_fd(); }
bool Context::prepare_sleep() noexcept { return impl_->prepare_sleep(); }
int Context::wake_fd() const noexcept { return impl_->wake_fd(); }
std::optional<AsyncEvent> Context::get_async_event() noexcept { return impl_->get_async_event(); }
std::uint64_t Context::async_dropped() const noexcept { return impl_->async_dropped(); }

std::optional<CmEvent> Context::wait_cm_event(std::chrono::milliseconds timeout) {
    impl_->run_until([this] { return impl_->has_events(); }, timeout);
    return impl_->get_cm_event();
}

bool Context::drain(std::chrono::milliseconds timeout) {
    return impl_->run_until([this] { return impl_->stack().active_pcbs() == 0; }, timeout);
}

namespace diagnostics {
PortCounters port(const Context& ctx) noexcept { return ctx.impl().port().counters(); }
StackCounters stack(const Context& ctx) noexcept { return ctx.impl().stack().counters(); }
std::optional<RxThreadCounters> rx_thread(const Context& ctx) noexcept { return ctx.impl().rx_thread_counters(); }
RxCopyStats rx_copies(const Context& ctx) noexcept { return ctx.impl().rx_copy_stats(); }
TxCopyStats tx_copies(const Context& ctx) noexcept { return ctx.impl().tx_copy_stats(); }
LayerCycles layer_cycles(const Context& ctx) noexcept { return ctx.impl().layer_cycles(); }
unsigned tcp_connections(const Context& ctx) noexcept { return ctx.impl().stack().active_pcbs(); }
bool memif_zero_copy(const Context& ctx) noexcept { return ctx.impl().port().memif_zero_copy(); }
}  // namespace diagnostics

ThreadingMode Context::threading_mode() const noexcept { return impl_->config().threading.mode; }
std::uint64_t Context::refused_connections() const noexcept { return impl_->refused_connections(); }

}  // namespace softrdma::verbs
