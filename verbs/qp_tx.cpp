// SPDX-License-Identifier: MIT
#include "verbs/qp_tx.hpp"

#include <algorithm>

#include "base/cycles.hpp"
#include "stack/tcp.hpp"

namespace softrdma::verbs::detail {

void TxHalf::start(rdmap::Upper& upper, const mpa::Agreed& agreed, std::uint32_t emss, const rdmap::Config& cfg,
                   std::uint64_t* cycles_framer, std::uint64_t* cycles_proto, std::uint64_t* cycles_lwip) {
    ep_.reset();
    framer_.reset();
    fpdu_tx_.emplace(mpa::tx_config(agreed, emss));
    framer_.emplace(*fpdu_tx_);
    ep_.emplace(rdmap::Role::tx, upper, *framer_, cfg);
    if (cycles_framer != nullptr) ep_->count_cycles(nullptr, cycles_framer);
    cycles_proto_ = cycles_proto;
    cycles_lwip_ = cycles_lwip;
    buf_.assign(std::max<std::uint32_t>(emss, 64), std::byte{0});
    off_ = len_ = 0;
    gate_ = false;
    written_ = 0;
}

// Keeping FPDUs whole on the wire: each batch pulled from the endpoint is whole FPDUs totalling at most one EMSS
// (buf_ is EMSS bytes and MULPDU makes every FPDU fit), and a batch is handed to lwIP only when lwIP holds no
// unsent segment (TcpConnection::tx_segment_boundary), so lwIP starts a new segment with it instead of
// appending it to a partly filled one. One batch = one segment. A batch lwIP takes only in part (its heap or
// segment pool full) is finished first; that is the one case where an FPDU may straddle two segments, and the
// peer's deframer accepts any cut. Copies on TX: endpoint -> buf_ (gather + CRC), buf_ -> lwIP.
bool TxHalf::pump(stack::TcpConnection& tcp) noexcept {
    if (!ep_) return false;
    bool wrote = false, again = false;
    for (;;) {
        if (len_ > 0) {
            const std::uint64_t t0 = cycles_lwip_ != nullptr ? cycles_now() : 0;
            const std::size_t n = tcp.write(std::span<const std::byte>(buf_).subspan(off_, len_));
            if (cycles_lwip_ != nullptr) *cycles_lwip_ += cycles_now() - t0;
            off_ += n;
            len_ -= n;
            written_ += n;
            wrote = wrote || n > 0;
            if (len_ > 0) {
                again = true;  // lwIP full: try again next turn (on_sent may not come if its heap was the limit)
                break;
            }
            continue;
        }
        const bool failed = ep_->state() == rdmap::State::error;
        if (gate_ && !failed) break;
        if (!ep_->tx_ready()) break;
        if (!tcp.tx_segment_boundary()) {
            again = true;  // an unsent segment is queued: start the next batch once it is out
            break;
        }
        const std::size_t room = std::min(buf_.size(), tcp.send_space());
        const std::uint64_t t0 = cycles_proto_ != nullptr ? cycles_now() : 0;
        const std::size_t n = ep_->pull_tx(std::span<std::byte>(buf_).first(room));
        if (cycles_proto_ != nullptr) *cycles_proto_ += cycles_now() - t0;
        if (n == 0) {
            again = true;  // the next FPDU does not fit the send buffer yet
            break;
        }
        off_ = 0;
        len_ = n;
    }
    if (wrote) {
        const std::uint64_t t0 = cycles_lwip_ != nullptr ? cycles_now() : 0;
        tcp.flush();
        if (cycles_lwip_ != nullptr) *cycles_lwip_ += cycles_now() - t0;
    }
    return again;
}

}  // namespace softrdma::verbs::detail
