// SPDX-License-Identifier: MIT
#include "verbs/qp_rx.hpp"

#include <algorithm>
#include <cstring>

#include "ddp/header.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/stream.hpp"
#include "rdmap/term_text.hpp"
#include "verbs/memory.hpp"
#include "verbs/srq.hpp"

namespace softrdma::verbs::detail {
namespace {

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

// ---- posted receives (consumer side) ----

rdmap::MemError RecvQueue::begin(std::uint32_t msn, bool& srq_limit) noexcept {
    srq_limit = false;
    if (has) return rdmap::MemError::no_receive;  // not reached: RDMAP binds one message at a time
    const bool got = srq != nullptr ? srq->take(bound, srq_limit) : ring.pop(bound);
    if (!got) return rdmap::MemError::no_receive;
    has = true;
    gone = false;
    bound.bound = true;
    bound.msn = msn;
    return rdmap::MemError::none;
}

const RecvSlot* RecvQueue::current(std::uint32_t msn) const noexcept { return has && bound.msn == msn ? &bound : nullptr; }

rdmap::Mem RecvQueue::place(const MemoryTable& mem, std::uint32_t msn, std::uint32_t mo, std::size_t len) noexcept {
    const RecvSlot* rp = current(msn);
    if (rp == nullptr) return {.err = rdmap::MemError::bounds};
    if (!mem.alive(rp->lease, rp->nsge)) {  // deregistered since the receive was posted
        gone = true;
        return {.err = rdmap::MemError::local_gone};
    }
    return scatter_piece(std::span(rp->sge).first(rp->nsge), mo, len);
}

WorkCompletion RecvQueue::complete(const rdmap::Completion& c, std::uint32_t qp_num) noexcept {
    WorkCompletion wc{.wr_id = bound.wr_id,
                      .status = c.status == rdmap::WcStatus::success ? WcStatus::success
                                : gone                                    ? WcStatus::loc_prot_err
                                                                          : WcStatus::wr_flush_err,
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

// ---- the receive half ----

RxHalf::RxHalf(MemoryTable& mem, std::uint32_t pd, std::uint32_t qp_num, RecvQueue& rq, std::uint32_t send_slots)
    : mem_(mem), pd_(pd), qp_num_(qp_num), rq_(rq), orq_(std::size_t{send_slots} + 1), sinks_(send_slots) {}

void RxHalf::start(const mpa::Agreed& agreed, const rdmap::Config& cfg, RxEventSink& sink,
                   std::atomic<std::uint64_t>& placed, std::uint64_t* cycles) {
    sink_ = &sink;
    placed_ = &placed;
    deframer_.emplace(mpa::rx_config(agreed));
    ep_.emplace(rdmap::Role::rx, *this, rdmap::no_framer(), cfg);
    if (cycles != nullptr) ep_->count_cycles(cycles, nullptr);
    first_ = true;
    term_pending_ = false;
    OrqMsg m;
    while (orq_.pop(m)) {  // a previous stream's
    }
}

void RxHalf::deliver(std::span<const std::byte> bytes) noexcept {
    if (!ep_ || bytes.empty()) return;
    OrqMsg m;
    while (orq_.pop(m)) {  // requests framed before their responses can arrive
        if (m.e.wr_id < sinks_.size()) sinks_[m.e.wr_id] = m.sink;
        ep_->expect_response(m.e);
    }
    if (first_) {
        first_ = false;
        sink_->emit(RxEvent{.kind = RxEvent::Kind::first_bytes});
    }
    const std::uint64_t before = ep_->placed_bytes();
    rdmap::receive(*deframer_, *ep_, bytes);
    placed_->fetch_add(ep_->placed_bytes() - before, std::memory_order_relaxed);
    if (term_pending_) {  // after the endpoint flushed its outstanding requests (on_terminate)
        term_pending_ = false;
        term_.first_status = first_status_.value_or(WcStatus::wr_flush_err);
        first_status_.reset();
        sink_->emit(term_);
    }
}

void RxHalf::stop() noexcept {
    if (ep_ && ep_->state() == rdmap::State::operational) ep_->stop(mpa::kTermConnectionLost);
    // Requests the tx half framed that the endpoint never took: none arrived for it since (the stream died with
    // a READ just sent), or it had failed already (an ORD credit that a completion gave back was spent before
    // the TERMINATE's event reached the tx half: with an RX thread the two events can be drained apart). They
    // are flushed after the endpoint's own, which are older. Before this they were never completed.
    OrqMsg m;
    while (orq_.pop(m))
        sink_->emit(RxEvent{.kind = RxEvent::Kind::request_done, .slot = m.e.wr_id, .status = WcStatus::wr_flush_err,
                            .answered = false});
}

rdmap::Mem RxHalf::tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access acc) {
    if (acc == rdmap::Access::local_write) {  // READ response into our READ WR's sink list (this side's copy)
        const std::uint32_t slot = read_sink_slot(stag, sinks_.size());
        if (slot == kNoSlot) return {.err = rdmap::MemError::invalid_stag};
        if (!mem_.alive(sinks_[slot].lease, sinks_[slot].n)) {  // deregistered since the READ was posted
            gone_slot_ = slot;
            return {.err = rdmap::MemError::local_gone};
        }
        return scatter_piece(sinks_[slot].spans(), to, len);
    }
    return mem_.lookup(stag, to, len, pd_, remote_right(acc));
}

rdmap::MemError RxHalf::recv_begin(std::uint32_t msn) {
    bool limit = false;
    const rdmap::MemError e = rq_.begin(msn, limit);
    if (limit) sink_->emit(RxEvent{.kind = RxEvent::Kind::srq_limit});
    return e;
}

rdmap::Mem RxHalf::recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) { return rq_.place(mem_, msn, mo, len); }

rdmap::MemError RxHalf::invalidate(std::uint32_t stag) { return mem_.invalidate(stag, pd_); }

void RxHalf::on_completion(const rdmap::Completion& c) {
    if (c.kind == rdmap::WcKind::recv) {
        if (rq_.current(c.msn) == nullptr) return;
        sink_->emit(RxEvent{.kind = RxEvent::Kind::recv, .wc = rq_.complete(c, qp_num_)});
        return;
    }
    WcStatus st = c.status == rdmap::WcStatus::success ? WcStatus::success
                  : c.wr_id == gone_slot_                 ? WcStatus::loc_prot_err
                                                          : WcStatus::wr_flush_err;
    if (c.wr_id == gone_slot_) gone_slot_ = ~std::uint64_t{0};
    if (st == WcStatus::wr_flush_err && first_status_) {  // the oldest request a received TERMINATE kills
        st = *first_status_;
        first_status_.reset();
    }
    // The atomic's original value goes into the WR's 8-byte SGE here (host order, as the target word), if that
    // region is still registered (else the WR fails: loc_prot_err); the completion event orders it before the
    // application sees the completion.
    if (st == WcStatus::success && c.kind == rdmap::WcKind::atomic && c.wr_id < sinks_.size() && sinks_[c.wr_id].n == 1) {
        if (mem_.alive(sinks_[c.wr_id].lease, 1))
            std::memcpy(sinks_[c.wr_id].sge[0].data(), &c.atomic_original, 8);
        else
            st = WcStatus::loc_prot_err;
    }
    sink_->emit(RxEvent{.kind = RxEvent::Kind::request_done, .slot = c.wr_id, .status = st,
                        .answered = c.status == rdmap::WcStatus::success});
}

// The stream failed here, or the peer's TERMINATE arrived. The event goes out when the endpoint call returns
// (deliver), after the endpoint flushed the requests it holds: the QP's tx half flushes the send queue when it
// applies the event, so flushes complete in posting order (requests on the wire first, as siw flushes its ORQ
// before its SQ).
void RxHalf::on_terminate(const rdmap::TermReport& t) {
    term_ = RxEvent{.kind = RxEvent::Kind::terminate, .code = t.code, .raw = t.raw, .cause = t.cause, .received = t.received};
    const std::size_t n = std::min(t.frame.size(), term_.term.size());
    if (n != 0) std::memcpy(term_.term.data(), t.frame.data(), n);  // a received TERMINATE has no frame to send
    term_.term_len = static_cast<std::uint8_t>(n);
    term_pending_ = true;
    if (t.received) first_status_ = term_effect(t.code, t.raw).status;
}

TermEffect term_effect(TermCode c, std::uint32_t raw) noexcept {
    // The RFC's layout, or Linux siw x86's when only that names a code.
    if (rdmap::term_text(c) == nullptr && rdmap::term_text(rdmap::term_code_siw_x86(raw)) != nullptr)
        c = rdmap::term_code_siw_x86(raw);
    if ((c.layer == TermLayer::ddp && c.etype == ddp::err::kEtypeTagged && c != ddp::err::t_version) ||
        (c.layer == TermLayer::rdmap && c.etype == rdmap::err::kEtypeProtection) || c == rdmap::err::o_cannot_invalidate)
        return {AsyncEventType::qp_access_err, WcStatus::rem_access_err};
    if (c.layer == TermLayer::ddp && c.etype == ddp::err::kEtypeUntagged && c != ddp::err::u_version)
        return {AsyncEventType::qp_req_err, WcStatus::rem_inv_req_err};
    return {AsyncEventType::qp_fatal, WcStatus::rem_op_err};
}

void RxHalf::on_inbound_request(const rdmap::IrqEntry& r) { sink_->emit(RxEvent{.kind = RxEvent::Kind::inbound, .irq = r}); }

// ---- the RX thread's sink ----

void RxEventRing::emit(const RxEvent& e) noexcept {
    if (!events_.push(e)) {
        lost_.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    // On the RX thread: ring the QP's doorbell once until the QP drains (it clears `rung_` first).
    if (doorbell_ != nullptr && !rung_.exchange(true, std::memory_order_acq_rel))
        doorbell_->push(static_cast<std::uint16_t>(flow_));  // never full: one entry per flow
}

}  // namespace softrdma::verbs::detail
