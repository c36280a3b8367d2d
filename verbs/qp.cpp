// SPDX-License-Identifier: MIT
// QueuePair: post_send/post_recv, the rdmap::Upper (every memory check of the stream in one place), and the
// stream glue: TCP bytes -> deframer -> endpoint (RX), endpoint -> whole FPDUs -> TCP (TX).
#include <algorithm>
#include <cstring>

#include "mpa/errors.hpp"
#include "base/cycles.hpp"
#include "rdmap/stream.hpp"
#include "stack/tcp.hpp"
#include "verbs/verbs.hpp"

#include <spdlog/spdlog.h>

namespace softrdma::verbs {
namespace {

// READ sink STags name a QP-local sink list (the READ WR's slot), not a region: they are only ever looked up
// with Access::local_write, which RDMAP uses for READ responses to our own requests (it checks the response
// carries the STag of the oldest request), and MR STags only with remote rights: the two spaces may hold the
// same value without meeting.
constexpr std::uint32_t kReadSinkTag = 0xff000000u;
constexpr std::uint32_t kRtrStag = 1;                 // RFC 6581 RTR: STag 1 (Chelsio refuses 0)
constexpr std::uint64_t kRtrWrId = ~std::uint64_t{0};  // the RTR's endpoint wr_id: not a slot, no completion
constexpr std::uint32_t kNoSlot = ~0u;

// The contiguous piece of a scatter list at byte offset `off` (at most `len` bytes); bounds past its end.
// READ sinks and posted receives are both lists of spans checked at post time.
rdmap::Mem scatter_piece(std::span<const std::span<std::byte>> sge, std::uint64_t off, std::size_t len) {
    for (const std::span<std::byte> s : sge) {
        if (off < s.size()) return {s.data() + off, std::min<std::size_t>(len, s.size() - off), rdmap::MemError::none};
        off -= s.size();
    }
    return {.err = rdmap::MemError::bounds};
}

// The slot of a READ sink STag (kReadSinkTag | slot), or kNoSlot.
std::uint32_t read_sink_slot(std::uint32_t stag, std::size_t slots) {
    const std::uint32_t slot = stag & 0x00ffffffu;
    return (stag & 0xff000000u) == kReadSinkTag && slot < slots ? slot : kNoSlot;
}

// The MR right a remote access needs.
std::uint32_t remote_right(rdmap::Access acc) {
    switch (acc) {
    case rdmap::Access::remote_write: return access::remote_write;
    case rdmap::Access::remote_read: return access::remote_read;
    case rdmap::Access::remote_atomic: return access::remote_atomic;
    case rdmap::Access::local_write: break;
    }
    return 0;
}

}  // namespace

// What the receive half tells the QP (RX thread -> application thread, SPSC). Sizing in RxSide.
struct RxEvent {
    enum class Kind : std::uint8_t { recv, request_done, inbound, terminate, first_bytes, srq_limit };
    Kind kind{Kind::recv};
    WorkCompletion wc{};          // recv
    std::uint64_t slot{0};        // request_done: the endpoint wr_id (send slot, or the RTR's)
    bool ok{true};                // request_done: completed (else flushed)
    rdmap::IrqEntry irq{};        // inbound
    TermCode code{};              // terminate
    std::uint32_t raw{0};         // terminate: the control word as on the wire
    TermCode cause{};             // terminate: what we found (sent ones; see TerminateInfo)
    bool received{false};         // terminate: received from the peer (else: to send, bytes below)
    std::uint8_t term_len{0};
    std::array<std::byte, rdmap::kTerminateLen + 2 + rdmap::kMaxHeaderLen> term{};
};

// A READ's sink list (or an atomic's 8-byte result SGE). The memory is the application's, registered and
// checked at post time; it must stay valid until the WR's completion (verbs rule), so the receive half may
// place into it until it reports the request done.
struct SinkList {
    std::array<std::span<std::byte>, rdmap::kMaxSge> sge{};
    std::uint8_t n{0};
    std::span<const std::span<std::byte>> spans() const { return std::span(sge).first(n); }
};

// A READ/atomic request the tx endpoint framed, with its sink list (application -> RX thread, SPSC).
struct OrqMsg {
    rdmap::OrqEntry e{};
    SinkList sink{};
};

// The stream's receive half with an RX thread: the deframer and an rx-role endpoint, fed by the RX thread
// (threading::FlowSink) after the handover and by the QP before it — never both (the handover orders them).
// Its rdmap::Upper answers memory questions from the MR table (atomics) and the QP's RecvQueue (consumer side)
// and turns everything else into RxEvents for the QP. Memory: rings sized at QP creation; deframer and
// endpoint built in start() (control path).
struct QueuePair::RxSide final : rdmap::Upper, threading::FlowSink {
    explicit RxSide(QueuePair& q)
        : qp(q),
          // Sizing rule: every event is bounded by a resource — one per posted receive (the SRQ's depth when
          // shared), one per outbound request (at most max_send_wr + the RTR), one per inbound request (IRD,
          // at most 255 by MPA), and a few singles (terminate, first bytes, limit); doubled for the flushes at
          // detach. A push that still fails is counted in `lost`.
          events(2 * (std::size_t{q.srq_ != nullptr ? q.srq_->max_wr_ : q.cap_.max_recv_wr} + q.cap_.max_send_wr + 1 +
                      256) + 8),
          orq(std::size_t{q.cap_.max_send_wr} + 1),
          sinks(q.sq_.size()) {}

    void start(const mpa::Agreed& agreed, const rdmap::Config& tx_cfg) {
        deframer.emplace(mpa::rx_config(agreed));
        rdmap::Config c = tx_cfg;
        c.role = rdmap::Role::rx;
        ep.emplace(*this, *qp.framer_, c);  // the framer is never used by an rx endpoint
        started = false;
        OrqMsg m;
        while (orq.pop(m)) {
        }
    }

    // threading::FlowSink: in-order stream bytes (RX thread after the handover, the QP before it).
    void rx_payload(std::span<const std::byte> bytes) noexcept override {
        if (!ep) return;
        OrqMsg m;
        while (orq.pop(m)) {  // requests framed before their responses can arrive
            if (m.e.wr_id < sinks.size()) sinks[m.e.wr_id] = m.sink;
            ep->expect_response(m.e);
        }
        if (!started) {
            started = true;
            emit(RxEvent{.kind = RxEvent::Kind::first_bytes});
        }
        const std::uint64_t placed = ep->placed_bytes();
        rdmap::receive(*deframer, *ep, bytes);
        ep->end_of_input();  // one frame's payload is one delivery
        qp.ctx_.placed_bytes_.fetch_add(ep->placed_bytes() - placed, std::memory_order_relaxed);
    }

    // ---- rdmap::Upper (rx role) ----
    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access acc) override {
        using rdmap::MemError;
        if (acc == rdmap::Access::local_write) {  // READ response into our READ WR's sink list (this side's copy)
            const std::uint32_t slot = read_sink_slot(stag, sinks.size());
            if (slot == kNoSlot) return {.err = rdmap::MemError::invalid_stag};
            return scatter_piece(sinks[slot].spans(), to, len);
        }
        return qp.ctx_.mr_lookup(stag, to, len, qp.pd_.handle(), remote_right(acc));
    }
    rdmap::MemError recv_begin(std::uint32_t msn) override {
        bool limit = false;
        const rdmap::MemError e = qp.recv_.begin(msn, limit);
        if (limit) emit(RxEvent{.kind = RxEvent::Kind::srq_limit});
        return e;
    }
    rdmap::Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override {
        return qp.recv_.place(msn, mo, len);
    }
    rdmap::MemError invalidate(std::uint32_t stag) override { return qp.ctx_.mr_invalidate(stag, qp.pd_.handle()); }
    void on_completion(const rdmap::Completion& c) override {
        if (c.kind == rdmap::WcKind::recv) {
            if (qp.recv_.current(c.msn) == nullptr) return;
            emit(RxEvent{.kind = RxEvent::Kind::recv, .wc = qp.recv_.complete(c, qp.qp_num_)});
            return;
        }
        const bool ok = c.status == rdmap::WcStatus::success;
        // The atomic's original value goes into the WR's 8-byte SGE here; the completion event orders it
        // before the application sees the completion.
        if (ok && c.kind == rdmap::WcKind::atomic && c.wr_id < sinks.size() && sinks[c.wr_id].n == 1)
            std::memcpy(sinks[c.wr_id].sge[0].data(), &c.atomic_original, 8);
        emit(RxEvent{.kind = RxEvent::Kind::request_done, .slot = c.wr_id, .ok = ok});
    }
    void on_terminate(const rdmap::TermReport& t) override {
        RxEvent e{.kind = RxEvent::Kind::terminate, .code = t.code, .raw = t.raw, .cause = t.cause, .received = t.received};
        const std::size_t n = std::min(t.frame.size(), e.term.size());
        if (n != 0) std::memcpy(e.term.data(), t.frame.data(), n);  // a received TERMINATE has no frame to send
        e.term_len = static_cast<std::uint8_t>(n);
        emit(e);
    }
    void on_inbound_request(const rdmap::IrqEntry& r) override { emit(RxEvent{.kind = RxEvent::Kind::inbound, .irq = r}); }

    void emit(const RxEvent& e) noexcept {
        if (!events.push(e)) {
            lost.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        // On the RX thread: ring the QP's doorbell once until the QP drains (it clears `rung` first).
        if (on_rx_thread && !rung.exchange(true, std::memory_order_acq_rel))
            qp.ctx_.doorbell_->push(static_cast<std::uint16_t>(qp.flow_));  // never full: one entry per flow
    }

    QueuePair& qp;
    boost::lockfree::spsc_queue<RxEvent> events;  // -> application thread
    boost::lockfree::spsc_queue<OrqMsg> orq;      // <- application thread
    std::vector<SinkList> sinks;  // by send slot: this side's copy of each outstanding request's sinks
    std::optional<mpa::Deframer<rdmap::Endpoint>> deframer;
    std::optional<rdmap::Endpoint> ep;
    bool started{false};
    bool on_rx_thread{false};  // set by the QP before go(): the doorbell is for the RX thread only (SPSC)
    std::atomic<bool> rung{false};
    std::atomic<std::uint64_t> lost{0};
};

std::unique_ptr<QueuePair> ProtectionDomain::create_qp(const QpInitAttr& attr) {
    if (attr.send_cq == nullptr || attr.recv_cq == nullptr) throw Error("create_qp: send_cq and recv_cq needed");
    if (attr.cap.max_send_wr == 0 || (attr.cap.max_recv_wr == 0 && attr.srq == nullptr))
        throw Error("create_qp: zero queue depth");
    if (attr.cap.max_send_wr >= (1u << 24)) throw Error("create_qp: max_send_wr too large");
    if (attr.cap.max_send_sge > rdmap::kMaxSge || attr.cap.max_recv_sge > rdmap::kMaxSge)
        throw Error("create_qp: at most rdmap::kMaxSge SGEs");
    if (ctx_.qp_count_ >= ctx_.cfg_.max_qp) throw Error("create_qp: ContextConfig::max_qp reached");
    if (attr.srq != nullptr && &attr.srq->pd_ != this) throw Error("create_qp: the SRQ belongs to another PD");
    ++ctx_.qp_count_;
    return std::unique_ptr<QueuePair>(new QueuePair(ctx_, *this, attr, ctx_.next_qpn_++));
}

QueuePair::QueuePair(Context& ctx, ProtectionDomain& pd, const QpInitAttr& attr, std::uint32_t qp_num)
    : ctx_(ctx),
      pd_(pd),
      send_cq_(attr.send_cq),
      recv_cq_(attr.recv_cq),
      cap_(attr.cap),
      sig_all_(attr.sq_sig_all),
      qp_num_(qp_num),
      sq_(attr.cap.max_send_wr),
      inline_buf_(static_cast<std::size_t>(attr.cap.max_send_wr) * attr.cap.max_inline_data),
      recv_(attr.srq != nullptr ? 0 : attr.cap.max_recv_wr, attr.srq),
      srq_(attr.srq) {
    for (std::uint32_t i = 0; i < sq_.size(); ++i) sq_[i].next_free = i + 1 < sq_.size() ? i + 1 : kNoSlot;
    sq_free_ = 0;
    if (ctx_.rx_) rxs_ = std::make_unique<RxSide>(*this);
    state_ = QpState::init;  // as rdma_create_qp: ready for post_recv before the connection
}

QueuePair::~QueuePair() {
    closing_ = true;
    detach_rx();  // first: the RX thread lets go of this QP's receive half before anything of it goes
    if (conn_ != nullptr) {
        CmId* c = conn_;
        conn_ = nullptr;
        c->qp_ = nullptr;
        c->abort();
    }
    if (in_tx_list_) std::replace(ctx_.tx_list_.begin(), ctx_.tx_list_.end(), this, static_cast<QueuePair*>(nullptr));
    --ctx_.qp_count_;
}

// ==== posting ================================================================================================

PostErrc QueuePair::check_sge(const Sge& s, bool need_write, std::span<std::byte>& out) const noexcept {
    const rdmap::Mem m = ctx_.mr_lookup(s.lkey, s.addr, s.length, pd_.handle(), need_write ? access::local_write : 0);
    if (m.err != rdmap::MemError::none) return PostErrc::bad_lkey;
    out = {m.ptr, s.length};
    return PostErrc::none;
}

std::uint32_t QueuePair::alloc_slot() noexcept {
    const std::uint32_t s = sq_free_;
    if (s == kNoSlot) return kNoSlot;
    sq_free_ = sq_[s].next_free;
    ++sq_used_;
    return s;
}

void QueuePair::free_slot(std::uint32_t slot) noexcept {
    sq_[slot].next_free = sq_free_;
    sq_free_ = slot;
    --sq_used_;
}

void QueuePair::complete_send(std::uint32_t slot, WcStatus st) noexcept {
    const SqSlot& s = sq_[slot];
    if (st != WcStatus::success || s.signaled)
        send_cq_->push(WorkCompletion{.wr_id = s.wr_id, .status = st, .opcode = s.opcode, .byte_len = s.byte_len,
                                      .qp_num = qp_num_});
    free_slot(slot);
}

PostResult<SendWr> QueuePair::post_send(std::span<const SendWr> wrs) noexcept {
    if (ctx_.cfg_.layer_cycles) {
        const std::uint64_t t0 = cycles_now();
        const PostResult<SendWr> r = post_send_inner(wrs);
        ctx_.prof_.api += cycles_now() - t0;
        return r;
    }
    return post_send_inner(wrs);
}

PostResult<SendWr> QueuePair::post_send_inner(std::span<const SendWr> wrs) noexcept {
    for (const SendWr& wr : wrs) {
        const bool signaled = sig_all_ || (wr.send_flags & send_flags::signaled) != 0;
        WcOpcode wc_op = WcOpcode::send;
        switch (wr.opcode) {
        case WrOpcode::send:
        case WrOpcode::send_with_imm:
        case WrOpcode::send_with_inv: wc_op = WcOpcode::send; break;
        case WrOpcode::rdma_write:
        case WrOpcode::rdma_write_with_imm: wc_op = WcOpcode::rdma_write; break;
        case WrOpcode::rdma_read: wc_op = WcOpcode::rdma_read; break;
        case WrOpcode::atomic_fetch_and_add: wc_op = WcOpcode::fetch_add; break;
        case WrOpcode::atomic_cmp_and_swp: wc_op = WcOpcode::comp_swap; break;
        }
        if (state_ == QpState::err) {  // verbs: a WR posted in ERR completes with a flush error
            send_cq_->push(WorkCompletion{.wr_id = wr.wr_id, .status = WcStatus::wr_flush_err, .opcode = wc_op,
                                          .qp_num = qp_num_});
            continue;
        }
        if (state_ != QpState::rts || !ep_) return {PostErrc::invalid_state, &wr};
        if (wr.sg_list.size() > cap_.max_send_sge) return {PostErrc::too_many_sge, &wr};
        const std::uint32_t slot = alloc_slot();
        if (slot == kNoSlot) return {PostErrc::queue_full, &wr};
        auto refuse = [&](PostErrc e) {  // not posted: the slot goes back, no completion
            free_slot(slot);
            return PostResult<SendWr>{e, &wr};
        };
        SqSlot& s = sq_[slot];
        s.wr_id = wr.wr_id;
        s.opcode = wc_op;
        s.signaled = signaled;
        s.nsink = 0;
        s.byte_len = 0;

        rdmap::WorkRequest w{};
        w.wr_id = slot;
        w.signaled = true;  // every WR completes at the endpoint so its slot comes back; unsignaled ones silently
        w.solicited = (wr.send_flags & send_flags::solicited) != 0;
        std::uint64_t total = 0;
        switch (wr.opcode) {
        case WrOpcode::send:
        case WrOpcode::send_with_imm:
        case WrOpcode::send_with_inv:
        case WrOpcode::rdma_write:
        case WrOpcode::rdma_write_with_imm: {
            const bool is_send = wc_op == WcOpcode::send;
            w.op = is_send ? rdmap::WrOp::send : rdmap::WrOp::write;
            w.with_imm = wr.opcode == WrOpcode::send_with_imm || wr.opcode == WrOpcode::rdma_write_with_imm;
            w.imm = wr.imm_data;
            w.with_inv = wr.opcode == WrOpcode::send_with_inv;
            w.inv_stag = wr.invalidate_rkey;
            w.remote_stag = wr.rdma.rkey;
            w.remote_to = wr.rdma.remote_addr;
            if ((wr.send_flags & send_flags::inline_data) != 0) {
                // Inline: copied now into the slot's buffer; no lkey needed (IBV_SEND_INLINE).
                for (const Sge& g : wr.sg_list) total += g.length;
                if (total > cap_.max_inline_data) return refuse(PostErrc::bad_length);
                std::byte* dst = inline_buf_.data() + static_cast<std::size_t>(slot) * cap_.max_inline_data;
                std::size_t off = 0;
                for (const Sge& g : wr.sg_list) {
                    if (g.length != 0) std::memcpy(dst + off, reinterpret_cast<const void*>(g.addr), g.length);
                    off += g.length;
                }
                if (total != 0) {
                    w.sgl[0] = std::span<const std::byte>(dst, total);
                    w.num_sge = 1;
                }
            } else {
                for (const Sge& g : wr.sg_list) {
                    std::span<std::byte> b;
                    if (const PostErrc e = check_sge(g, false, b); e != PostErrc::none) return refuse(e);
                    w.sgl[w.num_sge++] = b;
                    total += g.length;
                }
            }
            if (total > 0xffffffffu) return refuse(PostErrc::bad_length);
            break;
        }
        case WrOpcode::rdma_read: {
            w.op = rdmap::WrOp::read;
            for (const Sge& g : wr.sg_list) {
                if (const PostErrc e = check_sge(g, true, s.sink[s.nsink]); e != PostErrc::none) return refuse(e);
                ++s.nsink;
                total += g.length;
            }
            if (total > 0xffffffffu) return refuse(PostErrc::bad_length);
            w.local_stag = kReadSinkTag | slot;
            w.local_to = 0;
            w.read_len = static_cast<std::uint32_t>(total);
            w.remote_stag = wr.rdma.rkey;
            w.remote_to = wr.rdma.remote_addr;
            break;
        }
        case WrOpcode::atomic_fetch_and_add:
        case WrOpcode::atomic_cmp_and_swp: {
            if (wr.sg_list.size() != 1 || wr.sg_list[0].length != 8) return refuse(PostErrc::bad_length);
            if (const PostErrc e = check_sge(wr.sg_list[0], true, s.sink[0]); e != PostErrc::none) return refuse(e);
            s.nsink = 1;
            total = 8;
            const bool fa = wr.opcode == WrOpcode::atomic_fetch_and_add;
            w.op = fa ? rdmap::WrOp::fetch_add : rdmap::WrOp::cmp_swap;
            w.remote_stag = wr.atomic.rkey;
            w.remote_to = wr.atomic.remote_addr;
            w.compare = wr.atomic.compare_add;
            w.swap_add = fa ? wr.atomic.compare_add : wr.atomic.swap;
            break;
        }
        }
        s.byte_len = static_cast<std::uint32_t>(total);
        switch (ep_->post(w)) {
        case rdmap::PostStatus::ok: break;
        case rdmap::PostStatus::queue_full: return refuse(PostErrc::queue_full);  // not reached: slots <= sq_depth
        case rdmap::PostStatus::bad_wr: return refuse(PostErrc::invalid_opcode);
        case rdmap::PostStatus::not_operational: return refuse(PostErrc::invalid_state);
        case rdmap::PostStatus::not_agreed: return refuse(PostErrc::not_agreed);
        }
        schedule_tx();
    }
    return {};
}

PostResult<RecvWr> QueuePair::post_recv(std::span<const RecvWr> wrs) noexcept {
    if (ctx_.cfg_.layer_cycles) {
        const std::uint64_t t0 = cycles_now();
        const PostResult<RecvWr> r = post_recv_inner(wrs);
        ctx_.prof_.api += cycles_now() - t0;
        return r;
    }
    return post_recv_inner(wrs);
}

PostResult<RecvWr> QueuePair::post_recv_inner(std::span<const RecvWr> wrs) noexcept {
    for (const RecvWr& wr : wrs) {
        if (state_ == QpState::reset || srq_ != nullptr) return {PostErrc::invalid_state, &wr};
        if (wr.sg_list.size() > cap_.max_recv_sge) return {PostErrc::too_many_sge, &wr};
        if (state_ == QpState::err) {
            recv_cq_->push(WorkCompletion{.wr_id = wr.wr_id, .status = WcStatus::wr_flush_err, .opcode = WcOpcode::recv,
                                          .qp_num = qp_num_});
            continue;
        }
        if (recv_.ring.write_available() == 0) return {PostErrc::queue_full, &wr};
        RecvSlot r{};
        std::uint64_t total = 0;
        for (const Sge& g : wr.sg_list) {
            if (check_sge(g, true, r.sge[r.nsge]) != PostErrc::none) return {PostErrc::bad_lkey, &wr};
            ++r.nsge;
            total += g.length;
        }
        if (total > 0xffffffffu) return {PostErrc::bad_length, &wr};
        r.wr_id = wr.wr_id;
        r.total = static_cast<std::uint32_t>(total);
        recv_.ring.push(r);  // ownership of the buffers' use passes to the receive side (see RecvQueue)
    }
    return {};
}

bool QueuePair::modify_state(QpState s) noexcept {
    if (s == QpState::init && state_ == QpState::reset) {
        state_ = QpState::init;
        return true;
    }
    if (s == QpState::reset && state_ == QpState::err && conn_ == nullptr) {
        state_ = QpState::reset;
        return true;
    }
    if (s == QpState::err) {
        if (conn_ != nullptr) {
            conn_->abort();  // ends the stream: stream_lost() flushes
        } else if (state_ != QpState::err) {
            closing_ = true;
            stream_lost();
        }
        return true;
    }
    return false;
}

// ==== rdmap::Upper ===========================================================================================

rdmap::Mem QueuePair::tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access acc) {
    if (acc == rdmap::Access::local_write) {
        // READ response into the sink list of our READ WR in slot (stag & 0xffffff); `to` counts from 0.
        const std::uint32_t slot = read_sink_slot(stag, sq_.size());
        if (slot == kNoSlot) return {.err = rdmap::MemError::invalid_stag};
        return scatter_piece(std::span(sq_[slot].sink).first(sq_[slot].nsink), to, len);
    }
    return ctx_.mr_lookup(stag, to, len, pd_.handle(), remote_right(acc));
}

// ---- the receive queue (either thread: see RecvQueue) ----

rdmap::MemError QueuePair::RecvQueue::begin(std::uint32_t msn, bool& srq_limit) noexcept {
    srq_limit = false;
    if (has) return rdmap::MemError::no_receive;  // not reached: RDMAP binds one message at a time
    const bool got = srq != nullptr ? srq->take(bound, srq_limit) : ring.pop(bound);
    if (!got) return rdmap::MemError::no_receive;
    has = true;
    bound.bound = true;
    bound.msn = msn;
    return rdmap::MemError::none;
}

const RecvSlot* QueuePair::RecvQueue::current(std::uint32_t msn) const noexcept {
    return has && bound.msn == msn ? &bound : nullptr;
}

rdmap::Mem QueuePair::RecvQueue::place(std::uint32_t msn, std::uint32_t mo, std::size_t len) const noexcept {
    const RecvSlot* rp = current(msn);
    if (rp == nullptr) return {.err = rdmap::MemError::bounds};
    return scatter_piece(std::span(rp->sge).first(rp->nsge), mo, len);
}

WorkCompletion QueuePair::RecvQueue::complete(const rdmap::Completion& c, std::uint32_t qp_num) noexcept {
    WorkCompletion wc{.wr_id = bound.wr_id,
                      .status = c.status == rdmap::WcStatus::success ? WcStatus::success : WcStatus::wr_flush_err,
                      .opcode = c.imm_only ? WcOpcode::recv_rdma_with_imm : WcOpcode::recv,
                      .byte_len = c.byte_len,
                      .imm_data = c.imm,
                      .invalidated_rkey = c.inv_stag,
                      .qp_num = qp_num};
    if (c.has_imm) wc.wc_flags |= wc_flags::with_imm;
    if (c.has_inv) wc.wc_flags |= wc_flags::with_inv;
    if (c.solicited) wc.wc_flags |= wc_flags::solicited;
    has = false;
    return wc;
}

rdmap::MemError QueuePair::recv_begin(std::uint32_t msn) {
    bool limit = false;
    const rdmap::MemError e = recv_.begin(msn, limit);
    if (limit) ctx_.push_async(AsyncEvent{AsyncEventType::srq_limit_reached, srq_});
    return e;
}

rdmap::Mem QueuePair::recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) {
    return recv_.place(msn, mo, len);
}

rdmap::MemError QueuePair::invalidate(std::uint32_t stag) { return ctx_.mr_invalidate(stag, pd_.handle()); }

void QueuePair::on_completion(const rdmap::Completion& c) {
    if (c.kind == rdmap::WcKind::recv) {
        if (recv_.current(c.msn) == nullptr) return;
        recv_cq_->push(recv_.complete(c, qp_num_));
        return;
    }
    if (c.wr_id == kRtrWrId || c.wr_id >= sq_.size()) return;  // the RTR: internal
    const auto slot = static_cast<std::uint32_t>(c.wr_id);
    const bool ok = c.status == rdmap::WcStatus::success;
    if (ok && c.kind == rdmap::WcKind::atomic && sq_[slot].nsink == 1)
        std::memcpy(sq_[slot].sink[0].data(), &c.atomic_original, 8);  // host order, as the target word
    complete_send(slot, ok ? WcStatus::success : WcStatus::wr_flush_err);
}

void QueuePair::on_terminate(const rdmap::TermReport& t) {
    if (!closing_) term_ = TerminateInfo{t.code, t.received, t.raw, t.cause};
    enter_error();
}

// ==== state ==================================================================================================

// Flushes every posted receive, the bound one first. Consumer side of RecvQueue: with an RX thread, only
// after detach_rx() gave the receive half back to this thread.
void QueuePair::flush_rq() noexcept {
    if (recv_.has) {  // with an SRQ: the WR this QP took; the SRQ's own WRs stay for the other QPs
        recv_cq_->push(WorkCompletion{.wr_id = recv_.bound.wr_id, .status = WcStatus::wr_flush_err,
                                      .opcode = WcOpcode::recv, .qp_num = qp_num_});
        recv_.has = false;
    }
    RecvSlot r;
    while (recv_.ring.pop(r))
        recv_cq_->push(WorkCompletion{.wr_id = r.wr_id, .status = WcStatus::wr_flush_err, .opcode = WcOpcode::recv,
                                      .qp_num = qp_num_});
}

void QueuePair::enter_error() noexcept {
    state_ = QpState::err;
    detach_rx();
    flush_rq();  // the endpoint flushes its send side right after on_terminate
    schedule_tx();  // the TERMINATE goes out, then the connection closes (tx_pump)
}

void QueuePair::stream_lost() noexcept {
    closing_ = true;
    tx_len_ = 0;
    if (ep_ && ep_->state() == rdmap::State::operational) {
        // Flushes SQ/ORQ through on_completion and sends nothing: the connection ended in order (a FIN either
        // way) or was lost; a TERMINATE is for protocol errors, and siw answers one before a FIN with a reset.
        ep_->stop(mpa::kTermConnectionLost);
    }
    state_ = QpState::err;
    detach_rx();
    flush_rq();
}

void QueuePair::schedule_tx() noexcept { ctx_.schedule_tx(this); }

// The peer's first FPDU byte arrived: a responder may send from now (RFC 5044 section 7.1.2: its gate), and an
// initiator's hold ends (the peer's receive path is live: it sent from it).
void QueuePair::note_rx_start() noexcept {
    rx_started_ = true;
    tx_at_rx_start_ = tx_written_;
    if (tx_gate_) {
        tx_gate_ = false;
        schedule_tx();
    }
}

bool QueuePair::post_nudge() noexcept {
    if ((state_ != QpState::rts && state_ != QpState::rtr) || !ep_) return false;  // rtr: see rtr_before_terminate
    rdmap::WorkRequest w{};
    w.wr_id = kRtrWrId;  // internal, like the RTR: no slot, no completion
    w.signaled = false;
    w.op = rdmap::WrOp::write;
    w.remote_stag = kRtrStag;
    if (ep_->post(w) != rdmap::PostStatus::ok) return false;
    schedule_tx();
    return true;
}

void QueuePair::release_first_fpdu() noexcept {
    if (!tx_gate_) return;
    tx_gate_ = false;
    schedule_tx();
}

// ==== stream =================================================================================================

void QueuePair::enter_rts(CmId& conn, const mpa::Agreed& agreed, std::uint32_t emss, bool initiator, bool rfc7306,
                          bool hold_first) {
    conn_ = &conn;
    fpdu_tx_.emplace(mpa::tx_config(agreed, emss));
    framer_.emplace(*fpdu_tx_);
    deframer_.emplace(mpa::rx_config(agreed));
    rdmap::Upper& upper = *this;
    rdmap::Config ecfg{.sq_depth = cap_.max_send_wr + 2 /* + the RTR and a first-FPDU nudge */, .ird = agreed.ird,
                       .ord = agreed.ord, .rfc7306 = rfc7306,
                       .opaque_access_errors = ctx_.cfg_.security.opaque_access_errors};
    if (rxs_) {
        // RX thread: this endpoint sends; the receive half (its own endpoint and deframer) goes to the RX thread
        // at the handover. Between them: RxSide's rings and answered_.
        answered_.store(0, std::memory_order_relaxed);
        ecfg.role = rdmap::Role::tx;
        ecfg.answered = &answered_;
        rxs_->start(agreed, ecfg);
    }
    ep_.emplace(upper, *framer_, ecfg);
    if (ctx_.cfg_.layer_cycles) ep_->count_cycles(&ctx_.prof_.ep_rx, &ctx_.prof_.framer);
    tx_buf_.assign(std::max<std::uint32_t>(emss, 64), std::byte{0});
    tx_off_ = tx_len_ = 0;
    tx_gate_ = (!initiator && agreed.responder_waits_for_first_fpdu) || (initiator && hold_first);
    tx_written_ = 0;
    rx_started_ = false;
    tx_at_rx_start_ = 0;
    closing_ = false;
    state_ = QpState::rts;
    if (rxs_ && conn.conn_) {
        if (!initiator) watch_stream(*conn.conn_);  // the initiator's FPDUs come only after our reply
        if (flow_ >= 0 && !ctx_.rx_->handover(static_cast<std::uint16_t>(flow_), rxs_.get())) {
            spdlog::error("softrdma: RX thread command ring full: QP {} keeps its receive path here", qp_num_);
            ctx_.free_flow(flow_);
            flow_ = -1;
        }
    }
    if (initiator && agreed.p2p && agreed.rtr != mpa::RtrType::none) {
        // RFC 6581 RTR: a zero-length WRITE or READ to STag 1, sent before any other FPDU; no completion.
        rdmap::WorkRequest w{};
        w.wr_id = kRtrWrId;
        w.signaled = false;
        w.remote_stag = kRtrStag;
        if (agreed.rtr == mpa::RtrType::read) {
            w.op = rdmap::WrOp::read;
            w.local_stag = kRtrStag;
        } else {
            w.op = agreed.rtr == mpa::RtrType::send ? rdmap::WrOp::send : rdmap::WrOp::write;
        }
        ep_->post(w);
    }
    schedule_tx();
}

void QueuePair::rx_bytes(std::span<const std::byte> bytes) noexcept {
    if (!ep_ || bytes.empty()) return;
    if (rxs_) {
        // Before the handover (the initiator's FPDUs that came with or right after the MPA reply) the receive half
        // runs here, on the bytes lwIP delivers; after it, lwIP's bytes for this stream are stand-ins for what the
        // RX thread placed.
        if (handed_over_ || state_ == QpState::err) return;
        rxs_->rx_payload(bytes);
        drain_rx_events();
        return;
    }
    if (!rx_started_) note_rx_start();
    const std::uint64_t placed = ep_->placed_bytes();
    const std::uint64_t t0 = ctx_.cfg_.layer_cycles ? cycles_now() : 0;
    rdmap::receive(*deframer_, *ep_, bytes);
    if (ctx_.cfg_.layer_cycles) ctx_.prof_.proto_rx += cycles_now() - t0;
    ctx_.placed_bytes_.fetch_add(ep_->placed_bytes() - placed, std::memory_order_relaxed);
    if (ep_->tx_ready()) schedule_tx();  // READ/atomic responses, TERMINATE
}

void QueuePair::rx_end() noexcept {
    if (!rxs_ && ep_) ep_->end_of_input();  // with the RX thread, RxSide::rx_payload ends each delivery itself
}

// TX. Keeping FPDUs whole on the wire: each batch pulled from the endpoint is whole FPDUs totalling at most one
// EMSS (tx_buf_ is EMSS bytes and MULPDU makes every FPDU fit), and a batch is handed to lwIP only when lwIP
// holds no unsent segment (TcpConnection::tx_segment_boundary), so lwIP starts a new segment with it instead of
// appending it to a partly filled one. One batch = one segment. A batch lwIP takes only in part (its heap or
// segment pool full) is finished first; that is the one case where an FPDU may straddle two segments, and the
// peer's deframer accepts any cut. Copies on TX: endpoint -> tx_buf_ (gather + CRC), tx_buf_ -> lwIP.
void QueuePair::tx_pump() noexcept {
    if (!ep_ || conn_ == nullptr || !conn_->conn_ || !conn_->conn_->open()) return;
    stack::TcpConnection& tcp = *conn_->conn_;
    bool wrote = false;
    for (;;) {
        if (tx_len_ > 0) {
            const std::uint64_t t0 = ctx_.cfg_.layer_cycles ? cycles_now() : 0;
            const std::size_t n = tcp.write(std::span<const std::byte>(tx_buf_).subspan(tx_off_, tx_len_));
            if (ctx_.cfg_.layer_cycles) ctx_.prof_.lwip_tx += cycles_now() - t0;
            tx_off_ += n;
            tx_len_ -= n;
            tx_written_ += n;
            wrote = wrote || n > 0;
            if (tx_len_ > 0) {
                schedule_tx();  // lwIP full: try again next turn (on_sent may not come if its heap was the limit)
                break;
            }
            continue;
        }
        const bool failed = ep_->state() == rdmap::State::error;
        if (tx_gate_ && !failed) break;
        if (!ep_->tx_ready()) break;
        if (!tcp.tx_segment_boundary()) {
            schedule_tx();  // an unsent segment is queued: start the next batch once it is out
            break;
        }
        const std::size_t room = std::min(tx_buf_.size(), tcp.send_space());
        const std::uint64_t t0 = ctx_.cfg_.layer_cycles ? cycles_now() : 0;
        const std::size_t n = ep_->pull_tx(std::span<std::byte>(tx_buf_).first(room));
        if (ctx_.cfg_.layer_cycles) ctx_.prof_.proto_tx += cycles_now() - t0;
        if (n == 0) {
            schedule_tx();  // the next FPDU does not fit the send buffer yet
            break;
        }
        tx_off_ = 0;
        tx_len_ = n;
    }
    if (wrote) {
        const std::uint64_t t0 = ctx_.cfg_.layer_cycles ? cycles_now() : 0;
        tcp.flush();
        if (ctx_.cfg_.layer_cycles) ctx_.prof_.lwip_tx += cycles_now() - t0;
    }
    // In error: once the TERMINATE is out, the connection closes (the CM does it in its poll stage).
    if (state_ == QpState::err && !closing_ && tx_len_ == 0 && !ep_->tx_ready()) {
        closing_ = true;
        conn_->qp_failed();
    }
}

// ==== the receive half on the RX thread ======================================================================

void QueuePair::on_request_sent(const rdmap::OrqEntry& e) {
    OrqMsg m{.e = e};
    if (e.wr_id < sq_.size()) m.sink = SinkList{sq_[e.wr_id].sink, sq_[e.wr_id].nsink};
    if (rxs_) rxs_->orq.push(m);  // never full: one per send slot + the RTR
}

void QueuePair::watch_stream(stack::TcpConnection& conn) noexcept {
    if (!ctx_.rx_ || flow_ >= 0) return;
    flow_ = ctx_.alloc_flow(this);
    if (flow_ < 0) return;  // not followed: the receive half stays on this thread
    const stack::TcpConnection::FlowInfo fi = conn.flow_info();
    if (!ctx_.rx_->watch(static_cast<std::uint16_t>(flow_), threading::flow_key(fi.remote_ip_be, fi.remote_port, fi.local_port),
                         fi.rcv_nxt)) {
        ctx_.free_flow(flow_);
        flow_ = -1;
    }
}

void QueuePair::on_marker() noexcept {
    if (flow_ < 0 || !rxs_ || handed_over_ || state_ == QpState::err) return;
    rxs_->on_rx_thread = true;
    handed_over_ = true;
    ctx_.rx_->go(static_cast<std::uint16_t>(flow_));  // the RX thread owns the receive half from here
}

void QueuePair::on_gap() noexcept {
    if (conn_ != nullptr && conn_->conn_) conn_->conn_->ack_now();
}

bool QueuePair::rx_events_pending() const noexcept { return rxs_ && rxs_->events.read_available() != 0; }

void QueuePair::drain_rx_events() noexcept {
    if (!rxs_) return;
    rxs_->rung.store(false, std::memory_order_seq_cst);  // before draining: an event pushed now rings again
    RxEvent e;
    while (rxs_->events.pop(e)) {
        switch (e.kind) {
        case RxEvent::Kind::recv: recv_cq_->push(e.wc); break;
        case RxEvent::Kind::request_done:
            if (ep_) ep_->request_done();
            if (e.slot < sq_.size()) complete_send(static_cast<std::uint32_t>(e.slot), e.ok ? WcStatus::success : WcStatus::wr_flush_err);
            if (ep_ && ep_->tx_ready()) schedule_tx();
            break;
        case RxEvent::Kind::inbound:
            if (ep_) ep_->answer(e.irq);
            schedule_tx();
            break;
        case RxEvent::Kind::terminate:
            // A TERMINATE the peer sent is the reason even when the connection is already closing (its FIN
            // may have been seen first); one we would send while closing is only the flush of a lost stream.
            if (!term_ && (e.received || !closing_)) term_ = TerminateInfo{e.code, e.received, e.raw, e.cause};
            if (ep_) {
                if (e.received) ep_->stop(e.code);
                else ep_->send_terminate(e.code, std::span<const std::byte>(e.term).first(e.term_len));
            }
            if (state_ != QpState::err) enter_error();
            break;
        case RxEvent::Kind::first_bytes: note_rx_start(); break;
        case RxEvent::Kind::srq_limit: ctx_.push_async(AsyncEvent{AsyncEventType::srq_limit_reached, srq_}); break;
        }
    }
}

// Takes the receive half back from the RX thread (control path: waits, bounded, for the RX thread to let go)
// and flushes what it held: outstanding READ/atomic requests and the bound receive.
void QueuePair::detach_rx() noexcept {
    if (!rxs_) return;
    if (flow_ >= 0) {
        std::atomic<bool> done{false};
        if (ctx_.rx_->remove(static_cast<std::uint16_t>(flow_), done)) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (!done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until)
                std::this_thread::yield();
        }
        if (!done.load(std::memory_order_acquire)) {
            // The RX thread did not answer: it may still call this QP; leaking is safer than freeing.
            spdlog::error("softrdma: RX thread did not release QP {} in 2 s", qp_num_);
            rxs_.release();
            return;
        }
        ctx_.free_flow(flow_);
        flow_ = -1;
    }
    rxs_->on_rx_thread = false;
    // A flush, not a protocol error: outstanding requests come back as events, no TERMINATE is built.
    if (rxs_->ep && rxs_->ep->state() == rdmap::State::operational) rxs_->ep->stop(mpa::kTermConnectionLost);
    drain_rx_events();
}

// ==== shared receive queue ===================================================================================

std::unique_ptr<SharedReceiveQueue> ProtectionDomain::create_srq(const SrqInitAttr& attr) {
    if (attr.max_wr == 0) throw Error("create_srq: zero depth");
    if (attr.max_sge > rdmap::kMaxSge) throw Error("create_srq: at most rdmap::kMaxSge SGEs");
    return std::unique_ptr<SharedReceiveQueue>(new SharedReceiveQueue(ctx_, *this, attr));
}

SharedReceiveQueue::SharedReceiveQueue(Context& ctx, ProtectionDomain& pd, const SrqInitAttr& attr)
    : ctx_(ctx), pd_(pd), max_sge_(attr.max_sge), max_wr_(attr.max_wr), limit_(attr.srq_limit), ring_(attr.max_wr) {}

PostResult<RecvWr> SharedReceiveQueue::post_recv(std::span<const RecvWr> wrs) noexcept {
    for (const RecvWr& wr : wrs) {
        if (wr.sg_list.size() > max_sge_) return {PostErrc::too_many_sge, &wr};
        if (count_.load(std::memory_order_relaxed) >= max_wr_) return {PostErrc::queue_full, &wr};
        RecvSlot r{};
        std::uint64_t total = 0;
        for (const Sge& g : wr.sg_list) {
            const rdmap::Mem m = ctx_.mr_lookup(g.lkey, g.addr, g.length, pd_.handle(), access::local_write);
            if (m.err != rdmap::MemError::none) return {PostErrc::bad_lkey, &wr};
            r.sge[r.nsge++] = {m.ptr, g.length};
            total += g.length;
        }
        if (total > 0xffffffffu) return {PostErrc::bad_length, &wr};
        r.wr_id = wr.wr_id;
        r.total = static_cast<std::uint32_t>(total);
        if (!ring_.bounded_push(r)) return {PostErrc::queue_full, &wr};  // nodes: max_wr, allocated at creation
        count_.fetch_add(1, std::memory_order_release);
    }
    return {};
}

bool SharedReceiveQueue::take(RecvSlot& out, bool& limit_reached) noexcept {
    limit_reached = false;
    if (!ring_.pop(out)) return false;
    const std::uint32_t left = count_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    std::uint32_t lim = limit_.load(std::memory_order_relaxed);
    // Fires once per arm: whoever swaps the armed limit to 0 reports it.
    if (lim != 0 && left < lim && limit_.compare_exchange_strong(lim, 0, std::memory_order_relaxed)) limit_reached = true;
    return true;
}

}  // namespace softrdma::verbs
