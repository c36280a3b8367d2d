// SPDX-License-Identifier: MIT
#include "rdmap/duplex.hpp"

#include <algorithm>
#include <cstring>

#include "rdmap/stream.hpp"

namespace softrdma::rdmap {

static_assert(mpa::UlpduHandler<Duplex>);
static_assert(mpa::CrcFusingHandler<Duplex>);

namespace {

Config shared(Config c, std::atomic<std::uint32_t>& answered) {
    c.answered = &answered;
    return c;
}

}  // namespace

Duplex::Duplex(Upper& upper, Framer& framer, const Config& cfg)
    : upper_(upper),
      tx_(Role::tx, tx_wiring_, framer, shared(cfg, answered_)),
      rx_(Role::rx, rx_wiring_, no_framer(), shared(cfg, answered_)) {}

void Duplex::TxWiring::on_terminate(const TermReport& t) {
    // tx failed on its own (a READ response's source gone): it queued its TERMINATE; rx stops taking input.
    d.upper_.on_terminate(t);
    d.rx_.stop(t.code);
}

void Duplex::RxWiring::on_completion(const Completion& c) {
    if (c.kind == WcKind::read || c.kind == WcKind::atomic) d.tx_.request_done();  // an ORD credit back
    d.upper_.on_completion(c);
}

void Duplex::RxWiring::on_terminate(const TermReport& t) {
    d.upper_.on_terminate(t);
    // tx acts once the rx call returns (forward_terminate): rx flushes its outstanding requests first.
    d.term_.pending = true;
    d.term_.received = t.received;
    d.term_.code = t.code;
    d.term_.len = std::min(t.frame.size(), d.term_.frame.size());
    if (d.term_.len != 0) std::memcpy(d.term_.frame.data(), t.frame.data(), d.term_.len);
}

void Duplex::forward_terminate() {
    term_.pending = false;
    if (term_.received) tx_.stop(term_.code);
    else tx_.send_terminate(term_.code, std::span<const std::byte>(term_.frame).first(term_.len));
}

}  // namespace softrdma::rdmap

template class softrdma::mpa::Deframer<softrdma::rdmap::Duplex>;
