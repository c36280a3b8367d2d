// SPDX-License-Identifier: MIT
// MPA connection setup (RFC 5044 section 7.1, RFC 6581 sections 3-9) as two pure state machines: bytes in,
// bytes out, time passed in by the caller. No clocks, sockets, allocation or logging.
//
// Usage (both roles):
//   start(now)                      queue our first frame (initiator) / arm the request timer (responder)
//   output() / output_sent(n)       bytes to write to TCP, and how many were written
//   input(bytes, now) -> consumed   feed TCP bytes; consumption stops right after the peer's frame, so any
//                                   bytes after it (FPDUs) stay with the caller for the deframer
//   poll(now)                       time limits (reply 10 s, request 5 s by default, as siw)
//   outcome()                       in_progress / request_received (responder: call accept or reject) /
//                                   agreed / rejected / failed
// On agreed: flush output() first, then build FpduTx/Deframer from agreed() (tx_config / rx_config). On
// rejected or failed: flush output() (a reject reply may be queued), send a TERMINATE if failure().send_terminate
// (the caller's RDMAP layer builds it with failure().code, framed with agreed()'s CRC/marker choice), then close.
//
// Rules implemented (and where they come from):
//  - CRC (RFC 5044 s7.1, C flag): used when either side sets C; a side that did not ask must follow the peer.
//    CrcPolicy::off = do not ask, follow the peer (siw's default); preferred = ask; required = ask and refuse a
//    reply that does not echo C (siw mpa_crc_required); forbidden = local policy that refuses CRC (not RFC
//    behaviour, siw's mpa_crc_strict): the responder rejects, the initiator fails.
//  - Markers (RFC 5044 s7.1, M flag): each side's M says it wants Markers on the data it *receives*, so the
//    request's M decides responder->initiator and the reply's M decides initiator->responder. We can send and
//    receive Markers, but by default refuse to send them (markers_tx_ok = false: the responder rejects, the
//    initiator fails), as Linux siw does: no other software peer implements them, and no real one has checked
//    our placement. markers_tx_ok = true agrees.
//  - Revision, as siw and Chelsio: the initiator offers 1 or 2 (2 = enhanced, with IRD/ORD, always sent like
//    siw). The responder answers revisions 0, 1 and 2 with the request's revision (lowered to its own
//    configured revision; 0 is the pre-RFC draft, framed like 1) and drops a request above 2 without a reply
//    (siw: -EPROTO, the connection closes; cxgb4 aborts).
//  - IRD/ORD (RFC 6581 s3): the peer's ORD must fit our IRD; we grow our IRD up to max_ird (relaxed, like siw)
//    else fail with insufficient IRD (0x06, TERMINATE from the initiator). Our ORD is cut to the peer's IRD.
//  - Peer-to-peer (RFC 6581 s4-6): the initiator offers RTR types; the responder picks WRITE if offered and
//    accepted, else READ, else SEND; with P2P but no type offered it proposes WRITE (as siw). The initiator
//    checks the choice is one it offered, else TERMINATE "no matching RTR" (0x07). A responder that cannot
//    match rejects the request and reports 0x07.
//  - The responder sends no FPDU before the initiator's first FPDU (or RTR) arrives (RFC 5044 s7.1.2,
//    RFC 6581 s4): Agreed::responder_waits_for_first_fpdu is true on the responder; the QP enforces it.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "mpa/deframer.hpp"
#include "mpa/errors.hpp"
#include "mpa/fpdu.hpp"
#include "mpa/frames.hpp"
#include "base/term_code.hpp"

namespace softrdma::mpa {

using Clock = std::chrono::steady_clock;

// The connection choices are the API's (<softrdma/iwarp.hpp>).
using softrdma::CrcPolicy;
using softrdma::PrivateData;
using softrdma::RtrSet;
enum class RtrType : std::uint8_t { none, write, read, send };  // zero-length RDMA WRITE / READ / SEND

struct NegotiationConfig {
    std::uint8_t revision = 2;          // revision the initiator offers / the highest the responder speaks
    CrcPolicy crc = CrcPolicy::off;
    bool markers_rx = false;            // ask for Markers on the data we receive (our M bit)
    bool markers_tx_ok = false;         // agree to put Markers on the data we send when the peer asks
    bool peer_to_peer = false;          // initiator: ask for P2P; responder: accept P2P requests
    RtrSet rtr{true, true, false};      // initiator: RTR types offered; responder: types accepted
    std::uint16_t ird = 1;              // initiator: IRD/ORD sent; responder: defaults for accept()
    std::uint16_t ord = 1;
    std::uint16_t max_ird = 128;        // we may grow IRD up to this when the peer's ORD is higher
    std::span<const std::byte> private_data{};  // initiator: request private data (copied by start())
    std::chrono::nanoseconds reply_timeout = std::chrono::seconds(10);   // initiator waiting for the reply
    std::chrono::nanoseconds request_timeout = std::chrono::seconds(5);  // responder waiting for the request
};

struct Agreed {
    std::uint8_t revision = 0;
    bool enhanced = false;    // IRD/ORD exchanged (revision 2)
    bool crc = false;
    bool markers_rx = false;  // Markers on what we receive
    bool markers_tx = false;  // Markers on what we send
    std::uint16_t ird = 0;
    std::uint16_t ord = 0;
    bool p2p = false;
    RtrType rtr = RtrType::none;  // initiator: RTR it must send first; responder: RTR it must expect first
    bool responder_waits_for_first_fpdu = false;  // responder: send no FPDU until the first FPDU/RTR arrives
    PrivateData peer_private_data;  // application part (after the IRD/ORD header)
};

enum class Outcome : std::uint8_t { in_progress, request_received, agreed, rejected, failed };

enum class FailReason : std::uint8_t {
    timeout,        // no request/reply in time
    protocol,       // malformed or invalid frame
    unsupported,    // peer asks for something our policy refuses (markers, CRC)
    insufficient_ird,
    no_matching_rtr,
};

struct Failure {
    FailReason reason = FailReason::protocol;
    TermCode code{};              // MPA error code (errors.hpp)
    bool send_terminate = false;  // send a TERMINATE with `code` before closing (initiator after the reply)
};

// Common part: output buffer, outcome, time limit.
class Negotiator {
public:
    std::span<const std::byte> output() const { return {out_.data() + out_sent_, out_len_ - out_sent_}; }
    void output_sent(std::size_t n) { out_sent_ += n < out_len_ - out_sent_ ? n : out_len_ - out_sent_; }
    Outcome poll(Clock::time_point now);
    Outcome outcome() const { return outcome_; }
    const Agreed& agreed() const { return agreed_; }  // also filled as far as known when rejected/failed
    const Failure& failure() const { return failure_; }

protected:
    explicit Negotiator(const NegotiationConfig& cfg) : cfg_(cfg) {}
    void queue(const FrameParams& p);
    Outcome fail(FailReason r, TermCode code, bool terminate);

    NegotiationConfig cfg_;
    Outcome outcome_ = Outcome::in_progress;
    bool timer_armed_ = false;
    Clock::time_point deadline_{};
    Agreed agreed_{};
    Failure failure_{};
    std::array<std::byte, kFrameHeaderSize + kMaxPrivateDataSent> out_{};
    std::size_t out_len_ = 0;
    std::size_t out_sent_ = 0;
};

class Initiator : public Negotiator {
public:
    explicit Initiator(const NegotiationConfig& cfg) : Negotiator(cfg), dec_(FrameKind::reply) {}

    // Queues the MPA Request and starts the reply timer. Fails (protocol) if the config cannot be sent
    // (private data too long, revision not 1 or 2).
    Outcome start(Clock::time_point now);
    // Feeds bytes received; returns how many were consumed (never past the reply).
    std::size_t input(std::span<const std::byte> in, Clock::time_point now);
    // The peer's reply (valid once outcome() is not in_progress).
    const Frame& reply() const { return dec_.frame(); }

private:
    void evaluate_reply();
    bool sent_crc_ = false;
    FrameDecoder dec_;
};

class Responder : public Negotiator {
public:
    explicit Responder(const NegotiationConfig& cfg) : Negotiator(cfg), dec_(FrameKind::request) {}

    // Starts the request timer.
    void start(Clock::time_point now);
    // Feeds bytes received; returns how many were consumed (never past the request).
    std::size_t input(std::span<const std::byte> in, Clock::time_point now);

    // After outcome() == request_received: what the initiator asked for. agreed() already holds what accept()
    // will agree to (CRC, Markers, revision, P2P and RTR choice; IRD/ORD are set by accept).
    const Frame& request() const { return dec_.frame(); }
    std::span<const std::byte> request_private_data() const { return dec_.frame().private_data(); }

    // Accepts with our private data and IRD/ORD: queues the reply, outcome becomes agreed. Returns false (and
    // does nothing) if not in request_received or the private data is too long (252 with rev 2, else 256).
    bool accept(std::span<const std::byte> private_data, std::uint16_t ird, std::uint16_t ord);
    // Rejects (reply with R set) with our private data; outcome becomes rejected.
    bool reject(std::span<const std::byte> private_data);

private:
    void evaluate_request();
    Outcome auto_reject(FailReason r, TermCode code);
    std::uint8_t reply_revision_ = 1;
    FrameDecoder dec_;
};

// FPDU engine configurations from the agreement.
constexpr FpduTxConfig tx_config(const Agreed& a, std::uint32_t emss) { return {a.crc, a.markers_tx, emss}; }
constexpr DeframerConfig rx_config(const Agreed& a) { return {a.crc, a.markers_rx, 0}; }

}  // namespace softrdma::mpa
