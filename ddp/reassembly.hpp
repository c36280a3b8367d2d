// SPDX-License-Identifier: MIT
// DDP receive-side state: strict per-queue MSN/MO checks for untagged messages, continuity and TO-wrap checks
// for tagged messages, and the placement loop that makes the one copy (input buffer -> target memory).
//
// Strictness (what siw does, and what RFC 5041 section 5.3 allows us to require over an in-order LLP such
// as MPA/TCP): every queue's MSN starts at 1 and goes up by one per message; the segments of a message arrive
// in order, so each segment's MO equals the bytes already received for that message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "ddp/header.hpp"

namespace softrdma::ddp {

// One untagged queue's receive state (RFC 5041 section 5.3). 16 bytes; the endpoint holds one per QN.
class UntaggedQueue {
public:
    std::uint32_t expected_msn() const { return msn_; }
    std::uint32_t expected_mo() const { return mo_; }
    bool in_message() const { return mo_ != 0 || started_; }

    // Validates a segment's MSN and MO against this queue (the caller has already matched the QN).
    // Errors: u_msn_range when the MSN is not the one expected, u_invalid_mo when the MO is not the byte
    // count received so far, u_too_long when MO + payload does not fit the 32-bit MO space.
    ProtoStatus check(const UntaggedHeader& h, std::size_t payload_len) const {
        if (h.msn != msn_) return err::u_msn_range;
        if (h.mo != mo_) return err::u_invalid_mo;
        if (payload_len > std::size_t{0xFFFFFFFFu} - mo_) return err::u_too_long;
        return std::nullopt;
    }

    // Commits a checked segment once it has been received whole: the next segment continues the message, or
    // after the Last segment the next message (MSN + 1, wrapping mod 2^32 per RFC 5041) starts at MO 0.
    void advance(std::size_t payload_len, bool last) {
        if (last) {
            ++msn_;
            mo_ = 0;
            started_ = false;
        } else {
            mo_ += static_cast<std::uint32_t>(payload_len);
            started_ = true;
        }
    }

private:
    std::uint32_t msn_{1};
    std::uint32_t mo_{0};
    bool started_{false};  // a non-last segment with no payload was received (MO alone does not show it)
};

// The tagged message in progress on the stream (RFC 5041 section 5.2: its segments carry the same STag and
// consecutive TOs). Strict like siw: a continuation segment must name the same STag and continue at the
// next TO; one tagged message at a time.
class TaggedStream {
public:
    bool in_message() const { return active_; }
    std::uint32_t stag() const { return stag_; }
    std::uint64_t next_to() const { return next_to_; }
    std::uint64_t received() const { return received_; }

    // t_invalid_stag if a continuation names another STag, t_base_bounds if it does not continue at the
    // next TO, t_to_wrap if TO + payload passes 2^64 (RFC 5041 section 7.2).
    ProtoStatus check(const TaggedHeader& h, std::size_t payload_len) const {
        if (active_) {
            if (h.stag != stag_) return err::t_invalid_stag;
            if (h.to != next_to_) return err::t_base_bounds;
        }
        if (payload_len > 0 && h.to > ~std::uint64_t{0} - (payload_len - 1)) return err::t_to_wrap;
        return std::nullopt;
    }

    void advance(const TaggedHeader& h, std::size_t payload_len) {
        if (!active_) received_ = 0;
        active_ = !h.last();
        stag_ = h.stag;
        next_to_ = h.to + payload_len;
        received_ += payload_len;
    }

private:
    std::uint64_t next_to_{0};
    std::uint64_t received_{0};  // payload bytes of the current tagged message, including this segment
    std::uint32_t stag_{0};
    bool active_{false};
};

// Where a piece of payload goes, as answered by the layer above: `len` contiguous bytes at `dst`
// (1 <= len <= asked), or an error TermCode. The target memory is owned by the layer above; it stays valid
// at least until place() returns.
struct Target {
    std::byte* dst{nullptr};
    std::size_t len{0};
    ProtoStatus err{};
};

// Copies `piece` (payload bytes at `offset` from the segment's or message's start, pointing into the
// caller's input buffer) to the targets `resolve(offset, len) -> Target` names, asking again at each target
// boundary, with `copy(dst, src, n)` (memcpy, or a copy that also runs the MPA CRC). This is the only copy on
// the receive path. A resolver answering 0 bytes, more than asked, or a null pointer is a local catastrophic
// error: nothing is written outside what the resolver handed out.
template <class Resolve, class Copy>
ProtoStatus place(std::span<const std::byte> piece, std::size_t offset, Resolve&& resolve, Copy&& copy) {
    while (!piece.empty()) {
        const Target t = resolve(offset, piece.size());
        if (t.err) return t.err;
        if (t.dst == nullptr || t.len == 0 || t.len > piece.size()) return err::local_catastrophic;
        copy(t.dst, piece.data(), t.len);
        piece = piece.subspan(t.len);
        offset += t.len;
    }
    return std::nullopt;
}

template <class Resolve>
ProtoStatus place(std::span<const std::byte> piece, std::size_t offset, Resolve&& resolve) {
    return place(piece, offset, resolve,
                 [](std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); });
}

}  // namespace softrdma::ddp
