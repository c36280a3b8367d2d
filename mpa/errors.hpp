// SPDX-License-Identifier: MIT
// Every MPA error code in one place: the TERMINATE causes the MPA layer reports (layer LLP, error type 0 = MPA).
//
// RFC 5040 section 7.2 says LLP errors carry layer 2 with the error type and code defined by the LLP; for MPA the
// error type is 0 and the codes are RFC 5044 section 8 (0x01..0x04) and RFC 6581 section 9 (0x05..0x07). Linux
// siw (iwarp.h, enum llp_ecode) uses the same values; iwarp-wire.md lists the ones seen on the wire.
#pragma once

#include <cstdint>

#include "base/term_code.hpp"

namespace softrdma::mpa {

// Error type for every MPA error (RFC 5044 section 8: "Error type: 0 (MPA)").
inline constexpr std::uint8_t kLlpErrorTypeMpa = 0x0;

enum class MpaError : std::uint8_t {
    tcp_connection_lost = 0x01,  // RFC 5044 s8: TCP connection closed, terminated or lost
    crc_mismatch = 0x02,         // RFC 5044 s8: received MPA CRC does not match the computed value
    marker_mismatch = 0x03,      // RFC 5044 s8: received MPA Marker and ULPDU Length field mismatch
    invalid_req_rep = 0x04,      // RFC 5044 s8: received MPA Request/Reply frame not valid (e.g. bad key)
    local_catastrophic = 0x05,   // RFC 6581 s9: local catastrophic error
    insufficient_ird = 0x06,     // RFC 6581 s9: insufficient IRD resources (peer ORD above what we can take)
    no_matching_rtr = 0x07,      // RFC 6581 s9: no matching RTR model
};

constexpr TermCode term_code(MpaError e) {
    return TermCode{TermLayer::llp, kLlpErrorTypeMpa, static_cast<std::uint8_t>(e)};
}

inline constexpr TermCode kTermConnectionLost = term_code(MpaError::tcp_connection_lost);
inline constexpr TermCode kTermCrc = term_code(MpaError::crc_mismatch);
inline constexpr TermCode kTermMarker = term_code(MpaError::marker_mismatch);
inline constexpr TermCode kTermInvalidFrame = term_code(MpaError::invalid_req_rep);
inline constexpr TermCode kTermLocalCatastrophic = term_code(MpaError::local_catastrophic);
inline constexpr TermCode kTermInsufficientIrd = term_code(MpaError::insufficient_ird);
inline constexpr TermCode kTermNoMatchingRtr = term_code(MpaError::no_matching_rtr);

// A ULPDU Length that cannot hold the ULPDU header (shorter than the DDP control word, or than the header length
// the DDP layer derives from it). RFC 5044 has no code of its own for this: the length field is what framing
// failed on, so it is reported like a Marker/ULPDU Length mismatch (0x03, siw's LLP_ECODE_FPDU_START).
inline constexpr TermCode kTermBadUlpduLength = kTermMarker;

// Default DDP errors the deframer reports when the DDP handler says a control word is invalid but returns no
// error of its own (RFC 5040 section 7.2: DDP layer, "invalid DDP version" for tagged / untagged buffers).
inline constexpr TermCode kTermDdpTaggedInvalid = TermCode{TermLayer::ddp, 0x1, 0x04};
inline constexpr TermCode kTermDdpUntaggedInvalid = TermCode{TermLayer::ddp, 0x2, 0x06};

}  // namespace softrdma::mpa
