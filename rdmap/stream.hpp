// SPDX-License-Identifier: MIT
// Glue between an rdmap::Endpoint and the MPA layer: FpduTx as the endpoint's Framer, and receive() that feeds
// TCP bytes through the MPA deframer into the endpoint so that a deframer error (CRC, bad length, Marker) also
// reaches the endpoint's one TERMINATE choke point.
#pragma once

#include <span>

#include "mpa/deframer.hpp"
#include "mpa/fpdu.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/framer.hpp"

namespace softrdma::rdmap {

static_assert(mpa::UlpduHandler<Endpoint>);
static_assert(mpa::CrcFusingHandler<Endpoint>);
static_assert(kMaxHeaderLen <= mpa::Deframer<Endpoint>::kMaxUlpduHeader);

// Borrows `tx` (it must outlive the framer); all calls forwarded.
class FpduFramer final : public Framer {
public:
    explicit FpduFramer(mpa::FpduTx& tx) : tx_(tx) {}
    std::size_t mulpdu() const override { return tx_.mulpdu(); }
    std::size_t wire_size(std::size_t ulpdu_len) const override { return tx_.wire_size(ulpdu_len); }
    std::size_t write(std::span<std::byte> out, std::span<const std::byte> header,
                      std::span<const std::span<const std::byte>> payload) override {
        return tx_.write(out, header, payload);
    }

private:
    mpa::FpduTx& tx_;
};

// Feeds `in` (caller-owned, borrowed for the call) to the deframer, which calls the receiving endpoint (an rx
// Endpoint, or a Duplex). Any error ends the stream through on_llp_error (a no-op when the endpoint already
// failed and built its TERMINATE).
template <class Receiver>
ProtoStatus receive(mpa::Deframer<Receiver>& deframer, Receiver& ep, std::span<const std::byte> in) {
    ep.begin_input();
    const ProtoStatus st = deframer.feed(in, ep);
    if (st) ep.on_llp_error(*st);
    return st;
}

}  // namespace softrdma::rdmap
