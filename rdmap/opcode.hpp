// SPDX-License-Identifier: MIT
// The RDMAP opcode table: one constexpr row per 4-bit opcode (RFC 5040 section 4.3, RFC 7306 section 8).
//
// Everything opcode-specific on both paths comes from here: header length, tagged or untagged, queue number,
// the prebuilt control word, what payload the message may carry, who may send it, and the RX handlers the
// endpoint dispatches to. Rows 12..15 are reserved: `valid` false, and receiving one is "Unexpected OpCode".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ddp/header.hpp"
#include "base/term_code.hpp"
#include "rdmap/messages.hpp"

namespace softrdma::rdmap {

class Endpoint;

// RX handlers, defined in endpoint.cpp (friend of Endpoint). `header` runs once the whole DDP/RDMAP header
// of a segment is in and checked by DDP (validate, set up placement); `end` runs after the segment's
// FPDU passed its CRC (commit: completions, queued responses, atomics).
struct RxHandlers {
    static ProtoStatus write_header(Endpoint&);
    static ProtoStatus write_end(Endpoint&);
    static ProtoStatus read_request_header(Endpoint&);
    static ProtoStatus read_request_end(Endpoint&);
    static ProtoStatus read_response_header(Endpoint&);
    static ProtoStatus read_response_end(Endpoint&);
    static ProtoStatus send_header(Endpoint&);  // SEND family and Immediate Data (QN 0)
    static ProtoStatus send_end(Endpoint&);
    static ProtoStatus terminate_header(Endpoint&);
    static ProtoStatus terminate_end(Endpoint&);
    static ProtoStatus atomic_request_header(Endpoint&);
    static ProtoStatus atomic_request_end(Endpoint&);
    static ProtoStatus atomic_response_header(Endpoint&);
    static ProtoStatus atomic_response_end(Endpoint&);
};
using RxFn = ProtoStatus (*)(Endpoint&);

// What the DDP payload of a segment may hold.
enum class Payload : std::uint8_t {
    none,       // header only: a non-zero payload is an error
    data,       // placed into a tagged or untagged buffer
    term_info,  // TERMINATE: DDP Segment Length + offending headers, kept for the report
};

// Who starts the message, which fixes whether it may arrive unasked.
enum class Flow : std::uint8_t {
    message,    // SEND family, WRITE, Immediate Data: sent by the initiator, consumed by the peer
    request,    // READ / Atomic Request: counted against the peer's IRD and our ORD
    response,   // READ / Atomic Response: legal only in answer to our oldest outstanding request
    terminate,  // last message on the stream
};

inline constexpr std::uint8_t kDirTx = 1;  // this endpoint may send it
inline constexpr std::uint8_t kDirRx = 2;  // this endpoint accepts it

struct OpInfo {
    std::string_view name{"reserved"};
    bool valid{false};
    bool tagged{false};
    std::uint8_t qn{0};        // untagged queue number (unused when tagged)
    std::uint8_t hdr_len{0};   // DDP + RDMAP header bytes counted from the DDP control byte
    std::uint16_t ctrl{0};     // prebuilt control word, Last flag clear: T | DV=1 | RV=1 | opcode
    std::uint8_t dirs{0};      // kDirTx | kDirRx
    Payload payload{Payload::none};
    Flow flow{Flow::message};
    bool solicited{false};     // SE variant
    bool invalidate{false};    // RsvdULP carries an Invalidate STag
    RxFn rx_header{nullptr};
    RxFn rx_end{nullptr};
};

constexpr std::uint16_t make_ctrl(bool tagged, Opcode op) {
    return static_cast<std::uint16_t>((tagged ? ddp::kCtrlTagged : 0) | (ddp::kDdpVersion << ddp::kCtrlDdpVersionShift) |
                                      (kRdmapVersion << kCtrlRdmapVersionShift) | static_cast<std::uint8_t>(op));
}

namespace detail {
constexpr OpInfo row(std::string_view name, Opcode op, bool tagged, std::uint32_t qn, std::size_t hdr, Payload pl,
                     Flow flow, bool se, bool inv, RxFn h, RxFn e) {
    return OpInfo{name, true, tagged, static_cast<std::uint8_t>(qn), static_cast<std::uint8_t>(hdr),
                  make_ctrl(tagged, op), kDirTx | kDirRx, pl, flow, se, inv, h, e};
}
constexpr std::array<OpInfo, kOpcodeCount> build_table() {
    using H = RxHandlers;
    constexpr std::size_t tag = ddp::kTaggedHeaderLen;
    constexpr std::size_t untag = ddp::kUntaggedHeaderLen;
    std::array<OpInfo, kOpcodeCount> t{};
    // RFC 5040 section 4.3 / 4.4 / 4.8.
    t[0] = row("WRITE", Opcode::write, true, 0, tag, Payload::data, Flow::message, false, false, H::write_header, H::write_end);
    t[1] = row("READ_REQUEST", Opcode::read_request, false, kQnReadRequest, kReadRequestLen, Payload::none, Flow::request,
               false, false, H::read_request_header, H::read_request_end);
    t[2] = row("READ_RESPONSE", Opcode::read_response, true, 0, tag, Payload::data, Flow::response, false, false,
               H::read_response_header, H::read_response_end);
    t[3] = row("SEND", Opcode::send, false, kQnSend, untag, Payload::data, Flow::message, false, false, H::send_header, H::send_end);
    t[4] = row("SEND_INV", Opcode::send_inv, false, kQnSend, untag, Payload::data, Flow::message, false, true, H::send_header,
               H::send_end);
    t[5] = row("SEND_SE", Opcode::send_se, false, kQnSend, untag, Payload::data, Flow::message, true, false, H::send_header,
               H::send_end);
    t[6] = row("SEND_SE_INV", Opcode::send_se_inv, false, kQnSend, untag, Payload::data, Flow::message, true, true,
               H::send_header, H::send_end);
    t[7] = row("TERMINATE", Opcode::terminate, false, kQnTerminate, kTerminateLen, Payload::term_info, Flow::terminate, false,
               false, H::terminate_header, H::terminate_end);
    // RFC 7306 sections 3, 4 and 8.
    t[8] = row("IMM_DATA", Opcode::imm_data, false, kQnSend, kImmDataLen, Payload::none, Flow::message, false, false,
               H::send_header, H::send_end);
    t[9] = row("IMM_DATA_SE", Opcode::imm_data_se, false, kQnSend, kImmDataLen, Payload::none, Flow::message, true, false,
               H::send_header, H::send_end);
    t[10] = row("ATOMIC_REQUEST", Opcode::atomic_request, false, kQnReadRequest, kAtomicRequestLen, Payload::none,
                Flow::request, false, false, H::atomic_request_header, H::atomic_request_end);
    t[11] = row("ATOMIC_RESPONSE", Opcode::atomic_response, false, kQnAtomicResponse, kAtomicResponseLen, Payload::none,
                Flow::response, false, false, H::atomic_response_header, H::atomic_response_end);
    return t;
}
}  // namespace detail

inline constexpr std::array<OpInfo, kOpcodeCount> kOpTable = detail::build_table();

constexpr const OpInfo& op_info(Opcode op) { return kOpTable[static_cast<std::size_t>(op)]; }

// Opcodes 8..11 are RFC 7306's (Immediate Data, Immediate Data with SE, Atomic Request, Atomic Response): a
// stream carries them only when both ends agreed to (Config::rfc7306).
constexpr bool is_rfc7306(std::uint8_t opcode) { return opcode >= 8 && opcode <= 11; }

// The values iwarp-wire.md lists for real peers (with the Last flag).
static_assert(ddp::ctrl_with_last(kOpTable[0].ctrl, true) == 0xC140);
static_assert(ddp::ctrl_with_last(kOpTable[1].ctrl, true) == 0x4141);
static_assert(ddp::ctrl_with_last(kOpTable[2].ctrl, true) == 0xC142);
static_assert(ddp::ctrl_with_last(kOpTable[3].ctrl, true) == 0x4143);
static_assert(ddp::ctrl_with_last(kOpTable[7].ctrl, true) == 0x4147);
static_assert(kOpTable[1].hdr_len + 2 == 48 && kOpTable[0].hdr_len + 2 == 16 && kOpTable[3].hdr_len + 2 == 20);

}  // namespace softrdma::rdmap
