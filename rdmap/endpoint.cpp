// SPDX-License-Identifier: MIT
#include "rdmap/endpoint.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "ddp/segment.hpp"
#include "base/byteorder.hpp"
#include "mpa/crc32c.hpp"
#include "base/cycles.hpp"

namespace softrdma::rdmap {

// Atomics run on the target word with a lock-free atomic_ref: no lock on the data path.
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

namespace {

// RFC 5040 section 4.8 says which headers a TERMINATE carries; like siw we attach
//   - nothing for LLP (MPA) errors, RDMAP catastrophic errors, and version / opcode errors (the layout of the
//     offending segment is unknown);
//   - the DDP header for other DDP errors and RDMAP remote operation errors (M, D);
//   - DDP + RDMAP header for RDMAP remote protection errors (M, D, R).
struct Attach {
    bool m{false};
    bool d{false};
    bool r{false};
    std::size_t hdr_bytes{0};
};

Attach attach_rule(TermCode c, std::span<const std::byte> hdr) {
    if (hdr.size() < 2) return {};
    const bool tagged = ddp::ctrl_tagged(load_be16(hdr, 0));
    const std::size_t ddp_len = std::min(hdr.size(), tagged ? ddp::kTaggedHeaderLen : ddp::kUntaggedHeaderLen);
    switch (c.layer) {
    case TermLayer::llp:
        return {};
    case TermLayer::ddp:
        if (c == ddp::err::t_version || c == ddp::err::u_version) return {};
        return {true, true, false, ddp_len};
    case TermLayer::rdmap:
        if (c.etype == err::kEtypeCatastrophic || c == err::o_version || c == err::o_opcode) return {};
        if (c.etype == err::kEtypeProtection) {
            // The whole offending header; R only when it is an RDMA Read Request's (RFC 5040 section 4.8: "RDMA
            // Read Request Header Included"): a WRITE's or an atomic's header is attached with R clear.
            const bool read_request = !tagged && ctrl_opcode(load_be16(hdr, 0)) ==
                                                     static_cast<std::uint8_t>(Opcode::read_request);
            return {true, true, read_request, hdr.size()};
        }
        return {true, true, false, ddp_len};
    }
    return {};
}

WcKind wc_kind(WrOp op) {
    switch (op) {
    case WrOp::send: return WcKind::send;
    case WrOp::write: return WcKind::write;
    case WrOp::read: return WcKind::read;
    case WrOp::fetch_add:
    case WrOp::cmp_swap: return WcKind::atomic;
    }
    return WcKind::send;
}

std::size_t sgl_length(const WorkRequest& wr) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < wr.num_sge; ++i) n += wr.sgl[i].size();
    return n;
}

}  // namespace

Endpoint::Endpoint(Role role, Upper& upper, Framer& framer, Config cfg)
    : role_(role),
      upper_(upper),
      framer_(framer),
      cfg_(cfg),
      sq_(std::max<std::uint32_t>(cfg.sq_depth, 1)),
      orq_(std::max<std::uint16_t>(cfg.ord, 1)),
      irq_(std::max<std::uint16_t>(cfg.ird, 1)) {}

// ==== choke point ============================================================================================


TermCode Endpoint::fail(TermCode cause, std::span<const std::byte> hdr, std::size_t seg_len) {
    if (state_ == State::error) return error_ ? *error_ : cause;
    if (held_recv_) deliver_held();  // that SEND arrived whole before the error
    state_ = State::error;
    const bool tagged_msg = hdr.size() >= 2 && ddp::ctrl_tagged(load_be16(hdr, 0));
    const TermCode code = cfg_.opaque_access_errors ? opaque_access_error(cause, tagged_msg) : cause;
    error_ = code;

    // TERMINATE: untagged, QN 2, MSN 1 (the only message on that queue), MO 0 (RFC 5040 section 4.8).
    const Attach a = attach_rule(code, hdr);
    std::span<std::byte> t{term_tx_};
    const OpInfo& op = op_info(Opcode::terminate);
    ddp::UntaggedHeader uh{ddp::ctrl_with_last(op.ctrl, true), 0, kQnTerminate, tx_msn_[kQnTerminate]++, 0};
    uh.encode(t);
    const TerminateHeader th{code, a.m, a.d, a.r};
    th.encode(t);
    std::size_t len = kTerminateLen;
    if (a.hdr_bytes > 0) {
        store_be16(t, len, static_cast<std::uint16_t>(std::min<std::size_t>(seg_len, 0xFFFF)));
        len += 2;
        std::memcpy(t.data() + len, hdr.data(), a.hdr_bytes);
        len += a.hdr_bytes;
    }
    term_tx_len_ = len;
    term_pending_ = true;

    upper_.on_terminate(TermReport{code, false, a.m, a.d, a.r,
                                   std::span<const std::byte>(term_tx_).subspan(kTerminateLen, len - kTerminateLen),
                                   th.word(), std::span<const std::byte>(term_tx_).first(len), cause});
    flush();
    return code;
}

void Endpoint::deliver_held() {
    const Completion c = *held_recv_;
    held_recv_.reset();
    upper_.on_completion(c);
}

TermCode Endpoint::fail_rx(TermCode code) {
    return fail(code, std::span<const std::byte>(rx_.hdr).first(rx_.hdr_len), rx_.hdr_len + rx_.payload_len);
}

void Endpoint::on_llp_error(TermCode code) { fail(code, {}, 0); }

void Endpoint::enter_error_received(TermCode code, const TerminateHeader& th, std::span<const std::byte> attached) {
    if (state_ == State::error) return;
    if (held_recv_) deliver_held();
    state_ = State::error;
    error_ = code;
    upper_.on_terminate(TermReport{code, true, th.m, th.d, th.r, attached, th.word(), {}, code});
    flush();
}

// ---- split endpoints ----------------------------------------------------------------------------------------

// tx counts the requests it framed until request_done(); rx holds them (expect_response) until their response.
std::uint32_t Endpoint::orq_outstanding() const {
    return role_ == Role::tx ? orq_sent_ : static_cast<std::uint32_t>(orq_.size());
}
// rx counts the requests it accepted minus those tx had answered when this input began; tx holds them (answer)
// until answered.
std::uint32_t Endpoint::irq_outstanding() const {
    if (role_ == Role::rx) return irq_in_ - answered_seen_;
    return static_cast<std::uint32_t>(irq_.size());
}
void Endpoint::push_orq(const OrqEntry& e) {  // tx: a request framed
    ++orq_sent_;
    upper_.on_request_sent(e);
}
void Endpoint::push_irq(const IrqEntry& e) {  // rx: an inbound request accepted
    ++irq_in_;
    upper_.on_inbound_request(e);
}
void Endpoint::pop_irq() {  // tx: answered
    irq_.pop();
    if (cfg_.answered != nullptr) cfg_.answered->fetch_add(1, std::memory_order_release);
}
void Endpoint::expect_response(const OrqEntry& e) {
    if (state_ == State::operational && !orq_.full()) orq_.push(e);  // never full: the tx side keeps ORD
}
void Endpoint::request_done() {
    if (orq_sent_ > 0) --orq_sent_;
}
void Endpoint::answer(const IrqEntry& e) {
    if (state_ == State::operational && !irq_.full()) irq_.push(e);  // never full: the rx side keeps IRD
}
void Endpoint::send_terminate(TermCode code, std::span<const std::byte> terminate) {
    if (state_ == State::error) return;
    if (held_recv_) deliver_held();
    state_ = State::error;
    error_ = code;
    const std::size_t n = std::min(terminate.size(), term_tx_.size());
    std::memcpy(term_tx_.data(), terminate.data(), n);
    term_tx_len_ = n;
    term_pending_ = n >= kTerminateLen;
    flush();
}
void Endpoint::stop(TermCode code) {
    if (state_ == State::error) return;
    if (held_recv_) deliver_held();
    state_ = State::error;
    error_ = code;
    flush();
}

void Endpoint::flush() {
    // Requests already handed to the wire and waiting for a response complete first, then the send queue,
    // each in posting order.
    for (std::size_t i = 0; i < orq_.size(); ++i) {
        const OrqEntry& o = orq_.at(i);
        upper_.on_completion(Completion{.kind = wc_kind(o.op), .status = WcStatus::flushed, .wr_id = o.wr_id});
    }
    for (std::size_t i = 0; i < sq_.size(); ++i) {
        const WorkRequest& w = sq_.at(i);
        upper_.on_completion(Completion{.kind = wc_kind(w.op), .status = WcStatus::flushed, .wr_id = w.wr_id});
    }
    orq_.clear();
    sq_.clear();
    irq_.clear();
    tx_src_ = TxSrc::none;
}

// ==== TX =====================================================================================================

PostStatus Endpoint::post(const WorkRequest& wr) {
    if (state_ != State::operational) return PostStatus::not_operational;
    if (wr.num_sge > kMaxSge) return PostStatus::bad_wr;
    if (!cfg_.rfc7306 && (wr.with_imm || wr.op == WrOp::fetch_add || wr.op == WrOp::cmp_swap))
        return PostStatus::not_agreed;  // RFC 7306 messages reach only peers that agreed to them (Config::rfc7306)
    const std::size_t len = sgl_length(wr);
    switch (wr.op) {
    case WrOp::send:
        if (len > 0xFFFFFFFFu) return PostStatus::bad_wr;  // MO is 32 bits (RFC 5041 section 4.4)
        break;
    case WrOp::write:
        if (wr.with_inv) return PostStatus::bad_wr;
        if (len > 0 && wr.remote_to > ~std::uint64_t{0} - (len - 1)) return PostStatus::bad_address;  // TO wrap
        break;
    case WrOp::read:
    case WrOp::fetch_add:
    case WrOp::cmp_swap:
        if (wr.with_imm || wr.with_inv || wr.num_sge != 0) return PostStatus::bad_wr;
        if (cfg_.ord == 0) return PostStatus::bad_wr;  // no READ/atomic credits negotiated: it could never go
        if (wr.op != WrOp::read && (wr.remote_to & 7) != 0) return PostStatus::bad_address;  // RFC 7306: aligned
        if (wr.op == WrOp::read && wr.read_len > 0 && wr.remote_to > ~std::uint64_t{0} - (wr.read_len - 1u))
            return PostStatus::bad_address;  // the source's range wraps
        break;
    }
    if (sq_.full()) return PostStatus::queue_full;
    sq_.push(wr);
    return PostStatus::ok;
}

bool Endpoint::tx_ready() const {
    if (state_ == State::error) return term_pending_;
    if (!irq_.empty()) return true;
    if (sq_.empty()) return false;
    const WorkRequest& w = sq_.front();
    const bool request = w.op == WrOp::read || w.op == WrOp::fetch_add || w.op == WrOp::cmp_swap;
    return !(request && tx_src_ != TxSrc::sq && orq_outstanding() >= cfg_.ord);
}

Endpoint::NextPayload Endpoint::next_payload() const noexcept {
    // pull_tx's choice: the WR under way, else responses first, else the send queue's head.
    const bool sq_next = tx_src_ == TxSrc::sq || (tx_src_ == TxSrc::none && irq_.empty() && !sq_.empty());
    if (state_ == State::error || !sq_next || sq_.empty()) return {};
    const WorkRequest& wr = sq_.front();
    if ((wr.op != WrOp::send && wr.op != WrOp::write) || tx_phase_ != 0) return {};
    std::size_t off = tx_src_ == TxSrc::sq ? tx_sent_ : 0;
    for (std::size_t i = 0; i < wr.num_sge; ++i) {
        const std::span<const std::byte> g = wr.sgl[i];
        if (off < g.size()) return {g.data() + off, op_info(wr.op == WrOp::send ? Opcode::send : Opcode::write).hdr_len};
        off -= g.size();
    }
    return {};
}

std::size_t Endpoint::max_payload(std::size_t hdr_len) const {
    const std::size_t m = framer_.mulpdu();
    return m > hdr_len ? m - hdr_len : 0;
}

std::size_t Endpoint::pull_tx(std::span<std::byte> out) {
    std::size_t used = 0;
    for (;;) {
        if (state_ == State::error) {
            if (term_pending_) used += emit_terminate(out.subspan(used));
            return used;
        }
        if (tx_src_ == TxSrc::none) {
            tx_sent_ = 0;
            tx_phase_ = 0;
            if (!irq_.empty()) {
                tx_src_ = TxSrc::irq;  // responses first: they free the peer's ORD credits
            } else if (!sq_.empty()) {
                const WorkRequest& w = sq_.front();
                const bool request = w.op == WrOp::read || w.op == WrOp::fetch_add || w.op == WrOp::cmp_swap;
                if (request && orq_outstanding() >= cfg_.ord) return used;  // ORD credits exhausted: wait
                tx_src_ = TxSrc::sq;
            } else {
                return used;
            }
        }
        const std::size_t n = tx_src_ == TxSrc::irq ? emit_irq(out.subspan(used)) : emit_sq(out.subspan(used));
        if (n == 0 && state_ == State::operational) return used;
        used += n;
    }
}

std::size_t Endpoint::emit_terminate(std::span<std::byte> out) {
    const std::span<const std::byte> t(term_tx_);
    const std::span<const std::byte> piece = t.subspan(kTerminateLen, term_tx_len_ - kTerminateLen);
    if (framer_.wire_size(term_tx_len_) > out.size()) return 0;
    const std::size_t n = framer_.write(out, t.first(kTerminateLen), std::span<const std::span<const std::byte>>(&piece, 1));
    term_pending_ = false;
    return n;
}

std::size_t Endpoint::frame(std::span<std::byte> out, std::size_t hdr_len, std::size_t npieces) {
    std::size_t ulpdu = hdr_len;
    for (std::size_t i = 0; i < npieces; ++i) ulpdu += pieces_[i].size();
    if (framer_.wire_size(ulpdu) > out.size()) return 0;
    const std::uint64_t t0 = prof_framer_ != nullptr ? cycles_now() : 0;
    const std::size_t n = framer_.write(out, std::span<const std::byte>(hdr_tx_).first(hdr_len),
                                        std::span<const std::span<const std::byte>>(pieces_).first(npieces));
    if (prof_framer_ != nullptr) *prof_framer_ += cycles_now() - t0;
    if (n != 0) framed_bytes_ += ulpdu - hdr_len;
    return n;
}

std::size_t Endpoint::gather_sgl(const WorkRequest& wr, std::size_t off, std::size_t len) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < wr.num_sge && len > 0; ++i) {
        const std::span<const std::byte> s = wr.sgl[i];
        if (off >= s.size()) {
            off -= s.size();
            continue;
        }
        const std::size_t take = std::min(len, s.size() - off);
        pieces_[n++] = s.subspan(off, take);
        len -= take;
        off = 0;
    }
    return n;
}

void Endpoint::finish_sq_head() {
    sq_.pop();
    tx_src_ = TxSrc::none;
}

std::size_t Endpoint::emit_sq(std::span<std::byte> out) {
    WorkRequest& wr = sq_.front();
    const std::span<std::byte> h(hdr_tx_);

    // Trailing Immediate Data message of a SEND/WRITE with immediate (RFC 7306 section 4): QN 0, one segment.
    if (tx_phase_ == 1) {
        const OpInfo& op = op_info(wr.solicited ? Opcode::imm_data_se : Opcode::imm_data);
        ddp::UntaggedHeader{ddp::ctrl_with_last(op.ctrl, true), 0, kQnSend, tx_msn_[kQnSend], 0}.encode(h);
        encode_imm(h, wr.imm);
        const std::size_t n = frame(out, op.hdr_len, 0);
        if (n == 0) return 0;
        ++tx_msn_[kQnSend];
        if (wr.signaled) upper_.on_completion(Completion{.kind = wc_kind(wr.op), .wr_id = wr.wr_id});
        finish_sq_head();
        return n;
    }

    switch (wr.op) {
    case WrOp::send:
    case WrOp::write: {
        const bool send = wr.op == WrOp::send;
        // With immediate data the SE flag goes on the Immediate Data message, which completes the WR.
        const bool se = wr.solicited && !wr.with_imm;
        const Opcode opc = !send ? Opcode::write
                           : wr.with_inv ? (se ? Opcode::send_se_inv : Opcode::send_inv)
                                         : (se ? Opcode::send_se : Opcode::send);
        const OpInfo& op = op_info(opc);
        const std::size_t total = sgl_length(wr);
        const std::size_t maxp = max_payload(op.hdr_len);
        if (maxp == 0 && total > 0) return 0;  // MULPDU below the header length: nothing can go out
        ddp::Segment seg = ddp::SegmentPlan(total, std::max<std::size_t>(maxp, 1)).from(tx_sent_);
        if (seg.len != 0 && !upper_.source_alive(wr.wr_id)) {  // its memory was deregistered since the post
            fail(err::local_catastrophic, {}, 0);
            return 0;
        }
        const std::size_t np = gather_sgl(wr, seg.offset, seg.len);
        if (send) {
            // SEND with immediate data: every segment says that its Immediate Data follows (kImmFollows).
            const std::uint32_t rsvd_ulp = wr.with_inv ? wr.inv_stag : wr.with_imm ? kImmFollows : 0;
            ddp::UntaggedHeader{ddp::ctrl_with_last(op.ctrl, seg.last), rsvd_ulp, kQnSend,
                                tx_msn_[kQnSend], static_cast<std::uint32_t>(seg.offset)}
                .encode(h);
        } else {
            ddp::TaggedHeader{ddp::ctrl_with_last(op.ctrl, seg.last), wr.remote_stag, wr.remote_to + seg.offset}.encode(h);
        }
        const std::size_t n = frame(out, op.hdr_len, np);
        if (n == 0) return 0;
        tx_sent_ += seg.len;
        if (seg.last) {
            if (send) ++tx_msn_[kQnSend];
            if (wr.with_imm) {
                tx_phase_ = 1;
            } else {
                if (wr.signaled) upper_.on_completion(Completion{.kind = wc_kind(wr.op), .wr_id = wr.wr_id});
                finish_sq_head();
            }
        }
        return n;
    }
    case WrOp::read: {
        const OpInfo& op = op_info(Opcode::read_request);
        ddp::UntaggedHeader{ddp::ctrl_with_last(op.ctrl, true), 0, kQnReadRequest, tx_msn_[kQnReadRequest], 0}.encode(h);
        ReadRequest{wr.local_stag, wr.local_to, wr.read_len, wr.remote_stag, wr.remote_to}.encode(h);
        const std::size_t n = frame(out, op.hdr_len, 0);
        if (n == 0) return 0;
        ++tx_msn_[kQnReadRequest];
        push_orq(OrqEntry{wr.op, wr.signaled, wr.wr_id, wr.local_stag, wr.local_to, wr.read_len, 0});
        finish_sq_head();
        return n;
    }
    case WrOp::fetch_add:
    case WrOp::cmp_swap: {
        const OpInfo& op = op_info(Opcode::atomic_request);
        ddp::UntaggedHeader{ddp::ctrl_with_last(op.ctrl, true), 0, kQnReadRequest, tx_msn_[kQnReadRequest], 0}.encode(h);
        AtomicRequest a{};
        a.req_id = next_req_id_;
        a.stag = wr.remote_stag;
        a.to = wr.remote_to;
        a.add_swap = wr.swap_add;
        if (wr.op == WrOp::fetch_add) {
            a.op = static_cast<std::uint8_t>(AtomicOp::fetch_add);  // no field boundaries: mask 0
        } else {
            a.op = static_cast<std::uint8_t>(AtomicOp::cmp_swap);  // verbs semantics: whole-word compare and swap
            a.compare = wr.compare;
            a.compare_mask = ~std::uint64_t{0};
            a.add_swap_mask = ~std::uint64_t{0};
        }
        a.encode(h);
        const std::size_t n = frame(out, op.hdr_len, 0);
        if (n == 0) return 0;
        ++tx_msn_[kQnReadRequest];
        push_orq(OrqEntry{wr.op, wr.signaled, wr.wr_id, 0, 0, 8, next_req_id_++});
        finish_sq_head();
        return n;
    }
    }
    return 0;
}

std::size_t Endpoint::emit_irq(std::span<std::byte> out) {
    IrqEntry& e = irq_.front();
    const std::span<std::byte> h(hdr_tx_);
    if (e.atomic) {
        const OpInfo& op = op_info(Opcode::atomic_response);
        ddp::UntaggedHeader{ddp::ctrl_with_last(op.ctrl, true), 0, kQnAtomicResponse, tx_msn_[kQnAtomicResponse], 0}
            .encode(h);
        e.ar.encode(h);
        const std::size_t n = frame(out, op.hdr_len, 0);
        if (n == 0) return 0;
        ++tx_msn_[kQnAtomicResponse];
        pop_irq();
        tx_src_ = TxSrc::none;
        return n;
    }
    // READ response (RFC 5040 section 4.5): tagged to the requester's sink, data from our source region,
    // which is looked up again here (it may have been deregistered since the request was checked).
    const OpInfo& op = op_info(Opcode::read_response);
    const std::size_t maxp = max_payload(op.hdr_len);
    if (maxp == 0 && e.rr.size > 0) return 0;
    ddp::Segment seg = ddp::SegmentPlan(e.rr.size, std::max<std::size_t>(maxp, 1)).from(tx_sent_);
    std::size_t np = 0;
    std::size_t got = 0;
    while (got < seg.len && np < kMaxPieces) {
        const Mem m = upper_.tagged(e.rr.src_stag, e.rr.src_to + seg.offset + got, seg.len - got, Access::remote_read);
        if (m.err != MemError::none || m.ptr == nullptr || m.len == 0 || m.len > seg.len - got) {
            const TermCode c = term_code_for(m.err == MemError::none ? MemError::bounds : m.err, MemUse::rdma_source);
            fail(c, std::span<const std::byte>(e.hdr), kReadRequestLen);
            return 0;
        }
        pieces_[np++] = std::span<const std::byte>(m.ptr, m.len);
        got += m.len;
    }
    if (got < seg.len) {  // source came back in more pieces than one FPDU gathers: cut the segment here
        seg.len = got;
        seg.last = false;
    }
    ddp::TaggedHeader{ddp::ctrl_with_last(op.ctrl, seg.last), e.rr.sink_stag, e.rr.sink_to + seg.offset}.encode(h);
    const std::size_t n = frame(out, op.hdr_len, np);
    if (n == 0) return 0;
    tx_sent_ += seg.len;
    if (seg.last) {
        pop_irq();
        tx_src_ = TxSrc::none;
    }
    return n;
}

// ==== RX =====================================================================================================

std::size_t Endpoint::ulpdu_header_length(std::uint16_t ctrl) {
    if (state_ == State::error) return 0;
    if (ddp::check_ddp_ctrl(ctrl) || ctrl_rdmap_version(ctrl) != kRdmapVersion) return 0;
    const OpInfo& op = kOpTable[ctrl_opcode(ctrl)];
    if (!op.valid || op.tagged != ddp::ctrl_tagged(ctrl)) return 0;
    return op.hdr_len;
}

ProtoStatus Endpoint::on_ulpdu_header(std::span<const std::byte> hdr, std::size_t payload_len) {
    if (prof_rx_ != nullptr) [[unlikely]] {
        const std::uint64_t t0 = cycles_now();
        const ProtoStatus st = rx_header(hdr, payload_len);
        *prof_rx_ += cycles_now() - t0;
        return st;
    }
    return rx_header(hdr, payload_len);
}

// Every field is read from rx_.hdr, the header's private copy taken first: the input may lie in memory another
// process can rewrite while we parse it (a memif peer's buffers), and a field read twice from there could pass
// a check and then differ where it is used. What decides where and how much is written is read once.
ProtoStatus Endpoint::rx_header(std::span<const std::byte> in_hdr, std::size_t payload_len) {
    if (state_ == State::error) return error_;
    // Reset what the previous segment left (not the whole RxSeg: zero-filling its header array per FPDU
    // costs more than the rest of this function). th/uh/hdr are written below before anything reads them.
    rx_.op = nullptr;
    rx_.opcode = 0;
    rx_.hdr_len = 0;
    rx_.payload_len = 0;
    rx_.got = 0;
    rx_.access = Access::remote_write;
    if (in_hdr.size() < 2 || in_hdr.size() > rx_.hdr.size()) return fail(ddp::err::local_catastrophic, {}, 0);
    std::memcpy(rx_.hdr.data(), in_hdr.data(), in_hdr.size());
    const std::span<const std::byte> hdr(rx_.hdr.data(), in_hdr.size());
    const std::uint16_t ctrl = load_be16(hdr, 0);
    // DDP first (RFC 5041 section 7.2), then RDMAP (RFC 5040 section 7.2): versions, then the opcode.
    if (const ProtoStatus e = ddp::check_ddp_ctrl(ctrl)) return fail(*e, {}, 0);
    if (ctrl_rdmap_version(ctrl) != kRdmapVersion) return fail(err::o_version, {}, 0);
    const OpInfo& op = kOpTable[ctrl_opcode(ctrl)];
    if (!op.valid || (op.dirs & kDirRx) == 0 || op.tagged != ddp::ctrl_tagged(ctrl)) return fail(err::o_opcode, {}, 0);
    if (is_rfc7306(ctrl_opcode(ctrl)) && !cfg_.rfc7306) return fail(err::o_opcode, {}, 0);  // not agreed here
    rx_merge_imm_ = false;
    if (held_recv_ && op.hdr_len != kImmDataLen) deliver_held();  // only Immediate Data may join a held SEND
    if (hdr.size() != op.hdr_len) return fail(ddp::err::local_catastrophic, {}, 0);  // deframer broke the contract

    rx_.op = &op;
    rx_.opcode = ctrl_opcode(ctrl);
    rx_.hdr_len = hdr.size();
    rx_.payload_len = payload_len;

    if (op.tagged) {
        rx_.th = *ddp::TaggedHeader::decode(hdr);
        if (const ProtoStatus e = tagged_.check(rx_.th, payload_len)) return fail_rx(*e);
        if (tagged_.in_message() && tagged_op_ != rx_.opcode) return fail_rx(err::o_opcode);
        tagged_op_ = rx_.opcode;
    } else {
        rx_.uh = *ddp::UntaggedHeader::decode(hdr);
        if (op.flow == Flow::terminate) {
            // A TERMINATE is taken whatever its QN/MSN/MO: the stream ends either way, and no TERMINATE
            // answers a TERMINATE.
        } else {
            if (rx_.uh.qn != op.qn) return fail_rx(ddp::err::u_invalid_qn);
            ddp::UntaggedQueue& q = rxq_[rx_.uh.qn];
            if (const ProtoStatus e = q.check(rx_.uh, payload_len)) return fail_rx(*e);
            if (rx_.uh.qn == kQnSend && q.in_message() && send_op_ != rx_.opcode) return fail_rx(err::o_opcode);
        }
    }
    if (op.payload == Payload::none && payload_len != 0) return fail_rx(ddp::err::u_too_long);
    if (const ProtoStatus e = op.rx_header(*this)) return e;
    return std::nullopt;
}

ProtoStatus Endpoint::on_ulpdu_payload(std::span<const std::byte> bytes) {
    if (prof_rx_ != nullptr) [[unlikely]] {
        const std::uint64_t t0 = cycles_now();
        const ProtoStatus st = rx_payload(bytes, [](std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); });
        *prof_rx_ += cycles_now() - t0;
        return st;
    }
    return rx_payload(bytes, [](std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); });
}

ProtoStatus Endpoint::on_ulpdu_payload_crc(std::span<const std::byte> bytes, std::uint32_t& crc_state) {
    if (prof_rx_ != nullptr) [[unlikely]] {
        const std::uint64_t t0 = cycles_now();
        const ProtoStatus st = rx_payload_crc(bytes, crc_state);
        *prof_rx_ += cycles_now() - t0;
        return st;
    }
    return rx_payload_crc(bytes, crc_state);
}

ProtoStatus Endpoint::rx_payload_crc(std::span<const std::byte> bytes, std::uint32_t& crc_state) {
    // Bytes not copied (an error stops placement) need no CRC: the stream is dead then.
    std::uint32_t st = crc_state;
    const ProtoStatus e = rx_payload(bytes, [&st](std::byte* dst, const std::byte* src, std::size_t n) {
        st = mpa::crc32c_copy(st, dst, src, n);
    });
    if (!e && rx_.op != nullptr && rx_.op->payload == Payload::term_info) {
        st = mpa::crc32c_update(crc_state, bytes);  // TERMINATE info is kept truncated: CRC the whole piece
    }
    crc_state = st;
    return e;
}

template <class Copy>
ProtoStatus Endpoint::rx_payload(std::span<const std::byte> bytes, Copy&& copy) {
    if (state_ == State::error) return error_;
    if (rx_.op == nullptr || bytes.size() > rx_.payload_len - rx_.got) return fail_rx(ddp::err::local_catastrophic);
    switch (rx_.op->payload) {
    case Payload::none:
        return fail_rx(ddp::err::local_catastrophic);  // unreachable: header check refused a payload
    case Payload::term_info: {
        const std::size_t room = term_rx_.size() - std::min(term_rx_.size(), term_rx_len_);
        const std::size_t take = std::min(room, bytes.size());
        std::memcpy(term_rx_.data() + term_rx_len_, bytes.data(), take);
        term_rx_len_ += take;
        break;
    }
    case Payload::data: {
        ProtoStatus e;
        if (rx_.op->tagged) {
            e = ddp::place(
                bytes, rx_.got,
                [&](std::size_t off, std::size_t len) {
                    const Mem m = upper_.tagged(rx_.th.stag, rx_.th.to + off, len, rx_.access);
                    if (m.err != MemError::none)
                        return ddp::Target{nullptr, 0, term_code_for(m.err, MemUse::tagged_sink)};
                    return ddp::Target{m.ptr, m.len, std::nullopt};
                },
                copy);
        } else {
            e = ddp::place(
                bytes, rx_.got,
                [&](std::size_t off, std::size_t len) {
                    const Mem m = upper_.recv_place(rx_.uh.msn, static_cast<std::uint32_t>(rx_.uh.mo + off), len);
                    if (m.err != MemError::none) return ddp::Target{nullptr, 0, term_code_for(m.err, MemUse::receive)};
                    return ddp::Target{m.ptr, m.len, std::nullopt};
                },
                copy);
        }
        if (e) return fail_rx(*e);
        placed_bytes_ += bytes.size();
        break;
    }
    }
    rx_.got += bytes.size();
    return std::nullopt;
}

ProtoStatus Endpoint::on_ulpdu_end() {
    if (prof_rx_ != nullptr) [[unlikely]] {
        const std::uint64_t t0 = cycles_now();
        const ProtoStatus st = rx_end();
        *prof_rx_ += cycles_now() - t0;
        return st;
    }
    return rx_end();
}

ProtoStatus Endpoint::rx_end() {
    if (state_ == State::error) return error_;
    if (rx_.op == nullptr || rx_.got != rx_.payload_len) return fail_rx(ddp::err::local_catastrophic);
    const OpInfo& op = *rx_.op;
    const ProtoStatus e = op.rx_end(*this);
    if (state_ == State::error) return error_;
    if (e) return e;
    // The segment is whole and its CRC good: commit it to the DDP stream state.
    if (op.tagged) {
        tagged_.advance(rx_.th, rx_.payload_len);
    } else if (op.flow != Flow::terminate) {
        rxq_[rx_.uh.qn].advance(rx_.payload_len, rx_.uh.last());
    }
    rx_.op = nullptr;
    return std::nullopt;
}

// ==== RX handlers (the opcode table's rx_header / rx_end) ====================================================

// RDMA Write (RFC 5040 section 5.1): placed by DDP into the sink STag with remote-write right; no completion.
ProtoStatus RxHandlers::write_header(Endpoint& ep) {
    ep.rx_.access = Access::remote_write;
    return std::nullopt;
}
ProtoStatus RxHandlers::write_end(Endpoint&) { return std::nullopt; }

// RDMA Read Request (RFC 5040 section 5.2): checked now against IRD and the source region, answered in order.
ProtoStatus RxHandlers::read_request_header(Endpoint& ep) {
    if (ep.irq_outstanding() >= ep.cfg_.ird) return ep.fail_rx(err::o_catastrophic_stream);  // beyond IRD (as siw)
    const ReadRequest rr = ReadRequest::decode(ep.rx_.hdr);
    if (rr.size == 0) return std::nullopt;  // zero-length READ (an RTR): STags not checked (RFC 6581)
    if (rr.src_to > ~std::uint64_t{0} - (rr.size - 1)) return ep.fail_rx(err::p_to_wrap);
    std::size_t done = 0;
    while (done < rr.size) {
        const Mem m = ep.upper_.tagged(rr.src_stag, rr.src_to + done, rr.size - done, Access::remote_read);
        if (m.err != MemError::none) return ep.fail_rx(term_code_for(m.err, MemUse::rdma_source));
        if (m.len == 0 || m.len > rr.size - done) return ep.fail_rx(err::p_base_bounds);
        done += m.len;
    }
    return std::nullopt;
}
ProtoStatus RxHandlers::read_request_end(Endpoint& ep) {
    IrqEntry e{};
    e.atomic = false;
    e.rr = ReadRequest::decode(ep.rx_.hdr);
    std::memcpy(e.hdr.data(), ep.rx_.hdr.data(), kReadRequestLen);
    ep.push_irq(e);
    return std::nullopt;
}

// RDMA Read Response (RFC 5040 section 5.2): must match the oldest outstanding request exactly: sink STag,
// sink TO, and total length = RDMA Read Message Size (siw's checks and codes).
ProtoStatus RxHandlers::read_response_header(Endpoint& ep) {
    if (ep.orq_.empty() || ep.orq_.front().op != WrOp::read) return ep.fail_rx(err::o_opcode);
    const OrqEntry& o = ep.orq_.front();
    const ddp::TaggedHeader& th = ep.rx_.th;
    const std::uint64_t before = ep.tagged_.in_message() ? ep.tagged_.received() : 0;
    if (th.stag != o.sink_stag) return ep.fail_rx(ddp::err::t_invalid_stag);
    if (!ep.tagged_.in_message() && th.to != o.sink_to) return ep.fail_rx(ddp::err::t_base_bounds);
    if (before + ep.rx_.payload_len > o.size) return ep.fail_rx(ddp::err::t_base_bounds);
    if (th.last() && before + ep.rx_.payload_len != o.size) return ep.fail_rx(ddp::err::t_base_bounds);
    ep.rx_.access = Access::local_write;
    return std::nullopt;
}
ProtoStatus RxHandlers::read_response_end(Endpoint& ep) {
    if (!ep.rx_.th.last()) return std::nullopt;
    const OrqEntry o = ep.orq_.front();
    ep.orq_.pop();
    if (o.signaled) ep.upper_.on_completion(Completion{.kind = WcKind::read, .wr_id = o.wr_id, .byte_len = o.size});
    return std::nullopt;
}

// SEND family (RFC 5040 section 5.3) and Immediate Data (RFC 7306 section 4): QN 0, one posted receive per
// message, bound at the message's first segment. iWARP has no receiver-not-ready retry: no receive is a
// TERMINATE (DDP untagged, "no buffer available").
ProtoStatus RxHandlers::send_header(Endpoint& ep) {
    const ddp::UntaggedHeader& uh = ep.rx_.uh;
    if (ep.held_recv_) {
        // The Immediate Data its SEND announced: it completes that SEND's receive (no receive of its own).
        if (uh.msn == ep.held_recv_->msn + 1 && ep.rx_.op->hdr_len == kImmDataLen) {
            ep.rx_merge_imm_ = true;
            ep.send_op_ = ep.rx_.opcode;
            return std::nullopt;
        }
        ep.deliver_held();
    }
    if (!ep.rxq_[kQnSend].in_message()) {
        if (const MemError m = ep.upper_.recv_begin(uh.msn); m != MemError::none)
            return ep.fail_rx(term_code_for(m, MemUse::receive));
        ep.send_op_ = ep.rx_.opcode;
        ep.rx_inv_stag_ = uh.rsvd_ulp;
    }
    return std::nullopt;
}
ProtoStatus RxHandlers::send_end(Endpoint& ep) {
    const ddp::UntaggedHeader& uh = ep.rx_.uh;
    if (!uh.last()) return std::nullopt;
    const OpInfo& op = *ep.rx_.op;
    Completion c{.kind = WcKind::recv, .msn = uh.msn, .byte_len = static_cast<std::uint32_t>(uh.mo + ep.rx_.payload_len),
                 .solicited = op.solicited};
    if (op.hdr_len == kImmDataLen) {
        if (ep.rx_merge_imm_ && ep.held_recv_) {  // joins the held SEND: one completion, its bytes and the immediate
            Completion& held = *ep.held_recv_;
            held.has_imm = true;
            held.imm = decode_imm(ep.rx_.hdr);
            held.solicited = held.solicited || op.solicited;
            ep.rx_merge_imm_ = false;
            ep.deliver_held();
            return std::nullopt;
        }
        c.has_imm = true;
        c.imm_only = true;
        c.imm = decode_imm(ep.rx_.hdr);
    }
    if (op.invalidate) {
        if (const MemError m = ep.upper_.invalidate(ep.rx_inv_stag_); m != MemError::none)
            return ep.fail_rx(term_code_for(m, MemUse::invalidate));
        c.has_inv = true;
        c.inv_stag = ep.rx_inv_stag_;
    }
    // A SEND that announced its Immediate Data (kImmFollows): its completion waits for it (the next QN 0
    // message; any other message header, or the stream's end, delivers it as it is).
    if (ep.cfg_.rfc7306 && !op.invalidate && uh.rsvd_ulp == kImmFollows) {
        ep.held_recv_ = c;
        return std::nullopt;
    }
    ep.upper_.on_completion(c);
    return std::nullopt;
}

// TERMINATE (RFC 5040 section 4.8): the attached bytes are kept (bounded) and reported at the end.
ProtoStatus RxHandlers::terminate_header(Endpoint& ep) {
    ep.term_rx_len_ = 0;
    return std::nullopt;
}
ProtoStatus RxHandlers::terminate_end(Endpoint& ep) {
    const TerminateHeader th = TerminateHeader::decode(ep.rx_.hdr);
    ep.enter_error_received(th.code, th, std::span<const std::byte>(ep.term_rx_).first(ep.term_rx_len_));
    return th.code;
}

// Atomic Request (RFC 7306 section 3): on QN 1 with READ requests, sharing IRD; the 8-byte target must be
// aligned and carry the remote-atomic right. Executed when the segment is whole, answered in order.
ProtoStatus RxHandlers::atomic_request_header(Endpoint& ep) {
    if (ep.irq_outstanding() >= ep.cfg_.ird) return ep.fail_rx(err::o_catastrophic_stream);
    const AtomicRequest a = AtomicRequest::decode(ep.rx_.hdr);
    if (a.op > static_cast<std::uint8_t>(AtomicOp::cmp_swap)) return ep.fail_rx(err::o_opcode);
    if ((a.to & 7) != 0) return ep.fail_rx(term_code_for(MemError::misaligned, MemUse::rdma_source));
    const Mem m = ep.upper_.tagged(a.stag, a.to, 8, Access::remote_atomic);
    if (m.err != MemError::none) return ep.fail_rx(term_code_for(m.err, MemUse::rdma_source));
    if (m.len < 8 || (reinterpret_cast<std::uintptr_t>(m.ptr) & 7) != 0)
        return ep.fail_rx(term_code_for(MemError::misaligned, MemUse::rdma_source));
    return std::nullopt;
}
ProtoStatus RxHandlers::atomic_request_end(Endpoint& ep) {
    const AtomicRequest a = AtomicRequest::decode(ep.rx_.hdr);
    const Mem m = ep.upper_.tagged(a.stag, a.to, 8, Access::remote_atomic);  // looked up again: CRC now good
    if (m.err != MemError::none) return ep.fail_rx(term_code_for(m.err, MemUse::rdma_source));
    if (m.len < 8 || (reinterpret_cast<std::uintptr_t>(m.ptr) & 7) != 0)
        return ep.fail_rx(term_code_for(MemError::misaligned, MemUse::rdma_source));
    // Host-order 64-bit word in the region; atomic against local CPU access to it.
    std::atomic_ref<std::uint64_t> word(*reinterpret_cast<std::uint64_t*>(m.ptr));
    std::uint64_t orig = word.load();
    while (!word.compare_exchange_weak(orig, atomic_apply(a, orig).value_or(orig))) {
    }
    IrqEntry e{};
    e.atomic = true;
    e.ar = AtomicResponse{a.req_id, orig};
    ep.push_irq(e);
    return std::nullopt;
}

// Atomic Response (RFC 7306 section 3.2): QN 3, must answer the oldest outstanding request, an atomic one,
// with its request identifier.
ProtoStatus RxHandlers::atomic_response_header(Endpoint& ep) {
    if (ep.orq_.empty() || ep.orq_.front().op == WrOp::read) return ep.fail_rx(err::o_opcode);
    if (AtomicResponse::decode(ep.rx_.hdr).req_id != ep.orq_.front().req_id) return ep.fail_rx(err::o_opcode);
    return std::nullopt;
}
ProtoStatus RxHandlers::atomic_response_end(Endpoint& ep) {
    const AtomicResponse r = AtomicResponse::decode(ep.rx_.hdr);
    const OrqEntry o = ep.orq_.front();
    ep.orq_.pop();
    if (o.signaled)
        ep.upper_.on_completion(Completion{.kind = WcKind::atomic, .wr_id = o.wr_id, .byte_len = 8, .atomic_original = r.original});
    return std::nullopt;
}

}  // namespace softrdma::rdmap
