// SPDX-License-Identifier: MIT
// Both halves of one stream on one thread: a tx Endpoint and an rx Endpoint joined as verbs joins them (a QP's
// transmit and receive halves, verbs/qp_tx.hpp and verbs/qp_rx.hpp), with nothing between them but direct
// calls. For the protocol tests, the fuzzers and the benchmarks, which then exercise the same split endpoints
// the product runs; it adds no behaviour of its own.
//
// The wiring (Upper calls of one half that the other half needs):
//   tx frames a READ/atomic request   -> rx.expect_response()
//   rx completes or flushes it         -> tx.request_done(), then the upper layer's completion
//   rx accepts an inbound request      -> tx.answer()
//   rx builds a TERMINATE              -> tx.send_terminate() (framed and sent by tx); received: tx.stop()
//                                         both once the rx call returns, after rx flushed its outstanding
//                                         requests: flushes then complete in posting order (requests on the
//                                         wire before the send queue), as one endpoint would
//   tx fails (a READ source gone)      -> rx.stop()
// Every other Upper call goes to the upper layer unchanged. Memory: both endpoints' rings, allocated at
// construction; the data path allocates nothing.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <span>

#include "rdmap/endpoint.hpp"
#include "rdmap/framer.hpp"
#include "rdmap/upper.hpp"

namespace softrdma::rdmap {

class Duplex {
public:
    // `upper` and `framer` are borrowed and must outlive the pair.
    Duplex(Upper& upper, Framer& framer, const Config& cfg);
    Duplex(const Duplex&) = delete;
    Duplex& operator=(const Duplex&) = delete;

    // ---- TX (the tx endpoint) ----
    PostStatus post(const WorkRequest& wr) { return tx_.post(wr); }
    std::size_t pull_tx(std::span<std::byte> out) { return tx_.pull_tx(out); }
    bool tx_ready() const { return tx_.tx_ready(); }

    // ---- RX (the rx endpoint): mpa UlpduHandler ----
    void begin_input() { rx_.begin_input(); }
    std::size_t ulpdu_header_length(std::uint16_t ctrl) { return rx_.ulpdu_header_length(ctrl); }
    ProtoStatus on_ulpdu_header(std::span<const std::byte> hdr, std::size_t payload_len) {
        return after_rx(rx_.on_ulpdu_header(hdr, payload_len));
    }
    ProtoStatus on_ulpdu_payload(std::span<const std::byte> bytes) { return after_rx(rx_.on_ulpdu_payload(bytes)); }
    ProtoStatus on_ulpdu_payload_crc(std::span<const std::byte> bytes, std::uint32_t& crc_state) {
        return after_rx(rx_.on_ulpdu_payload_crc(bytes, crc_state));
    }
    ProtoStatus on_ulpdu_end() { return after_rx(rx_.on_ulpdu_end()); }
    // An error from below (the deframer's): the rx endpoint's choke point builds the TERMINATE, tx sends it.
    void on_llp_error(TermCode code) {
        rx_.on_llp_error(code);
        forward_pending();
    }
    // The stream ended without a protocol error: both halves error and flush, nothing is sent.
    void stop(TermCode code) {
        rx_.stop(code);
        tx_.stop(code);
    }

    // Error once either half failed; error() is the first failure's code.
    State state() const {
        return tx_.state() == State::error || rx_.state() == State::error ? State::error : State::operational;
    }
    const ProtoStatus& error() const { return rx_.error() ? rx_.error() : tx_.error(); }
    std::uint32_t orq_outstanding() const { return tx_.orq_outstanding(); }
    std::uint32_t irq_outstanding() const { return tx_.irq_outstanding(); }  // held by tx until answered
    std::uint64_t placed_bytes() const { return rx_.placed_bytes(); }
    void count_cycles(std::uint64_t* rx_callbacks, std::uint64_t* framer) {
        rx_.count_cycles(rx_callbacks, nullptr);
        tx_.count_cycles(nullptr, framer);
    }

    Endpoint& tx() { return tx_; }
    Endpoint& rx() { return rx_; }

private:
    // A TERMINATE the rx endpoint reported during the call just made: tx sends it (or stops) now.
    ProtoStatus after_rx(ProtoStatus st) {
        forward_pending();
        return st;
    }
    void forward_pending() {
        if (term_.pending) forward_terminate();
    }
    void forward_terminate();

    // Both endpoints' upper layers reach the application's memory and receives unchanged; what differs is how
    // each half tells the other what it learnt.
    struct Wiring : Upper {
        Duplex& d;
        explicit Wiring(Duplex& dx) : d(dx) {}
        Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, Access a) override {
            return d.upper_.tagged(stag, to, len, a);
        }
        MemError recv_begin(std::uint32_t msn) override { return d.upper_.recv_begin(msn); }
        Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override {
            return d.upper_.recv_place(msn, mo, len);
        }
        MemError invalidate(std::uint32_t stag) override { return d.upper_.invalidate(stag); }
    };
    // The tx endpoint's upper layer: the application's, plus what rx must learn.
    struct TxWiring final : Wiring {
        using Wiring::Wiring;
        void on_completion(const Completion& c) override { d.upper_.on_completion(c); }
        void on_terminate(const TermReport& t) override;
        void on_request_sent(const OrqEntry& e) override { d.rx_.expect_response(e); }
    };
    // The rx endpoint's upper layer.
    struct RxWiring final : Wiring {
        using Wiring::Wiring;
        void on_completion(const Completion& c) override;
        void on_terminate(const TermReport& t) override;
        void on_inbound_request(const IrqEntry& e) override { d.tx_.answer(e); }
    };

    Upper& upper_;
    std::atomic<std::uint32_t> answered_{0};
    struct {
        bool pending{false};
        bool received{false};
        TermCode code{};
        std::array<std::byte, kTerminateLen + 2 + kMaxHeaderLen> frame{};
        std::size_t len{0};
    } term_;
    TxWiring tx_wiring_{*this};
    RxWiring rx_wiring_{*this};
    Endpoint tx_;
    Endpoint rx_;
};

}  // namespace softrdma::rdmap
