// SPDX-License-Identifier: MIT
// FPDU framing constants and the FPDU transmitter (RFC 5044 sections 4 and 5).
//
// FPDU: [be16 ULPDU length][ULPDU][pad to 4][CRC32c]. The pad makes 2 + length a multiple of 4; the CRC field
// is always there and holds 0 when CRC is not negotiated. The CRC covers every FPDU octet before the CRC field:
// length, ULPDU, pad and any Markers inside the FPDU (RFC 5044 section 4.4; a Marker's reserved half is
// "ignored on receive except for the CRC").
//
// Markers (RFC 5044 section 4.3), when negotiated for a direction, sit at every 512th octet of the TCP sequence
// space counted from the first octet of the first FPDU sent in that direction (stream offset 0 = first FPDU,
// after the MPA Request/Reply). A Marker is 4 octets: 16 reserved bits (0) and FPDUPTR, the distance in octets
// back from the Marker to the first octet of the FPDU it is in. A Marker that falls exactly where an FPDU starts
// belongs to that FPDU (it is the FPDU's first octet, FPDUPTR = 0, and it is inside that FPDU's CRC). FPDUs are
// multiples of 4 octets, so a Marker never splits the length field or the CRC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace softrdma::mpa {

inline constexpr std::size_t kLengthFieldSize = 2;
inline constexpr std::size_t kCrcFieldSize = 4;
inline constexpr std::size_t kMarkerSize = 4;
inline constexpr std::size_t kMarkerInterval = 512;
inline constexpr std::size_t kMaxUlpduLength = 0xffff;  // the length field is 16 bits

// Pad bytes after the ULPDU so that 2 + length + pad is a multiple of 4.
constexpr std::size_t pad_length(std::size_t ulpdu_len) { return (0 - (ulpdu_len + kLengthFieldSize)) & 3u; }

// FPDU octets without Markers.
constexpr std::size_t fpdu_size_unmarked(std::size_t ulpdu_len) {
    return kLengthFieldSize + ulpdu_len + pad_length(ulpdu_len) + kCrcFieldSize;
}

// MULPDU, the largest ULPDU (DDP header + payload) per FPDU, from the effective MSS (RFC 5044 section 4.2
// with the section 5 marker term):
//   without Markers: MULPDU = EMSS - (6 + EMSS mod 4)
//   with Markers:    MULPDU = EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)
// 6 = length field + CRC. The FPDU is then at most EMSS - EMSS mod 4 octets plus the Markers that can fall in a
// span of EMSS octets (ceil(EMSS/512)), so any FPDU of at most MULPDU fits one segment of EMSS octets wherever
// it starts. For EMSS 1448 (MSS 1460 with timestamps) both siw's "FPDU = MSS rounded down to 8" and this give
// a ULPDU of 1442 without Markers. Clamped to the 16-bit length field; 0 if EMSS is too small to be useful.
constexpr std::size_t mulpdu_for(std::uint32_t emss, bool markers) {
    std::size_t overhead = 6 + emss % 4;
    if (markers) overhead += kMarkerSize * ((emss + kMarkerInterval - 1) / kMarkerInterval);
    if (emss <= overhead + 2) return 0;
    const std::size_t m = emss - overhead;
    return m > kMaxUlpduLength ? kMaxUlpduLength : m;
}
static_assert(mulpdu_for(1448, false) == 1442);
static_assert(mulpdu_for(1448, true) == 1430);

struct FpduTxConfig {
    bool crc = false;
    bool markers = false;       // Markers negotiated on the data we send (the peer's M bit)
    std::uint32_t emss = 1448;  // effective MSS: TCP payload octets per segment
};

// Builds FPDUs into caller memory, one pass over the payload (copy and CRC fused), no allocation.
//
//   FpduTx tx(cfg);                             // or FpduTx(tx_config(agreed, emss)) - see negotiation.hpp
//   std::size_t max = tx.mulpdu();              // DDP splits messages so header + payload <= max
//   std::size_t n = tx.wire_size(ulpdu_len);    // exact bytes the next write() emits (Markers depend on position)
//   tx.write(out, ddp_header, sges);            // emits one FPDU, returns n, advances the stream position
//
// The stream position is counted from the first FPDU of this direction (offset 0 unless the connection already
// sent FPDUs, e.g. the RTR); it must be a multiple of 4. Every FPDU is emitted in full: the caller sends the
// returned bytes in order and sends nothing else on the stream.
class FpduTx {
public:
    explicit FpduTx(const FpduTxConfig& cfg, std::uint64_t stream_offset = 0);

    // Largest ULPDU (header + payload) per FPDU so that each FPDU fits in one segment of EMSS octets.
    std::size_t mulpdu() const { return mulpdu_; }

    // Octets write() will emit for a ULPDU of ulpdu_len octets at the current stream position.
    std::size_t wire_size(std::size_t ulpdu_len) const;

    // Writes one FPDU carrying ulpdu_header followed by the payload pieces into out. Returns the octets written
    // (== wire_size(total)), or 0 without writing anything if the ULPDU exceeds 65535 octets or out is smaller
    // than wire_size(total). ulpdu_header starts with the DDP control word (the MPA length is written here).
    std::size_t write(std::span<std::byte> out, std::span<const std::byte> ulpdu_header,
                      std::span<const std::span<const std::byte>> payload);

    // Convenience for a contiguous payload.
    std::size_t write(std::span<std::byte> out, std::span<const std::byte> ulpdu_header,
                      std::span<const std::byte> payload) {
        const std::span<const std::byte> one[1] = {payload};
        return write(out, ulpdu_header, std::span<const std::span<const std::byte>>(one, payload.empty() ? 0 : 1));
    }

    // The same FPDU as write() with a payload of payload_len octets, except that the payload octets are left
    // as they are: out[kLengthFieldSize + ulpdu_header.size(), + payload_len) is for the caller to fill before
    // the bytes are read. Only without CRC and Markers (the CRC covers the payload, and Markers would cut it):
    // returns 0 without writing anything otherwise, and as write() does when the FPDU does not fit.
    std::size_t write_deferred(std::span<std::byte> out, std::span<const std::byte> ulpdu_header,
                               std::size_t payload_len);
    bool can_defer() const { return !crc_ && !markers_; }

    std::uint64_t stream_position() const { return pos_; }
    bool crc() const { return crc_; }
    bool markers() const { return markers_; }

private:
    bool crc_;
    bool markers_;
    std::size_t mulpdu_;
    std::uint64_t pos_;
};

}  // namespace softrdma::mpa
