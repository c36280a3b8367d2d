// SPDX-License-Identifier: MIT
// RDMAP (RFC 5040, RFC 7306) control byte, error codes and the message headers that follow the DDP header.
//
// Every size is counted from the DDP control byte (the 2-byte MPA length is MPA's and never appears here).
// All fields big-endian, read and written through ddp/wire.hpp; no struct overlays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "ddp/header.hpp"
#include "base/byteorder.hpp"
#include "base/term_code.hpp"

namespace softrdma::rdmap {

// ---- RDMAP control byte: the low byte of the 16-bit control word (RFC 5040 section 4.2) -----------------
inline constexpr std::uint16_t kCtrlRdmapVersionMask = 0x00C0;  // RV
inline constexpr unsigned kCtrlRdmapVersionShift = 6;
inline constexpr std::uint16_t kCtrlRdmapReserved = 0x0030;     // zero on TX, not checked on RX
inline constexpr std::uint16_t kCtrlOpcodeMask = 0x000F;
inline constexpr std::uint8_t kRdmapVersion = 1;

constexpr std::uint8_t ctrl_rdmap_version(std::uint16_t c) {
    return static_cast<std::uint8_t>((c & kCtrlRdmapVersionMask) >> kCtrlRdmapVersionShift);
}
constexpr std::uint8_t ctrl_opcode(std::uint16_t c) { return static_cast<std::uint8_t>(c & kCtrlOpcodeMask); }

// ---- opcodes (RFC 5040 section 4.3; RFC 7306 section 8 adds 8..11) ---------------------------------------
enum class Opcode : std::uint8_t {
    write = 0,
    read_request = 1,
    read_response = 2,
    send = 3,
    send_inv = 4,
    send_se = 5,
    send_se_inv = 6,
    terminate = 7,
    imm_data = 8,         // RFC 7306: Immediate Data
    imm_data_se = 9,      // RFC 7306: Immediate Data with Solicited Event
    atomic_request = 10,  // RFC 7306
    atomic_response = 11, // RFC 7306
};
inline constexpr std::size_t kOpcodeCount = 16;  // the 4-bit field; 12..15 are reserved

// ---- untagged queue numbers (RFC 5040 section 5.1; RFC 7306 section 8) -----------------------------------
inline constexpr std::uint32_t kQnSend = 0;            // SEND family and Immediate Data
inline constexpr std::uint32_t kQnReadRequest = 1;     // RDMA Read Request and Atomic Request
inline constexpr std::uint32_t kQnTerminate = 2;
inline constexpr std::uint32_t kQnAtomicResponse = 3;  // RFC 7306
inline constexpr std::size_t kQueueCount = 4;

// ---- SEND with immediate data (softrdma, on streams that agreed to RFC 7306) ---------------------------------
// RFC 7306 has no SEND with immediate data: a SEND and an Immediate Data message are two messages, each taking
// a receive. Verbs applications expect one receive completion carrying the SEND's bytes and the immediate. The
// sender says "my Immediate Data follows" by putting this value in the SEND's DDP RsvdULP field (RDMAP's
// Invalidate STag, which a plain SEND leaves reserved; RFC 5040 has the receiver ignore it), and the receiver
// holds that SEND's completion until the next QN 0 message (MSN + 1) joins it. The decision rests on the SEND's
// own header, not on where TCP cut the stream. Without the value (any other RFC 7306 peer) each message takes a
// receive of its own, as the RFC has it. Never sent to a peer that did not agree to RFC 7306 (Linux siw, Chelsio
// by default): a SEND with immediate data cannot be posted there (PostErrc::not_agreed).
inline constexpr std::uint32_t kImmFollows = 0x73060001;

// ---- RDMAP error codes (RFC 5040 section 4.8) ------------------------------------------------------------
namespace err {
inline constexpr std::uint8_t kEtypeCatastrophic = 0;
inline constexpr std::uint8_t kEtypeProtection = 1;  // Remote Protection Error
inline constexpr std::uint8_t kEtypeOperation = 2;   // Remote Operation Error
inline constexpr TermCode local_catastrophic{TermLayer::rdmap, kEtypeCatastrophic, 0x00};
inline constexpr TermCode p_invalid_stag{TermLayer::rdmap, kEtypeProtection, 0x00};
inline constexpr TermCode p_base_bounds{TermLayer::rdmap, kEtypeProtection, 0x01};
inline constexpr TermCode p_access{TermLayer::rdmap, kEtypeProtection, 0x02};
inline constexpr TermCode p_stag_not_assoc{TermLayer::rdmap, kEtypeProtection, 0x03};
inline constexpr TermCode p_to_wrap{TermLayer::rdmap, kEtypeProtection, 0x04};
inline constexpr TermCode p_cannot_invalidate{TermLayer::rdmap, kEtypeProtection, 0x09};
inline constexpr TermCode p_unspecified{TermLayer::rdmap, kEtypeProtection, 0xFF};
inline constexpr TermCode o_version{TermLayer::rdmap, kEtypeOperation, 0x05};
inline constexpr TermCode o_opcode{TermLayer::rdmap, kEtypeOperation, 0x06};
inline constexpr TermCode o_catastrophic_stream{TermLayer::rdmap, kEtypeOperation, 0x07};
inline constexpr TermCode o_catastrophic_global{TermLayer::rdmap, kEtypeOperation, 0x08};
inline constexpr TermCode o_cannot_invalidate{TermLayer::rdmap, kEtypeOperation, 0x09};
inline constexpr TermCode o_unspecified{TermLayer::rdmap, kEtypeOperation, 0xFF};
}  // namespace err

// ---- header sizes ------------------------------------------------------------------------------------------
inline constexpr std::size_t kReadRequestLen = ddp::kUntaggedHeaderLen + 28;     // 46 (48 with MPA length)
inline constexpr std::size_t kTerminateLen = ddp::kUntaggedHeaderLen + 4;        // 22, attached headers follow
inline constexpr std::size_t kImmDataLen = ddp::kUntaggedHeaderLen + 8;          // 26
inline constexpr std::size_t kAtomicRequestLen = ddp::kUntaggedHeaderLen + 52;   // 70
inline constexpr std::size_t kAtomicResponseLen = ddp::kUntaggedHeaderLen + 12;  // 30
inline constexpr std::size_t kMaxHeaderLen = kAtomicRequestLen;

// ---- RDMA Read Request header (RFC 5040 section 4.4), after the untagged DDP header -----------------------
struct ReadRequest {
    std::uint32_t sink_stag{0};
    std::uint64_t sink_to{0};
    std::uint32_t size{0};  // RDMA Read Message Size
    std::uint32_t src_stag{0};
    std::uint64_t src_to{0};

    void encode(std::span<std::byte> out) const {  // out: the whole header, >= kReadRequestLen bytes
        store_be32(out, 18, sink_stag);
        store_be64(out, 22, sink_to);
        store_be32(out, 30, size);
        store_be32(out, 34, src_stag);
        store_be64(out, 38, src_to);
    }
    static ReadRequest decode(std::span<const std::byte> in) {  // in: >= kReadRequestLen bytes
        return ReadRequest{load_be32(in, 18), load_be64(in, 22), load_be32(in, 30),
                           load_be32(in, 34), load_be64(in, 38)};
    }
    friend bool operator==(const ReadRequest&, const ReadRequest&) = default;
};

// ---- Terminate header (RFC 5040 section 4.8) -------------------------------------------------------------
// One 32-bit Terminate Control word: Layer 0xF0000000, EType 0x0F000000, Error Code 0x00FF0000, then the
// header-control bits M (DDP Segment Length valid) 0x8000, D (DDP header included) 0x4000, R (RDMAP header
// included) 0x2000, reserved 0x1FFF. The message payload carries, when M/D/R say so, the 16-bit DDP Segment
// Length of the offending segment, its DDP header and its RDMAP header.
inline constexpr std::uint32_t kTermFlagM = 0x8000;
inline constexpr std::uint32_t kTermFlagD = 0x4000;
inline constexpr std::uint32_t kTermFlagR = 0x2000;

struct TerminateHeader {
    TermCode code{};
    bool m{false};
    bool d{false};
    bool r{false};

    std::uint32_t word() const {
        return (std::uint32_t{static_cast<std::uint8_t>(code.layer)} & 0xF) << 28 |
               (std::uint32_t{code.etype} & 0xF) << 24 | std::uint32_t{code.ecode} << 16 | (m ? kTermFlagM : 0) |
               (d ? kTermFlagD : 0) | (r ? kTermFlagR : 0);
    }
    void encode(std::span<std::byte> out) const { store_be32(out, 18, word()); }
    static TerminateHeader decode(std::span<const std::byte> in) {  // in: >= kTerminateLen bytes
        const std::uint32_t w = load_be32(in, 18);
        return TerminateHeader{TermCode{static_cast<TermLayer>(w >> 28), static_cast<std::uint8_t>((w >> 24) & 0xF),
                                        static_cast<std::uint8_t>(w >> 16)},
                               (w & kTermFlagM) != 0, (w & kTermFlagD) != 0, (w & kTermFlagR) != 0};
    }
    friend bool operator==(const TerminateHeader&, const TerminateHeader&) = default;
};

// ---- Immediate Data header (RFC 7306 section 4): 8 bytes of data right after the untagged header ---------
inline void encode_imm(std::span<std::byte> out, std::uint64_t imm) { store_be64(out, 18, imm); }
inline std::uint64_t decode_imm(std::span<const std::byte> in) { return load_be64(in, 18); }

// ---- Atomic Request / Response (RFC 7306 section 3) ---------------------------------------------------------
enum class AtomicOp : std::uint8_t { fetch_add = 0, swap = 1, cmp_swap = 2 };  // low 4 bits of the first word
inline constexpr std::uint32_t kAtomicOpMask = 0xF;

struct AtomicRequest {
    std::uint8_t op{0};  // AtomicOp, kept raw so that an unknown value can be reported
    std::uint32_t req_id{0};
    std::uint32_t stag{0};  // Remote STag
    std::uint64_t to{0};    // Remote Tagged Offset, 8-byte aligned
    std::uint64_t add_swap{0};
    std::uint64_t add_swap_mask{0};
    std::uint64_t compare{0};
    std::uint64_t compare_mask{0};

    void encode(std::span<std::byte> out) const {
        store_be32(out, 18, op & kAtomicOpMask);
        store_be32(out, 22, req_id);
        store_be32(out, 26, stag);
        store_be64(out, 30, to);
        store_be64(out, 38, add_swap);
        store_be64(out, 46, add_swap_mask);
        store_be64(out, 54, compare);
        store_be64(out, 62, compare_mask);
    }
    static AtomicRequest decode(std::span<const std::byte> in) {  // in: >= kAtomicRequestLen bytes
        return AtomicRequest{static_cast<std::uint8_t>(load_be32(in, 18) & kAtomicOpMask),
                             load_be32(in, 22), load_be32(in, 26), load_be64(in, 30),
                             load_be64(in, 38), load_be64(in, 46), load_be64(in, 54),
                             load_be64(in, 62)};
    }
    friend bool operator==(const AtomicRequest&, const AtomicRequest&) = default;
};

// Applies an RFC 7306 section 3.1 operation to `orig` and returns the new value; nullopt for an unknown op.
//   FetchAdd: add, with carries not propagated out of a bit whose add-mask bit is set (field boundaries).
//   Swap:     new = (orig & ~swap_mask) | (swap & swap_mask).
//   CmpSwap:  if ((orig ^ compare) & compare_mask) == 0, swap as above; else unchanged.
constexpr std::optional<std::uint64_t> atomic_apply(const AtomicRequest& a, std::uint64_t orig) {
    switch (static_cast<AtomicOp>(a.op)) {
    case AtomicOp::fetch_add: {
        if (a.add_swap_mask == 0) return orig + a.add_swap;
        std::uint64_t out = 0;
        unsigned carry = 0;
        for (unsigned bit = 0; bit < 64; ++bit) {
            const std::uint64_t m = std::uint64_t{1} << bit;
            const unsigned sum = carry + ((orig & m) ? 1U : 0U) + ((a.add_swap & m) ? 1U : 0U);
            if (sum & 1U) out |= m;
            carry = ((sum & 2U) != 0 && (a.add_swap_mask & m) == 0) ? 1U : 0U;
        }
        return out;
    }
    case AtomicOp::swap:
        return (orig & ~a.add_swap_mask) | (a.add_swap & a.add_swap_mask);
    case AtomicOp::cmp_swap:
        if (((orig ^ a.compare) & a.compare_mask) != 0) return orig;
        return (orig & ~a.add_swap_mask) | (a.add_swap & a.add_swap_mask);
    }
    return std::nullopt;
}

struct AtomicResponse {
    std::uint32_t req_id{0};    // Original Request Identifier
    std::uint64_t original{0};  // Original Remote Data Value

    void encode(std::span<std::byte> out) const {
        store_be32(out, 18, req_id);
        store_be64(out, 22, original);
    }
    static AtomicResponse decode(std::span<const std::byte> in) {  // in: >= kAtomicResponseLen bytes
        return AtomicResponse{load_be32(in, 18), load_be64(in, 22)};
    }
    friend bool operator==(const AtomicResponse&, const AtomicResponse&) = default;
};

}  // namespace softrdma::rdmap
