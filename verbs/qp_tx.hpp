// SPDX-License-Identifier: MIT
// The transmit half of a QP's stream (internal to verbs), the same in both threading modes, always on the
// application thread: MPA framing (mpa::FpduTx), a tx-role rdmap::Endpoint (work requests, READ/atomic
// responses, TERMINATEs); pump() frames whole FPDUs into the connection's TX chunk (zero-copy transmit) or,
// without one, into a one-EMSS staging buffer that TCP copies. Its
// rdmap::Upper is the QP (send completions, READ-response sources, the requests it framed).
// Memory: built by start() (control path); pump() allocates nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "mpa/fpdu.hpp"
#include "mpa/negotiation.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"

namespace softrdma::stack {
class Stack;
class TcpConnection;
}  // namespace softrdma::stack

namespace softrdma::verbs::detail {

// Frames with mpa::FpduTx. While pump() frames in place in a TX chunk on a Stack that can (defer_to), the payload
// of an FPDU carrying at least kDeferMin bytes is left out of the chunk (mpa::FpduTx::write_deferred: no CRC,
// no Markers) and recorded with the Stack (stack::Stack::defer_fill, stack::FillBook): every frame carrying it
// goes out straight from the application's memory, and the chunk gets it only if the loan of that memory ends
// first. The payload spans must then stay valid until the record ends: the work requests' registered memory
// and READ sources, whose loan ends at a polled send-side completion, an MR's deregistration or the
// connection's close (each settles the book first), all on the application's thread (this one). Pieces in the
// send queue's inline buffers are always copied.
class DeferringFramer final : public rdmap::Framer {
public:
    // `copied`: memory whose bytes are always copied at framing (the send queue's inline buffers, written again
    // as soon as a WR's slot is reused, which the application's completions do not order).
    DeferringFramer(mpa::FpduTx& tx, std::span<const std::byte> copied) : tx_(tx), copied_(copied) {}
    std::size_t mulpdu() const override { return tx_.mulpdu(); }
    std::size_t wire_size(std::size_t ulpdu_len) const override { return tx_.wire_size(ulpdu_len); }
    std::size_t write(std::span<std::byte> out, std::span<const std::byte> header,
                      std::span<const std::span<const std::byte>> payload) override;
    void defer_to(stack::Stack* stack) noexcept { defer_ = stack; }
    // Below this much payload an FPDU is copied at once (two mbufs cost more than copying it).
    static constexpr std::size_t kDeferMin = 1024;

private:
    mpa::FpduTx& tx_;
    std::span<const std::byte> copied_;
    stack::Stack* defer_ = nullptr;
};

class TxHalf {
public:
    // A new stream (control path). `cycles_framer` / `cycles_proto` / `cycles_lwip` (null = off): layer accounting.
    // `emss`: what FPDUs are sized for; `segment`: the TCP segment size (the batch of FPDUs pump() hands over).
    // `framed_total`: DDP payload bytes framed are added to it (TxCopyStats; borrowed, the Engine's).
    // `inline_bufs`: the send queue's inline buffers (borrowed: the QP's), never sent from (DeferringFramer).
    void start(rdmap::Upper& upper, const mpa::Agreed& agreed, std::uint32_t emss, std::uint32_t segment,
               const rdmap::Config& cfg, std::span<const std::byte> inline_bufs, std::uint64_t& framed_total,
               std::uint64_t* cycles_framer, std::uint64_t* cycles_proto, std::uint64_t* cycles_lwip);
    bool started() const noexcept { return ep_.has_value(); }
    rdmap::Endpoint& ep() noexcept { return *ep_; }
    const rdmap::Endpoint& ep() const noexcept { return *ep_; }

    // The first-FPDU gate: closed, nothing but a TERMINATE leaves (a responder until the initiator's first bytes,
    // RFC 5044 section 7.1.2; an initiator holding its first FPDU, FirstFpduGuard::Mode::hold).
    void set_gate(bool closed) noexcept { gate_ = closed; }
    bool gated() const noexcept { return gate_; }

    // Moves whole FPDUs into TCP while it takes them. Returns true when it must run again later (lwIP full, an
    // unsent segment still queued, the next FPDU not fitting the send buffer).
    bool pump(stack::TcpConnection& tcp) noexcept;
    // Nothing staged and nothing ready to frame (the send queue reached TCP, or only ORD-blocked requests remain).
    // `tcp`: the stream's connection (null once it is gone), whose TX chunk may hold staged bytes.
    bool idle(const stack::TcpConnection* tcp) const noexcept;
    void drop_staged(stack::TcpConnection* tcp) noexcept;
    // Stream bytes handed to TCP since start().
    std::uint64_t written() const noexcept { return written_; }

private:
    void flush(stack::TcpConnection& tcp) noexcept;
    std::optional<mpa::FpduTx> fpdu_tx_;
    std::optional<DeferringFramer> framer_;
    std::optional<rdmap::Endpoint> ep_;
    // The largest FPDU for segments of `emss` bytes: the segment's MULPDU up to kCopyBatchMax (MTU 1500 and
    // 9000: one FPDU fills a segment); above it (large segments, 65344 bytes) half the segment, rounded down to
    // whole words, so two FPDUs of 32672 bytes fill one. Each FPDU costs its framing, a DDP header to check
    // and a placement step on both sides whatever its size: with large segments, 32672-byte FPDUs against
    // 8960-byte ones took the SEND half round trip at 32 KiB / 64 KiB / 256 KiB / 1 MiB from 4.52 / 6.91 /
    // 19.86 / 82.6 us to 3.71 / 5.59 / 15.1 / 55.7 us (slow spell, interleaved, 2026-11-30; bench/RESULTS.md,
    // "FPDUs of half a large segment").
    static constexpr std::uint32_t kCopyBatchMax = 8960;
    static constexpr std::uint32_t fpdu_limit(std::uint32_t emss) noexcept {
        return emss <= kCopyBatchMax ? emss : std::max(kCopyBatchMax, (emss / 2) & ~3u);
    }
    // Staging when no TX chunk is to be had: whole FPDUs the endpoint wrote, not yet taken by TCP. Sizing: one
    // segment, at most one FPDU (fpdu_limit: 32672 bytes with large segments), so one batch fills at most one
    // TCP segment and the largest FPDU fits. TCP copies it in pieces its heap pools hold (TcpConnection::write).
    std::vector<std::byte> buf_;
    std::size_t batch_{0};  // one segment: the most a batch framed in a TX chunk holds
    // The first batch after the link went quiet (nothing sent and unacknowledged): at most this, half a large
    // segment in whole FPDUs (one of 32672 bytes), so the peer places the first half of a lone 64 KiB message
    // while the second is framed and sent (see pump()). It must hold the largest FPDU, or a lone message would
    // never start (static_assert in start()).
    static constexpr std::uint32_t kIdleBatch = 4 * kCopyBatchMax;
    std::size_t off_{0};
    std::size_t len_{0};
    // Frame in place in TX chunks (zero-copy transmit) when segments are this large (see pump()): MTU 9000 (8960)
    // and large segments.
    static constexpr std::uint32_t kZeroCopyMinSegment = 8192;
    bool zero_copy_{false};
    bool gate_{false};
    std::uint64_t written_{0};
    std::uint64_t* framed_total_{nullptr};
    std::uint64_t* cycles_proto_{nullptr};
    std::uint64_t* cycles_lwip_{nullptr};
};

}  // namespace softrdma::verbs::detail
