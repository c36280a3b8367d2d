// SPDX-License-Identifier: MIT
#include "mpa/frames.hpp"

#include <algorithm>
#include <cstring>

#include "mpa/errors.hpp"
#include "base/byteorder.hpp"

namespace softrdma::mpa {
namespace {

const std::array<char, kKeySize>& key_of(FrameKind k) { return k == FrameKind::request ? kRequestKey : kReplyKey; }

bool key_matches(const std::byte* p, std::size_t n, FrameKind k) {
    const auto& key = key_of(k);
    for (std::size_t i = 0; i < n; ++i)
        if (p[i] != static_cast<std::byte>(key[i])) return false;
    return true;
}

}  // namespace

void encode_ird_ord(std::span<std::byte, kIrdOrdSize> out, const IrdOrd& v) {
    std::uint16_t ird = v.ird & kIrdOrdMask, ord = v.ord & kIrdOrdMask;
    if (v.peer_to_peer) ird |= kIrdPeerToPeer;
    if (v.send_rtr) ird |= kIrdSendRtr;
    if (v.write_rtr) ord |= kOrdWriteRtr;
    if (v.read_rtr) ord |= kOrdReadRtr;
    put_be16(out.data(), ird);
    put_be16(out.data() + 2, ord);
}

IrdOrd decode_ird_ord(std::span<const std::byte, kIrdOrdSize> in) {
    const std::uint16_t ird = get_be16(in.data()), ord = get_be16(in.data() + 2);
    IrdOrd v;
    v.ird = ird & kIrdOrdMask;
    v.ord = ord & kIrdOrdMask;
    v.peer_to_peer = (ird & kIrdPeerToPeer) != 0;
    v.send_rtr = (ird & kIrdSendRtr) != 0;
    v.write_rtr = (ord & kOrdWriteRtr) != 0;
    v.read_rtr = (ord & kOrdReadRtr) != 0;
    return v;
}

std::size_t frame_size(const FrameParams& p) {
    if (p.ird_ord != nullptr && p.revision != 2) return 0;
    const std::size_t pd = (p.ird_ord ? kIrdOrdSize : 0) + p.private_data.size();
    if (pd > kMaxPrivateDataSent) return 0;
    return kFrameHeaderSize + pd;
}

std::size_t encode_frame(std::span<std::byte> out, const FrameParams& p) {
    const std::size_t n = frame_size(p);
    if (n == 0 || out.size() < n) return 0;
    const auto& key = key_of(p.kind);
    for (std::size_t i = 0; i < kKeySize; ++i) out[i] = static_cast<std::byte>(key[i]);
    std::uint8_t flags = 0;
    if (p.markers) flags |= kFlagMarkers;
    if (p.crc) flags |= kFlagCrc;
    if (p.reject) flags |= kFlagReject;
    if (p.ird_ord) flags |= kFlagEnhanced;
    out[16] = static_cast<std::byte>(flags);
    out[17] = static_cast<std::byte>(p.revision);
    put_be16(out.data() + 18, static_cast<std::uint16_t>(n - kFrameHeaderSize));
    std::size_t off = kFrameHeaderSize;
    if (p.ird_ord) {
        encode_ird_ord(std::span<std::byte, kIrdOrdSize>(out.data() + off, kIrdOrdSize), *p.ird_ord);
        off += kIrdOrdSize;
    }
    if (!p.private_data.empty()) std::memcpy(out.data() + off, p.private_data.data(), p.private_data.size());
    return n;
}

FrameDecoder::Status FrameDecoder::fail() {
    error_ = kTermInvalidFrame;
    status_ = Status::error;
    return status_;
}

FrameDecoder::Result FrameDecoder::feed(std::span<const std::byte> in) {
    Result r;
    if (status_ != Status::need_more) {
        r.status = status_;
        return r;
    }
    std::size_t i = 0;
    // Header: key (checked as soon as it is complete), flags, revision, private data length.
    if (got_ < kFrameHeaderSize) {
        const std::size_t k = std::min(in.size(), kFrameHeaderSize - got_);
        std::memcpy(hdr_.data() + got_, in.data(), k);
        // Check the key bytes received so far: a wrong key fails without waiting for the rest.
        const std::size_t key_have = std::min(got_ + k, kKeySize);
        if (!key_matches(hdr_.data(), key_have, expected_)) {
            r.consumed = k;
            r.status = fail();
            return r;
        }
        got_ += k;
        i = k;
        if (got_ < kFrameHeaderSize) {
            r.consumed = i;
            return r;
        }
        const auto flags = std::to_integer<std::uint8_t>(hdr_[16]);
        frame_.kind = expected_;
        frame_.markers = (flags & kFlagMarkers) != 0;
        frame_.crc = (flags & kFlagCrc) != 0;
        frame_.reject = (flags & kFlagReject) != 0;
        frame_.reserved_flags = flags & kFlagsReserved;
        frame_.revision = std::to_integer<std::uint8_t>(hdr_[17]);
        frame_.pd_length = get_be16(hdr_.data() + 18);
        frame_.enhanced = frame_.revision == 2 && (flags & kFlagEnhanced) != 0;
        if (frame_.pd_length > kMaxPrivateDataReceived) {
            r.consumed = i;
            r.status = fail();
            return r;
        }
        // RFC 6581: an enhanced frame carries at least the IRD/ORD header. A reject frame may carry less.
        if (frame_.enhanced && frame_.pd_length < kIrdOrdSize && !frame_.reject) {
            r.consumed = i;
            r.status = fail();
            return r;
        }
    }
    // Private data.
    const std::size_t pd_got = got_ - kFrameHeaderSize;
    const std::size_t k = std::min(in.size() - i, static_cast<std::size_t>(frame_.pd_length) - pd_got);
    if (k) std::memcpy(frame_.pd.data() + pd_got, in.data() + i, k);
    got_ += k;
    i += k;
    r.consumed = i;
    if (got_ == kFrameHeaderSize + frame_.pd_length) {
        if (frame_.enhanced && frame_.pd_length >= kIrdOrdSize) {
            frame_.ird_ord = decode_ird_ord(std::span<const std::byte, kIrdOrdSize>(frame_.pd.data(), kIrdOrdSize));
        } else if (frame_.enhanced) {
            frame_.enhanced = false;  // short reject frame: no IRD/ORD to report
        }
        status_ = Status::done;
    }
    r.status = status_;
    return r;
}

}  // namespace softrdma::mpa
