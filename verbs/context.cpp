// SPDX-License-Identifier: MIT
// Context (port + stack + MR table + the polling turn), protection domains, memory regions, CQs.
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "stack/tcp.hpp"
#include "threading/rx_thread.hpp"
#include "base/cycles.hpp"

#include <rte_cycles.h>
#include <cstdio>
#include "verbs/verbs.hpp"

namespace softrdma::verbs {

const char* to_string(PostErrc e) noexcept {
    switch (e) {
    case PostErrc::none: return "none";
    case PostErrc::invalid_state: return "invalid QP state";
    case PostErrc::queue_full: return "queue full";
    case PostErrc::too_many_sge: return "too many SGEs";
    case PostErrc::bad_lkey: return "bad lkey or SGE outside its region";
    case PostErrc::bad_length: return "bad length";
    case PostErrc::invalid_opcode: return "invalid opcode";
    case PostErrc::not_agreed: return "RFC 7306 operation (immediate data, atomic) on a connection that did not agree to it";
    }
    return "?";
}

const char* to_string(WcStatus s) noexcept {
    switch (s) {
    case WcStatus::success: return "success";
    case WcStatus::wr_flush_err: return "WR flush error";
    case WcStatus::loc_prot_err: return "local protection error";
    case WcStatus::fatal_err: return "fatal error";
    }
    return "?";
}

const char* to_string(QpState s) noexcept {
    switch (s) {
    case QpState::reset: return "RESET";
    case QpState::init: return "INIT";
    case QpState::rtr: return "RTR";
    case QpState::rts: return "RTS";
    case QpState::sqd: return "SQD";
    case QpState::sqe: return "SQE";
    case QpState::err: return "ERR";
    }
    return "?";
}

const char* to_string(CmEventType t) noexcept {
    switch (t) {
    case CmEventType::connect_request: return "connect request";
    case CmEventType::established: return "established";
    case CmEventType::rejected: return "rejected";
    case CmEventType::unreachable: return "unreachable";
    case CmEventType::disconnected: return "disconnected";
    case CmEventType::error: return "error";
    }
    return "?";
}

// ==== CQ =====================================================================================================

namespace {

int make_eventfd(const char* what) {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) throw Error(std::string(what) + ": eventfd: " + std::strerror(errno));
    return fd;
}
void signal_fd(int fd) noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(fd, &one, sizeof one);  // only fails when the counter is full
}
bool drain_fd(int fd) noexcept {
    std::uint64_t v = 0;
    return ::read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v) && v != 0;
}

}  // namespace

CompletionQueue::CompletionQueue(std::uint32_t cqe) : efd_(make_eventfd("create_cq")), ring_(cqe) {}

CompletionQueue::~CompletionQueue() { ::close(efd_); }

void CompletionQueue::req_notify(bool solicited_only) noexcept { armed_ = solicited_only ? Arm::solicited : Arm::next; }

bool CompletionQueue::get_event() noexcept { return drain_fd(efd_); }

void CompletionQueue::push(const WorkCompletion& wc) noexcept {
    if (count_ == ring_.size()) {
        ++overruns_;
    } else {
        ring_[(head_ + count_) % ring_.size()] = wc;
        ++count_;
    }
    // One syscall per armed event, not per completion (as verbs providers ring the doorbell once per arm).
    if (armed_ == Arm::next ||
        (armed_ == Arm::solicited && ((wc.wc_flags & wc_flags::solicited) != 0 || wc.status != WcStatus::success))) {
        armed_ = Arm::none;
        signal_fd(efd_);
    }
}

std::size_t CompletionQueue::poll(std::span<WorkCompletion> out) noexcept {
    const std::size_t n = std::min(out.size(), count_);
    for (std::size_t i = 0; i < n; ++i) {
        out[i] = ring_[head_];
        head_ = (head_ + 1) % ring_.size();
    }
    count_ -= n;
    return n;
}

// ==== memory regions =========================================================================================

MemoryRegion::~MemoryRegion() {
    Context::MrEntry& e = ctx_.mrs_[index_];
    constexpr auto r = std::memory_order_relaxed;
    e.valid.store(false, r);
    e.in_use.store(false, r);
    e.tag.store(0, r);
    // The RX thread may be placing into this region right now (a check passed just before): wait until it has
    // finished that turn, so the memory is not written after the application frees it.
    if (ctx_.rx_) ctx_.rx_->quiesce();
    e.base.store(nullptr, r);
    e.length.store(0, r);
    ctx_.mr_free_.push_back(index_);
}

void MemoryRegion::invalidate() noexcept { ctx_.mrs_[index_].valid.store(false, std::memory_order_relaxed); }

bool MemoryRegion::valid() const noexcept { return ctx_.mrs_[index_].valid.load(std::memory_order_relaxed); }

std::uint32_t MemoryRegion::rekey(std::uint8_t key) noexcept {
    Context::MrEntry& e = ctx_.mrs_[index_];
    e.key.store(key, std::memory_order_relaxed);
    e.valid.store(true, std::memory_order_relaxed);
    stag_ = (stag_ & ~0xffu) | key;
    return stag_;
}

namespace {
// Random bits for STags: the kernel's CSPRNG (control path only: one call per registration).
std::uint32_t random32() {
    std::uint32_t v = 0;
    if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v))
        throw Error(std::string("reg_mr: getrandom: ") + std::strerror(errno));
    return v;
}
}  // namespace

std::unique_ptr<MemoryRegion> ProtectionDomain::reg_mr(std::span<std::byte> bytes, std::uint32_t access_flags) {
    if (ctx_.mr_free_.empty()) throw Error("reg_mr: MR table full (ContextConfig::max_mr)");
    // RFC 5040: remote write/atomic need local write too (as ibv_reg_mr refuses remote write without it).
    if ((access_flags & (access::remote_write | access::remote_atomic)) != 0 && !(access_flags & access::local_write))
        throw Error("reg_mr: remote write/atomic access requires local write");
    constexpr std::uint32_t remote = access::remote_write | access::remote_read | access::remote_atomic;
    if ((access_flags & access::remote_invalidate) != 0 && (access_flags & remote) == 0)
        throw Error("reg_mr: remote_invalidate needs a remote access right");
    const std::uint32_t rnd = random32();
    const std::uint32_t index = ctx_.mr_free_.back();
    ctx_.mr_free_.pop_back();
    const auto key = static_cast<std::uint8_t>(rnd & 0xffu);
    const std::uint32_t tag = ((rnd >> 8) << ctx_.mr_slot_bits_ | (index + 1)) & 0xffffffu;
    Context::MrEntry& e = ctx_.mrs_[index];
    constexpr auto r = std::memory_order_relaxed;
    e.tag.store(tag, r);
    e.base.store(bytes.data(), r);
    e.length.store(bytes.size(), r);
    e.pd.store(handle_, r);
    e.access.store(access_flags, r);
    e.key.store(key, r);
    e.valid.store(true, r);
    e.in_use.store(true, std::memory_order_release);
    const std::uint32_t stag = tag << 8 | key;
    return std::unique_ptr<MemoryRegion>(new MemoryRegion(ctx_, index, stag, bytes, access_flags));
}

// The entry an STag names: its tag's low bits give the slot, and the whole tag (random bits included) must be
// the entry's; the key is checked by the callers (a stale key reads "invalidated").
Context::MrEntry* Context::mr_entry(std::uint32_t stag) noexcept {
    const std::uint32_t tag = stag >> 8;
    const std::uint32_t slot = tag & ((1u << mr_slot_bits_) - 1);
    if (slot == 0 || slot > cfg_.max_mr) return nullptr;
    MrEntry& e = mrs_[slot - 1];
    if (!e.in_use.load(std::memory_order_acquire) || e.tag.load(std::memory_order_relaxed) != tag) return nullptr;
    return &e;
}

// SEND with Invalidate (either thread): the STag must be valid, keyed, of this PD, and registered for remote
// invalidation (access::remote_invalidate). Anything else is "cannot invalidate", and nothing changes.
rdmap::MemError Context::mr_invalidate(std::uint32_t stag, std::uint32_t pd) noexcept {
    MrEntry* e = mr_entry(stag);
    if (e == nullptr) return rdmap::MemError::invalid_stag;
    constexpr auto r = std::memory_order_relaxed;
    if (e->key.load(r) != (stag & 0xffu) || !e->valid.load(r)) return rdmap::MemError::invalidated;
    if (e->pd.load(r) != pd) return rdmap::MemError::wrong_pd;
    if ((e->access.load(r) & access::remote_invalidate) == 0) return rdmap::MemError::access;
    e->valid.store(false, r);
    return rdmap::MemError::none;
}

rdmap::Mem Context::mr_lookup(std::uint32_t stag, std::uint64_t to, std::size_t len, std::uint32_t pd,
                              std::uint32_t need) noexcept {
    using rdmap::MemError;
    const MrEntry* e = mr_entry(stag);
    if (e == nullptr) return {.err = MemError::invalid_stag};
    constexpr auto r = std::memory_order_relaxed;
    if (e->key.load(r) != (stag & 0xffu) || !e->valid.load(r)) return {.err = MemError::invalidated};
    if (e->pd.load(r) != pd) return {.err = MemError::wrong_pd};
    if ((e->access.load(r) & need) != need) return {.err = MemError::access};
    std::byte* const b = e->base.load(r);
    const std::size_t length = e->length.load(r);
    const auto base = reinterpret_cast<std::uint64_t>(b);
    if (to < base || to - base > length || len > length - (to - base)) return {.err = MemError::bounds};
    return {b + (to - base), len, MemError::none};
}

// ==== context ================================================================================================

std::unique_ptr<Context> Context::open(const ContextConfig& cfg) { return std::unique_ptr<Context>(new Context(cfg)); }

Context::Context(const ContextConfig& cfg) : cfg_(cfg) {
    if (cfg.max_mr == 0 || cfg.max_mr >= (1u << 24)) throw Error("ContextConfig::max_mr must be 1 .. 2^24-1");
    const bool rx_thread = cfg.threading.mode == threading::Mode::rx_thread;
    if (rx_thread && !cfg.port.capture_path.empty())
        throw Error("ContextConfig: a capture file needs run-to-completion mode (RX and TX would share the writer)");
    port_ = io::open_port(cfg.port, cfg.eal);
    if (cfg.threading.app_core >= 0) threading::pin_this_thread(cfg.threading.app_core);
    if (rx_thread && cfg.layer_cycles) throw Error("ContextConfig: layer_cycles needs run-to-completion mode");
    stack::StackConfig scfg = cfg.stack;
    scfg.rx_external = rx_thread;
    scfg.count_cycles = cfg.layer_cycles;
    scfg.tcp_checksums = cfg.tcp_checksums == ContextConfig::Checksums::on ||
                         (cfg.tcp_checksums == ContextConfig::Checksums::automatic &&
                          cfg.port.backend != io::Backend::memif);
    stack_ = std::make_unique<stack::Stack>(*port_, scfg);
    if (rx_thread) {
        if (cfg.max_qp > 65535) throw Error("ContextConfig: the RX thread follows at most 65535 connections (max_qp)");
        flows_.assign(cfg.max_qp, nullptr);
        for (std::uint32_t i = cfg.max_qp; i-- > 0;) flow_free_.push_back(static_cast<std::uint16_t>(i));
        doorbell_ = std::make_unique<boost::lockfree::spsc_queue<std::uint16_t>>(cfg.max_qp);
        rx_ = std::make_unique<threading::RxThread>(*port_, cfg.threading, cfg.max_qp, scfg.tcp_checksums);
    }
    mrs_ = std::make_unique<MrEntry[]>(cfg.max_mr);
    while ((1u << mr_slot_bits_) <= cfg.max_mr) ++mr_slot_bits_;  // slot + 1 fits; max_mr < 2^24 (checked above)
    mr_free_.reserve(cfg.max_mr);
    for (std::uint32_t i = cfg.max_mr; i-- > 0;) mr_free_.push_back(i);
    // Sizing: a QP is listed at most once, but during a TX pass the QPs already taken off may list themselves
    // again behind the ones being served: 2 x max_qp, so push_back never allocates.
    tx_list_.reserve(2 * static_cast<std::size_t>(cfg.max_qp));
    ids_.reserve(cfg.max_qp);
    wake_efd_ = make_eventfd("Context::open");
    cm_efd_ = make_eventfd("Context::open");  // last: nothing after it throws
    if (rx_) rx_->set_wakeup(&want_wake_, wake_efd_);
}

Context::~Context() {
    // Connections still closing (our FIN not yet acknowledged, the peer's not yet answered) need polling to
    // finish; a process that stops polling leaves its peer waiting. Bounded by close_linger.
    if (cfg_.close_linger.count() > 0)
        run_until([this] { return stack_->active_pcbs() == 0; }, cfg_.close_linger);
    if (rx_) rx_->stop();  // then: nothing polls the port while the rest goes
    events_.clear();  // connect requests nobody took: their ids abort their connections here
    orphans_.clear();
    ::close(cm_efd_);
    ::close(wake_efd_);
}

bool Context::prepare_sleep() noexcept {
    if (!rx_) return false;
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

std::unique_ptr<ProtectionDomain> Context::alloc_pd() {
    return std::unique_ptr<ProtectionDomain>(new ProtectionDomain(*this, next_pd_++));
}

std::unique_ptr<CompletionQueue> Context::create_cq(std::uint32_t cqe) {
    if (cqe == 0) throw Error("create_cq: cqe must be > 0");
    return std::unique_ptr<CompletionQueue>(new CompletionQueue(cqe));
}

void Context::schedule_tx(QueuePair* qp) noexcept {
    if (qp->in_tx_list_) return;
    qp->in_tx_list_ = true;
    tx_list_.push_back(qp);  // capacity reserved at open (see the constructor)
}

namespace {
void release_rx_slot(void* rx, std::uint32_t slot) noexcept { static_cast<threading::RxThread*>(rx)->release(slot); }
}  // namespace

int Context::alloc_flow(QueuePair* qp) noexcept {
    if (flow_free_.empty()) return -1;
    const std::uint16_t id = flow_free_.back();
    flow_free_.pop_back();
    flows_[id] = qp;
    return id;
}

void Context::free_flow(int id) noexcept {
    if (id < 0) return;
    flows_[static_cast<std::size_t>(id)] = nullptr;
    flow_free_.push_back(static_cast<std::uint16_t>(id));  // capacity max_qp: reserved by assign at open
}

std::optional<threading::RxCounters> Context::rx_thread_counters() const noexcept {
    if (!rx_) return std::nullopt;
    return rx_->counters();
}

RxCopyStats Context::rx_copy_stats() const noexcept {
    const std::uint64_t placed = placed_bytes_.load(std::memory_order_relaxed);
    RxCopyStats s{.payload_bytes = placed, .copied_bytes = placed};
    if (rx_) s.copied_bytes += rx_->counters().tcp_payload_copied;
    return s;
}

LayerCycles Context::layer_cycles() const noexcept {
    const stack::StackCycles& st = stack_->cycles();
    LayerCycles l;
    l.cycles_per_ns = static_cast<double>(rte_get_tsc_hz()) / 1e9;
    l.io = st.io;
    // Receive callbacks (the protocol's RX) run inside the stack's poll: what is left of it is lwIP's.
    const std::uint64_t stack_rest = st.total - std::min(st.total, st.io + prof_.proto_rx);
    l.lwip = stack_rest + prof_.lwip_tx;
    l.mpa = (prof_.proto_rx - std::min(prof_.proto_rx, prof_.ep_rx)) + prof_.framer;
    l.ddp_rdmap = prof_.ep_rx + (prof_.proto_tx - std::min(prof_.proto_tx, prof_.framer));
    const std::uint64_t inner = st.total + prof_.proto_tx + prof_.lwip_tx;
    l.verbs = (prof_.poll - std::min(prof_.poll, inner)) + prof_.api;
    return l;
}

LayerCycles LayerCycles::since(const LayerCycles& e) const noexcept {
    LayerCycles d = *this;
    d.io -= e.io;
    d.lwip -= e.lwip;
    d.mpa -= e.mpa;
    d.ddp_rdmap -= e.ddp_rdmap;
    d.verbs -= e.verbs;
    return d;
}

std::string LayerCycles::table(std::uint64_t messages) const {
    const double n = static_cast<double>(std::max<std::uint64_t>(messages, 1));
    const double all = static_cast<double>(std::max<std::uint64_t>(total(), 1));
    std::string out = "layer        cycles/msg    ns/msg   share\n";
    const std::pair<const char*, std::uint64_t> rows[] = {
        {"io", io}, {"lwip", lwip}, {"mpa+crc", mpa}, {"ddp/rdmap", ddp_rdmap}, {"verbs", verbs}, {"total", total()}};
    for (const auto& [name, c] : rows) {
        char line[96];
        std::snprintf(line, sizeof line, "%-10s %12.0f %9.1f %6.1f%%\n", name, static_cast<double>(c) / n,
                      static_cast<double>(c) / n / cycles_per_ns, 100.0 * static_cast<double>(c) / all);
        out += line;
    }
    return out;
}

unsigned Context::poll() noexcept {
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

unsigned Context::poll_turn() noexcept {
    unsigned frames = 0;
    if (rx_) {
        if (slept_) {  // awake again: whether the RX thread woke us or epoll timed out
            slept_ = false;
            want_wake_.store(false, std::memory_order_relaxed);
            drain_fd(wake_efd_);
        }
        // Frames the RX thread copied: each slot goes to lwIP without a copy and comes back to the RX thread
        // through release_rx_slot when lwIP frees it. Sizing: 256 per turn bounds the turn's length.
        using Kind = threading::RxThread::Kind;
        frames = rx_->drain(256, [this](const threading::RxThread::Frame& f) {
            switch (f.kind) {
            case Kind::frame: stack_->input_external(f.data, f.len, &release_rx_slot, rx_.get(), f.slot); break;
            case Kind::headers:  // payload already placed by the RX thread: lwIP counts stand-in bytes
                // What placing it produced (completions, a TERMINATE) comes first, in stream order with TCP's
                // view of the same bytes (a FIN right behind a TERMINATE must not overtake it).
                if (QueuePair* qp = flows_[f.flow]; qp != nullptr && qp->rx_events_pending()) qp->drain_rx_events();
                stack_->input_headers(f.data, f.len, f.payload_len, &release_rx_slot, rx_.get(), f.slot);
                break;
            case Kind::gap:  // a segment after a hole, payload dropped: lwIP sees its headers, the peer a dup ACK
                stack_->input_external(f.data, f.len, &release_rx_slot, rx_.get(), f.slot);
                if (QueuePair* qp = flows_[f.flow]) qp->on_gap();
                break;
            case Kind::marker:  // every byte forwarded before the handover has reached the QP: let the RX thread go
                if (QueuePair* qp = flows_[f.flow]) qp->on_marker();
                break;
            }
        });
        // QPs whose receive half produced events (completions, inbound requests, TERMINATEs).
        std::uint16_t id = 0;
        while (doorbell_->pop(id))
            if (QueuePair* qp = flows_[id]) qp->drain_rx_events();
    }
    frames += stack_->poll();  // RX (run to completion): lwIP callbacks -> CmId -> QueuePair::rx_bytes
    // TX: every QP with work, once. A QP that stays blocked schedules itself again.
    const std::size_t n = tx_list_.size();
    for (std::size_t i = 0; i < n; ++i) {
        QueuePair* qp = tx_list_[i];
        if (qp == nullptr) continue;  // destroyed while listed
        qp->in_tx_list_ = false;
        qp->tx_pump();
    }
    tx_list_.erase(tx_list_.begin(), tx_list_.begin() + static_cast<std::ptrdiff_t>(n));
    // CM: pending closes at once, negotiation time limits once per millisecond. The check is one TSC read
    // (a steady_clock read costs ~50 ns on a VM: a quarter of an idle turn).
    if (const std::uint64_t tsc = rte_get_timer_cycles(); cm_work_ || tsc >= next_timer_tsc_) {
        const auto now = mpa::Clock::now();
        cm_work_ = false;
        next_timer_tsc_ = tsc + std::max<std::uint64_t>(1, rte_get_timer_hz() / 1000);
        for (std::size_t i = 0; i < ids_.size(); ++i) ids_[i]->service(now);
        std::erase_if(orphans_, [](const std::unique_ptr<CmId>& id) { return id->phase_ == CmId::Phase::closed && !id->close_pending_; });
    }
    stack_->flush_tx();
    return frames;
}

bool Context::run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    Idler idle(cfg_.idle);
    for (;;) {
        if (done()) return true;
        if (std::chrono::steady_clock::now() >= deadline) return false;
        idle.after(poll() != 0);
    }
}

void Context::push_event(CmEvent ev) {
    events_.push_back(std::move(ev));
    signal_fd(cm_efd_);
}

void Context::drop_events(const CmId* id) noexcept {
    std::erase_if(events_, [id](const CmEvent& e) { return e.id == id && !e.request; });
    if (events_.empty()) drain_fd(cm_efd_);
}

void Context::push_async(const AsyncEvent& e) noexcept {
    if (async_count_ == async_.size()) {
        ++async_dropped_;
        return;
    }
    async_[(async_head_ + async_count_) % async_.size()] = e;
    ++async_count_;
}

std::optional<AsyncEvent> Context::get_async_event() noexcept {
    if (async_count_ == 0) return std::nullopt;
    const AsyncEvent e = async_[async_head_];
    async_head_ = (async_head_ + 1) % async_.size();
    --async_count_;
    return e;
}

std::optional<CmEvent> Context::get_cm_event() {
    if (events_.empty()) return std::nullopt;
    CmEvent e = std::move(events_.front());
    events_.pop_front();
    if (events_.empty()) drain_fd(cm_efd_);
    return e;
}

std::optional<CmEvent> Context::wait_cm_event(std::chrono::milliseconds timeout) {
    run_until([&] { return !events_.empty(); }, timeout);
    return get_cm_event();
}

}  // namespace softrdma::verbs
