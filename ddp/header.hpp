// SPDX-License-Identifier: MIT
// DDP (RFC 5041) control word, tagged and untagged headers, and the DDP error codes.
//
// Layout (RFC 5041 section 4), counted from the DDP control byte; the 2-byte MPA length before it belongs
// to MPA and is never part of these spans:
//
//   tagged   (14 bytes): ctrl16 | STag32 | TO64
//   untagged (18 bytes): ctrl16 | RsvdULP32 | QN32 | MSN32 | MO32
//
// ctrl16 is DDP's control byte followed by the first RsvdULP byte, which RDMAP uses as its own control
// byte (RFC 5040 section 4.2). Both are handled as one 16-bit word with the masks below; DDP owns the high
// byte and passes the low byte through.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "base/byteorder.hpp"
#include "base/term_code.hpp"

namespace softrdma::ddp {

// ---- control word (RFC 5041 section 4.2 / 4.3; RFC 5040 section 4.2) ------------------------------------
inline constexpr std::uint16_t kCtrlTagged = 0x8000;         // T: tagged buffer model
inline constexpr std::uint16_t kCtrlLast = 0x4000;           // L: last segment of the DDP message
inline constexpr std::uint16_t kCtrlDdpReserved = 0x3C00;    // Rsvd: zero on TX, not checked on RX
inline constexpr std::uint16_t kCtrlDdpVersionMask = 0x0300; // DV
inline constexpr unsigned kCtrlDdpVersionShift = 8;
inline constexpr std::uint16_t kCtrlUlpMask = 0x00FF;        // first RsvdULP byte (RDMAP's control byte)
inline constexpr std::uint8_t kDdpVersion = 1;

constexpr bool ctrl_tagged(std::uint16_t c) { return (c & kCtrlTagged) != 0; }
constexpr bool ctrl_last(std::uint16_t c) { return (c & kCtrlLast) != 0; }
constexpr std::uint8_t ctrl_ddp_version(std::uint16_t c) {
    return static_cast<std::uint8_t>((c & kCtrlDdpVersionMask) >> kCtrlDdpVersionShift);
}
constexpr std::uint16_t ctrl_with_last(std::uint16_t c, bool last) {
    return static_cast<std::uint16_t>(last ? (c | kCtrlLast) : (c & ~kCtrlLast));
}

// ---- header sizes ------------------------------------------------------------------------------------
inline constexpr std::size_t kTaggedHeaderLen = 14;    // RFC 5041 section 4.3
inline constexpr std::size_t kUntaggedHeaderLen = 18;  // RFC 5041 section 4.4

// ---- DDP error codes (RFC 5041 section 7.2; the TERMINATE triple of RFC 5040 section 4.8) -----------------
namespace err {
inline constexpr std::uint8_t kEtypeCatastrophic = 0;
inline constexpr std::uint8_t kEtypeTagged = 1;
inline constexpr std::uint8_t kEtypeUntagged = 2;
inline constexpr TermCode local_catastrophic{TermLayer::ddp, kEtypeCatastrophic, 0x00};
// Tagged buffer errors.
inline constexpr TermCode t_invalid_stag{TermLayer::ddp, kEtypeTagged, 0x00};
inline constexpr TermCode t_base_bounds{TermLayer::ddp, kEtypeTagged, 0x01};
inline constexpr TermCode t_stag_not_assoc{TermLayer::ddp, kEtypeTagged, 0x02};
inline constexpr TermCode t_to_wrap{TermLayer::ddp, kEtypeTagged, 0x03};
inline constexpr TermCode t_version{TermLayer::ddp, kEtypeTagged, 0x04};
// Untagged buffer errors.
inline constexpr TermCode u_invalid_qn{TermLayer::ddp, kEtypeUntagged, 0x01};
inline constexpr TermCode u_no_buffer{TermLayer::ddp, kEtypeUntagged, 0x02};  // Invalid MSN: no buffer
inline constexpr TermCode u_msn_range{TermLayer::ddp, kEtypeUntagged, 0x03};  // Invalid MSN: out of range
inline constexpr TermCode u_invalid_mo{TermLayer::ddp, kEtypeUntagged, 0x04};
inline constexpr TermCode u_too_long{TermLayer::ddp, kEtypeUntagged, 0x05};   // message too long for buffer
inline constexpr TermCode u_version{TermLayer::ddp, kEtypeUntagged, 0x06};
}  // namespace err

// Checks the DDP half of the control word (RFC 5041 section 7.2: version is the only DDP field a receiver
// validates before it knows the buffer model; reserved bits are ignored on receive).
constexpr ProtoStatus check_ddp_ctrl(std::uint16_t ctrl) {
    if (ctrl_ddp_version(ctrl) != kDdpVersion) return ctrl_tagged(ctrl) ? err::t_version : err::u_version;
    return std::nullopt;
}

// ---- tagged header (RFC 5041 section 4.3) ----------------------------------------------------------------
struct TaggedHeader {
    std::uint16_t ctrl{0};  // must have kCtrlTagged
    std::uint32_t stag{0};  // data sink STag
    std::uint64_t to{0};    // data sink tagged offset

    bool last() const { return ctrl_last(ctrl); }

    // Writes exactly kTaggedHeaderLen bytes at the front of `out` (out.size() >= kTaggedHeaderLen).
    void encode(std::span<std::byte> out) const {
        store_be16(out, 0, ctrl);
        store_be32(out, 2, stag);
        store_be64(out, 6, to);
    }
    // Reads the first kTaggedHeaderLen bytes; nullopt if `in` is shorter or the T bit is clear.
    static std::optional<TaggedHeader> decode(std::span<const std::byte> in) {
        if (in.size() < kTaggedHeaderLen) return std::nullopt;
        TaggedHeader h{load_be16(in, 0), load_be32(in, 2), load_be64(in, 6)};
        if (!ctrl_tagged(h.ctrl)) return std::nullopt;
        return h;
    }
    friend bool operator==(const TaggedHeader&, const TaggedHeader&) = default;
};

// ---- untagged header (RFC 5041 section 4.4) --------------------------------------------------------------
struct UntaggedHeader {
    std::uint16_t ctrl{0};     // kCtrlTagged clear
    std::uint32_t rsvd_ulp{0}; // RsvdULP bits 8..39: RDMAP's Invalidate STag (SEND with Invalidate), rdmap::kImmFollows, or zero
    std::uint32_t qn{0};       // queue number
    std::uint32_t msn{0};      // message sequence number, starts at 1 per queue (RFC 5041 section 5.3)
    std::uint32_t mo{0};       // message offset: byte offset of this segment's payload in the message

    bool last() const { return ctrl_last(ctrl); }

    void encode(std::span<std::byte> out) const {
        store_be16(out, 0, ctrl);
        store_be32(out, 2, rsvd_ulp);
        store_be32(out, 6, qn);
        store_be32(out, 10, msn);
        store_be32(out, 14, mo);
    }
    static std::optional<UntaggedHeader> decode(std::span<const std::byte> in) {
        if (in.size() < kUntaggedHeaderLen) return std::nullopt;
        UntaggedHeader h{load_be16(in, 0), load_be32(in, 2), load_be32(in, 6), load_be32(in, 10),
                         load_be32(in, 14)};
        if (ctrl_tagged(h.ctrl)) return std::nullopt;
        return h;
    }
    friend bool operator==(const UntaggedHeader&, const UntaggedHeader&) = default;
};

}  // namespace softrdma::ddp
