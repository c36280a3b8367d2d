// SPDX-License-Identifier: MIT
// rdmap::Endpoint: one RDMAP stream (one connection in RDMA mode), testable on bytes.
//
//   TX: post() queues work requests; pull_tx(out) writes whole FPDUs for them (and for READ/atomic responses
//       and the TERMINATE) into the caller's buffer, segmented at MULPDU by DDP rules.
//   RX: the endpoint is the MPA deframer's UlpduHandler (ulpdu_header_length / on_ulpdu_header /
//       on_ulpdu_payload / on_ulpdu_end); payload is copied once, from the input buffer to the memory the
//       upper layer names.
//   Errors: every MPA, DDP and RDMAP error goes through one function (fail) that builds the TERMINATE,
//       moves the endpoint to State::error for good and flushes posted work. pull_tx then emits only the
//       TERMINATE.
//
// Threading: single-threaded; all calls (and all Upper callbacks) on the connection's thread.
// Memory: everything is allocated in the constructor (queues sized by Config); nothing on the data path.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "ddp/header.hpp"
#include "ddp/reassembly.hpp"
#include "base/term_code.hpp"
#include "rdmap/framer.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/opcode.hpp"
#include "rdmap/upper.hpp"

namespace softrdma::rdmap {

// SGEs per work request (siw offers 6; libibverbs' common max_send_sge is 4..32).
inline constexpr std::size_t kMaxSge = 8;
// Payload pieces gathered into one FPDU. A READ response source may come back in pieces (non-contiguous
// region): a segment is cut short rather than gather more than this. Must be >= kMaxSge.
inline constexpr std::size_t kMaxPieces = 16;
static_assert(kMaxPieces >= kMaxSge);


// A send-queue work request (the shape of ibv_send_wr). The endpoint copies the request; the memory the SGEs
// point to stays owned by the poster and must stay valid and unchanged until the WR's completion (or flush).
struct WorkRequest {
    std::uint64_t wr_id{0};
    WrOp op{WrOp::send};
    bool signaled{true};
    bool solicited{false};      // send (and its Immediate Data): SE variant
    bool with_imm{false};       // send/write: followed by an Immediate Data message (RFC 7306 section 4)
    std::uint64_t imm{0};
    bool with_inv{false};       // send: SEND with Invalidate of inv_stag
    std::uint32_t inv_stag{0};
    std::uint32_t remote_stag{0};  // write: sink; read: source; atomics: target
    std::uint64_t remote_to{0};
    std::uint32_t local_stag{0};   // read: our sink region (checked again on arrival with local_write)
    std::uint64_t local_to{0};
    std::uint32_t read_len{0};     // read: RDMA Read Message Size
    std::uint64_t compare{0};      // cmp_swap: compare value
    std::uint64_t swap_add{0};     // cmp_swap: swap value; fetch_add: addend
    std::array<std::span<const std::byte>, kMaxSge> sgl{};  // send/write payload, gathered in order
    std::uint8_t num_sge{0};
};

// bad_address: the remote range wraps past 2^64, or an atomic's target is not 8-byte aligned (RFC 7306).
enum class PostStatus : std::uint8_t { ok, queue_full, bad_wr, not_operational, not_agreed, bad_address };

// Which half of a stream an endpoint runs. A stream has two endpoints, as a QP has two halves: `tx` (posting,
// framing, READ/atomic responses, the TERMINATE) and `rx` (deframed input, placement, completions of inbound
// messages and of our READ/atomic requests). With an RX thread they run on two threads; rdmap::Duplex
// (duplex.hpp) joins them on one. What one half learns that the other needs goes through Upper
// (on_request_sent, on_inbound_request, on_terminate) and comes back in through expect_response / answer /
// send_terminate / stop; the layer above carries it (between the threads, or by a direct call). The ORD/IRD
// credits stay exact: the tx endpoint counts requests until request_done(); the rx endpoint counts inbound
// requests minus `answered`, which the tx endpoint advances (shared atomic).
enum class Role : std::uint8_t { tx, rx };

struct Config {
    std::uint32_t sq_depth{64};  // WRs posted and not yet handed to the wire (or awaiting a response)
    std::uint16_t ird{16};       // inbound READ + atomic requests we hold for answer (MPA-negotiated IRD)
    std::uint16_t ord{16};       // outbound READ + atomic requests outstanding (MPA-negotiated ORD)
    // Inbound requests the tx endpoint has answered (written by tx, read by rx). Borrowed; null: none counted.
    std::atomic<std::uint32_t>* answered{nullptr};
    // RFC 7306 (Immediate Data, Atomic Request/Response, opcodes 8-11) on this stream. RFC 7306 leaves the
    // agreement to the ULP (nothing in MPA negotiates it): off, post() refuses those operations (not_agreed)
    // and an inbound one is a TERMINATE (RDMAP, unexpected opcode), which is what peers without RFC 7306
    // (Linux siw, Chelsio) do with them.
    bool rfc7306{false};
    // Security (RFC 5042 section 5): report every failed access to our memory as "invalid STag" (and every
    // failed invalidation alike) instead of the precise RFC 5040/5041 code, which would tell a prober whether
    // an STag exists and where its region ends. The precise cause still reaches the upper layer
    // (TermReport::cause). Off here (the protocol tests check exact codes); verbs turns it on by default.
    bool opaque_access_errors{false};
};

enum class State : std::uint8_t { operational, error };

class Endpoint {
public:
    // `upper` and `framer` are borrowed and must outlive the endpoint. An rx endpoint frames nothing (its
    // TERMINATE goes to the tx endpoint as TermReport::frame): pass rdmap::no_framer().
    Endpoint(Role role, Upper& upper, Framer& framer, Config cfg);
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;

    // ---- TX ------------------------------------------------------------------------------------------------
    // Queues a work request (copied). Its completion comes when its last FPDU has been written by pull_tx()
    // (SEND, WRITE: handed to TCP, as siw), when the last READ response segment arrives (READ), or when the
    // Atomic Response arrives; unsignaled WRs complete silently unless flushed.
    PostStatus post(const WorkRequest& wr);
    // Writes as many whole FPDUs as fit into `out` (caller-owned; nothing written past out.size()), returns the
    // byte count. 0 when nothing is ready or the next FPDU does not fit.
    std::size_t pull_tx(std::span<std::byte> out);
    bool tx_ready() const;
    // Where the payload of the next FPDU pull_tx() writes comes from, and the DDP/RDMAP header before it, when
    // that FPDU is a SEND or WRITE segment with payload; {} otherwise (nothing queued, a READ response or
    // request, an atomic, immediate data, a TERMINATE). For placing the FPDU where its payload copy runs fast
    // (verbs::detail::TxHalf: base::unaliased_start).
    struct NextPayload {
        const std::byte* src = nullptr;
        std::size_t hdr_len = 0;
    };
    NextPayload next_payload() const noexcept;

    // ---- RX: mpa UlpduHandler --------------------------------------------------------------------------------
    // Header bytes for a ULPDU whose first 16 bits are `ctrl`, counted from the DDP control byte. 0 for a
    // control word we cannot parse (bad version, reserved opcode, T flag not the opcode's): the deframer then
    // calls on_ulpdu_header() with the control word alone, which reports the exact error.
    std::size_t ulpdu_header_length(std::uint16_t ctrl);
    // `hdr`: the whole header, borrowed for the call; `payload_len`: payload bytes that follow.
    ProtoStatus on_ulpdu_header(std::span<const std::byte> hdr, std::size_t payload_len);
    // `bytes` points into the caller's input buffer, borrowed for the call; copied to its target here.
    ProtoStatus on_ulpdu_payload(std::span<const std::byte> bytes);
    // Same, when MPA CRC is on: the copy runs the CRC too (crc32c_copy), so payload is read once. `crc_state`
    // is the deframer's running CRC register, updated over every byte of `bytes`.
    ProtoStatus on_ulpdu_payload_crc(std::span<const std::byte> bytes, std::uint32_t& crc_state);
    ProtoStatus on_ulpdu_end();

    // ---- errors from below: the deframer's error (CRC, bad length, ...) enters the choke point here ------
    void on_llp_error(TermCode code);

    // ---- the other half (see Role) ----------------------------------------------------------------------------
    // rx: a request the tx endpoint framed (its Upper::on_request_sent), expected back in order.
    void expect_response(const OrqEntry& e);
    // tx: the response to one of our requests arrived at the rx endpoint (completed or flushed): a credit back.
    void request_done();
    // tx: an inbound request the rx endpoint accepted (its Upper::on_inbound_request), to answer in order.
    void answer(const IrqEntry& e);
    // tx: the rx endpoint failed and built `terminate` (TermReport::frame): send it, then error and flush.
    void send_terminate(TermCode code, std::span<const std::byte> terminate);
    // The stream ended without a protocol error (a TERMINATE received on the rx side, the connection closed
    // in order or lost, the QP moved to ERR): error and flush, and nothing is sent. An orderly close is a FIN
    // and nothing else; a TERMINATE is for protocol errors.
    void stop(TermCode code);

    State state() const { return state_; }
    const ProtoStatus& error() const { return error_; }
    std::uint32_t orq_outstanding() const;
    std::uint32_t irq_outstanding() const;
    // Role rx, at the start of each input (rdmap::receive): takes the tx side's `answered` count once, so every
    // request in one delivery counts against IRD as of its arrival. Read per request instead, the result raced
    // the other thread (an RX thread saw four requests at IRD 2 answered or refused by timing alone).
    void begin_input() {
        if (role_ == Role::rx && cfg_.answered != nullptr) answered_seen_ = cfg_.answered->load(std::memory_order_acquire);
    }
    // DDP payload bytes placed into upper-layer memory so far (tagged and untagged), for copy accounting.
    std::uint64_t placed_bytes() const { return placed_bytes_; }
    // DDP payload bytes framed for sending so far (role tx: the gather copy's payload), for copy accounting.
    std::uint64_t framed_bytes() const { return framed_bytes_; }
    // Cost accounting (off unless set): cycles spent in the RX callbacks (DDP/RDMAP receive work, placement
    // and, when MPA CRC is on, the CRC fused into the copy) and in the framer (MPA framing, markers, CRC and
    // the gather copy) are added to these counters. Borrowed; null = off.
    void count_cycles(std::uint64_t* rx_callbacks, std::uint64_t* framer) {
        prof_rx_ = rx_callbacks;
        prof_framer_ = framer;
    }

private:
    friend struct RxHandlers;

    // Fixed-capacity FIFO over storage allocated once.
    template <class T>
    class Ring {
    public:
        explicit Ring(std::size_t cap) : buf_(cap) {}
        bool empty() const { return n_ == 0; }
        bool full() const { return n_ == buf_.size(); }
        std::size_t size() const { return n_; }
        T& front() { return buf_[head_]; }
        const T& front() const { return buf_[head_]; }
        T& at(std::size_t i) { return buf_[(head_ + i) % buf_.size()]; }
        void push(const T& v) {
            buf_[(head_ + n_) % buf_.size()] = v;
            ++n_;
        }
        void pop() {
            head_ = (head_ + 1) % buf_.size();
            --n_;
        }
        void clear() { head_ = n_ = 0; }

    private:
        std::vector<T> buf_;
        std::size_t head_{0};
        std::size_t n_{0};
    };

    // The segment being received.
    struct RxSeg {
        const OpInfo* op{nullptr};
        std::uint8_t opcode{0};
        std::size_t hdr_len{0};
        std::size_t payload_len{0};
        std::size_t got{0};
        ddp::TaggedHeader th{};
        ddp::UntaggedHeader uh{};
        Access access{Access::remote_write};
        std::array<std::byte, kMaxHeaderLen> hdr{};
    };
    enum class TxSrc : std::uint8_t { none, sq, irq };

    // The choke point. Records `code`, builds the TERMINATE (attaching the DDP Segment Length and the
    // offending header `hdr` as RFC 5040 section 4.8 and attach rules in endpoint.cpp say), reports it,
    // flushes posted work, and returns `code` so callers can `return fail(...)`.
    TermCode fail(TermCode cause, std::span<const std::byte> hdr, std::size_t seg_len);
    TermCode fail_rx(TermCode code);  // fail() with the segment being received attached
    void deliver_held();              // held_recv_ to the upper layer
    void enter_error_received(TermCode code, const TerminateHeader& th, std::span<const std::byte> attached);
    void flush();

    template <class Copy>
    ProtoStatus rx_payload(std::span<const std::byte> bytes, Copy&& copy);
    ProtoStatus rx_header(std::span<const std::byte> hdr, std::size_t payload_len);
    ProtoStatus rx_payload_crc(std::span<const std::byte> bytes, std::uint32_t& crc_state);
    ProtoStatus rx_end();
    std::size_t emit_terminate(std::span<std::byte> out);
    std::size_t emit_sq(std::span<std::byte> out);
    std::size_t emit_irq(std::span<std::byte> out);
    // Frames one segment: header in hdr_tx_[0..hdr_len), payload pieces in pieces_[0..npieces). 0 if no fit.
    std::size_t frame(std::span<std::byte> out, std::size_t hdr_len, std::size_t npieces);
    // Fills pieces_ with the SGL bytes [off, off + len); returns the piece count.
    std::size_t gather_sgl(const WorkRequest& wr, std::size_t off, std::size_t len);
    std::size_t max_payload(std::size_t hdr_len) const;
    void finish_sq_head();
    void push_orq(const OrqEntry& e);
    void push_irq(const IrqEntry& e);
    void pop_irq();

    Role role_;
    Upper& upper_;
    Framer& framer_;
    Config cfg_;
    State state_{State::operational};
    ProtoStatus error_{};

    // TX
    Ring<WorkRequest> sq_;   // sized by cfg.sq_depth
    Ring<OrqEntry> orq_;     // sized by cfg.ord: a READ/atomic is not sent while ORD requests are outstanding
    Ring<IrqEntry> irq_;     // sized by cfg.ird: an inbound request beyond IRD is a TERMINATE
    std::uint32_t orq_sent_{0};  // role tx: requests framed and not yet request_done()
    std::uint32_t irq_in_{0};    // role rx: inbound requests accepted (minus answered_seen_ = outstanding)
    std::uint32_t answered_seen_{0};  // role rx: *cfg_.answered as of this input's start (begin_input)
    TxSrc tx_src_{TxSrc::none};
    std::uint8_t tx_phase_{0};   // 0: the WR's main message; 1: its trailing Immediate Data message
    std::size_t tx_sent_{0};     // payload bytes of the current message already framed
    std::array<std::uint32_t, kQueueCount> tx_msn_{1, 1, 1, 1};  // next MSN per queue (RFC 5041 section 5.3)
    std::uint32_t next_req_id_{1};
    std::array<std::byte, kMaxHeaderLen> hdr_tx_{};
    std::array<std::span<const std::byte>, kMaxPieces> pieces_{};

    // RX
    std::array<ddp::UntaggedQueue, kQueueCount> rxq_{};
    ddp::TaggedStream tagged_{};
    std::uint8_t tagged_op_{0};  // opcode of the tagged message in progress
    std::uint8_t send_op_{0};    // opcode of the QN 0 message in progress
    std::uint32_t rx_inv_stag_{0};
    RxSeg rx_{};
    // RFC 7306 streams: the receive completion of a SEND that announced its Immediate Data (kImmFollows), held
    // until the next ULPDU header; that Immediate Data (MSN + 1) joins it instead of taking a receive of its own.
    std::optional<Completion> held_recv_{};
    bool rx_merge_imm_{false};  // the segment being received is such an Immediate Data message
    std::uint64_t placed_bytes_{0};
    std::uint64_t framed_bytes_{0};
    std::uint64_t* prof_rx_{nullptr};
    std::uint64_t* prof_framer_{nullptr};
    // Received TERMINATE's attached bytes: DDP Segment Length + the largest header a TERMINATE can carry
    // (RFC 5040 section 4.8); anything beyond is dropped (reporting only).
    std::array<std::byte, 2 + kMaxHeaderLen> term_rx_{};
    std::size_t term_rx_len_{0};

    // TERMINATE to send: its own header + DDP Segment Length + the largest offending header (an Atomic Request).
    std::array<std::byte, kTerminateLen + 2 + kMaxHeaderLen> term_tx_{};
    std::size_t term_tx_len_{0};
    bool term_pending_{false};
};

}  // namespace softrdma::rdmap
