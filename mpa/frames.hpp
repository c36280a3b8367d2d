// SPDX-License-Identifier: MIT
// MPA Request/Reply frames (RFC 5044 section 7.1) with the RFC 6581 (revision 2) IRD/ORD header.
//
//   0..15  key: "MPA ID Req Frame" or "MPA ID Rep Frame" (16 ASCII bytes, no terminator)
//   16     flags: M 0x80 (markers wanted on the data this side receives), C 0x40 (CRC), R 0x20 (reject),
//                 0x10 enhanced connection establishment (RFC 6581), 0x0f reserved (sent 0, ignored)
//   17     revision: 1 = RFC 5044, 2 = RFC 6581
//   18..19 private data length (big-endian), then the private data
// Revision 2 with the enhanced flag puts a 4-byte header first in the private data (counted in the length):
//   IRD word: 0x8000 peer-to-peer, 0x4000 zero-length SEND RTR, 0x3fff IRD
//   ORD word: 0x8000 zero-length RDMA WRITE RTR, 0x4000 zero-length RDMA READ RTR, 0x3fff ORD
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/term_code.hpp"

namespace softrdma::mpa {

inline constexpr std::size_t kKeySize = 16;
inline constexpr std::size_t kFrameHeaderSize = 20;
inline constexpr std::array<char, kKeySize> kRequestKey{'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R',
                                                        'e', 'q', ' ', 'F', 'r', 'a', 'm', 'e'};
inline constexpr std::array<char, kKeySize> kReplyKey{'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R',
                                                      'e', 'p', ' ', 'F', 'r', 'a', 'm', 'e'};

inline constexpr std::uint8_t kFlagMarkers = 0x80;
inline constexpr std::uint8_t kFlagCrc = 0x40;
inline constexpr std::uint8_t kFlagReject = 0x20;
inline constexpr std::uint8_t kFlagEnhanced = 0x10;
inline constexpr std::uint8_t kFlagsReserved = 0x0f;  // RFC 5044: set to zero, ignored on receive

inline constexpr std::uint16_t kIrdOrdMask = 0x3fff;
inline constexpr std::uint16_t kIrdPeerToPeer = 0x8000;
inline constexpr std::uint16_t kIrdSendRtr = 0x4000;  // "zero-length FPDU" RTR: a zero-length SEND
inline constexpr std::uint16_t kOrdWriteRtr = 0x8000;
inline constexpr std::uint16_t kOrdReadRtr = 0x4000;
inline constexpr std::size_t kIrdOrdSize = 4;

// Private data limits. RFC 5044 section 7.1 allows up to 512 bytes, and we accept that much. We send at most
// 256 in all (Linux RDMA_MAX_PRIVATE_DATA; siw and cxgb4 refuse more), so the application gets 252 with rev 2.
using softrdma::kMaxPrivateDataReceived;  // <softrdma/iwarp.hpp>: 512
inline constexpr std::size_t kMaxPrivateDataSent = 256;
inline constexpr std::size_t kMaxAppPrivateDataV2 = kMaxPrivateDataSent - kIrdOrdSize;
inline constexpr std::size_t kMaxFrameSize = kFrameHeaderSize + kMaxPrivateDataReceived;

enum class FrameKind : std::uint8_t { request, reply };

// RFC 6581 section 3: the IRD/ORD words of an enhanced frame.
struct IrdOrd {
    std::uint16_t ird = 0;  // 14 bits
    std::uint16_t ord = 0;  // 14 bits
    bool peer_to_peer = false;
    bool send_rtr = false;   // zero-length SEND RTR (IRD word 0x4000)
    bool write_rtr = false;  // zero-length RDMA WRITE RTR (ORD word 0x8000)
    bool read_rtr = false;   // zero-length RDMA READ RTR (ORD word 0x4000)

    friend bool operator==(const IrdOrd&, const IrdOrd&) = default;
};

void encode_ird_ord(std::span<std::byte, kIrdOrdSize> out, const IrdOrd& v);
IrdOrd decode_ird_ord(std::span<const std::byte, kIrdOrdSize> in);

// What to put in a frame. encode_frame derives the private data length and the enhanced flag: the IRD/ORD header
// is sent (and the 0x10 flag set) when ird_ord is present, which requires revision 2.
struct FrameParams {
    FrameKind kind = FrameKind::request;
    bool markers = false;
    bool crc = false;
    bool reject = false;
    std::uint8_t revision = 2;
    const IrdOrd* ird_ord = nullptr;            // enhanced (revision 2) frames only
    std::span<const std::byte> private_data{};  // application private data (after the IRD/ORD header)
};

// Size encode_frame will write, or 0 if the frame is not valid to send (private data over kMaxPrivateDataSent
// in all, or an IRD/ORD header with a revision other than 2).
std::size_t frame_size(const FrameParams& p);
// Writes the frame into out; returns bytes written, 0 if invalid or out is too small.
std::size_t encode_frame(std::span<std::byte> out, const FrameParams& p);

// A decoded frame. private_data() is the application part (after the IRD/ORD header when enhanced).
struct Frame {
    FrameKind kind = FrameKind::request;
    bool markers = false;
    bool crc = false;
    bool reject = false;
    bool enhanced = false;  // revision 2 and flag 0x10: ird_ord is valid
    std::uint8_t reserved_flags = 0;
    std::uint8_t revision = 0;
    std::uint16_t pd_length = 0;  // as on the wire, IRD/ORD header included
    IrdOrd ird_ord{};
    std::array<std::byte, kMaxPrivateDataReceived> pd{};  // raw private data as on the wire

    std::span<const std::byte> raw_private_data() const { return {pd.data(), pd_length}; }
    std::span<const std::byte> private_data() const {
        const std::size_t skip = enhanced ? kIrdOrdSize : 0;
        return {pd.data() + skip, pd_length - skip};
    }
};

// Resumable, bounded decoder: bytes may arrive one at a time. It never consumes past the end of the frame, so
// whatever follows (FPDUs after a reply) stays with the caller. Rejects a wrong key (as soon as the 16 key bytes
// are in), a private data length over kMaxPrivateDataReceived, and an enhanced frame too short for IRD/ORD, all
// as kTermInvalidFrame (RFC 5044 section 8, code 0x04).
class FrameDecoder {
public:
    enum class Status : std::uint8_t { need_more, done, error };
    struct Result {
        std::size_t consumed = 0;
        Status status = Status::need_more;
    };

    explicit FrameDecoder(FrameKind expected) : expected_(expected) {}

    Result feed(std::span<const std::byte> in);
    Status status() const { return status_; }
    const Frame& frame() const { return frame_; }   // complete when status() == done
    TermCode error() const { return error_; }        // when status() == error

private:
    Status fail();

    FrameKind expected_;
    Status status_ = Status::need_more;
    std::array<std::byte, kFrameHeaderSize> hdr_{};
    std::size_t got_ = 0;  // bytes of the frame consumed so far
    Frame frame_{};
    TermCode error_{};
};

}  // namespace softrdma::mpa
