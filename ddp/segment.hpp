// SPDX-License-Identifier: MIT
// DDP segmentation (RFC 5041 section 5.2 and 8): a message of `total` bytes is cut into DDP segments whose
// payload is at most `max_payload` = MULPDU - header length, in order, the Last flag on the final one. A
// zero-length message is one segment with no payload and the Last flag.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace softrdma::ddp {

struct Segment {
    std::size_t offset{0};  // payload offset in the message (the MO of an untagged segment, TO delta of tagged)
    std::size_t len{0};     // payload bytes in this segment
    bool last{false};

    friend bool operator==(const Segment&, const Segment&) = default;
};

class SegmentPlan {
public:
    // max_payload must be > 0 (the caller checks MULPDU > header length once per connection).
    constexpr SegmentPlan(std::size_t total, std::size_t max_payload) : total_(total), max_(max_payload) {}

    constexpr std::size_t count() const { return total_ == 0 ? 1 : (total_ + max_ - 1) / max_; }

    // Segment i, 0 <= i < count().
    constexpr Segment at(std::size_t i) const {
        const std::size_t off = i * max_;
        const std::size_t len = std::min(max_, total_ - std::min(off, total_));
        return Segment{off, len, i + 1 == count()};
    }

    // The segment that starts at `offset` (offset < total, or 0 for an empty message): the resumable form
    // used by a sender that remembers only how many bytes it has sent.
    constexpr Segment from(std::size_t offset) const {
        const std::size_t len = std::min(max_, total_ - offset);
        return Segment{offset, len, offset + len == total_};
    }

private:
    std::size_t total_;
    std::size_t max_;
};

}  // namespace softrdma::ddp
