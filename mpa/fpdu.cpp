// SPDX-License-Identifier: MIT
#include "mpa/fpdu.hpp"

#include <cassert>
#include <cstring>

#include "mpa/crc32c.hpp"
#include "base/byteorder.hpp"
#include "base/copy.hpp"

namespace softrdma::mpa {
namespace {

// With CRC, pieces this large go through base::copy_staged: the fused copy + CRC into a bounce buffer in this
// core's cache, then a string copy (whole lines) into the TX chunk, instead of the fused loop's 16-byte stores
// into the chunk, each waiting for its line from the peer's core (bench/RESULTS.md, "4K aliasing in the copies the peer
// reads"). The source is read once, so the CRC covers exactly the bytes sent even if the application rewrites
// its buffer meanwhile.
constexpr std::size_t kCrcStagedMin = 1024;

// Writes FPDU octets at out, inserting Markers where the stream position requires and keeping the CRC.
struct Emitter {
    std::byte* out;
    std::uint64_t pos;
    const std::uint64_t fpdu_start;
    const bool markers;
    const bool crc_on;
    std::uint32_t crc = kCrc32cInit;

    void marker_if_due() {
        if (!markers || pos % kMarkerInterval != 0) return;
        put_be16(out, 0);
        put_be16(out + 2, static_cast<std::uint16_t>(pos - fpdu_start));  // FPDUPTR, RFC 5044 s4.3
        if (crc_on) crc = crc32c_update(crc, out, kMarkerSize);
        out += kMarkerSize;
        pos += kMarkerSize;
    }
    void put(const std::byte* src, std::size_t n) {
        while (n != 0) {
            marker_if_due();
            std::size_t k = n;
            if (markers) {
                const std::size_t room = kMarkerInterval - static_cast<std::size_t>(pos % kMarkerInterval);
                if (room < k) k = room;
            }
            if (!crc_on) {
                base::copy_out(out, src, k);  // into a TX chunk the peer reads: see base/copy.hpp
            } else if (k < kCrcStagedMin) {
                crc = crc32c_copy(crc, out, src, k);
            } else {
                base::copy_staged(out, src, k, [this](std::byte* b, const std::byte* s, std::size_t n) {
                    crc = crc32c_copy(crc, b, s, n);
                });
            }
            out += k;
            pos += k;
            src += k;
            n -= k;
        }
    }
};

// An FPDU without Markers or CRC: its length field and ULPDU header; returns where the payload goes.
std::byte* plain_head(std::byte* o, std::size_t ulpdu_len, std::span<const std::byte> ulpdu_header) {
    put_be16(o, static_cast<std::uint16_t>(ulpdu_len));
    o += kLengthFieldSize;
    if (!ulpdu_header.empty()) std::memcpy(o, ulpdu_header.data(), ulpdu_header.size());
    return o + ulpdu_header.size();
}
// ... and its pad and CRC field (0: CRC not in use), from just past the payload.
void plain_tail(std::byte* o, std::size_t ulpdu_len) { std::memset(o, 0, pad_length(ulpdu_len) + kCrcFieldSize); }

// Markers emitted while writing `len` FPDU octets from stream position pos (a Marker goes before any octet
// that lands on a multiple of 512).
std::size_t markers_in(std::uint64_t pos, std::size_t len) {
    std::size_t count = 0;
    while (len != 0) {
        if (pos % kMarkerInterval == 0) {
            ++count;
            pos += kMarkerSize;
        }
        const std::size_t room = kMarkerInterval - static_cast<std::size_t>(pos % kMarkerInterval);
        const std::size_t k = len < room ? len : room;
        pos += k;
        len -= k;
    }
    return count;
}

}  // namespace

FpduTx::FpduTx(const FpduTxConfig& cfg, std::uint64_t stream_offset)
    : crc_(cfg.crc), markers_(cfg.markers), mulpdu_(mulpdu_for(cfg.emss, cfg.markers)), pos_(stream_offset) {
    assert(stream_offset % 4 == 0);
}

std::size_t FpduTx::wire_size(std::size_t ulpdu_len) const {
    const std::size_t base = fpdu_size_unmarked(ulpdu_len);
    return markers_ ? base + kMarkerSize * markers_in(pos_, base) : base;
}

std::size_t FpduTx::write(std::span<std::byte> out, std::span<const std::byte> ulpdu_header,
                          std::span<const std::span<const std::byte>> payload) {
    std::size_t ulpdu_len = ulpdu_header.size();
    for (const auto& piece : payload) ulpdu_len += piece.size();
    if (ulpdu_len > kMaxUlpduLength) return 0;
    const std::size_t total = wire_size(ulpdu_len);
    if (out.size() < total) return 0;

    if (!markers_ && !crc_) {  // the octets back to back: no Marker can fall inside, no CRC to run along
        std::byte* o = plain_head(out.data(), ulpdu_len, ulpdu_header);
        for (const auto& piece : payload) {
            base::copy_out(o, piece.data(), piece.size());  // into a TX chunk the peer reads: see base/copy.hpp
            o += piece.size();
        }
        plain_tail(o, ulpdu_len);
        pos_ += total;
        return total;
    }

    Emitter e{out.data(), pos_, pos_, markers_, crc_};
    std::byte len_field[kLengthFieldSize];
    put_be16(len_field, static_cast<std::uint16_t>(ulpdu_len));
    e.put(len_field, sizeof len_field);
    e.put(ulpdu_header.data(), ulpdu_header.size());
    for (const auto& piece : payload) e.put(piece.data(), piece.size());
    static constexpr std::byte kZeros[4]{};
    e.put(kZeros, pad_length(ulpdu_len));
    e.marker_if_due();  // a Marker between pad and CRC is inside this FPDU's CRC
    store_crc32c(e.out, crc_ ? crc32c_final(e.crc) : 0);
    e.out += kCrcFieldSize;
    e.pos += kCrcFieldSize;

    assert(static_cast<std::size_t>(e.out - out.data()) == total);
    pos_ = e.pos;
    return total;
}

std::size_t FpduTx::write_deferred(std::span<std::byte> out, std::span<const std::byte> ulpdu_header,
                                   std::size_t payload_len) {
    if (!can_defer()) return 0;
    const std::size_t ulpdu_len = ulpdu_header.size() + payload_len;
    if (ulpdu_len > kMaxUlpduLength) return 0;
    const std::size_t total = fpdu_size_unmarked(ulpdu_len);
    if (out.size() < total) return 0;
    plain_tail(plain_head(out.data(), ulpdu_len, ulpdu_header) + payload_len, ulpdu_len);
    pos_ += total;
    return total;
}

}  // namespace softrdma::mpa
