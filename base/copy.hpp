// SPDX-License-Identifier: MIT
#pragma once
// copy_out(): a payload copy into memory another core reads next (a TX chunk the memif peer reads where it
// lies, a ring buffer), avoiding one slow case of the C library's large-copy path.
//
// glibc copies a few KiB and more with `rep movsb`, which writes whole lines without first reading them: the
// fast way into lines another core holds. When the destination sits 1-63 bytes above the source modulo 4 KiB
// (every load then looks as if it might read a store still waiting for its line: 4K aliasing), the string
// copy stalls on each of those lines' trips from the other core. Framing meets that case all the time: an
// FPDU's payload lands 20 bytes (MPA length + DDP/RDMAP header) above a page-aligned source, the next 24 more.
// Measured (bench/copy_alias: two processes, the destination shared; the host in its slow spell, ~600 ns core
// cache line round trip), 32 KiB in 8936-byte FPDU pieces of which the first two alias: 3.1 us with memcpy,
// 1.4-1.5 us with copy_out (the aliasing pieces staged through a bounce buffer placed to miss the alias);
// with no piece aliasing, 1.3 us either way. In the fast spell (~160 ns) 0.95 / 0.76 us. SEND half round
// trip, seven interleaved rounds (2026-11-30, mostly slow): 16 KiB 4.20 -> 3.49 us, 32 KiB 5.86 -> 5.08,
// 64 KiB 8.34 -> 7.55, 128 KiB 14.07 -> 12.76.
//
// The bounce buffer is on the caller's stack (kBounce + 64 bytes; no allocation, no thread-local storage in
// every thread of a program that loads the drop-in libraries), line-aligned and used at the destination's
// offset within a line, so bounce -> destination is a multiple of 64 bytes apart (0 or at least 64 modulo
// 4 KiB: not aliasing); source -> bounce stays within this core's cache.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace softrdma::base {

inline constexpr std::size_t kBounce = 16384;    // >= an FPDU's payload (8936 at most): one step per piece
inline constexpr std::size_t kBounceMin = 1024;  // below this the stall is too small to be worth a copy

// (dst - src) mod 4 KiB in 1..63: the aliasing case above.
inline bool copy_aliases(const void* dst, const void* src) noexcept {
    const std::size_t d = (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) & 4095u;
    return d != 0 && d < 64;
}

// Copies n bytes from src to dst through the bounce buffer, `stage(bounce, src, k)` doing the first copy of
// each step of at most kBounce bytes (memcpy, or a copy that also runs a checksum over what it reads: the
// source is then read once, and the checksum covers exactly the bytes written). Never inlined: the 16 KiB
// frame is then set up only on this path, not in every caller of copy_out.
template <class Stage>
[[gnu::noinline]] void copy_staged(void* dst, const void* src, std::size_t n, Stage&& stage) noexcept {
    alignas(64) std::byte bounce[kBounce + 64];
    std::byte* const b = bounce + (reinterpret_cast<std::uintptr_t>(dst) & 63u);
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    while (n != 0) {
        const std::size_t k = n < kBounce ? n : kBounce;
        stage(b, s, k);
        std::memcpy(d, b, k);
        d += k;
        s += k;
        n -= k;
    }
}

// Where to begin writing into a page-aligned buffer (a fresh TX chunk) when the first payload lands `lead`
// bytes after the beginning and comes from `src`: a multiple of 64 below 4 KiB such that the payload sits
// 64-127 bytes above its source modulo 4 KiB, or 0 when it already sits 64 to 4096 - kUnaliasedReach bytes
// above (later FPDUs land a few dozen bytes further each: a batch stays clear of the aliasing window, and
// copy_out does not need its bounce buffer). A page-aligned source with SEND's 20-byte lead: 64.
inline constexpr std::size_t kUnaliasedReach = 512;  // 8 FPDUs x at most 24 bytes of drift, plus the window
inline std::size_t unaliased_start(const void* src, std::size_t lead) noexcept {
    const std::size_t d = (lead - reinterpret_cast<std::uintptr_t>(src)) & 4095u;  // dst - src at start 0
    if (d >= 64 && d <= 4096 - kUnaliasedReach) return 0;
    return (((64 - d) & 4095u) + 63u) & ~std::size_t{63};
}

inline void copy_out(void* dst, const void* src, std::size_t n) noexcept {
    if (n < kBounceMin || !copy_aliases(dst, src)) {
        std::memcpy(dst, src, n);
        return;
    }
    copy_staged(dst, src, n, [](std::byte* b, const std::byte* s, std::size_t k) { std::memcpy(b, s, k); });
}

}  // namespace softrdma::base
