// SPDX-License-Identifier: MIT
// Every TERMINATE cause in words: the (layer, error type, error code) triples of RFC 5040 section 7.4 (RDMAP),
// RFC 5041 section 7.2 (DDP), RFC 5044 section 8 and RFC 6581 section 9 (MPA, the LLP layer), as the three
// layers of this stack name them (mpa/errors.hpp, ddp/header.hpp, rdmap/messages.hpp). For logs and for the
// reasons applications read (CM events, QP errors); never on the data path.
#pragma once

#include <cstdint>

#include "ddp/header.hpp"
#include "mpa/errors.hpp"
#include "rdmap/messages.hpp"

namespace softrdma::rdmap {

// The cause in a few words, or nullptr for a triple no RFC defines.
constexpr const char* term_text(TermCode c) {
    struct Row {
        TermCode code;
        const char* text;
    };
    constexpr Row rows[] = {
        {err::local_catastrophic, "RDMAP local catastrophic error"},
        {err::p_invalid_stag, "invalid STag"},
        {err::p_base_bounds, "base or bounds violation"},
        {err::p_access, "access rights violation"},
        {err::p_stag_not_assoc, "STag not associated with this stream (protection domain)"},
        {err::p_to_wrap, "tagged offset wrap"},
        {err::p_cannot_invalidate, "STag cannot be invalidated"},
        {err::p_unspecified, "unspecified remote protection error"},
        {err::o_version, "invalid RDMAP version"},
        {err::o_opcode, "unexpected opcode"},
        {err::o_catastrophic_stream, "catastrophic error, localized to this stream"},
        {err::o_catastrophic_global, "catastrophic error, global"},
        {err::o_cannot_invalidate, "STag cannot be invalidated"},
        {err::o_unspecified, "unspecified remote operation error"},
        {ddp::err::local_catastrophic, "DDP local catastrophic error"},
        {ddp::err::t_invalid_stag, "DDP: invalid STag"},
        {ddp::err::t_base_bounds, "DDP: base or bounds violation"},
        {ddp::err::t_stag_not_assoc, "DDP: STag not associated with this stream"},
        {ddp::err::t_to_wrap, "DDP: tagged offset wrap"},
        {ddp::err::t_version, "DDP: invalid version (tagged)"},
        {ddp::err::u_invalid_qn, "DDP: invalid queue number"},
        {ddp::err::u_no_buffer, "DDP: no receive posted (invalid MSN, no buffer available)"},
        {ddp::err::u_msn_range, "DDP: MSN out of range"},
        {ddp::err::u_invalid_mo, "DDP: invalid message offset"},
        {ddp::err::u_too_long, "DDP: message longer than the posted receive"},
        {ddp::err::u_version, "DDP: invalid version (untagged)"},
        {mpa::kTermConnectionLost, "MPA: TCP connection closed, terminated or lost"},
        {mpa::kTermCrc, "MPA: CRC error"},
        {mpa::kTermMarker, "MPA: marker or ULPDU length error"},
        {mpa::kTermInvalidFrame, "MPA: invalid request/reply frame"},
        {mpa::kTermLocalCatastrophic, "MPA: local catastrophic error"},
        {mpa::kTermInsufficientIrd, "MPA: insufficient IRD resources"},
        {mpa::kTermNoMatchingRtr, "MPA: no matching RTR model"},
    };
    for (const Row& r : rows)
        if (r.code == c) return r.text;
    return nullptr;
}

// The triple read from a control word laid out as Linux siw's x86 build lays it out (little-endian bit fields:
// layer in the low nibble of the first byte, error type in its high nibble, code in the second byte), i.e. what
// such a peer meant by the word it sent.
constexpr TermCode term_code_siw_x86(std::uint32_t raw) {
    return TermCode{static_cast<TermLayer>((raw >> 24) & 0xF), static_cast<std::uint8_t>((raw >> 28) & 0xF),
                    static_cast<std::uint8_t>((raw >> 16) & 0xFF)};
}

}  // namespace softrdma::rdmap
