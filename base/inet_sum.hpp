// SPDX-License-Identifier: MIT
// The Internet checksum's ones' complement sum (RFC 1071), the one implementation the RX thread's checks
// (stack/frame.cpp) and lwIP (LWIP_CHKSUM, stack/lwip-port/arch/cc.h) use.
//
// Words are read in host order: the ones' complement sum is byte-order independent (RFC 1071 section 2.B), so
// a sum folded to all ones means the same in either order, and a checksum stored as it is computed lands in
// network order. An odd last byte counts as the first byte of a zero-padded word. Eight bytes per step: the
// sum of 16-bit words modulo 0xffff is the sum of 64-bit words modulo 0xffff (2^16 = 1 there), and each carry
// out of bit 63 is worth 2^64 = 1 (section 2.C's "deferred carries"). lwIP's own loop takes 32 bits per step
// and a call per byte swap; a 20-byte IP header is then ~25 instructions instead of ~80.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace softrdma {

// The sum of n bytes at p, not yet folded (add sums of several pieces, then fold once; every piece but the
// last must have an even length).
inline std::uint64_t ones_sum(const void* data, std::size_t n, std::uint64_t acc = 0) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    // acc itself may be any 64-bit value: its carries are counted as well.
    std::uint64_t carries = 0;
    for (; n >= 8; p += 8, n -= 8) {
        std::uint64_t w;
        std::memcpy(&w, p, 8);
        acc += w;
        carries += acc < w;
    }
    // The last 0-7 bytes: 4, 2, then 1 byte into the low addresses of a zeroed word. Either byte order gives
    // the same sum modulo 0xffff: bytes landing 16 bits higher are worth 2^16 = 1 times as much, and an odd
    // last byte followed by zeros is the zero-padded word RFC 1071 adds.
    std::uint64_t tail = 0;
#pragma GCC unroll 3  // (each memcpy then of a constant size: no call)
    for (const std::size_t step : {4u, 2u, 1u}) {
        if (n < step) continue;
        std::uint32_t w = 0;
        std::memcpy(&w, p, step);
        tail += w;
        p += step;
        n -= step;
    }
    // Bring acc below 2^33 before the small terms go in, so nothing below carries out again.
    acc = (acc & 0xffffffffu) + (acc >> 32);
    return acc + carries + tail;
}

// Folds a sum to 16 bits with end-around carries: a non-zero sum never folds to 0 (it gives 0xffff), as with
// RFC 1071's 16-bit loop.
constexpr std::uint16_t ones_fold(std::uint64_t s) noexcept {
    s = (s & 0xffffffffu) + (s >> 32);
    s = (s & 0xffffu) + (s >> 16);
    s = (s & 0xffffu) + (s >> 16);
    s = (s & 0xffffu) + (s >> 16);
    return static_cast<std::uint16_t>(s);
}

}  // namespace softrdma
