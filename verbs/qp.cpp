// SPDX-License-Identifier: MIT
// QueuePair: post_send/post_recv, the rdmap::Upper (every memory check of the stream in one place), and the
// stream glue: TCP bytes -> deframer -> endpoint (RX), endpoint -> whole FPDUs -> TCP (TX).
#include <algorithm>
#include <cstring>

#include "mpa/errors.hpp"
#include "rdmap/stream.hpp"
#include "stack/tcp.hpp"
#include "verbs/verbs.hpp"

namespace softrdma::verbs {
namespace {

// READ sink STags name a QP-local sink list (the READ WR's slot), not a region: they are only ever looked up
// with Access::local_write, which RDMAP uses for READ responses to our own requests (it checks the response
// carries the STag of the oldest request). MR STags have index < 2^24 - 1 << 8, so the spaces never meet for
// max_mr below 0xff0000.
constexpr std::uint32_t kReadSinkTag = 0xff000000u;
constexpr std::uint32_t kRtrStag = 1;                 // RFC 6581 RTR: STag 1 (Chelsio refuses 0)
constexpr std::uint64_t kRtrWrId = ~std::uint64_t{0};  // the RTR's endpoint wr_id: not a slot, no completion
constexpr std::uint32_t kNoSlot = ~0u;

}  // namespace

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
      rq_(attr.srq != nullptr ? 0 : attr.cap.max_recv_wr),
      srq_(attr.srq) {
    for (std::uint32_t i = 0; i < sq_.size(); ++i) sq_[i].next_free = i + 1 < sq_.size() ? i + 1 : kNoSlot;
    sq_free_ = 0;
    state_ = QpState::init;  // as rdma_create_qp: ready for post_recv before the connection
}

QueuePair::~QueuePair() {
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
        }
        schedule_tx();
    }
    return {};
}

PostResult<RecvWr> QueuePair::post_recv(std::span<const RecvWr> wrs) noexcept {
    for (const RecvWr& wr : wrs) {
        if (state_ == QpState::reset || srq_ != nullptr) return {PostErrc::invalid_state, &wr};
        if (wr.sg_list.size() > cap_.max_recv_sge) return {PostErrc::too_many_sge, &wr};
        if (state_ == QpState::err) {
            recv_cq_->push(WorkCompletion{.wr_id = wr.wr_id, .status = WcStatus::wr_flush_err, .opcode = WcOpcode::recv,
                                          .qp_num = qp_num_});
            continue;
        }
        if (rq_count_ == rq_.size()) return {PostErrc::queue_full, &wr};
        RecvSlot& r = rq_[(rq_head_ + rq_count_) % rq_.size()];
        r.nsge = 0;
        std::uint64_t total = 0;
        for (const Sge& g : wr.sg_list) {
            if (check_sge(g, true, r.sge[r.nsge]) != PostErrc::none) return {PostErrc::bad_lkey, &wr};
            ++r.nsge;
            total += g.length;
        }
        if (total > 0xffffffffu) return {PostErrc::bad_length, &wr};
        r.wr_id = wr.wr_id;
        r.total = static_cast<std::uint32_t>(total);
        r.bound = false;
        ++rq_count_;
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
    using rdmap::MemError;
    if (acc == rdmap::Access::local_write) {
        // READ response into the sink list of our READ WR in slot (stag & 0xffffff); `to` counts from 0.
        const std::uint32_t slot = stag & 0x00ffffffu;
        if ((stag & 0xff000000u) != kReadSinkTag || slot >= sq_.size()) return {.err = MemError::invalid_stag};
        const SqSlot& s = sq_[slot];
        std::uint64_t off = to;
        for (std::size_t i = 0; i < s.nsink; ++i) {
            if (off < s.sink[i].size())
                return {s.sink[i].data() + off, std::min<std::size_t>(len, s.sink[i].size() - off), MemError::none};
            off -= s.sink[i].size();
        }
        return {.err = MemError::bounds};
    }
    std::uint32_t need = 0;
    switch (acc) {
    case rdmap::Access::remote_write: need = access::remote_write; break;
    case rdmap::Access::remote_read: need = access::remote_read; break;
    case rdmap::Access::remote_atomic: need = access::remote_atomic; break;
    case rdmap::Access::local_write: break;
    }
    return ctx_.mr_lookup(stag, to, len, pd_.handle(), need);
}

RecvSlot* QueuePair::bound_recv(std::uint32_t msn) noexcept {
    RecvSlot* r = srq_ != nullptr ? (srq_has_ ? &srq_bound_ : nullptr) : (rq_count_ != 0 ? &rq_[rq_head_] : nullptr);
    return r != nullptr && r->bound && r->msn == msn ? r : nullptr;
}

rdmap::MemError QueuePair::recv_begin(std::uint32_t msn) {
    if (srq_ != nullptr) {
        if (srq_has_ || !srq_->take(srq_bound_)) return rdmap::MemError::no_receive;
        srq_has_ = true;
        srq_bound_.bound = true;
        srq_bound_.msn = msn;
        return rdmap::MemError::none;
    }
    if (rq_count_ == 0) return rdmap::MemError::no_receive;
    RecvSlot& r = rq_[rq_head_];
    r.bound = true;
    r.msn = msn;
    return rdmap::MemError::none;
}

rdmap::Mem QueuePair::recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) {
    const RecvSlot* rp = bound_recv(msn);
    if (rp == nullptr) return {.err = rdmap::MemError::bounds};
    const RecvSlot& r = *rp;
    std::uint32_t off = mo;
    for (std::size_t i = 0; i < r.nsge; ++i) {
        if (off < r.sge[i].size())
            return {r.sge[i].data() + off, std::min<std::size_t>(len, r.sge[i].size() - off), rdmap::MemError::none};
        off -= static_cast<std::uint32_t>(r.sge[i].size());
    }
    return {.err = rdmap::MemError::bounds};
}

rdmap::MemError QueuePair::invalidate(std::uint32_t stag) {
    Context::MrEntry* e = ctx_.mr_entry(stag);
    if (e == nullptr) return rdmap::MemError::invalid_stag;
    if (e->key != (stag & 0xffu) || !e->valid) return rdmap::MemError::invalidated;
    if (e->pd != pd_.handle()) return rdmap::MemError::wrong_pd;
    e->valid = false;
    return rdmap::MemError::none;
}

void QueuePair::on_completion(const rdmap::Completion& c) {
    if (c.kind == rdmap::WcKind::recv) {
        const RecvSlot* rp = bound_recv(c.msn);
        if (rp == nullptr) return;
        const RecvSlot& r = *rp;
        WorkCompletion wc{.wr_id = r.wr_id,
                          .status = c.status == rdmap::WcStatus::success ? WcStatus::success : WcStatus::wr_flush_err,
                          .opcode = c.has_imm ? WcOpcode::recv_rdma_with_imm : WcOpcode::recv,
                          .byte_len = c.byte_len,
                          .imm_data = c.imm,
                          .invalidated_rkey = c.inv_stag,
                          .qp_num = qp_num_};
        if (c.has_imm) wc.wc_flags |= wc_flags::with_imm;
        if (c.has_inv) wc.wc_flags |= wc_flags::with_inv;
        if (c.solicited) wc.wc_flags |= wc_flags::solicited;
        if (srq_ != nullptr) {
            srq_has_ = false;
        } else {
            rq_head_ = (rq_head_ + 1) % rq_.size();
            --rq_count_;
        }
        recv_cq_->push(wc);
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
    if (!closing_) term_ = TerminateInfo{t.code, t.received};
    enter_error();
}

// ==== state ==================================================================================================

void QueuePair::flush_rq() noexcept {
    if (srq_has_) {  // the SRQ WR this QP took; the SRQ's own WRs stay for the other QPs
        recv_cq_->push(WorkCompletion{.wr_id = srq_bound_.wr_id, .status = WcStatus::wr_flush_err,
                                      .opcode = WcOpcode::recv, .qp_num = qp_num_});
        srq_has_ = false;
    }
    while (rq_count_ > 0) {
        const RecvSlot& r = rq_[rq_head_];
        recv_cq_->push(WorkCompletion{.wr_id = r.wr_id, .status = WcStatus::wr_flush_err, .opcode = WcOpcode::recv,
                                      .qp_num = qp_num_});
        rq_head_ = (rq_head_ + 1) % rq_.size();
        --rq_count_;
    }
}

void QueuePair::enter_error() noexcept {
    state_ = QpState::err;
    flush_rq();  // the endpoint flushes its send side right after on_terminate
    schedule_tx();  // the TERMINATE goes out, then the connection closes (tx_pump)
}

void QueuePair::stream_lost() noexcept {
    closing_ = true;
    tx_len_ = 0;
    if (ep_ && ep_->state() == rdmap::State::operational) {
        ep_->on_llp_error(mpa::kTermConnectionLost);  // flushes SQ/ORQ through on_completion; nothing is sent
    }
    state_ = QpState::err;
    flush_rq();
}

void QueuePair::schedule_tx() noexcept { ctx_.schedule_tx(this); }

// ==== stream =================================================================================================

void QueuePair::enter_rts(CmId& conn, const mpa::Agreed& agreed, std::uint32_t emss, bool initiator) {
    conn_ = &conn;
    fpdu_tx_.emplace(mpa::tx_config(agreed, emss));
    framer_.emplace(*fpdu_tx_);
    deframer_.emplace(mpa::rx_config(agreed));
    rdmap::Upper& upper = *this;
    ep_.emplace(upper, *framer_, rdmap::Config{.sq_depth = cap_.max_send_wr + 1 /* + the RTR */, .ird = agreed.ird, .ord = agreed.ord});
    tx_buf_.assign(std::max<std::uint32_t>(emss, 64), std::byte{0});
    tx_off_ = tx_len_ = 0;
    tx_gate_ = !initiator && agreed.responder_waits_for_first_fpdu;
    closing_ = false;
    state_ = QpState::rts;
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
    if (tx_gate_) {
        tx_gate_ = false;  // the initiator's first FPDU (or RTR) is arriving: the responder may send
        schedule_tx();
    }
    const std::uint64_t placed = ep_->placed_bytes();
    rdmap::receive(*deframer_, *ep_, bytes);
    ctx_.placed_bytes_ += ep_->placed_bytes() - placed;
    if (ep_->tx_ready()) schedule_tx();  // READ/atomic responses, TERMINATE
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
            const std::size_t n = tcp.write(std::span<const std::byte>(tx_buf_).subspan(tx_off_, tx_len_));
            tx_off_ += n;
            tx_len_ -= n;
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
        const std::size_t n = ep_->pull_tx(std::span<std::byte>(tx_buf_).first(room));
        if (n == 0) {
            schedule_tx();  // the next FPDU does not fit the send buffer yet
            break;
        }
        tx_off_ = 0;
        tx_len_ = n;
    }
    if (wrote) tcp.flush();
    // In error: once the TERMINATE is out, the connection closes (the CM does it in its poll stage).
    if (state_ == QpState::err && !closing_ && tx_len_ == 0 && !ep_->tx_ready()) {
        closing_ = true;
        conn_->qp_failed();
    }
}

// ==== shared receive queue ===================================================================================

std::unique_ptr<SharedReceiveQueue> ProtectionDomain::create_srq(const SrqInitAttr& attr) {
    if (attr.max_wr == 0) throw Error("create_srq: zero depth");
    if (attr.max_sge > rdmap::kMaxSge) throw Error("create_srq: at most rdmap::kMaxSge SGEs");
    return std::unique_ptr<SharedReceiveQueue>(new SharedReceiveQueue(ctx_, *this, attr));
}

SharedReceiveQueue::SharedReceiveQueue(Context& ctx, ProtectionDomain& pd, const SrqInitAttr& attr)
    : ctx_(ctx), pd_(pd), max_sge_(attr.max_sge), limit_(attr.srq_limit), ring_(attr.max_wr) {}

PostResult<RecvWr> SharedReceiveQueue::post_recv(std::span<const RecvWr> wrs) noexcept {
    for (const RecvWr& wr : wrs) {
        if (wr.sg_list.size() > max_sge_) return {PostErrc::too_many_sge, &wr};
        if (count_ == ring_.size()) return {PostErrc::queue_full, &wr};
        RecvSlot& r = ring_[(head_ + count_) % ring_.size()];
        r.nsge = 0;
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
        r.bound = false;
        ++count_;
    }
    return {};
}

bool SharedReceiveQueue::take(RecvSlot& out) noexcept {
    if (count_ == 0) return false;
    out = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    --count_;
    if (limit_ != 0 && count_ < limit_) {
        limit_ = 0;  // fires once per arm
        ctx_.push_async(AsyncEvent{AsyncEventType::srq_limit_reached, this});
    }
    return true;
}

}  // namespace softrdma::verbs
