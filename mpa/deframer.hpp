// SPDX-License-Identifier: MIT
// MPA receive deframer (RFC 5044 sections 4 and 5): turns the TCP byte stream, cut anywhere, into ULPDU header
// and payload calls on a DDP handler, stripping and checking Markers and the CRC.
//
// Zero copy: payload spans handed to the handler point into the caller's input buffer. Only the ULPDU header
// (DDP + RDMAP headers, at most kMaxUlpduHeader octets) is staged contiguously here, because a segment boundary
// or a Marker may split it. Payload is cut at Markers and at the end of each input buffer.
//
// CRC and placement in one pass, two ways (the handler picks at compile time):
//  - plain UlpduHandler: the deframer runs the CRC over each payload chunk right before on_ulpdu_payload, so
//    the chunk (at most one input buffer, and at most 508 octets with Markers) is in L1 when the handler copies;
//  - CrcFusingHandler (also has on_ulpdu_payload_crc(bytes, crc_state)): when CRC is negotiated the deframer
//    calls that instead, and the handler copies with crc32c_copy(crc_state, dst, bytes...) and stores the new
//    state, so the payload is read exactly once. The deframer does not CRC those octets again.
// A CRC mismatch is found after placement; that is allowed (RFC 5041 section 5: placed data is not delivered):
// the handler never gets on_ulpdu_end for that FPDU, and feed() returns kTermCrc.
//
// Data path: no allocation, locks, logging or exceptions. Everything inlines into the handler's code.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "mpa/crc32c.hpp"
#include "mpa/errors.hpp"
#include "mpa/fpdu.hpp"
#include "base/term_code.hpp"
#include "base/byteorder.hpp"

namespace softrdma::mpa {

// The contract agreed with the DDP layer.
template <class H>
concept UlpduHandler = requires(H& h, std::uint16_t ctrl, std::span<const std::byte> bytes, std::size_t n) {
    // Length in bytes of the ULPDU header (DDP+RDMAP headers, counted from the first ULPDU byte - the DDP control
    // byte - NOT counting the 2-byte MPA length), decided by the first 16 bits of the ULPDU in host order.
    // 0 = invalid control word: the deframer then calls on_ulpdu_header once with just the 2 control bytes and
    // n = 0 and returns that call's error; if it returns none, the deframer reports a DDP invalid-version error.
    { h.ulpdu_header_length(ctrl) } -> std::same_as<std::size_t>;
    // Whole ULPDU header, contiguous (valid only during the call), and the payload length that follows.
    { h.on_ulpdu_header(bytes, n) } -> std::same_as<softrdma::ProtoStatus>;
    // Next piece of payload, pointing into the caller's input buffer; the handler copies it to its target.
    { h.on_ulpdu_payload(bytes) } -> std::same_as<softrdma::ProtoStatus>;
    // FPDU complete and its CRC (if negotiated) verified. Not called when the CRC fails.
    { h.on_ulpdu_end() } -> std::same_as<softrdma::ProtoStatus>;
};

// Optional extension: the handler runs the CRC itself while copying (crc32c_copy), updating crc_state in place.
// Used instead of on_ulpdu_payload only when CRC is negotiated.
template <class H>
concept CrcFusingHandler =
    UlpduHandler<H> && requires(H& h, std::span<const std::byte> bytes, std::uint32_t& crc_state) {
        { h.on_ulpdu_payload_crc(bytes, crc_state) } -> std::same_as<softrdma::ProtoStatus>;
    };

struct DeframerConfig {
    bool crc = false;                 // CRC negotiated: check it
    bool markers = false;             // Markers negotiated on the data we receive (our M bit)
    std::uint64_t stream_offset = 0;  // position of the next octet, counted from the peer's first FPDU
};

template <UlpduHandler H>
class Deframer {
public:
    // Largest ULPDU header the handler may ask for (a READ request is 46 octets).
    static constexpr std::size_t kMaxUlpduHeader = 128;

    explicit Deframer(const DeframerConfig& cfg)
        : crc_on_(cfg.crc),
          markers_(cfg.markers),
          head_crc_at_once_(cfg.crc && !cfg.markers),
          pos_(cfg.stream_offset),
          fpdu_start_(cfg.stream_offset),
          next_marker_((cfg.stream_offset + kMarkerInterval - 1) / kMarkerInterval * kMarkerInterval) {}

    // Consumes all of `in`, calling the handler for every ULPDU part in it, or stops at the first error and
    // returns it. After an error the deframer stays failed and returns the same error.
    ProtoStatus feed(std::span<const std::byte> in, H& h);

    bool failed() const { return error_.has_value(); }
    ProtoStatus error() const { return error_; }
    std::uint64_t stream_position() const { return pos_; }
    // True between FPDUs (no partial FPDU and no partial Marker held).
    bool at_fpdu_boundary() const { return state_ == State::length && len_got_ == 0 && marker_got_ == 0; }

private:
    enum class State : std::uint8_t { length, header, payload, trailer };

    ProtoStatus fail(TermCode t) {
        error_ = t;
        return error_;
    }
    void crc(const std::byte* p, std::size_t n) {
        if (crc_on_) crc_ = crc32c_update(crc_, p, n);
    }
    // Length field and ULPDU header octets: without Markers they are contiguous in head_, so their CRC is
    // taken in one call when the header is complete (one call per FPDU instead of one per piece).
    void head_crc(const std::byte* p, std::size_t n) {
        if (!head_crc_at_once_) crc(p, n);
    }
    std::byte* hdr() { return head_.data() + kLengthFieldSize; }
    // Called with the 2 control bytes staged; decides the header length.
    ProtoStatus on_control(H& h);

    const bool crc_on_;
    const bool markers_;
    const bool head_crc_at_once_;
    State state_ = State::length;
    std::uint64_t pos_;
    std::uint64_t fpdu_start_;   // stream position of the current FPDU's first octet
    std::uint64_t next_marker_;  // stream position of the next Marker (when markers_)
    std::uint32_t crc_ = kCrc32cInit;
    std::uint16_t ulpdu_len_ = 0;
    std::size_t len_got_ = 0;
    std::size_t hdr_len_ = 0;  // 2 until the handler has told the real length
    std::size_t hdr_got_ = 0;
    bool hdr_len_known_ = false;
    std::size_t payload_rem_ = 0;
    std::size_t pad_ = 0;
    std::size_t trailer_got_ = 0;
    std::size_t marker_got_ = 0;
    ProtoStatus error_{};
    std::array<std::byte, kMarkerSize> marker_buf_{};
    std::array<std::byte, 3 + kCrcFieldSize> trailer_{};
    alignas(8) std::array<std::byte, kLengthFieldSize + kMaxUlpduHeader> head_{};  // length field, ULPDU header
};

template <UlpduHandler H>
ProtoStatus Deframer<H>::on_control(H& h) {
    const std::uint16_t ctrl = get_be16(hdr());
    const std::size_t hl = h.ulpdu_header_length(ctrl);
    if (hl == 0) {
        if (ProtoStatus st = h.on_ulpdu_header(std::span<const std::byte>(hdr(), 2), 0)) return fail(*st);
        return fail((ctrl & 0x8000u) ? kTermDdpTaggedInvalid : kTermDdpUntaggedInvalid);
    }
    if (hl < 2 || hl > kMaxUlpduHeader) return fail(kTermLocalCatastrophic);  // handler broke its contract
    if (hl > ulpdu_len_) return fail(kTermBadUlpduLength);
    hdr_len_ = hl;
    hdr_len_known_ = true;
    return std::nullopt;
}

template <UlpduHandler H>
ProtoStatus Deframer<H>::feed(std::span<const std::byte> in, H& h) {
    if (error_) return error_;
    const std::byte* p = in.data();
    std::size_t n = in.size();
    while (n != 0) {
        // Fast path: a whole FPDU lies in the input (the usual case: one or more FPDUs per TCP segment) and no
        // Markers: header, payload and trailer are read in place, with no staging and no state steps.
        // Anything unusual (a bad length or control word) falls through to the state machine below, which
        // reports it exactly as for a cut stream.
        if (!markers_ && state_ == State::length && len_got_ == 0 && n >= kLengthFieldSize) {
            const std::uint16_t ulen = get_be16(p);
            const std::size_t pad = pad_length(ulen);
            const std::size_t total = kLengthFieldSize + ulen + pad + kCrcFieldSize;
            const std::size_t hl = ulen >= 2 && n >= total ? h.ulpdu_header_length(get_be16(p + 2)) : 0;
            if (hl >= 2 && hl <= kMaxUlpduHeader && hl <= ulen) {
                std::uint32_t c = kCrc32cInit;
                if (crc_on_) c = crc32c_update(c, p, kLengthFieldSize + hl);
                const std::span<const std::byte> payload(p + kLengthFieldSize + hl, ulen - hl);
                if (ProtoStatus st = h.on_ulpdu_header(std::span<const std::byte>(p + kLengthFieldSize, hl),
                                                       payload.size()))
                    return fail(*st);
                if (!payload.empty()) {
                    ProtoStatus st;
                    if constexpr (CrcFusingHandler<H>) {
                        st = crc_on_ ? h.on_ulpdu_payload_crc(payload, c) : h.on_ulpdu_payload(payload);
                    } else {
                        if (crc_on_) c = crc32c_update(c, payload.data(), payload.size());
                        st = h.on_ulpdu_payload(payload);
                    }
                    if (st) return fail(*st);
                }
                const std::byte* trailer = p + kLengthFieldSize + ulen;
                if (crc_on_) {
                    if (pad != 0) c = crc32c_update(c, trailer, pad);
                    if (load_crc32c(trailer + pad) != crc32c_final(c)) return fail(kTermCrc);
                }
                if (ProtoStatus st = h.on_ulpdu_end()) return fail(*st);
                p += total;
                n -= total;
                pos_ += total;
                fpdu_start_ = pos_;
                continue;
            }
        }
        // Markers first: RFC 5044 section 4.3. They are part of the FPDU they sit in (and of its CRC).
        if (markers_ && (marker_got_ != 0 || pos_ == next_marker_)) {
            const std::size_t k = std::min(n, kMarkerSize - marker_got_);
            std::memcpy(marker_buf_.data() + marker_got_, p, k);
            crc(p, k);
            marker_got_ += k;
            p += k;
            n -= k;
            pos_ += k;
            if (marker_got_ < kMarkerSize) break;
            marker_got_ = 0;
            // FPDUPTR: octets back from the Marker to its FPDU's first octet; the low 2 bits count as 0.
            const std::uint16_t fpduptr = get_be16(marker_buf_.data() + 2) & 0xfffcu;
            const auto expected = static_cast<std::uint16_t>(next_marker_ - fpdu_start_);
            if (fpduptr != expected) return fail(kTermMarker);
            next_marker_ += kMarkerInterval;
            continue;
        }
        std::size_t avail = n;
        if (markers_) avail = std::min<std::uint64_t>(avail, next_marker_ - pos_);

        switch (state_) {
        case State::length: {
            const std::size_t k = std::min(avail, kLengthFieldSize - len_got_);
            std::memcpy(head_.data() + len_got_, p, k);
            head_crc(p, k);
            len_got_ += k;
            p += k;
            n -= k;
            pos_ += k;
            if (len_got_ < kLengthFieldSize) break;
            ulpdu_len_ = get_be16(head_.data());
            if (ulpdu_len_ < 2) return fail(kTermBadUlpduLength);  // no room for the DDP control word
            pad_ = pad_length(ulpdu_len_);
            hdr_len_ = 2;
            hdr_got_ = 0;
            hdr_len_known_ = false;
            state_ = State::header;
            break;
        }
        case State::header: {
            const std::size_t k = std::min(avail, hdr_len_ - hdr_got_);
            std::memcpy(hdr() + hdr_got_, p, k);
            head_crc(p, k);
            hdr_got_ += k;
            p += k;
            n -= k;
            pos_ += k;
            if (hdr_got_ < hdr_len_) break;
            if (!hdr_len_known_) {
                if (ProtoStatus st = on_control(h)) return st;
                if (hdr_got_ < hdr_len_) break;
            }
            payload_rem_ = ulpdu_len_ - hdr_len_;
            if (head_crc_at_once_) crc_ = crc32c_update(crc_, head_.data(), kLengthFieldSize + hdr_len_);
            if (ProtoStatus st = h.on_ulpdu_header(std::span<const std::byte>(hdr(), hdr_len_), payload_rem_))
                return fail(*st);
            trailer_got_ = 0;
            state_ = payload_rem_ != 0 ? State::payload : State::trailer;
            break;
        }
        case State::payload: {
            const std::size_t k = std::min(avail, payload_rem_);
            const std::span<const std::byte> chunk(p, k);
            ProtoStatus st;
            if constexpr (CrcFusingHandler<H>) {
                if (crc_on_)
                    st = h.on_ulpdu_payload_crc(chunk, crc_);
                else
                    st = h.on_ulpdu_payload(chunk);
            } else {
                crc(p, k);
                st = h.on_ulpdu_payload(chunk);
            }
            if (st) return fail(*st);
            payload_rem_ -= k;
            p += k;
            n -= k;
            pos_ += k;
            if (payload_rem_ == 0) state_ = State::trailer;
            break;
        }
        case State::trailer: {
            // Pad octets (in the CRC), then the CRC field (not in it).
            const std::size_t k = std::min(avail, pad_ + kCrcFieldSize - trailer_got_);
            std::memcpy(trailer_.data() + trailer_got_, p, k);
            if (trailer_got_ < pad_) crc(p, std::min(k, pad_ - trailer_got_));
            trailer_got_ += k;
            p += k;
            n -= k;
            pos_ += k;
            if (trailer_got_ < pad_ + kCrcFieldSize) break;
            if (crc_on_ && load_crc32c(trailer_.data() + pad_) != crc32c_final(crc_)) return fail(kTermCrc);
            if (ProtoStatus st = h.on_ulpdu_end()) return fail(*st);
            state_ = State::length;
            len_got_ = 0;
            crc_ = kCrc32cInit;
            fpdu_start_ = pos_;
            break;
        }
        }
    }
    return std::nullopt;
}

}  // namespace softrdma::mpa
