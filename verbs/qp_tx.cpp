// SPDX-License-Identifier: MIT
#include "verbs/qp_tx.hpp"

#include <algorithm>

#include "base/copy.hpp"
#include "base/cycles.hpp"
#include "stack/stack.hpp"
#include "stack/tcp.hpp"

namespace softrdma::verbs::detail {

std::size_t DeferringFramer::write(std::span<std::byte> out, std::span<const std::byte> header,
                                   std::span<const std::span<const std::byte>> payload) {
    if (defer_ != nullptr && tx_.can_defer() && !payload.empty() && defer_->fill_room() >= payload.size()) {
        std::size_t len = 0;
        bool lent = true;  // every piece the application's until its completion (not an inline buffer)
        const auto c0 = reinterpret_cast<std::uintptr_t>(copied_.data()), c1 = c0 + copied_.size();
        for (const auto& piece : payload) {
            len += piece.size();
            const auto p0 = reinterpret_cast<std::uintptr_t>(piece.data());
            lent = lent && (p0 + piece.size() <= c0 || p0 >= c1);
        }
        if (len >= kDeferMin && lent) {
            const std::size_t n = tx_.write_deferred(out, header, len);
            if (n == 0) return 0;
            std::byte* dst = out.data() + mpa::kLengthFieldSize + header.size();
            for (const auto& piece : payload) {
                defer_->defer_fill(dst, piece.data(), static_cast<std::uint32_t>(piece.size()));
                dst += piece.size();
            }
            return n;
        }
    }
    return tx_.write(out, header, payload);
}

void TxHalf::start(rdmap::Upper& upper, const mpa::Agreed& agreed, std::uint32_t emss, std::uint32_t segment,
                   const rdmap::Config& cfg, std::span<const std::byte> inline_bufs, std::uint64_t& framed_total,
                   std::uint64_t* cycles_framer, std::uint64_t* cycles_proto, std::uint64_t* cycles_lwip) {
    ep_.reset();
    framer_.reset();
    // FPDUs of at most fpdu_limit(emss): the segment's at MTU 1500 and 9000, half a large segment (32672 bytes).
    static_assert(kIdleBatch >= fpdu_limit(stack::kLargeSegmentMss), "a quiet link's first batch holds an FPDU");
    const std::uint32_t fpdu_max = fpdu_limit(emss);
    fpdu_tx_.emplace(mpa::tx_config(agreed, fpdu_max));
    framer_.emplace(*fpdu_tx_, inline_bufs);
    ep_.emplace(rdmap::Role::tx, upper, *framer_, cfg);
    if (cycles_framer != nullptr) ep_->count_cycles(nullptr, cycles_framer);
    framed_total_ = &framed_total;
    cycles_proto_ = cycles_proto;
    cycles_lwip_ = cycles_lwip;
    buf_.assign(std::max<std::uint32_t>(std::min(segment, fpdu_max), 64), std::byte{0});
    batch_ = std::max<std::uint32_t>(segment, 64);
    off_ = len_ = 0;
    zero_copy_ = segment >= kZeroCopyMinSegment;
    gate_ = false;
    written_ = 0;
}

// Keeping FPDUs whole on the wire: each batch pulled from the endpoint is whole FPDUs totalling at most one
// segment (MULPDU makes every FPDU fit in the link's MSS, and a large segment holds two), and a batch is handed
// to lwIP only when lwIP holds no unsent segment (TcpConnection::tx_segment_boundary), so lwIP starts a new
// segment with it instead of appending it to a partly filled one. One batch = one segment. A batch lwIP takes only in part (its send buffer or segment pool full) is
// finished first; that is the one case where an FPDU may straddle two segments, and the peer's deframer accepts
// any cut.
// Where the batch is built: in place in the connection's TX chunk (zero-copy transmit: the one TX copy, gather +
// CRC, then lwIP and the frame reference those bytes), or, when the port has no TX arena or no chunk is free,
// in buf_, which lwIP copies (and the frame again). In place only for segments of kZeroCopyMinSegment or more:
// MTU 9000 and large segments (stack::StackConfig::large_segments). At MTU 1500 the frame's second mbuf and the
// chunk's reference counting cost more than the copies they save (64 KiB WRITE, memif, A/B in one sitting: in
// place ~5-10 % slower). At MTU 9000 in place is faster (+4 to +47 % in pairs; 2026-11-26, five pairs: median
// 11221 vs 9570 MiB/s run to completion, 5536 vs 5351 with RX threads). It had been off there because a close
// stalled under faults with RX threads; that was the test harness not draining the RX thread (README,
// "Three RX-thread faults"): 10 runs of the MTU 9000 faults case with it on passed since.
// Pipelining a lone message: each batch is one segment that framing, memif and the peer's placement each handle
// whole in turn, so after a quiet link (nothing in flight) the first batch is at most kIdleBatch (4 FPDUs):
// the peer places it while the rest is framed. SEND half round trip, two interleaved rounds (2026-11-26):
// 64 KiB 4.14-4.21 vs 4.82-5.02 us, 128 KiB 7.3-7.6 vs 8.1-8.2 us, 4 KiB-32 KiB and 256 KiB-1 MiB unchanged,
// 2 FPDUs (17920) no better; 64 KiB WRITE bandwidth and the 64 B message rate unchanged (a stream is never
// quiet).
// Sending from where the payload is (`deferring`): when the Stack can (memif, no CRC, no Markers) and the batch
// is framed in place, FPDUs of at least DeferringFramer::kDeferMin payload are framed without their payload,
// each frame takes it straight from the application's memory, and the chunk gets the bytes only if they must
// outlive the source's loan (stack::Stack::defer_fill, stack::FillBook): in a stream most are acknowledged
// first, so a payload byte is copied once on this side (memif's, into its ring) instead of twice. 64 KiB WRITE
// 18321 -> 21220 MiB/s, 8 MiB 12038 -> 12298 (receiver-bound), medians of eight interleaved rounds
// (2026-11-27; bench/RESULTS.md, "Sending from the source"). A lone message (nothing in flight, `lone`): its
// batches go out in this one call, each sent before the next is framed, so the peer starts on the first frame
// a copy earlier. SEND half round trip (2026-11-27, interleaved with the commit before, three rounds): 32 KiB
// 2.51-2.71 vs 2.79-2.98 us, 128 KiB 6.65-6.77 vs 7.48-7.76 us.
void TxHalf::flush(stack::TcpConnection& tcp) noexcept {
    if (cycles_lwip_ == nullptr) return tcp.flush();
    // A frame sent from its source goes to the driver inside lwIP's output (Stack::send_deferred), counted as
    // io there: not lwIP's.
    const std::uint64_t t0 = cycles_now(), io0 = tcp.stack().cycles().io;
    tcp.flush();
    const std::uint64_t io = tcp.stack().cycles().io - io0;
    *cycles_lwip_ += cycles_now() - t0 - std::min(io, cycles_now() - t0);
}

bool TxHalf::pump(stack::TcpConnection& tcp) noexcept {
    if (!ep_) return false;
    bool wrote = false, again = false;
    const bool deferring = zero_copy_ && fpdu_tx_->can_defer() && tcp.stack().can_defer_fill();
    const bool lone = deferring && tcp.nothing_in_flight();
    for (;;) {
        if (tcp.tx_staged() > 0 || len_ > 0) {
            const std::uint64_t t0 = cycles_lwip_ != nullptr ? cycles_now() : 0;
            std::size_t n = 0, left = 0;
            if (len_ > 0) {
                n = tcp.write(std::span<const std::byte>(buf_).subspan(off_, len_));
                off_ += n;
                len_ -= n;
                left = len_;
            } else {
                n = tcp.tx_push();
                left = tcp.tx_staged();
            }
            if (cycles_lwip_ != nullptr) *cycles_lwip_ += cycles_now() - t0;
            written_ += n;
            wrote = wrote || n > 0;
            if (left > 0) {
                again = true;  // lwIP full: try again next turn (on_sent may not come if its heap was the limit)
                break;
            }
            continue;
        }
        const bool failed = ep_->state() == rdmap::State::error;
        if (gate_ && !failed) break;
        if (!ep_->tx_ready()) break;
        if (!tcp.tx_segment_boundary()) {
            if (lone && wrote) {  // send it now and go on framing (see above)
                flush(tcp);
                wrote = false;
                if (tcp.tx_segment_boundary()) continue;
            }
            again = true;  // an unsent segment is queued: start the next batch once it is out
            break;
        }
        const std::size_t space = tcp.send_space();
        const bool quiet = tcp.nothing_in_flight();
        const std::size_t limit = quiet ? std::min<std::size_t>(kIdleBatch, batch_) : batch_;
        // A lone message in a fresh chunk: begin where its payload does not land 1-63 bytes above its source
        // modulo 4 KiB (base::unaliased_start; with CRC or Markers the copy is staged anyway).
        std::size_t fresh_start = 0;
        if (zero_copy_ && quiet && fpdu_tx_->can_defer())
            if (const rdmap::Endpoint::NextPayload np = ep_->next_payload(); np.src != nullptr)
                fresh_start = base::unaliased_start(np.src, mpa::kLengthFieldSize + np.hdr_len);
        std::span<std::byte> out = zero_copy_ ? tcp.tx_buffer(std::min(limit, space), fresh_start) : std::span<std::byte>();
        const bool in_place = !out.empty();
        if (!in_place && tcp.tx_waiting()) break;  // its share of TX chunks in flight: on_sent schedules us again
        if (!in_place) out = std::span<std::byte>(buf_).first(std::min(buf_.size(), space));
        const std::uint64_t t0 = cycles_proto_ != nullptr ? cycles_now() : 0;
        const std::uint64_t framed0 = ep_->framed_bytes();
        if (in_place && deferring) framer_->defer_to(&tcp.stack());
        const std::size_t n = ep_->pull_tx(out);
        framer_->defer_to(nullptr);
        if (cycles_proto_ != nullptr) *cycles_proto_ += cycles_now() - t0;
        *framed_total_ += ep_->framed_bytes() - framed0;
        if (n == 0) {
            again = true;  // the next FPDU does not fit the send buffer yet
            break;
        }
        if (in_place) {
            tcp.tx_commit(n);
        } else {
            off_ = 0;
            len_ = n;
        }
    }
    if (wrote) flush(tcp);
    return again;
}

bool TxHalf::idle(const stack::TcpConnection* tcp) const noexcept {
    return len_ == 0 && (tcp == nullptr || tcp->tx_staged() == 0) && (!ep_ || !ep_->tx_ready());
}

void TxHalf::drop_staged(stack::TcpConnection* tcp) noexcept {
    len_ = 0;
    if (tcp != nullptr) tcp->tx_drop_staged();
}

}  // namespace softrdma::verbs::detail
