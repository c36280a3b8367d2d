// SPDX-License-Identifier: MIT
// Connection manager: TCP connect/accept, MPA negotiation (mpa::Initiator / mpa::Responder), the handover of the
// TCP connection to the QP's stream, the first-FPDU guard and the close; the CmId / CmListener handles and
// Context::listen / connect. Events go to the engine's CM channel, apart from CQs. Control path: allocates.
#include "verbs/cm.hpp"

#include <algorithm>
#include <cstdio>

#include "base/log.hpp"

#include "rdmap/term_text.hpp"
#include "verbs/engine.hpp"
#include "verbs/qp.hpp"

namespace softrdma::verbs {

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

const char* to_string(TermCode c) noexcept {
    const char* text = rdmap::term_text(c);
    return text != nullptr ? text : "not an RFC 5040/5041/5044 code";
}

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

const char* to_string(AsyncEventType t) noexcept {
    switch (t) {
    case AsyncEventType::srq_limit_reached: return "SRQ limit reached";
    case AsyncEventType::qp_fatal: return "QP fatal error";
    case AsyncEventType::qp_req_err: return "QP invalid request error";
    case AsyncEventType::qp_access_err: return "QP access error";
    case AsyncEventType::cq_err: return "CQ overrun";
    }
    return "?";
}

std::string AsyncEvent::describe() const {
    if (type == AsyncEventType::srq_limit_reached) return to_string(type);
    if (type == AsyncEventType::cq_err)
        return "CQ overrun: a completion of QP " + std::to_string(qp_num) +
               " found the CQ full and was lost (size CQs for every outstanding WR of their QPs)";
    return std::string(to_string(type)) + " on QP " + std::to_string(qp_num) + ": " + term.describe();
}

}  // namespace softrdma::verbs

namespace softrdma::verbs::detail {
namespace {

// A TERMINATE we sent because the peer failed an access to our memory or an invalidation (what a host probing
// for STags causes; SecurityConfig::max_access_errors_per_peer counts them).
bool is_access_error(TermCode c) { return term_effect(c, 0).async == AsyncEventType::qp_access_err; }

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

// The TCP callbacks while the connection is not the QP's stream (connecting, negotiating, closing).
struct Conn::TcpHandler final : stack::TcpConnection::Handler {
    Conn& c;
    explicit TcpHandler(Conn& conn) : c(conn) {}
    void on_connected(stack::TcpConnection&) override { c.on_tcp_connected(); }
    void on_receive(stack::TcpConnection&, stack::RecvBuffer data) override { c.on_tcp_receive(std::move(data)); }
    void on_sent(stack::TcpConnection&, std::size_t) override { c.on_tcp_sent(); }
    void on_remote_close(stack::TcpConnection&) override { c.on_tcp_remote_close(); }
    void on_error(stack::TcpConnection&, stack::TcpError e) override { c.on_tcp_error(e); }
};

Conn::Conn(Engine& engine, CmListener& listener, const ConnParam& defaults, std::unique_ptr<stack::TcpConnection> tcp)
    : keep_engine_(engine.shared_from_this()),
      engine_(engine),
      handler_(std::make_unique<TcpHandler>(*this)),
      tcp_(std::move(tcp)),
      listener_(&listener) {
    tcp_->set_handler(handler_.get());
    tcp_->set_priority(stack::TcpPriority::expendable);  // gives way to new connections until RDMA mode
    note_endpoints();
    pending_ = true;  // the engine counted it (new_request)
    mpa::NegotiationConfig nc;
    nc.crc = defaults.crc;
    nc.peer_to_peer = true;  // we answer peer-to-peer requests (RTR WRITE preferred, else READ), as siw
    nc.rtr = defaults.rtr;
    nc.markers_rx = defaults.markers_rx;
    nc.markers_tx_ok = defaults.markers_tx;
    nc.ird = defaults.responder_resources;
    nc.ord = defaults.initiator_depth;
    if (defaults.mpa_timeout.count() > 0) nc.request_timeout = defaults.mpa_timeout;
    resp_.emplace(nc);
    resp_->start(mpa::Clock::now());
    phase_ = Phase::negotiating;
    engine_.add_conn(this);  // last: nothing after it throws
}

Conn::Conn(Engine& engine, stack::Ipv4 addr, std::uint16_t port, QueuePair& qp, const ConnParam& param)
    : keep_engine_(engine.shared_from_this()), engine_(engine), handler_(std::make_unique<TcpHandler>(*this)), initiator_(true) {
    pd_copy_.assign(param.private_data.begin(), param.private_data.end());
    mpa::NegotiationConfig nc;
    nc.revision = param.mpa_revision;
    nc.crc = param.crc;
    nc.peer_to_peer = param.peer_to_peer;
    nc.rtr = param.rtr;
    nc.markers_rx = param.markers_rx;
    nc.markers_tx_ok = param.markers_tx;
    nc.ird = param.responder_resources;
    nc.ord = param.initiator_depth;
    nc.private_data = pd_copy_;
    if (param.mpa_timeout.count() > 0) nc.reply_timeout = param.mpa_timeout;
    ini_.emplace(nc);
    rfc7306_ = param.rfc7306;
    liveness_ = param.liveness;
    guard_ = param.first_fpdu;
    phase_ = Phase::connecting;
    addr_ = addr;
    port_ = port;
    retry_until_ = mpa::Clock::now() + param.connect_retry;
    local_port_ = param.local_port;
    // Throws when lwIP cannot start (or the port is taken): nothing bound yet.
    tcp_ = stack::connect(engine_.stack(), addr, port, *handler_, stack::kConnectTimeout, local_port_);
    engine_.add_conn(this);
    qp_ = &qp.impl();
    qp_handle_ = &qp;
    qp_->bind(*this);  // RTR: MPA negotiation under way
}

Conn::~Conn() {
    leave_pending();
    engine_.remove_conn(this);
    engine_.drop_events(handle_);
    take_back_tcp();
    unbind_qp();
    // A connection that already ended in order (rejected, disconnected: its FIN is due in the poll stage) closes
    // with that FIN; so does one waiting to send its TERMINATE after an RTR (rtr_before_terminate: a reset there
    // is what crashes siw). Only a connection still in use is aborted (RST).
    if (tcp_ && (close_pending_ || deferred_term_) && tcp_->open() && tcp_->close()) return;
    if (tcp_) tcp_->abort();
}

void Conn::close_for_context() noexcept {
    draining_ = false;
    guarding_ = false;
    deferred_term_ = std::nullopt;
    if (phase_ == Phase::closed) return;  // ended in order: its FIN goes out while the Context lingers
    take_back_tcp();
    if (tcp_) tcp_->abort();  // RST: the application let go of the Context with this connection in use
    finish(CmEventType::disconnected, "the Context closed", /*quiet=*/true);
}

void Conn::drop_tcp() noexcept {
    leave_pending();
    close_pending_ = false;
    take_back_tcp();
    unbind_qp();
    tcp_.reset();  // aborts a connection still open (the linger ran out)
}

void Conn::unbind_qp() noexcept {
    if (qp_ == nullptr) return;
    Qp* q = qp_;
    qp_ = nullptr;
    qp_handle_ = nullptr;
    q->unbind();
    q->end_stream();
}

void Conn::take_back_tcp() noexcept {
    if (!stream_owned_) return;
    stream_owned_ = false;
    if (tcp_) tcp_->set_handler(handler_.get());
}

void Conn::leave_pending() noexcept {
    if (!pending_) return;
    pending_ = false;
    engine_.pending_done(peer_ip_be_);
}

// ---- accept / reject / disconnect ---------------------------------------------------------------------------

bool Conn::accept(QueuePair& qp, const ConnParam& param) {
    Qp& q = qp.impl();
    if (phase_ != Phase::request || !resp_ || !q.connectable()) return false;
    if (!resp_->accept(param.private_data, param.responder_resources, param.initiator_depth)) return false;
    qp_ = &q;
    qp_handle_ = &qp;
    q.bind(*this);
    rfc7306_ = param.rfc7306;
    responder_grace_ = param.responder_grace;
    liveness_ = param.liveness;
    write_negotiation_output();  // the reply goes into TCP before any FPDU of the QP
    go_rdma(resp_->agreed());
    emit(CmEventType::established);
    return true;
}

bool Conn::reject(std::span<const std::byte> private_data) {
    if (phase_ != Phase::request || !resp_) return false;
    if (!resp_->reject(private_data)) return false;
    write_negotiation_output();
    finish(CmEventType::rejected, "", /*quiet=*/true);
    return true;
}

void Conn::disconnect() {
    if (phase_ == Phase::rdma && qp_ != nullptr && qp_->state() == QpState::rts && !qp_->tx_idle()) {
        qp_->begin_drain();  // SQD: no new sends; what is queued still goes out
        draining_ = true;
        drain_deadline_ = mpa::Clock::now() + std::chrono::seconds(5);
        engine_.cm_work();
        return;
    }
    if (draining_) return;
    finish(CmEventType::disconnected, "local disconnect");
}

void Conn::abort() {
    if (tcp_) tcp_->abort();  // no callback follows
    finish(CmEventType::disconnected, "aborted locally");
}

void Conn::evict() {
    if (tcp_) tcp_->abort();
    finish(CmEventType::error, "reset: too many pending connections", /*quiet=*/true);
}

void Conn::qp_gone() noexcept {
    take_back_tcp();  // before the QP's stream (and its callbacks) goes
    qp_ = nullptr;
    qp_handle_ = nullptr;
    abort();
}

bool Conn::qp_leaves() noexcept {
    if (phase_ != Phase::closed) return false;
    qp_ = nullptr;
    qp_handle_ = nullptr;
    return true;
}

void Conn::note_endpoints() {
    const stack::TcpConnection::FlowInfo fi = tcp_->flow_info();
    peer_ = peer_of(*tcp_);
    peer_ip_be_ = fi.remote_ip_be;
    peer_port_ = fi.remote_port;
    local_port_ = fi.local_port;
}

// ---- TCP events ---------------------------------------------------------------------------------------------

void Conn::on_tcp_connected() {
    if (phase_ != Phase::connecting) return;
    phase_ = Phase::negotiating;
    if (tcp_) note_endpoints();
    // With an RX thread: it follows the connection from here (before our MPA request, so before any byte the
    // responder sends), forwarding in-order bytes until the QP hands the stream over after the reply.
    if (qp_ != nullptr && tcp_) qp_->watch(*tcp_);
    ini_->start(mpa::Clock::now());
    write_negotiation_output();
    check_outcome();
}

// Ownership of received bytes stays with the RecvBuffer: the negotiator and the QP read (and the QP copies
// payload out of) the pbufs during the call, and the pbufs go back to DPDK when it returns.
void Conn::on_tcp_receive(stack::RecvBuffer data) {
    // connecting: nothing can arrive; request: the initiator may send nothing before our reply (dropped);
    // closed: the stream is over.
    if (phase_ != Phase::negotiating) return;
    data.for_each_segment([&](std::span<const std::byte> s) {
        if (phase_ == Phase::negotiating) {
            const auto now = mpa::Clock::now();
            const std::size_t used = initiator_ ? ini_->input(s, now) : resp_->input(s, now);
            check_outcome();
            s = s.subspan(std::min(used, s.size()));
        }
        // Bytes after the MPA reply are FPDUs: the QP's stream, which holds the callbacks from the next delivery.
        if (phase_ == Phase::rdma && qp_ != nullptr && !s.empty()) qp_->deliver_early(s);
    });
}

void Conn::on_tcp_sent() {
    if (phase_ != Phase::closed && phase_ != Phase::rdma) write_negotiation_output();
}

void Conn::on_tcp_remote_close() {
    if (phase_ == Phase::rdma) {
        stream_closed_by_peer();
        return;
    }
    finish(initiator_ ? CmEventType::error : CmEventType::disconnected, "peer closed during MPA negotiation",
           /*quiet=*/!initiator_ && phase_ != Phase::request);
}

void Conn::on_tcp_error(stack::TcpError e) {
    const std::string reason = std::string("TCP: ") + stack::to_string(e);
    const bool unreachable = e == stack::TcpError::refused || e == stack::TcpError::timed_out;
    if (phase_ == Phase::connecting && e == stack::TcpError::refused && mpa::Clock::now() < retry_until_) {
        retry_at_ = mpa::Clock::now() + std::chrono::milliseconds(20);  // connect again from the poll stage
        engine_.cm_work();
        return;
    }
    switch (phase_) {
    case Phase::connecting: finish(unreachable ? CmEventType::unreachable : CmEventType::error, reason); break;
    case Phase::negotiating: finish(CmEventType::error, reason, /*quiet=*/!initiator_); break;
    case Phase::request: finish(CmEventType::disconnected, reason); break;
    case Phase::rdma:
        // lwIP gave up: keepalive probes unanswered, or its retransmission limit (ConnParam::liveness).
        if (e == stack::TcpError::timed_out) {
            char why[200];
            std::snprintf(why, sizeof why,
                          "peer not responding: TCP keepalive (%u probes, %lld ms apart, after %lld ms idle) or "
                          "retransmissions went unanswered",
                          liveness_.keepalive_probes, static_cast<long long>(liveness_.keepalive_interval.count()),
                          static_cast<long long>(liveness_.keepalive_idle.count()));
            finish(CmEventType::disconnected, why, false, WcStatus::retry_exc_err);
        } else {
            finish(CmEventType::disconnected, reason);
        }
        break;
    case Phase::closed: break;
    }
}

void Conn::peer_dead(const std::string& why) {
    log::warn("CM {}: {}", peer_, why);
    if (tcp_) tcp_->abort();  // RST (if it gets there); nothing lingers retransmitting to a dead peer
    finish(CmEventType::disconnected, why, false, WcStatus::retry_exc_err);
}

// ConnParam::liveness.user_timeout, from the poll stage (once a millisecond): the oldest unacknowledged byte
// must move within the limit, and so must a stream the peer's closed receive window holds back (as Linux's
// TCP_USER_TIMEOUT since 5.11: a peer that answers zero-window probes but never opens its window would
// otherwise hold the connection forever). Time without poll stages (the application away) restarts the clock.
void Conn::check_user_timeout(mpa::Clock::time_point now) {
    if (now - last_check_ > std::chrono::milliseconds(100)) una_since_ = now;
    last_check_ = now;
    const std::optional<std::uint32_t> una = tcp_->oldest_unacked();
    if (una != una_) {
        una_ = una;
        una_since_ = now;
    } else if (una && now - una_since_ >= liveness_.user_timeout) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - una_since_).count();
        peer_dead((tcp_->window_closed() ? "peer not accepting data: its receive window closed for "
                                         : "peer not responding: data unacknowledged for ") +
                  std::to_string(ms) + " ms (user timeout " + std::to_string(liveness_.user_timeout.count()) + " ms)");
    }
}

void Conn::stream_closed_by_peer() { finish(CmEventType::disconnected, "peer closed"); }

void Conn::stream_error(stack::TcpError e) { on_tcp_error(e); }

void Conn::stream_failed() {
    if (fail_event_) {  // the negotiation failed: the event comes now that the TERMINATE is out
        const auto [type, reason] = *fail_event_;
        fail_event_.reset();
        finish(type, reason);
        return;
    }
    finish(CmEventType::disconnected, "QP error", quiet_close_);
}

// ---- negotiation --------------------------------------------------------------------------------------------

void Conn::write_negotiation_output() {
    if (!tcp_ || !tcp_->open()) return;
    mpa::Negotiator* n = initiator_ ? static_cast<mpa::Negotiator*>(&*ini_) : static_cast<mpa::Negotiator*>(&*resp_);
    const auto out = n->output();
    if (out.empty()) return;
    n->output_sent(tcp_->write(out));
    tcp_->flush();
}

void Conn::check_outcome() {
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
            const CmEventType type = f.reason == mpa::FailReason::timeout ? CmEventType::unreachable : CmEventType::error;
            if (f.send_terminate && qp_ != nullptr) {
                // The reply arrived but cannot be used (IRD, RTR): TERMINATE with the MPA code, framed as agreed,
                // through the QP's stream; the connection closes once it is out (stream_failed).
                if (rtr_before_terminate(f.code, type)) return;
                emit(type, fail_text(f.reason));
                quiet_close_ = true;
                go_rdma(ini_->agreed());
                qp_->fail_stream(f.code);
                return;
            }
            finish(type, fail_text(f.reason));
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
        ev.id = handle_;
        ev.listener = listener_;
        ev.private_data = peer_pd_;
        ev.ird = resp_->request().ird_ord.ird;
        ev.ord = resp_->request().ird_ord.ord;
        ev.request = engine_.release_orphan(this);  // the application owns the id from here
        if (!ev.request) return;
        engine_.push_event(std::move(ev));
        return;
    }
    case mpa::Outcome::rejected:
    case mpa::Outcome::failed:  // automatic reject (policy) or a bad request: no event, the id is an orphan
        write_negotiation_output();
        finish(CmEventType::error, fail_text(resp_->failure().reason), /*quiet=*/true);
        return;
    }
}

void Conn::go_rdma(const mpa::Agreed& agreed) {
    phase_ = Phase::rdma;
    leave_pending();
    if (tcp_) tcp_->set_priority(stack::TcpPriority::vital);  // lwIP never sacrifices a running session
    // Dead-peer detection from here (an MPA exchange has its own time limits).
    if (tcp_ && liveness_.keepalive_probes > 0) {
        constexpr std::chrono::milliseconds tick{20};  // lwIP's slow timer (TCP_TMR_INTERVAL x 2)
        tcp_->set_keepalive(std::max(liveness_.keepalive_idle, tick), std::max(liveness_.keepalive_interval, tick),
                            liveness_.keepalive_probes);
    }
    una_.reset();
    una_since_ = last_check_ = mpa::Clock::now();
    ird_ = agreed.ird;
    ord_ = agreed.ord;
    if (qp_ == nullptr || !tcp_) return;
    qp_->start_stream(*tcp_, agreed,
                      {.initiator = initiator_, .rfc7306 = rfc7306_,
                       .hold_first = initiator_ && guard_.mode == FirstFpduGuard::Mode::hold});
    stream_owned_ = true;  // the QP's stream holds the TCP callbacks from here
    guarding_ = initiator_ && guard_.mode != FirstFpduGuard::Mode::off && ini_->outcome() == mpa::Outcome::agreed;
    hold_until_ = mpa::Clock::now() + guard_.delay;
    // A responder held to the RFC's gate (no peer-to-peer): opened by the initiator's first FPDU, or by the
    // grace (ConnParam::responder_grace) for a server that speaks first.
    if (!initiator_ && agreed.responder_waits_for_first_fpdu && responder_grace_.count() > 0) {
        guarding_ = true;
        hold_until_ = mpa::Clock::now() + responder_grace_;
    }
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
void Conn::guard_first_fpdu(mpa::Clock::time_point now) {
    if (phase_ != Phase::rdma || qp_ == nullptr || (qp_->state() != QpState::rts && !deferred_term_)) {
        guarding_ = false;
        return;
    }
    if (!initiator_) {  // the responder's grace (go_rdma); the initiator's first FPDU opens the gate itself
        if (qp_->peer_spoke()) {
            guarding_ = false;
        } else if (now >= hold_until_) {
            qp_->release_first_fpdu();
            guarding_ = false;
        }
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

// A peer-to-peer responder that waits for its RTR (Linux siw) must get one before its stream ends: siw 6.1
// reports a connection to iw_cm only once the RTR arrived, and a stream that ends before that (our TERMINATE
// for a reply we cannot use, a FIN, a reset) reaches iw_cm's close handler in a state it does not expect, and
// the kernel BUG()s (seen: "invalid opcode" in cm_work_handler). So when the reply asks for an RTR we can send
// (WRITE or READ: siw never picks SEND), that RTR goes first, with the first-FPDU nudges behind it, and the
// TERMINATE only kRtrSettle later: read apart from the RTR, it ends an established connection. The QP refuses
// posts meanwhile, and the application hears of the failure when the TERMINATE is out. False when the reply
// asks for no such RTR (the TERMINATE goes at once).
bool Conn::rtr_before_terminate(TermCode code, CmEventType type) {
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
    qp_->refuse_posts();  // the connection failed
    deferred_term_ = code;
    deferred_until_ = mpa::Clock::now() + CmId::kRtrSettle;
    return true;
}

void Conn::finish(CmEventType type, const std::string& reason, bool quiet, WcStatus first) {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    leave_pending();
    // A TERMINATE sent or received is the reason the stream ended, even when the peer's FIN (which follows a
    // TERMINATE) is what this call reports.
    std::string why = reason;
    if (qp_ != nullptr && qp_->terminate_info() && type == CmEventType::disconnected) {
        const TerminateInfo& t = *qp_->terminate_info();
        why = t.describe();
        if (t.received) log::warn("QP {}: {}", qp_->qp_num(), why);  // a peer's error
        else if (is_access_error(t.cause) && peer_ip_be_ != 0) engine_.note_access_error(peer_ip_be_);
    }
    if (qp_ != nullptr) qp_->end_stream(first);
    take_back_tcp();
    close_pending_ = true;  // closed in the poll stage, after the RecvBuffer of this turn reopened the window
    engine_.cm_work();      // (lwIP answers a close with unread data by RST)
    if (!quiet) emit(type, why);
}

void Conn::emit(CmEventType type, const std::string& reason) {
    // Control path only. debug: a thousand connections must not flood the default log.
    log::debug("CM {} {} (IRD {} ORD {}){}{}", initiator_ ? "initiator" : "responder", to_string(type),
                  ird_, ord_, reason.empty() ? "" : ": ", reason);
    CmEvent ev;
    ev.type = type;
    ev.id = handle_;
    ev.listener = listener_;
    ev.private_data = peer_pd_;
    ev.ird = ird_;
    ev.ord = ord_;
    ev.reason = reason;
    engine_.push_event(std::move(ev));
}

void Conn::service(mpa::Clock::time_point now) {
    if (guarding_) guard_first_fpdu(now);
    if (deferred_term_ && now >= deferred_until_) {  // rtr_before_terminate(): the RTR has had its time
        const TermCode code = *deferred_term_;
        deferred_term_ = std::nullopt;
        guarding_ = false;
        if (phase_ == Phase::rdma && qp_ != nullptr) qp_->fail_stream(code);
    }
    if (retry_at_) {
        if (phase_ != Phase::connecting) {
            retry_at_.reset();
        } else if (now >= *retry_at_) {
            retry_at_.reset();
            try {
                tcp_ = stack::connect(engine_.stack(), addr_, port_, *handler_, stack::kConnectTimeout, local_port_);
            } catch (const std::exception& e) {
                tcp_.reset();
                finish(CmEventType::unreachable, std::string("TCP: ") + e.what());
            }
        } else {
            engine_.cm_work();  // not yet: look again next turn
        }
    }
    if (phase_ == Phase::rdma && tcp_ && tcp_->open() && liveness_.user_timeout.count() > 0) check_user_timeout(now);
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
        if (tcp_ && tcp_->open()) {
            if (!tcp_->close()) {  // no memory for the FIN: next turn
                engine_.cm_work();
                return;
            }
        }
        close_pending_ = false;
    }
}

// ---- listener -----------------------------------------------------------------------------------------------

struct Listener::Acceptor final : stack::TcpListener::Handler {
    Listener& l;
    explicit Acceptor(Listener& li) : l(li) {}
    void on_accept(std::unique_ptr<stack::TcpConnection> c) override {
        if (l.handle_ != nullptr) l.engine_.new_request(*l.handle_, std::move(c));
    }
};

Listener::Listener(Engine& engine, std::uint16_t port, const ConnParam& defaults)
    : keep_engine_(engine.shared_from_this()),
      engine_(engine),
      port_(port),
      defaults_(defaults),
      acceptor_(std::make_unique<Acceptor>(*this)) {
    defaults_.private_data = {};  // not kept: the application's buffer
    tcp_ = std::make_unique<stack::TcpListener>(engine.stack(), port, *acceptor_);
    engine_.add_listener(this);  // last: nothing after it throws (but a vector growing: then tcp_ goes)
}

Listener::~Listener() {
    engine_.remove_listener(this);
    tcp_.reset();
    engine_.forget_listener(handle_);
}

}  // namespace softrdma::verbs::detail

// ==== the handles =============================================================================================

namespace softrdma::verbs {

CmId::CmId(std::unique_ptr<detail::Conn> impl) : impl_(std::move(impl)) { impl_->set_handle(this); }
CmId::~CmId() = default;
bool CmId::accept(QueuePair& qp, const ConnParam& param) { return impl_->accept(qp, param); }
bool CmId::reject(std::span<const std::byte> private_data) { return impl_->reject(private_data); }
void CmId::disconnect() { impl_->disconnect(); }
void CmId::abort() { impl_->abort(); }
const mpa::PrivateData& CmId::peer_private_data() const noexcept { return impl_->peer_private_data(); }
QueuePair* CmId::qp() noexcept { return impl_->qp(); }
bool CmId::connected() const noexcept { return impl_->connected(); }
unsigned CmId::nudges_sent() const noexcept { return impl_->nudges_sent(); }
std::string CmId::peer() const { return impl_->peer(); }
Ipv4 CmId::peer_address() const noexcept { return impl_->peer_address(); }
std::uint16_t CmId::peer_port() const noexcept { return impl_->peer_port(); }
std::uint16_t CmId::local_port() const noexcept { return impl_->local_port(); }

CmListener::CmListener(std::unique_ptr<detail::Listener> impl) : impl_(std::move(impl)) { impl_->set_handle(this); }
CmListener::~CmListener() = default;
std::uint16_t CmListener::port() const noexcept { return impl_->port(); }

std::unique_ptr<CmListener> Context::listen(std::uint16_t port, const ConnParam& defaults) {
    impl_->check_open("listen");
    return std::make_unique<CmListener>(std::make_unique<detail::Listener>(*impl_, port, defaults));
}

std::unique_ptr<CmId> Context::connect(stack::Ipv4 addr, std::uint16_t port, QueuePair& qp, const ConnParam& param) {
    if (!qp.impl().connectable()) throw Error("connect: the QP must be in INIT, unconnected");
    if (&qp.impl().engine() != impl_.get()) throw Error("connect: the QP belongs to another Context");
    if (param.mpa_revision != 1 && param.mpa_revision != 2) throw Error("connect: MPA revision must be 1 or 2");
    if (param.peer_to_peer && param.mpa_revision != 2) throw Error("connect: peer-to-peer mode needs MPA revision 2");
    if (param.peer_to_peer && !param.rtr.write && !param.rtr.read && !param.rtr.send)
        throw Error("connect: peer-to-peer mode needs at least one RTR type");
    if (param.private_data.size() > mpa::kMaxPrivateDataSent - (param.mpa_revision == 2 ? mpa::kIrdOrdSize : 0))
        throw Error("connect: private data above 252 bytes (256 with MPA revision 1)");
    return std::make_unique<CmId>(std::make_unique<detail::Conn>(*impl_, addr, port, qp, param));
}

}  // namespace softrdma::verbs
