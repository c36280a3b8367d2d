// SPDX-License-Identifier: MIT
#include "threading/rx_thread.hpp"

#include <pthread.h>
#include <unistd.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <rte_lcore.h>
#include <rte_mempool.h>

#include "base/cycles.hpp"
#include "base/idle.hpp"
#include "base/tsan.hpp"
#include "stack/frame.hpp"

namespace softrdma::threading {

void pin_this_thread(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (core >= CPU_SETSIZE) throw std::system_error(EINVAL, std::generic_category(), "threading: no core " + std::to_string(core));
    if (core >= 0) {
        CPU_SET(static_cast<unsigned>(core), &set);
    } else {
        const unsigned n = std::max(1u, std::thread::hardware_concurrency());
        for (unsigned c = 0; c < n && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
    }
    if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0)
        throw std::system_error(rc, std::generic_category(),
                                "threading: cannot pin a thread to core " + std::to_string(core));
}

namespace {

// Slot size: the port's largest single-mbuf frame, rounded up to a cache line so slots do not share lines.
std::uint32_t slot_bytes(const io::Port& port) { return (port.mbuf_data_room() + 63u) & ~63u; }

unsigned index_capacity(unsigned flows) {
    unsigned c = 16;
    while (c < 2 * flows) c *= 2;
    return c;
}

}  // namespace

RxThread::RxThread(io::Port& port, const ThreadingConfig& cfg, unsigned max_flows, bool verify_tcp_checksums)
    : port_(port),
      cfg_(cfg),
      slot_size_(slot_bytes(port)),
      nslots_(std::max(64u, cfg.rx_slots)),
      large_size_(port.large_frames() ? (io::Port::kLargeRxFrame + 63u) & ~63u : 0),
      nlarge_(port.large_frames() ? kLargeSlots : 0),
      ooo_cap_(port.large_frames() ? kOooLarge : kOooTotal),
      max_flows_(std::clamp(max_flows, 1u, 65535u)),
      verify_tcp_(verify_tcp_checksums),
      mem_(new std::byte[std::size_t{nslots_} * slot_size_]),
      large_mem_(nlarge_ != 0 ? new std::byte[std::size_t{nlarge_} * large_size_] : nullptr),
      ring_(nslots_ + nlarge_ + max_flows_),
      free_(nslots_),
      large_free_(std::max(1u, nlarge_)),
      cmd_(4 * max_flows_),
      flows_(max_flows_),
      index_(index_capacity(max_flows_), 0),
      linear_(new std::byte[slot_size_]) {
    // Borrowed frames must be freed on the thread that receives them, and this thread keeps frames across a
    // handover (a held frame holds the memif client's ring): the port must copy (the engine sees to it).
    if (port.borrowing())
        throw std::invalid_argument("RxThread: the port borrows received frames (PortConfig::memif_borrow_rx); "
                                    "an RX thread needs it off");
    for (std::uint32_t s = 0; s < nslots_; ++s) free_.push(s);
    for (std::uint32_t s = 0; s < nlarge_; ++s) large_free_.push(nslots_ + s);
    // The thread pins itself (an std::thread inherits its creator's affinity, which DPDK's EAL set to the
    // application's lcore); a failure ends it before it polls, so wait for the answer here.
    std::atomic<int> pinned{0};  // 0 pending, 1 ok, -1 failed
    thread_ = std::thread([this, &pinned] {
        try {
            pin_this_thread(cfg_.rx_core);
        } catch (...) {
            pinned.store(-1, std::memory_order_release);
            return;
        }
        // An lcore id of its own gives the thread per-lcore mempool caches: the mbufs memif allocates for
        // received frames and the ones this thread frees stay a small, hot LIFO set instead of going through
        // the pools' shared rings each time (as for an unregistered thread). The ports' pools are sized for one
        // cache more than the EAL's lcores for this (io/port.cpp). Registered after pinning: DPDK records the
        // affinity it finds.
        if (rte_thread_register() == 0 && rte_lcore_id() != LCORE_ID_ANY)
            lcore_.store(static_cast<std::int32_t>(rte_lcore_id()), std::memory_order_relaxed);
        pinned.store(1, std::memory_order_release);  // last touch of `pinned`: it lives on the creator's stack
        run();
        if (lcore_.load(std::memory_order_relaxed) >= 0) {
            // What this thread's caches hold goes back to the pools (the port may close next, and the lcore id
            // may go to another thread), then the id is released. Every pool: the mbufs freed here come from the
            // sender's pool where the driver passes them on (net_ring).
            rte_mempool_walk([](rte_mempool* mp, void*) {
                if (rte_mempool_cache* c = rte_mempool_default_cache(mp, rte_lcore_id()); c != nullptr)
                    rte_mempool_cache_flush(c, mp);
            }, nullptr);
            rte_thread_unregister();
        }
    });
    while (pinned.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    if (pinned.load(std::memory_order_acquire) < 0) {
        thread_.join();
        throw std::system_error(EINVAL, std::generic_category(),
                                "threading: cannot pin the RX thread to core " + std::to_string(cfg.rx_core));
    }
}

RxThread::~RxThread() {
    stop();
    Desc d;
    while (ring_.pop(d)) {  // frames nobody will take
    }
}

void RxThread::stop() noexcept {
    stop_.store(true, std::memory_order_release);
    if (!thread_.joinable()) return;
    thread_.join();
    for (Flow& f : flows_) {  // held frames are ours (the RX thread's, and it is gone)
        for (unsigned i = 0; i < f.nheld; ++i) rte_pktmbuf_free(f.held[i]);
        f.nheld = 0;
    }
    held_.store(0, std::memory_order_relaxed);
}

RxCounters RxThread::counters() const noexcept {
    constexpr auto r = std::memory_order_relaxed;
    return RxCounters{frames_.load(r), bytes_copied_.load(r), tcp_copied_.load(r), tcp_placed_.load(r),
                      dropped_.load(r), ooo_.load(r), stalled_.load(r), held_.load(r), lcore_.load(r),
                      cyc_io_.load(r), cyc_place_.load(r), cyc_forward_.load(r)};
}

// ---- commands (application thread) ---------------------------------------------------------------------------

bool RxThread::push_cmd(const Cmd& c) noexcept {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!cmd_.push(c)) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::yield();
    }
    return true;
}

bool RxThread::watch(std::uint16_t flow, std::uint64_t key, std::uint32_t rcv_nxt) noexcept {
    return flow < max_flows_ && push_cmd(Cmd{.op = Cmd::Op::watch, .flow = flow, .seq = rcv_nxt, .key = key});
}
bool RxThread::handover(std::uint16_t flow, FlowSink* sink) noexcept {
    return flow < max_flows_ && push_cmd(Cmd{.op = Cmd::Op::handover, .flow = flow, .sink = sink});
}
bool RxThread::go(std::uint16_t flow) noexcept {
    return flow < max_flows_ && push_cmd(Cmd{.op = Cmd::Op::go, .flow = flow});
}
bool RxThread::remove(std::uint16_t flow, std::atomic<bool>& done) noexcept {
    if (!thread_.joinable() || stop_.load(std::memory_order_acquire)) {
        done.store(true, std::memory_order_release);  // no RX thread: nothing can touch the sink
        return true;
    }
    return flow < max_flows_ && push_cmd(Cmd{.op = Cmd::Op::remove, .flow = flow, .done = &done});
}

bool RxThread::quiesce() const noexcept {
    if (!thread_.joinable() || stop_.load(std::memory_order_acquire)) return true;
    const std::uint64_t e0 = epoch_.load(std::memory_order_acquire);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (epoch_.load(std::memory_order_acquire) < e0 + 2) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::yield();
    }
    return true;
}

// ---- RX thread -----------------------------------------------------------------------------------------------

RxThread::Flow* RxThread::find(std::uint64_t key, std::uint16_t* id) noexcept {
    const std::size_t mask = index_.size() - 1;
    for (std::size_t i = (key * 0x9E3779B97F4A7C15ull) >> 40 & mask;; i = (i + 1) & mask) {
        const std::uint32_t e = index_[i];
        if (e == 0) return nullptr;
        if (flows_[e - 1].key == key) {
            *id = static_cast<std::uint16_t>(e - 1);
            return &flows_[e - 1];
        }
    }
}

void RxThread::index_insert(std::uint64_t key, std::uint16_t id) noexcept {
    const std::size_t mask = index_.size() - 1;
    std::size_t i = (key * 0x9E3779B97F4A7C15ull) >> 40 & mask;
    while (index_[i] != 0 && flows_[index_[i] - 1].key != key) i = (i + 1) & mask;  // >= half empty: ends
    index_[i] = id + 1u;
}

// Linear probing delete by backward shift: entries after the hole move back if their home slot allows.
void RxThread::index_erase(std::uint64_t key) noexcept {
    const std::size_t mask = index_.size() - 1;
    std::size_t i = (key * 0x9E3779B97F4A7C15ull) >> 40 & mask;
    while (index_[i] != 0 && flows_[index_[i] - 1].key != key) i = (i + 1) & mask;
    if (index_[i] == 0) return;
    index_[i] = 0;
    for (std::size_t j = (i + 1) & mask; index_[j] != 0; j = (j + 1) & mask) {
        const std::size_t home = (flows_[index_[j] - 1].key * 0x9E3779B97F4A7C15ull) >> 40 & mask;
        // Move j into the hole i unless its home lies cyclically in (i, j].
        const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            index_[i] = index_[j];
            index_[j] = 0;
            i = j;
        }
    }
}

void RxThread::do_commands() noexcept {
    Cmd c;
    while (cmd_.pop(c)) {
        Flow& f = flows_[c.flow];
        switch (c.op) {
        case Cmd::Op::watch:
            if (f.state != Flow::State::unused) index_erase(f.key);
            f.state = Flow::State::forward;
            f.key = c.key;
            f.rcv_nxt = c.seq;
            f.sink = nullptr;
            index_insert(c.key, c.flow);
            break;
        case Cmd::Op::handover:
            if (f.state != Flow::State::forward) break;
            f.state = Flow::State::hold;
            f.sink = c.sink;
            ring_.push(Desc{.flow = c.flow, .kind = Kind::marker});  // room: one marker per flow is reserved
            break;
        case Cmd::Op::go: {
            if (f.state != Flow::State::hold) break;
            f.state = Flow::State::place;
            const unsigned n = f.nheld;
            f.nheld = 0;
            sub(held_, n);
            for (unsigned i = 0; i < n; ++i) process(f.held[i]);  // in arrival order, now placed
            break;
        }
        case Cmd::Op::remove:
            if (f.state == Flow::State::place) ooo_held_ -= f.nheld;
            for (unsigned i = 0; i < f.nheld; ++i) rte_pktmbuf_free(f.held[i]);  // held: ours, never acknowledged
            sub(held_, f.nheld);
            f.nheld = 0;
            if (f.state != Flow::State::unused) index_erase(f.key);
            f = Flow{};
            c.done->store(true, std::memory_order_release);
            break;
        }
    }
}

// A whole frame into a slot (a large slot if it is larger than a small one). Ownership: `m` stays the caller's;
// the slot goes to the frame ring.
void RxThread::forward_copy(const rte_mbuf* m, std::uint32_t tcp_payload) noexcept {
    std::uint32_t slot = 0;
    const bool fits = m->pkt_len <= slot_size_ ? free_.pop(slot) : m->pkt_len <= large_size_ && large_free_.pop(slot);
    if (!fits) {
        add(dropped_, 1);
        return;
    }
    std::byte* dst = slot_data(slot);
    std::uint32_t off = 0;
    for (const rte_mbuf* seg = m; seg != nullptr; seg = seg->next) {
        std::memcpy(dst + off, rte_pktmbuf_mtod(seg, const void*), seg->data_len);
        off += seg->data_len;
    }
    ring_.push(Desc{.slot = slot, .len = off});  // never full: room for every slot
    add(frames_, 1);
    add(bytes_copied_, off);
    add(tcp_copied_, tcp_payload);
}

// A frame's headers into a slot: its payload was placed (headers) or dropped (gap: the IP length is cut to
// the headers and its checksum redone, so lwIP sees a segment without payload).
void RxThread::forward_headers(const std::byte* frame, std::uint32_t hdr_len, std::uint32_t payload_len, Kind kind,
                               std::uint16_t flow) noexcept {
    std::uint32_t slot = 0;
    if (!free_.pop(slot)) {  // callers checked; a drop here would be a bug, not a TCP matter
        add(dropped_, 1);
        return;
    }
    std::byte* dst = slot_data(slot);
    std::memcpy(dst, frame, hdr_len);
    if (kind == Kind::gap) {
        stack::cut_payload(dst, hdr_len);
        payload_len = 0;
    }
    ring_.push(Desc{.slot = slot, .len = hdr_len, .payload_len = payload_len, .flow = flow, .kind = kind});
    add(frames_, 1);
    add(bytes_copied_, hdr_len);
}

// One received frame. Ownership: `m` is the RX thread's; it is freed here, or held by its flow (hold state)
// until go()/remove().
void RxThread::process(rte_mbuf* m) noexcept {
    const std::byte* f = rte_pktmbuf_mtod(m, const std::byte*);
    const std::uint32_t flen = m->pkt_len;
    if (m->nb_segs > 1) {  // chained (a jumbo frame in small mbufs): make it contiguous first
        if (flen > slot_size_) {
            add(dropped_, 1);
            rte_pktmbuf_free(m);
            return;
        }
        std::uint32_t off = 0;
        for (const rte_mbuf* seg = m; seg != nullptr; seg = seg->next) {
            std::memcpy(linear_.get() + off, rte_pktmbuf_mtod(seg, const void*), seg->data_len);
            off += seg->data_len;
        }
        f = linear_.get();
    }
    const stack::TcpFrame v = stack::parse_tcp_frame(f, flen);  // the stack's one parser
    if (!v.valid) {
        forward_copy(m, 0);  // ARP, ICMP, fragments: lwIP checks them
        rte_pktmbuf_free(m);
        return;
    }
    // lwIP does not check TCP checksums in this mode (payload it counts may never reach it): we do. It does
    // check IP header checksums, so we must too: a segment placed here that lwIP then dropped would put the
    // two out of step (seen with corrupted TTL bits: the TCP checksum does not cover them).
    if (!stack::ip_checksum_ok(f, v) || (verify_tcp_ && !stack::tcp_checksum_ok(f, v))) {
        add(dropped_, 1);
        rte_pktmbuf_free(m);
        return;
    }
    std::uint16_t id = 0;
    Flow* fl = find(flow_key(v.src_ip_be, v.src_port, v.dst_port), &id);
    if (fl == nullptr || v.payload_len == 0) {
        forward_copy(m, v.payload_len);
        rte_pktmbuf_free(m);
        return;
    }
    const std::uint32_t end = v.seq + v.payload_len;
    switch (fl->state) {
    case Flow::State::unused: break;  // not in the index
    case Flow::State::forward:
        if (stack::seq_after(v.seq, fl->rcv_nxt)) {  // after a gap: lwIP must not queue it (see the header comment)
            add(ooo_, 1);
            forward_headers(f, v.hdr_len, 0, Kind::gap, id);
        } else {
            if (stack::seq_after(end, fl->rcv_nxt)) fl->rcv_nxt = end;
            forward_copy(m, v.payload_len);
        }
        break;
    case Flow::State::hold:
        if (fl->nheld < kHeld) {
            fl->held[fl->nheld++] = m;  // ownership: the flow's, until go() or remove()
            add(held_, 1);
            return;
        }
        add(dropped_, 1);  // never acknowledged: the peer resends it
        break;
    case Flow::State::place:
        if (stack::seq_after(v.seq, fl->rcv_nxt)) {
            add(ooo_, 1);
            forward_headers(f, v.hdr_len, 0, Kind::gap, id);  // lwIP sees no payload and answers a duplicate ACK
            if (m->nb_segs == 1 && fl->nheld < kHeld && ooo_held_ < ooo_cap_) {
                fl->held[fl->nheld++] = m;  // ownership: the flow's, until placed (place_held) or remove()
                ++ooo_held_;
                add(held_, 1);
                return;
            }
        } else if (free_.read_available() == 0) {
            add(dropped_, 1);  // no slot for the headers: place nothing, so lwIP and we stay in step
        } else {
            if (stack::seq_after(end, fl->rcv_nxt)) {  // new bytes from rcv_nxt on (a resent segment may overlap)
                const std::uint32_t skip = fl->rcv_nxt - v.seq;
                const std::uint64_t t0 = counting_ ? cycles_now() : 0;
                fl->sink->rx_payload(std::span<const std::byte>(f + v.hdr_len + skip, v.payload_len - skip));
                if (counting_) place_cycles_ += cycles_now() - t0;
                add(tcp_placed_, v.payload_len - skip);
                fl->rcv_nxt = end;
            }
            forward_headers(f, v.hdr_len, v.payload_len, Kind::headers, id);
            if (fl->nheld != 0) place_held(*fl, id);
        }
        break;
    }
    rte_pktmbuf_free(m);
}

// Segments kept after a hole (place state) that the hole's filling made in order: placed, their headers
// forwarded (lwIP, which saw them without payload, now takes them in order), freed. Ones wholly before
// rcv_nxt (resent meanwhile) are freed. Stops when no slot is free for headers (they stay; the peer resends).
void RxThread::place_held(Flow& fl, std::uint16_t id) noexcept {
    for (unsigned i = 0; i < fl.nheld;) {
        rte_mbuf* h = fl.held[i];
        const std::byte* hf = rte_pktmbuf_mtod(h, const std::byte*);
        // Checked when it arrived; parsed again, and taken only if still valid: a memif peer's buffer may have
        // been rewritten since (its lengths then still lie inside the mbuf).
        const stack::TcpFrame hv = stack::parse_tcp_frame(hf, h->pkt_len);
        if (!hv.valid) {
            add(dropped_, 1);
            rte_pktmbuf_free(h);
            --ooo_held_;
            sub(held_, 1);
            fl.held[i] = fl.held[--fl.nheld];
            continue;
        }
        if (stack::seq_after(hv.seq, fl.rcv_nxt)) {
            ++i;  // still beyond a hole
            continue;
        }
        const std::uint32_t end = hv.seq + hv.payload_len;
        if (stack::seq_after(end, fl.rcv_nxt)) {
            if (free_.read_available() == 0) return;
            const std::uint32_t skip = fl.rcv_nxt - hv.seq;
            const std::uint64_t t0 = counting_ ? cycles_now() : 0;
            fl.sink->rx_payload(std::span<const std::byte>(hf + hv.hdr_len + skip, hv.payload_len - skip));
            if (counting_) place_cycles_ += cycles_now() - t0;
            add(tcp_placed_, hv.payload_len - skip);
            fl.rcv_nxt = end;
            forward_headers(hf, hv.hdr_len, hv.payload_len, Kind::headers, id);
        }
        rte_pktmbuf_free(h);
        --ooo_held_;
        sub(held_, 1);
        fl.held[i] = fl.held[--fl.nheld];
        i = 0;  // rcv_nxt moved: look at all again
    }
}

// The application thread sleeps (set_wakeup): wake it once. A write per wake-up, never per frame.
void RxThread::wake() noexcept {
    std::atomic<bool>* f = wake_flag_.load(std::memory_order_acquire);
    if (f == nullptr || !f->load(std::memory_order_seq_cst) || !f->exchange(false, std::memory_order_seq_cst)) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
}

void RxThread::run() noexcept {
    constexpr unsigned kBurst = 32;
    rte_mbuf* burst[kBurst];
    Idler idle(cfg_.rx_idle);
    while (!stop_.load(std::memory_order_acquire)) {
        epoch_.store(epoch_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
        do_commands();
        // Poll only as many frames as there are free slots (each takes at most one): when the application
        // holds them all, frames wait in the NIC's ring (beyond it they are dropped there; TCP resends).
        const auto room = static_cast<unsigned>(std::min<std::size_t>(free_.read_available(), kBurst));
        unsigned got = 0;
        if (room == 0) {
            add(stalled_, 1);
        } else {
            counting_ = count_cycles_.load(std::memory_order_relaxed);
            const std::uint64_t t0 = counting_ ? cycles_now() : 0;
            got = port_.rx_burst(std::span<rte_mbuf*>(burst, room));
            const std::uint64_t t1 = counting_ ? cycles_now() : 0;
            // Commands queued before these frames arrived (a handover pushed before our MPA reply went out)
            // must apply to them.
            if (got != 0) do_commands();  // (rx_burst acquired what the sender wrote: base/tsan.hpp)
            place_cycles_ = 0;
            for (unsigned i = 0; i < got; ++i) process(burst[i]);
            if (got != 0) {
                wire_release(port_.pool());  // mbufs freed here go to the application's allocs
                wake();
                if (counting_) {  // only turns that received: an idle poll is waiting, no layer's cost
                    const std::uint64_t t2 = cycles_now();
                    add(cyc_io_, t1 - t0);
                    add(cyc_place_, place_cycles_);
                    add(cyc_forward_, t2 - t1 - std::min(place_cycles_, t2 - t1));
                }
            }
        }
        idle.after(got != 0);
    }
}

}  // namespace softrdma::threading
