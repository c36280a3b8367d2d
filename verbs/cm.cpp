// SPDX-License-Identifier: MIT
// Connection manager: TCP connect/accept, MPA negotiation (mpa::Initiator / mpa::Responder), then the byte
// stream handed to the QP. Events go to the Context's CM channel, apart from CQs. Control path: allocates.
#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "rdmap/term_text.hpp"
#include "stack/tcp.hpp"
#include "verbs/verbs.hpp"

namespace softrdma::verbs {
namespace {

// A TERMINATE we sent because the peer failed an access to our memory or an invalidation (what a host probing
// for STags causes; SecurityConfig::max_access_errors_per_peer counts them).
bool is_access_error(TermCode c) {
    return (c.layer == TermLayer::ddp && c.etype == ddp::err::kEtypeTagged && c != ddp::err::t_version) ||
           (c.layer == TermLayer::rdmap && c.etype == rdmap::err::kEtypeProtection) || c == rdmap::err::o_cannot_invalidate;
}

// "a.b.c.d:port" of the peer, for messages.
std::string peer_of(const stack::TcpConnection& c) {
    const stack::TcpConnection::FlowInfo fi = c.flow_info();
    return stack::Ipv4{fi.remote_ip_be}.str() + ":" + std::to_string(fi.remote_port);
}

const char* fail_text(mpa::FailReason r) {
    switch (r) {
    case mpa::FailReason::timeout: return "MPA: no reply in time";
    case mpa::FailReason::protocol: return "MPA: protocol error";
    case mpa::FailReason::unsupported: return "MPA: peer asks for something our policy refuses";
    case mpa::FailReason::insufficient_ird: return "MPA: insufficient IRD";
    case mpa::FailReason::no_matching_rtr: return "MPA: no matching RTR";
    }
    return "MPA: failed";
}

}  // namespace

std::string TerminateInfo::describe() const {
    char buf[320];
    const char* text = rdmap::term_text(code);
    int n = std::snprintf(buf, sizeof buf, "TERMINATE %s: layer %u type %u code 0x%02x (%s), control word 0x%08x",
                          received ? "received" : "sent", static_cast<unsigned>(code.layer), code.etype, code.ecode,
                          text != nullptr ? text : "not an RFC 5040/5041/5044 code", raw);
    // What we found, when the TERMINATE told the peer less (SecurityConfig::opaque_access_errors).
    if (!received && !(cause == code) && n > 0 && static_cast<std::size_t>(n) < sizeof buf) {
        const char* c = rdmap::term_text(cause);
        n += std::snprintf(buf + n, sizeof buf - static_cast<std::size_t>(n), "; found: %s", c != nullptr ? c : "?");
    }
    // Linux siw's x86 build lays the word out swapped (layer and type exchanged): say what such a peer meant.
    const TermCode siw = rdmap::term_code_siw_x86(raw);
    if (received && text == nullptr && rdmap::term_text(siw) != nullptr && n > 0 && static_cast<std::size_t>(n) < sizeof buf)
        std::snprintf(buf + n, sizeof buf - static_cast<std::size_t>(n), "; laid out as Linux siw (x86) sends it: %s",
                      rdmap::term_text(siw));
    return buf;
}

// TCP callbacks, forwarded. Ownership of received bytes stays with the RecvBuffer: the QP copies payload
// out of the pbufs (the one copy) during the call, and the pbufs go back to DPDK when it returns.
struct CmId::TcpHandler final : stack::TcpConnection::Handler {
    CmId& id;
    explicit TcpHandler(CmId& i) : id(i) {}
    void on_connected(stack::TcpConnection&) override { id.on_tcp_connected(); }
    void on_receive(stack::TcpConnection&, stack::RecvBuffer data) override {
        data.for_each_segment([&](std::span<const std::byte> s) { id.on_tcp_receive(s); });
        id.on_tcp_receive_end();
    }
    void on_sent(stack::TcpConnection&, std::size_t) override { id.on_tcp_sent(); }
    void on_remote_close(stack::TcpConnection&) override { id.on_tcp_remote_close(); }
    void on_error(stack::TcpConnection&, stack::TcpError e) override {
        id.on_tcp_error(stack::to_string(e), e == stack::TcpError::refused || e == stack::TcpError::timed_out);
    }
};

struct CmListener::Acceptor final : stack::TcpListener::Handler {
    CmListener& l;
    explicit Acceptor(CmListener& li) : l(li) {}
    void on_accept(std::unique_ptr<stack::TcpConnection> c) override { l.ctx_.new_request(l, std::move(c)); }
};

CmId::CmId(Context& ctx) : ctx_(ctx), handler_(std::make_unique<TcpHandler>(*this)) { ctx_.ids_.push_back(this); }

CmId::~CmId() {
    leave_pending();
    std::erase(ctx_.ids_, this);
    ctx_.drop_events(this);
    if (qp_ != nullptr) {
        QueuePair* q = qp_;
        qp_ = nullptr;
        q->detach_conn();
        q->stream_lost();
    }
    // An id that already ended in order (rejected, disconnected: its FIN is due in the poll stage) closes with
    // that FIN; so does one waiting to send its TERMINATE after an RTR (rtr_before_terminate: a reset there
    // is what crashes siw). Only a connection still in use is aborted (RST).
    if (conn_ && (close_pending_ || deferred_term_) && conn_->open() && conn_->close()) return;
    if (conn_) conn_->abort();
}

// ---- listen / connect ---------------------------------------------------------------------------------------

CmListener::CmListener(Context& ctx, std::uint16_t port, const ConnParam& defaults)
    : ctx_(ctx), port_(port), defaults_(defaults), acceptor_(std::make_unique<Acceptor>(*this)) {
    defaults_.private_data = {};
    listener_ = std::make_unique<stack::TcpListener>(ctx.stack(), port, *acceptor_);
}

CmListener::~CmListener() {
    listener_.reset();
    for (auto& id : ctx_.orphans_)
        if (id->listener_ == this) id->listener_ = nullptr;
    for (auto& ev : ctx_.events_)
        if (ev.listener == this) ev.listener = nullptr;
}

std::unique_ptr<CmListener> Context::listen(std::uint16_t port, const ConnParam& defaults) {
    return std::unique_ptr<CmListener>(new CmListener(*this, port, defaults));
}

// ---- limits on what a host may hold (SecurityConfig; README "Security") ---------------------------------------

Context::PeerRecord& Context::peer_record(std::uint32_t ip_be) {
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
void Context::note_access_error(std::uint32_t ip_be) {
    if (cfg_.security.max_access_errors_per_peer == 0) return;
    PeerRecord& r = peer_record(ip_be);
    const auto now = std::chrono::steady_clock::now();
    if (r.errors == 0 || now - r.window_start >= cfg_.security.access_error_window) {
        r.errors = 0;
        r.window_start = now;
    }
    if (++r.errors == cfg_.security.max_access_errors_per_peer)
        spdlog::warn("softrdma: {} caused {} access errors within {} s: its new connections are refused for that long",
                     stack::Ipv4{ip_be}.str(), r.errors, cfg_.security.access_error_window.count());
}

void CmId::leave_pending() noexcept {
    if (!pending_) return;
    pending_ = false;
    if (auto it = ctx_.peers_.find(peer_ip_be_); it != ctx_.peers_.end() && it->second.pending > 0) --it->second.pending;
    if (ctx_.pending_total_ > 0) --ctx_.pending_total_;
}

void Context::new_request(CmListener& l, std::unique_ptr<stack::TcpConnection> conn) {
    const SecurityConfig& sec = cfg_.security;
    const std::uint32_t ip = conn->flow_info().remote_ip_be;
    const auto now = std::chrono::steady_clock::now();
    PeerRecord& rec = peer_record(ip);
    // A host that keeps failing accesses to our memory (guessing STags) gets no new connection for a while.
    const bool penalized = sec.max_access_errors_per_peer != 0 && rec.errors >= sec.max_access_errors_per_peer &&
                           now - rec.window_start < sec.access_error_window;
    if (penalized || (sec.max_pending_per_peer != 0 && rec.pending >= sec.max_pending_per_peer)) {
        spdlog::debug("softrdma: connection from {} reset at accept ({})", peer_of(*conn),
                      penalized ? "too many access errors" : "too many pending connections from it");
        ++refused_connections_;
        conn->abort();
        return;
    }
    if (sec.max_pending != 0 && pending_total_ >= sec.max_pending) {
        // Full: the oldest connection still in MPA setup makes room (a request the application holds is its
        // own to answer); none: the newcomer is refused.
        const auto oldest = std::find_if(orphans_.begin(), orphans_.end(), [](const std::unique_ptr<CmId>& o) {
            return o->pending_ && o->phase_ == CmId::Phase::negotiating;
        });
        if (oldest == orphans_.end()) {
            ++refused_connections_;
            conn->abort();
            return;
        }
        ++refused_connections_;
        if ((*oldest)->conn_) (*oldest)->conn_->abort();
        (*oldest)->finish(CmEventType::error, "reset: too many pending connections", /*quiet=*/true);
    }
    std::unique_ptr<CmId> id(new CmId(*this));
    id->listener_ = &l;
    id->conn_ = std::move(conn);
    id->conn_->set_handler(id->handler_.get());
    id->conn_->set_priority(stack::TcpPriority::expendable);  // gives way to new connections until RDMA mode
    id->peer_ = peer_of(*id->conn_);
    id->peer_ip_be_ = ip;
    id->pending_ = true;
    ++peer_record(ip).pending;
    ++pending_total_;
    mpa::NegotiationConfig nc;
    nc.crc = l.defaults_.crc;
    nc.peer_to_peer = true;  // we answer peer-to-peer requests (RTR WRITE preferred, else READ), as siw
    nc.rtr = l.defaults_.rtr;
    nc.markers_rx = l.defaults_.markers_rx;
    nc.markers_tx_ok = l.defaults_.markers_tx;
    nc.ird = l.defaults_.responder_resources;
    nc.ord = l.defaults_.initiator_depth;
    if (l.defaults_.mpa_timeout.count() > 0) nc.request_timeout = l.defaults_.mpa_timeout;
    id->resp_.emplace(nc);
    id->resp_->start(mpa::Clock::now());
    id->phase_ = CmId::Phase::negotiating;
    orphans_.push_back(std::move(id));
}

std::unique_ptr<CmId> Context::connect(stack::Ipv4 addr, std::uint16_t port, QueuePair& qp, const ConnParam& param) {
    if (qp.state_ != QpState::init || qp.conn_ != nullptr) throw Error("connect: the QP must be in INIT, unconnected");
    if (param.mpa_revision != 1 && param.mpa_revision != 2) throw Error("connect: MPA revision must be 1 or 2");
    if (param.peer_to_peer && param.mpa_revision != 2) throw Error("connect: peer-to-peer mode needs MPA revision 2");
    if (param.peer_to_peer && !param.rtr.write && !param.rtr.read && !param.rtr.send)
        throw Error("connect: peer-to-peer mode needs at least one RTR type");
    if (param.private_data.size() > mpa::kMaxPrivateDataSent - (param.mpa_revision == 2 ? mpa::kIrdOrdSize : 0))
        throw Error("connect: private data above 252 bytes (256 with MPA revision 1)");
    std::unique_ptr<CmId> id(new CmId(*this));
    id->initiator_ = true;
    id->qp_ = &qp;
    qp.conn_ = id.get();
    qp.state_ = QpState::rtr;  // MPA negotiation under way
    id->pd_copy_.assign(param.private_data.begin(), param.private_data.end());
    mpa::NegotiationConfig nc;
    nc.revision = param.mpa_revision;
    nc.crc = param.crc;
    nc.peer_to_peer = param.peer_to_peer;
    nc.rtr = param.rtr;
    nc.markers_rx = param.markers_rx;
    nc.markers_tx_ok = param.markers_tx;
    nc.ird = param.responder_resources;
    nc.ord = param.initiator_depth;
    nc.private_data = id->pd_copy_;
    if (param.mpa_timeout.count() > 0) nc.reply_timeout = param.mpa_timeout;
    id->ini_.emplace(nc);
    id->rfc7306_ = param.rfc7306;
    id->guard_ = param.first_fpdu;
    id->phase_ = CmId::Phase::connecting;
    id->conn_ = stack::connect(*stack_, addr, port, *id->handler_);
    return id;
}

// ---- accept / reject / disconnect ---------------------------------------------------------------------------

bool CmId::accept(QueuePair& qp, const ConnParam& param) {
    if (phase_ != Phase::request || !resp_ || qp.conn_ != nullptr || qp.state_ != QpState::init) return false;
    if (!resp_->accept(param.private_data, param.responder_resources, param.initiator_depth)) return false;
    qp_ = &qp;
    rfc7306_ = param.rfc7306;
    write_negotiation_output();  // the reply goes into TCP before any FPDU of the QP
    go_rdma(resp_->agreed());
    emit(CmEventType::established);
    return true;
}

bool CmId::reject(std::span<const std::byte> private_data) {
    if (phase_ != Phase::request || !resp_) return false;
    if (!resp_->reject(private_data)) return false;
    write_negotiation_output();
    finish(CmEventType::rejected, "", /*quiet=*/true);
    return true;
}

void CmId::disconnect() {
    if (phase_ == Phase::rdma && qp_ != nullptr && qp_->state_ == QpState::rts && !qp_->tx_idle()) {
        qp_->state_ = QpState::sqd;  // post_send refused from here; what is queued still goes out
        qp_->schedule_tx();
        draining_ = true;
        drain_deadline_ = mpa::Clock::now() + std::chrono::seconds(5);
        ctx_.cm_work_ = true;
        return;
    }
    if (draining_) return;
    finish(CmEventType::disconnected, "local disconnect");
}

void CmId::abort() {
    if (conn_) conn_->abort();
    finish(CmEventType::disconnected, "aborted locally");
}

// ---- TCP events ---------------------------------------------------------------------------------------------

std::string CmId::peer() const { return peer_; }

void CmId::on_tcp_connected() {
    if (phase_ != Phase::connecting) return;
    phase_ = Phase::negotiating;
    if (conn_) {
        peer_ = peer_of(*conn_);
        peer_ip_be_ = conn_->flow_info().remote_ip_be;
    }
    // With an RX thread: it follows the connection from here (before our MPA request, so before any byte the
    // responder sends), forwarding in-order bytes until the QP hands the stream over after the reply.
    if (qp_ != nullptr && conn_) qp_->watch_stream(*conn_);
    ini_->start(mpa::Clock::now());
    write_negotiation_output();
    check_outcome();
}

void CmId::on_tcp_receive(std::span<const std::byte> bytes) {
    switch (phase_) {
    case Phase::rdma:
        if (qp_ != nullptr) qp_->rx_bytes(bytes);
        return;
    case Phase::negotiating: {
        const auto now = mpa::Clock::now();
        const std::size_t used = initiator_ ? ini_->input(bytes, now) : resp_->input(bytes, now);
        check_outcome();
        // Bytes after the MPA reply are FPDUs: they belong to the QP now.
        if (phase_ == Phase::rdma && used < bytes.size() && qp_ != nullptr) qp_->rx_bytes(bytes.subspan(used));
        return;
    }
    case Phase::connecting:
    case Phase::request:  // the initiator may send nothing before our reply: dropped
    case Phase::closed: return;
    }
}

void CmId::on_tcp_receive_end() {
    if (phase_ == Phase::rdma && qp_ != nullptr) qp_->rx_end();
}

void CmId::on_tcp_sent() {
    if (phase_ == Phase::rdma) {
        if (qp_ != nullptr) qp_->schedule_tx();
    } else if (phase_ != Phase::closed) {
        write_negotiation_output();
    }
}

void CmId::on_tcp_remote_close() {
    if (phase_ == Phase::rdma) {
        finish(CmEventType::disconnected, "peer closed");
    } else {
        finish(initiator_ ? CmEventType::error : CmEventType::disconnected, "peer closed during MPA negotiation",
               /*quiet=*/!initiator_ && phase_ != Phase::request);
    }
}

void CmId::on_tcp_error(const char* what, bool unreachable) {
    const std::string reason = std::string("TCP: ") + what;
    switch (phase_) {
    case Phase::connecting: finish(unreachable ? CmEventType::unreachable : CmEventType::error, reason); break;
    case Phase::negotiating: finish(CmEventType::error, reason, /*quiet=*/!initiator_); break;
    case Phase::request:
    case Phase::rdma: finish(CmEventType::disconnected, reason); break;
    case Phase::closed: break;
    }
}

// ---- negotiation --------------------------------------------------------------------------------------------

void CmId::write_negotiation_output() {
    if (!conn_ || !conn_->open()) return;
    mpa::Negotiator* n = initiator_ ? static_cast<mpa::Negotiator*>(&*ini_) : static_cast<mpa::Negotiator*>(&*resp_);
    const auto out = n->output();
    if (out.empty()) return;
    n->output_sent(conn_->write(out));
    conn_->flush();
}

void CmId::check_outcome() {
    if (initiator_) {
        switch (ini_->outcome()) {
        case mpa::Outcome::in_progress:
        case mpa::Outcome::request_received: return;
        case mpa::Outcome::agreed:
            peer_pd_ = ini_->agreed().peer_private_data;
            go_rdma(ini_->agreed());
            emit(CmEventType::established);
            return;
        case mpa::Outcome::rejected:
            peer_pd_ = ini_->agreed().peer_private_data;
            finish(CmEventType::rejected, "rejected by peer");
            return;
        case mpa::Outcome::failed: {
            const mpa::Failure& f = ini_->failure();
            if (f.send_terminate && qp_ != nullptr) {
                // The reply arrived but cannot be used (IRD, RTR): TERMINATE with the MPA code, framed as agreed,
                // through the QP's choke point; the connection closes once it is out.
                const CmEventType type = f.reason == mpa::FailReason::timeout ? CmEventType::unreachable : CmEventType::error;
                if (rtr_before_terminate(f.code, type)) return;
                emit(type, fail_text(f.reason));
                quiet_close_ = true;
                go_rdma(ini_->agreed());
                qp_->ep_->on_llp_error(f.code);
                return;
            }
            finish(f.reason == mpa::FailReason::timeout ? CmEventType::unreachable : CmEventType::error,
                   fail_text(f.reason));
            return;
        }
        }
        return;
    }
    switch (resp_->outcome()) {
    case mpa::Outcome::in_progress:
    case mpa::Outcome::agreed: return;  // agreed only through accept()
    case mpa::Outcome::request_received: {
        if (phase_ != Phase::negotiating) return;
        phase_ = Phase::request;
        leave_pending();  // its request is in: the application answers it (accept or reject)
        peer_pd_.assign(resp_->request_private_data());
        CmEvent ev;
        ev.type = CmEventType::connect_request;
        ev.id = this;
        ev.listener = listener_;
        ev.private_data = peer_pd_;
        ev.ird = resp_->request().ird_ord.ird;
        ev.ord = resp_->request().ird_ord.ord;
        const auto it = std::find_if(ctx_.orphans_.begin(), ctx_.orphans_.end(),
                                     [this](const std::unique_ptr<CmId>& p) { return p.get() == this; });
        if (it == ctx_.orphans_.end()) return;
        ev.request = std::move(*it);
        ctx_.orphans_.erase(it);
        ctx_.push_event(std::move(ev));
        return;
    }
    case mpa::Outcome::rejected:
    case mpa::Outcome::failed:  // automatic reject (policy) or a bad request: no event, the id is an orphan
        write_negotiation_output();
        finish(CmEventType::error, fail_text(resp_->failure().reason), /*quiet=*/true);
        return;
    }
}

void CmId::go_rdma(const mpa::Agreed& agreed) {
    phase_ = Phase::rdma;
    leave_pending();
    if (conn_) conn_->set_priority(stack::TcpPriority::vital);  // lwIP never sacrifices a running session
    ird_ = agreed.ird;
    ord_ = agreed.ord;
    if (qp_ == nullptr) return;
    const std::uint32_t mss = conn_ ? conn_->mss() : 0;
    const bool hold = initiator_ && guard_.mode == FirstFpduGuard::Mode::hold;
    qp_->enter_rts(*this, agreed, mss != 0 ? mss : 536, initiator_, rfc7306_, hold);
    guarding_ = initiator_ && guard_.mode != FirstFpduGuard::Mode::off && ini_->outcome() == mpa::Outcome::agreed;
    hold_until_ = mpa::Clock::now() + guard_.delay;
    first_tx_at_.reset();
    nudges_sent_ = 0;
    nudge_step_ = 0;
    tx_seen_ = 0;
}

// ---- The accept window ----------------------------------------------------------------------------------------
// Linux siw (6.1, siw_cm.c siw_accept) sends its MPA reply and only afterwards attaches its RDMA receive upcall
// to the socket (siw_qp_socket_assoc; in peer-to-peer mode the RTR upcall). TCP bytes that arrive in between
// are acknowledged by the kernel but nobody reads them: the socket's data-ready callback fired while the CM's
// own handler was still installed, which ignores data in RDMA mode, and it fires again only when the next
// segment arrives. A kernel initiator is never that fast; a user-space one is: our first FPDU (the first SEND,
// or the RTR) leaves 0.1-0.2 ms after the reply, siw ACKs it and never processes it, and both ends wait forever
// (seen in 10 of 13 connects; in peer-to-peer mode the reset that ends such a stuck connection crashed the
// 6.1 guest kernel in iw_cm). Nothing in MPA tells us when the peer is ready, so the initiator makes sure a
// segment of ours arrives after any such window (FirstFpduGuard):
//   nudge (default): the first FPDU goes at once; while the stream then stays quiet, a zero-length RDMA WRITE
//     to STag 1 follows `delay`, 10x and 100x ... after it. A zero-length WRITE places nothing and completes
//     nothing (siw skips it before any STag check, softrdma too, as for the RTR); arriving after the window it
//     makes siw read everything queued. Skipped while our stream is sending anyway (its own segments do the
//     same), and over for good once the peer has sent us an FPDU and we sent more after it (its receive path
//     is then provably live). Costs softrdma-to-softrdma setup nothing.
//   hold: the first FPDU waits `delay` (every connection pays it; for peers that must see no extra FPDU).
//   off: neither (a responder without the window: softrdma, an RNIC).
void CmId::guard_first_fpdu(mpa::Clock::time_point now) {
    if (phase_ != Phase::rdma || qp_ == nullptr || (qp_->state() != QpState::rts && !deferred_term_)) {
        guarding_ = false;
        return;
    }
    if (guard_.mode == FirstFpduGuard::Mode::hold) {
        if (now >= hold_until_ || qp_->peer_spoke()) {
            qp_->release_first_fpdu();
            guarding_ = false;
        }
        return;
    }
    const std::uint64_t tx = qp_->tx_written();
    if (!first_tx_at_) {
        if (tx == 0) return;  // the first FPDU has not reached TCP yet
        first_tx_at_ = now;
        tx_seen_ = tx;
        last_tx_seen_ = now;
        return;
    }
    if (qp_->peer_spoke() && tx > qp_->tx_written_when_peer_spoke()) {
        guarding_ = false;  // the peer sent from its receive path, and a segment of ours followed: it is live
        return;
    }
    if (tx != tx_seen_) {
        tx_seen_ = tx;
        last_tx_seen_ = now;
    }
    if (nudge_step_ >= guard_.nudges) {
        guarding_ = false;
        return;
    }
    auto due = guard_.delay;
    for (unsigned k = 0; k < nudge_step_ && due < std::chrono::minutes(1); ++k) due *= 10;
    if (now < *first_tx_at_ + due) return;
    ++nudge_step_;
    // A stream still sending puts its own segments behind the window: no nudge needed at this step.
    if (now - last_tx_seen_ < std::chrono::milliseconds(2)) return;
    if (qp_->post_nudge()) ++nudges_sent_;
}

void CmId::qp_failed() {
    if (fail_event_) {  // the negotiation failed: the event comes now that the TERMINATE is out
        const auto [type, reason] = *fail_event_;
        fail_event_.reset();
        finish(type, reason);
        return;
    }
    finish(CmEventType::disconnected, "QP error", quiet_close_);
}

// A peer-to-peer responder that waits for its RTR (Linux siw) must get one before its stream ends: siw 6.1
// reports a connection to iw_cm only once the RTR arrived, and a stream that ends before that (our TERMINATE
// for a reply we cannot use, a FIN, a reset) reaches iw_cm's close handler in a state it does not expect, and
// the kernel BUG()s (seen: "invalid opcode" in cm_work_handler). So when the reply asks for an RTR we can send
// (WRITE or READ: siw never picks SEND), that RTR goes first, with the first-FPDU nudges behind it, and the
// TERMINATE only kRtrSettle later: read apart from the RTR, it ends an established connection. The QP refuses
// posts meanwhile, and the application hears of the failure when the TERMINATE is out. False when the reply
// asks for no such RTR (the TERMINATE goes at once).
bool CmId::rtr_before_terminate(TermCode code, CmEventType type) {
    const mpa::Frame& rep = ini_->reply();
    if (!rep.enhanced || !rep.ird_ord.peer_to_peer || (!rep.ird_ord.write_rtr && !rep.ird_ord.read_rtr)) return false;
    mpa::Agreed a = ini_->agreed();
    a.p2p = true;
    a.rtr = rep.ird_ord.write_rtr ? mpa::RtrType::write : mpa::RtrType::read;
    if (a.rtr == mpa::RtrType::read && a.ord == 0) a.ord = 1;
    fail_event_.emplace(type, fail_text(ini_->failure().reason));
    guard_.mode = FirstFpduGuard::Mode::nudge;  // the RTR goes at once, nudged like a first FPDU
    go_rdma(a);
    guarding_ = true;
    qp_->state_ = QpState::rtr;  // no posts: the connection failed
    deferred_term_ = code;
    deferred_until_ = mpa::Clock::now() + kRtrSettle;
    return true;
}

void CmId::finish(CmEventType type, const std::string& reason, bool quiet) {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    leave_pending();
    // A TERMINATE sent or received is the reason the stream ended, even when the peer's FIN (which follows a
    // TERMINATE) is what this call reports.
    std::string why = reason;
    if (qp_ != nullptr && qp_->term_ && type == CmEventType::disconnected) {
        why = qp_->term_->describe();
        if (qp_->term_->received) spdlog::warn("softrdma: QP {}: {}", qp_->qp_num(), why);  // a peer's error
        else if (is_access_error(qp_->term_->cause) && peer_ip_be_ != 0) ctx_.note_access_error(peer_ip_be_);
    }
    if (qp_ != nullptr) qp_->stream_lost();
    close_pending_ = true;  // closed in the poll stage, after the RecvBuffer of this turn reopened the window
    ctx_.cm_work_ = true;   // (lwIP answers a close with unread data by RST)
    if (!quiet) emit(type, why);
}

void CmId::emit(CmEventType type, const std::string& reason) {
    // Control path only. debug: a thousand connections must not flood the default log.
    spdlog::debug("softrdma: CM {} {} (IRD {} ORD {}){}{}", initiator_ ? "initiator" : "responder", to_string(type),
                  ird_, ord_, reason.empty() ? "" : ": ", reason);
    CmEvent ev;
    ev.type = type;
    ev.id = this;
    ev.listener = listener_;
    ev.private_data = peer_pd_;
    ev.ird = ird_;
    ev.ord = ord_;
    ev.reason = reason;
    ctx_.push_event(std::move(ev));
}

void CmId::service(mpa::Clock::time_point now) {
    if (guarding_) guard_first_fpdu(now);
    if (deferred_term_ && now >= deferred_until_) {  // rtr_before_terminate(): the RTR has had its time
        const TermCode code = *deferred_term_;
        deferred_term_.reset();
        guarding_ = false;
        if (phase_ == Phase::rdma && qp_ != nullptr && qp_->ep_) qp_->ep_->on_llp_error(code);
    }
    if (draining_ && (phase_ != Phase::rdma || qp_ == nullptr || qp_->tx_idle() || now >= drain_deadline_)) {
        draining_ = false;
        finish(CmEventType::disconnected, "local disconnect");
    }
    if (phase_ == Phase::negotiating) {
        if (initiator_) ini_->poll(now);
        else resp_->poll(now);
        check_outcome();
    }
    if (close_pending_) {
        if (conn_ && conn_->open()) {
            if (!conn_->close()) {  // no memory for the FIN: next turn
                ctx_.cm_work_ = true;
                return;
            }
        }
        close_pending_ = false;
    }
}

}  // namespace softrdma::verbs
