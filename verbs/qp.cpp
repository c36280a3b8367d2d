// SPDX-License-Identifier: MIT
// detail::Qp: posting, the verbs state, applying what the receive half reports, the stream's TCP callbacks, and
// the QueuePair handle. The receive half is qp_rx.cpp, the transmit half qp_tx.cpp.
#include "verbs/qp.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/log.hpp"

#include "base/cycles.hpp"
#include "mpa/errors.hpp"
#include "verbs/cm.hpp"
#include "verbs/cq.hpp"
#include "verbs/engine.hpp"
#include "verbs/srq.hpp"

namespace softrdma::verbs::detail {
namespace {

constexpr std::uint32_t kRtrStag = 1;                 // RFC 6581 RTR: STag 1 (Chelsio refuses 0)
constexpr std::uint64_t kRtrWrId = ~std::uint64_t{0};  // the RTR's and nudges' endpoint wr_id: no slot, no completion

}  // namespace

Qp::Qp(const std::shared_ptr<Engine>& engine, std::uint32_t pd, const QpInitAttr& attr, std::uint32_t qp_num)
    : keep_engine_(engine),
      keep_send_cq_(attr.send_cq->shared_impl()),
      keep_recv_cq_(attr.recv_cq->shared_impl()),
      keep_srq_(attr.srq != nullptr ? attr.srq->shared_impl() : nullptr),
      engine_(*engine),
      pd_(pd),
      send_cq_(attr.send_cq->impl()),
      recv_cq_(attr.recv_cq->impl()),
      cap_(attr.cap),
      sig_all_(attr.sq_sig_all),
      qp_num_(qp_num),
      srq_(attr.srq != nullptr ? &attr.srq->impl() : nullptr),
      sq_(attr.cap.max_send_wr),
      inline_buf_(static_cast<std::size_t>(attr.cap.max_send_wr) * attr.cap.max_inline_data),
      recv_(attr.srq != nullptr ? 0 : attr.cap.max_recv_wr, srq_),
      rx_(std::make_unique<RxHalf>(engine->memory(), pd, qp_num, recv_, attr.cap.max_send_wr)) {
    for (std::uint32_t i = 0; i < sq_.size(); ++i) sq_[i].next_free = i + 1 < sq_.size() ? i + 1 : kNoSlot;
    sq_free_ = 0;
    if (engine_.rx_thread() != nullptr)
        ring_ = std::make_unique<RxEventRing>(srq_ != nullptr ? srq_->max_wr() : cap_.max_recv_wr, cap_.max_send_wr);
    state_ = QpState::init;  // as rdma_create_qp: ready for post_recv before the connection
    engine_.track_qp(this);  // last: nothing after it throws
}

Qp::~Qp() {
    closing_ = true;
    detach_rx();  // first: the RX thread lets go of this QP's receive half before anything of it goes
    if (conn_ != nullptr) {
        Conn* c = conn_;
        conn_ = nullptr;
        c->qp_gone();  // aborts the connection (RST): a QP destroyed while connected
    }
    engine_.remove_qp(this);
}

// ==== posting ================================================================================================

PostErrc Qp::check_sge(const Sge& s, bool need_write, std::span<std::byte>& out, Lease& lease) const noexcept {
    const rdmap::Mem m = engine_.memory().lookup_local(s.lkey, s.addr, s.length, pd_,
                                                       need_write ? access::local_write : 0, lease);
    if (m.err != rdmap::MemError::none) return PostErrc::bad_lkey;
    out = {m.ptr, s.length};
    return PostErrc::none;
}

std::uint32_t Qp::alloc_slot() noexcept {
    const std::uint32_t s = sq_free_;
    if (s == kNoSlot) return kNoSlot;
    sq_free_ = sq_[s].next_free;
    ++sq_used_;
    return s;
}

void Qp::free_slot(std::uint32_t slot) noexcept {
    sq_[slot].next_free = sq_free_;
    sq_free_ = slot;
    --sq_used_;
}

void Qp::complete(Cq& cq, const WorkCompletion& wc) noexcept {
    if (cq.push(wc)) engine_.push_async(AsyncEvent{.type = AsyncEventType::cq_err, .cq = cq.handle(), .qp_num = qp_num_});
}

void Qp::complete_send(std::uint32_t slot, WcStatus st) noexcept {
    const SqSlot& s = sq_[slot];
    if (st == WcStatus::wr_flush_err && fail_status_) {  // the oldest WR the connection's end kills: its cause
        st = *fail_status_;
        fail_status_.reset();
    }
    if (st != WcStatus::success || s.signaled)
        complete(send_cq_, WorkCompletion{.wr_id = s.wr_id, .status = st, .opcode = s.opcode, .byte_len = s.byte_len,
                                     .qp_num = qp_num_});
    free_slot(slot);
}

PostResult<SendWr> Qp::post_send(std::span<const SendWr> wrs) noexcept {
    if (Engine::Prof* prof = engine_.prof()) {
        const std::uint64_t t0 = cycles_now();
        const PostResult<SendWr> r = post_send_inner(wrs);
        prof->api += cycles_now() - t0;
        return r;
    }
    return post_send_inner(wrs);
}

PostResult<SendWr> Qp::post_send_inner(std::span<const SendWr> wrs) noexcept {
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
            complete(send_cq_, WorkCompletion{.wr_id = wr.wr_id, .status = WcStatus::wr_flush_err, .opcode = wc_op,
                                         .qp_num = qp_num_});
            continue;
        }
        if (state_ != QpState::rts || !tx_.started()) return {PostErrc::invalid_state, &wr};
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
        s.sink.n = 0;
        s.nsrc = 0;
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
                    if (const PostErrc e = check_sge(g, false, b, s.src[s.nsrc]); e != PostErrc::none) return refuse(e);
                    ++s.nsrc;
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
                if (const PostErrc e = check_sge(g, true, s.sink.sge[s.sink.n], s.sink.lease[s.sink.n]); e != PostErrc::none)
                    return refuse(e);
                ++s.sink.n;
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
            if (const PostErrc e = check_sge(wr.sg_list[0], true, s.sink.sge[0], s.sink.lease[0]); e != PostErrc::none)
                return refuse(e);
            s.sink.n = 1;
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
        switch (tx_.ep().post(w)) {
        case rdmap::PostStatus::ok: break;
        case rdmap::PostStatus::queue_full: return refuse(PostErrc::queue_full);  // not reached: slots <= sq_depth
        case rdmap::PostStatus::bad_wr: return refuse(PostErrc::invalid_opcode);
        case rdmap::PostStatus::not_operational: return refuse(PostErrc::invalid_state);
        case rdmap::PostStatus::not_agreed: return refuse(PostErrc::not_agreed);
        case rdmap::PostStatus::bad_address: return refuse(PostErrc::bad_remote_address);
        }
        schedule_tx();
    }
    return {};
}

PostResult<RecvWr> Qp::post_recv(std::span<const RecvWr> wrs) noexcept {
    if (Engine::Prof* prof = engine_.prof()) {
        const std::uint64_t t0 = cycles_now();
        const PostResult<RecvWr> r = post_recv_inner(wrs);
        prof->api += cycles_now() - t0;
        return r;
    }
    return post_recv_inner(wrs);
}

PostResult<RecvWr> Qp::post_recv_inner(std::span<const RecvWr> wrs) noexcept {
    for (const RecvWr& wr : wrs) {
        if (state_ == QpState::reset || srq_ != nullptr) return {PostErrc::invalid_state, &wr};
        if (wr.sg_list.size() > cap_.max_recv_sge) return {PostErrc::too_many_sge, &wr};
        if (state_ == QpState::err) {
            complete(recv_cq_, WorkCompletion{.wr_id = wr.wr_id, .status = WcStatus::wr_flush_err, .opcode = WcOpcode::recv,
                                         .qp_num = qp_num_});
            continue;
        }
        if (recv_.ring.write_available() == 0) return {PostErrc::queue_full, &wr};
        RecvSlot r{};
        std::uint64_t total = 0;
        for (const Sge& g : wr.sg_list) {
            if (check_sge(g, true, r.sge[r.nsge], r.lease[r.nsge]) != PostErrc::none) return {PostErrc::bad_lkey, &wr};
            ++r.nsge;
            total += g.length;
        }
        if (total > 0xffffffffu) return {PostErrc::bad_length, &wr};
        r.wr_id = wr.wr_id;
        r.total = static_cast<std::uint32_t>(total);
        recv_.ring.push(r);  // ownership of the buffers' use passes to the receive half (see RecvQueue)
    }
    return {};
}

bool Qp::modify_state(QpState s) noexcept {
    if (s == QpState::init && state_ == QpState::reset) {
        state_ = QpState::init;
        return true;
    }
    if (s == QpState::reset && state_ == QpState::err) {
        // Back to RESET once the stream is over (a refused connect, a disconnect, a TERMINATE whose connection
        // has closed): everything was flushed on the way into ERR; the CmId, if any, lets go of this QP, and
        // the QP can be taken to INIT and connected again (start_stream restarts both halves).
        if (conn_ != nullptr) {
            if (!conn_->qp_leaves()) return false;  // the connection is still closing: not yet
            conn_ = nullptr;
        }
        term_.reset();
        state_ = QpState::reset;
        return true;
    }
    if (s == QpState::err) {
        if (conn_ != nullptr) {
            conn_->abort();  // ends the stream: end_stream() flushes
        } else if (state_ != QpState::err) {
            end_stream();
        }
        return true;
    }
    return false;
}

// ==== the tx half's Upper =====================================================================================

rdmap::Mem Qp::tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access acc) {
    // Asked by the tx endpoint only for READ-response sources (Access::remote_read): looked up again when the
    // response is framed, the region may have gone since the request was checked.
    if (acc != rdmap::Access::remote_read) return {.err = rdmap::MemError::access};
    return engine_.memory().lookup(stag, to, len, pd_, access::remote_read);
}

bool Qp::source_alive(std::uint64_t wr_id) {
    if (wr_id >= sq_.size()) return true;  // the RTR, a nudge: no memory
    const SqSlot& s = sq_[wr_id];
    if (engine_.memory().alive(s.src, s.nsrc)) return true;
    lost_slot_ = wr_id;  // the endpoint now ends the stream and flushes this WR: it completes loc_prot_err
    return false;
}

void Qp::on_completion(const rdmap::Completion& c) {
    // Send-side WRs: SEND/WRITE when framed, any flushed; READ/atomic completions come from the receive half.
    if (c.wr_id == kRtrWrId || c.wr_id >= sq_.size()) return;  // the RTR, a nudge: internal
    WcStatus st = c.status == rdmap::WcStatus::success ? WcStatus::success : WcStatus::wr_flush_err;
    if (c.wr_id == lost_slot_) {
        st = WcStatus::loc_prot_err;
        lost_slot_ = ~std::uint64_t{0};
    }
    complete_send(static_cast<std::uint32_t>(c.wr_id), st);
}

void Qp::on_terminate(const rdmap::TermReport& t) {
    // A TERMINATE the tx half built (a READ response's source gone, the initiator's MPA failure).
    if (!closing_ && !term_) note_terminate(TerminateInfo{t.code, t.received, t.raw, t.cause});
    if (state_ != QpState::err) enter_error();
}

void Qp::on_request_sent(const rdmap::OrqEntry& e) {
    OrqMsg m{.e = e};
    if (e.wr_id < sq_.size()) m.sink = sq_[e.wr_id].sink;
    if (rx_) rx_->requests().push(m);  // never full: one per send slot + the RTR
}

// ==== what the receive half reports ===========================================================================

void Qp::apply(const RxEvent& e) noexcept {
    switch (e.kind) {
    case RxEvent::Kind::recv: complete(recv_cq_, e.wc); break;
    case RxEvent::Kind::request_done:
        // An ORD credit back when the response came; not for a request the stream's end flushed or killed (a
        // TERMINATE's event follows): spent on the next READ, it would put that READ, and what is queued behind
        // it, on the wire before that event arrives (with an RX thread the two may be drained apart), and they
        // would complete out of posting order. Left queued, the stream's end flushes them in order.
        if (e.answered && tx_.started()) tx_.ep().request_done();
        if (e.slot < sq_.size()) complete_send(static_cast<std::uint32_t>(e.slot), e.status);
        if (e.answered && tx_.started() && tx_.ep().tx_ready()) schedule_tx();
        break;
    case RxEvent::Kind::inbound:
        if (tx_.started()) tx_.ep().answer(e.irq);
        schedule_tx();
        break;
    case RxEvent::Kind::terminate:
        // A TERMINATE the peer sent is the reason even when the connection is already closing (its FIN may
        // have been seen first); one we would send while closing is only the flush of a lost stream.
        if (!term_ && (e.received || !closing_)) note_terminate(TerminateInfo{e.code, e.received, e.raw, e.cause});
        if (e.received && e.first_status != WcStatus::wr_flush_err) fail_status_ = e.first_status;
        // ERR first: letting go of the receive half flushes the requests framed after it failed (RxHalf::stop),
        // which are older than anything still in the send queue; then the tx half flushes that queue.
        if (state_ != QpState::err) enter_error();
        if (tx_.started()) {
            if (e.received) tx_.ep().stop(e.code);
            else tx_.ep().send_terminate(e.code, std::span<const std::byte>(e.term).first(e.term_len));
        }
        fail_status_.reset();  // taken by the oldest WR flushed, if any
        break;
    case RxEvent::Kind::first_bytes: note_rx_start(); break;
    case RxEvent::Kind::srq_limit:  // not for an SRQ whose handle is gone (nobody could act on it)
        if (srq_->handle() != nullptr) engine_.push_async(AsyncEvent{AsyncEventType::srq_limit_reached, srq_->handle()});
        break;
    }
}

void Qp::drain_events() noexcept {
    if (ring_) ring_->drain([this](const RxEvent& e) { apply(e); });
}

// The peer's first FPDU byte arrived: a responder may send from now (RFC 5044 section 7.1.2: its gate), and an
// initiator's hold ends (the peer's receive path is live: it sent from it).
void Qp::note_rx_start() noexcept {
    rx_started_ = true;
    tx_at_rx_start_ = tx_.written();
    if (tx_.gated()) {
        tx_.set_gate(false);
        schedule_tx();
    }
}

// ==== state ==================================================================================================

// Flushes every posted receive, the bound one first. Consumer side of RecvQueue: with an RX thread, only
// after detach_rx() gave the receive half back to this thread.
void Qp::flush_rq() noexcept {
    if (recv_.has) {  // with an SRQ: the WR this QP took; the SRQ's own WRs stay for the other QPs
        complete(recv_cq_, WorkCompletion{.wr_id = recv_.bound.wr_id,
                                     .status = recv_.gone ? WcStatus::loc_prot_err : WcStatus::wr_flush_err,
                                     .opcode = WcOpcode::recv, .qp_num = qp_num_});
        recv_.has = false;
    }
    RecvSlot r;
    while (recv_.ring.pop(r))
        complete(recv_cq_, WorkCompletion{.wr_id = r.wr_id, .status = WcStatus::wr_flush_err, .opcode = WcOpcode::recv,
                                     .qp_num = qp_num_});
}

// The TERMINATE that ends this QP's stream: kept for terminate_info(), and told as an async QP error.
void Qp::note_terminate(const TerminateInfo& t) noexcept {
    term_ = t;
    engine_.push_async(AsyncEvent{.type = term_effect(t.received ? t.code : t.cause, t.received ? t.raw : 0).async,
                                  .qp_num = qp_num_, .term = t});
}

void Qp::enter_error() noexcept {
    state_ = QpState::err;
    detach_rx();
    flush_rq();     // the endpoints flush their send side themselves
    schedule_tx();  // the TERMINATE goes out, then the connection closes (tx_pump)
}

void Qp::close_for_context() noexcept {
    if (state_ != QpState::err) end_stream();  // flushes everything, lets go of the RX thread
    else detach_rx();
    tcp_ = nullptr;
}

void Qp::end_stream(WcStatus first) noexcept {
    closing_ = true;
    if (first != WcStatus::wr_flush_err && state_ != QpState::err) fail_status_ = first;
    tx_.drop_staged(tcp_);
    // Flushes SQ/ORQ through on_completion / events and sends nothing: the connection ended in order (a FIN
    // either way) or was lost; a TERMINATE is for protocol errors, and siw answers one before a FIN with a reset.
    if (tx_.started() && tx_.ep().state() == rdmap::State::operational) tx_.ep().stop(mpa::kTermConnectionLost);
    state_ = QpState::err;
    detach_rx();
    flush_rq();
    fail_status_.reset();  // taken by the oldest WR flushed, if any
    tcp_ = nullptr;
}

void Qp::begin_drain() noexcept {
    if (state_ == QpState::rts) state_ = QpState::sqd;  // post_send refused from here; what is queued still goes out
    schedule_tx();
}

void Qp::schedule_tx() noexcept { engine_.schedule_tx(this); }

void Qp::bind(Conn& conn) noexcept {
    conn_ = &conn;
    state_ = QpState::rtr;  // MPA negotiation under way
}

bool Qp::post_nudge() noexcept {
    if ((state_ != QpState::rts && state_ != QpState::rtr) || !tx_.started()) return false;
    rdmap::WorkRequest w{};
    w.wr_id = kRtrWrId;  // internal, like the RTR: no slot, no completion
    w.signaled = false;
    w.op = rdmap::WrOp::write;
    w.remote_stag = kRtrStag;
    if (tx_.ep().post(w) != rdmap::PostStatus::ok) return false;
    schedule_tx();
    return true;
}

void Qp::release_first_fpdu() noexcept {
    if (!tx_.gated()) return;
    tx_.set_gate(false);
    schedule_tx();
}

// ==== the stream =============================================================================================

void Qp::start_stream(stack::TcpConnection& tcp, const mpa::Agreed& agreed, const StreamParams& p) {
    tcp_ = &tcp;
    // FPDUs are sized for the segment (MULPDU from EMSS, RFC 5044; TxHalf::fpdu_limit): at MTU 1500 and 9000
    // one FPDU fills a segment; a large segment (stack::StackConfig) carries two of 32672 bytes.
    const std::uint32_t mss = tcp.mss();
    const std::uint32_t segment = mss != 0 ? mss : 536;
    const std::uint32_t emss = segment;
    Engine::Prof* prof = engine_.prof();
    rdmap::Config ecfg{.sq_depth = cap_.max_send_wr + 2 /* + the RTR and a first-FPDU nudge */, .ird = agreed.ird,
                       .ord = agreed.ord, .answered = &answered_, .rfc7306 = p.rfc7306,
                       .opaque_access_errors = engine_.config().security.opaque_access_errors};
    answered_.store(0, std::memory_order_relaxed);
    // The receive half runs on this thread until a handover to the RX thread (on_marker): it reports to the QP.
    // It counts its cycles into the application thread's profile only when it stays on this thread (run to
    // completion); the RX thread counts its turns in the receive halves itself (LayerCycles::rx_place).
    rx_->start(agreed, ecfg, *this, engine_.placed_bytes(), prof != nullptr && !ring_ ? &prof->ep_rx : nullptr);
    tx_.start(*this, agreed, emss, segment, ecfg, inline_buf_, engine_.framed_bytes(), prof != nullptr ? &prof->framer : nullptr,
              prof != nullptr ? &prof->proto_tx : nullptr, prof != nullptr ? &prof->lwip_tx : nullptr);
    tx_.set_gate((!p.initiator && agreed.responder_waits_for_first_fpdu) || (p.initiator && p.hold_first));
    rx_started_ = false;
    tx_at_rx_start_ = 0;
    closing_ = false;
    handed_over_ = false;
    state_ = QpState::rts;
    // The TCP connection's callbacks are the stream's from here: received bytes go to the receive half.
    handler_ = std::make_unique<StreamHandler>(*this, false);
    tcp.set_handler(handler_.get());
    if (ring_) {
        if (!p.initiator) watch(tcp);  // the initiator's FPDUs come only after our reply
        if (flow_ >= 0 && !engine_.rx_thread()->handover(static_cast<std::uint16_t>(flow_), rx_.get())) {
            log::error("RX thread command ring full: QP {} keeps its receive path here", qp_num_);
            engine_.free_flow(flow_);
            flow_ = -1;
        }
    }
    if (p.initiator && agreed.p2p && agreed.rtr != mpa::RtrType::none) {
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
        tx_.ep().post(w);
    }
    schedule_tx();
}

void Qp::fail_stream(TermCode code) noexcept {
    if (tx_.started()) tx_.ep().on_llp_error(code);  // on_terminate: term_, ERR; the TERMINATE goes out, then close
}

// RX, run to completion (and with an RX thread before the handover): bytes lwIP delivered, in order.
void Qp::deliver(std::span<const std::byte> bytes) noexcept {
    if (state_ == QpState::err || !rx_) return;
    if (Engine::Prof* prof = engine_.prof()) {
        const std::uint64_t t0 = cycles_now();
        rx_->deliver(bytes);
        prof->proto_rx += cycles_now() - t0;
    } else {
        rx_->deliver(bytes);
    }
}

void Qp::StreamHandler::on_receive(stack::TcpConnection&, stack::RecvBuffer data) {
    // Ownership of the bytes stays with the RecvBuffer: the receive half copies payload out of the pbufs (the
    // one copy) during the call, and the pbufs go back to DPDK when it returns.
    if (placed_elsewhere) return;  // stand-ins for what the RX thread placed (lwIP only counts them)
    data.for_each_segment([this](std::span<const std::byte> s) { qp.deliver(s); });
}

void Qp::StreamHandler::on_sent(stack::TcpConnection&, std::size_t) { qp.schedule_tx(); }

void Qp::StreamHandler::on_remote_close(stack::TcpConnection&) {
    if (qp.conn_ != nullptr) qp.conn_->stream_closed_by_peer();
}

void Qp::StreamHandler::on_error(stack::TcpConnection&, stack::TcpError e) {
    if (qp.conn_ != nullptr) qp.conn_->stream_error(e);
}

// TX, from the poll turn.
void Qp::tx_pump() noexcept {
    if (!tx_.started() || tcp_ == nullptr || !tcp_->open()) return;
    if (tx_.pump(*tcp_)) schedule_tx();
    // In error: once the TERMINATE is out, the connection closes (the CM does it in its poll stage).
    if (state_ == QpState::err && !closing_ && tx_.idle(tcp_)) {
        closing_ = true;
        if (conn_ != nullptr) conn_->stream_failed();
    }
}

// ==== with the RX thread ======================================================================================

void Qp::watch(stack::TcpConnection& tcp) noexcept {
    threading::RxThread* rx = engine_.rx_thread();
    if (rx == nullptr || flow_ >= 0) return;
    flow_ = engine_.alloc_flow(this);
    if (flow_ < 0) return;  // not followed: the receive half stays on this thread
    const stack::TcpConnection::FlowInfo fi = tcp.flow_info();
    if (!rx->watch(static_cast<std::uint16_t>(flow_), threading::flow_key(fi.remote_ip_be, fi.remote_port, fi.local_port),
                   fi.rcv_nxt)) {
        engine_.free_flow(flow_);
        flow_ = -1;
    }
}

void Qp::on_marker() noexcept {
    if (flow_ < 0 || !ring_ || handed_over_ || state_ == QpState::err) return;
    ring_->ring_on(engine_.doorbell(), flow_);  // before go(): the doorbell is for the RX thread only (SPSC)
    rx_->set_sink(*ring_);                       // its events travel through the ring from now
    handed_over_ = true;
    if (handler_) handler_->placed_elsewhere = true;  // lwIP's bytes of this stream are stand-ins from now
    // The RX thread owns the receive half from here. It takes commands every turn: a ring still full after a
    // second means it is not running; the stream cannot be received any more (it holds the segments) and ends.
    if (!engine_.rx_thread()->go(static_cast<std::uint16_t>(flow_))) {
        log::error("RX thread command ring full for 1 s: QP {} cannot take its stream over; ending it", qp_num_);
        fail_stream(rdmap::err::local_catastrophic);
    }
}

void Qp::on_gap() noexcept {
    if (tcp_ != nullptr) tcp_->ack_now();
}

// Takes the receive half back from the RX thread (control path: waits, bounded, for the RX thread to let go)
// and stops it: outstanding READ/atomic requests come back as flushed events.
void Qp::detach_rx() noexcept {
    if (flow_ >= 0) {
        std::atomic<bool> done{false};
        if (engine_.rx_thread()->remove(static_cast<std::uint16_t>(flow_), done)) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (!done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until)
                std::this_thread::yield();
        }
        if (!done.load(std::memory_order_acquire)) {
            // The RX thread did not answer: it may still call the receive half; leaking is safer than freeing.
            log::error("RX thread did not release QP {} in 2 s", qp_num_);
            (void)rx_.release();
            return;
        }
        engine_.free_flow(flow_);
        flow_ = -1;
    }
    if (ring_) ring_->ring_on(nullptr, -1);
    if (handler_) handler_->placed_elsewhere = false;
    const bool was_closing = closing_;
    closing_ = true;  // a flush, not a protocol error
    drain_events();   // what the receive half reported on the RX thread comes first
    if (rx_) {
        rx_->set_sink(*this);  // it runs here again
        rx_->stop();           // what it still held: flushed, applied at once
    }
    closing_ = was_closing;
}

}  // namespace softrdma::verbs::detail

// ==== the handle ==============================================================================================

namespace softrdma::verbs {

const char* to_string(WrOpcode o) noexcept {
    switch (o) {
    case WrOpcode::send: return "send";
    case WrOpcode::send_with_imm: return "send_with_imm";
    case WrOpcode::send_with_inv: return "send_with_inv";
    case WrOpcode::rdma_write: return "rdma_write";
    case WrOpcode::rdma_write_with_imm: return "rdma_write_with_imm";
    case WrOpcode::rdma_read: return "rdma_read";
    case WrOpcode::atomic_fetch_and_add: return "atomic_fetch_and_add";
    case WrOpcode::atomic_cmp_and_swp: return "atomic_cmp_and_swp";
    }
    return "?";
}

const char* to_string(PostErrc e) noexcept {
    switch (e) {
    case PostErrc::none: return "none";
    case PostErrc::invalid_state: return "invalid QP state";
    case PostErrc::queue_full: return "queue full";
    case PostErrc::too_many_sge: return "too many SGEs";
    case PostErrc::bad_lkey: return "bad lkey or SGE outside its region";
    case PostErrc::bad_length: return "bad length";
    case PostErrc::invalid_opcode: return "invalid opcode";
    case PostErrc::bad_remote_address: return "bad remote address (the range wraps past 2^64, or an atomic's target is not 8-byte aligned)";
    case PostErrc::not_agreed: return "RFC 7306 operation (immediate data, atomic) on a connection that did not agree to it";
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

QueuePair::QueuePair(std::unique_ptr<detail::Qp> impl) : impl_(std::move(impl)) {}
QueuePair::~QueuePair() = default;
PostResult<SendWr> QueuePair::post_send(std::span<const SendWr> wrs) noexcept { return impl_->post_send(wrs); }
PostResult<RecvWr> QueuePair::post_recv(std::span<const RecvWr> wrs) noexcept { return impl_->post_recv(wrs); }
bool QueuePair::modify_state(QpState s) noexcept { return impl_->modify_state(s); }
QpState QueuePair::state() const noexcept { return impl_->state(); }
std::uint32_t QueuePair::qp_num() const noexcept { return impl_->qp_num(); }
const std::optional<TerminateInfo>& QueuePair::terminate_info() const noexcept { return impl_->terminate_info(); }
const QpCap& QueuePair::cap() const noexcept { return impl_->cap(); }
std::uint32_t QueuePair::pd_handle() const noexcept { return impl_->pd(); }

std::unique_ptr<QueuePair> ProtectionDomain::create_qp(const QpInitAttr& attr) {
    if (attr.send_cq == nullptr || attr.recv_cq == nullptr) throw Error("create_qp: send_cq and recv_cq needed");
    if (attr.cap.max_send_wr == 0 || (attr.cap.max_recv_wr == 0 && attr.srq == nullptr))
        throw Error("create_qp: zero queue depth");
    if (attr.cap.max_send_wr >= (1u << 24)) throw Error("create_qp: max_send_wr too large");
    if (attr.cap.max_send_sge > kMaxSge || attr.cap.max_recv_sge > kMaxSge)
        throw Error("create_qp: at most kMaxSge (8) SGEs");
    if (attr.srq != nullptr && attr.srq->impl().pd() != handle_) throw Error("create_qp: the SRQ belongs to another PD");
    engine_->check_open("create_qp");
    detail::Engine& e = *engine_;
    const std::uint32_t qpn = e.add_qp();  // throws when max_qp is reached
    try {
        return std::make_unique<QueuePair>(std::make_unique<detail::Qp>(engine_, handle_, attr, qpn));
    } catch (...) {
        e.remove_qp(nullptr);
        throw;
    }
}

}  // namespace softrdma::verbs
