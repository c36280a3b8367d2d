// SPDX-License-Identifier: MIT
// CRC32c: slice-by-8 tables and an SSE4.2 path with three interleaved crc32q streams (see crc32c.hpp).
#include "mpa/crc32c.hpp"

#include <array>
#include <cstring>

#include "base/byteorder.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#define SOFTRDMA_CRC32C_X86 1
#else
#define SOFTRDMA_CRC32C_X86 0
#endif

namespace softrdma::mpa {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // Castagnoli polynomial, bit-reflected (RFC 3720 section 12.1)

// ---- slice-by-8 tables ----------------------------------------------------------------------------------------
using Table8 = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Table8 make_slice8() {
    Table8 t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
        t[0][i] = c;
    }
    for (std::size_t k = 1; k < 8; ++k)
        for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
    return t;
}
constexpr Table8 kSlice8 = make_slice8();
static_assert(kSlice8[0][1] == 0xF26B8303u, "CRC32c byte table");

// ---- "append N zero bytes" operator as four byte tables -------------------------------------------------------
// The CRC register is linear over GF(2): running it over N zero bytes multiplies it by a 32x32 matrix M^N.
// Joining independent streams needs crc(A||B) = M^|B| crc(A) xor crc0(B); four 256-entry tables evaluate
// M^N on a 32-bit register with four lookups. Built at compile time by matrix squaring.
using Mat = std::array<std::uint32_t, 32>;  // column j = image of bit j

constexpr std::uint32_t mat_times(const Mat& m, std::uint32_t v) {
    std::uint32_t r = 0;
    for (int j = 0; v != 0; ++j, v >>= 1)
        if (v & 1u) r ^= m[static_cast<std::size_t>(j)];
    return r;
}
constexpr Mat mat_mul(const Mat& a, const Mat& b) {  // a*b
    Mat r{};
    for (std::size_t j = 0; j < 32; ++j) r[j] = mat_times(a, b[j]);
    return r;
}
constexpr Mat zero_bytes_operator(std::size_t n) {
    Mat one_bit{};  // one zero bit: shift right, xor poly when the low bit falls out
    one_bit[0] = kPoly;
    for (std::size_t j = 1; j < 32; ++j) one_bit[j] = 1u << (j - 1);
    Mat byte = one_bit;
    for (int i = 0; i < 3; ++i) byte = mat_mul(byte, byte);  // 8 bits
    Mat result{};
    for (std::size_t j = 0; j < 32; ++j) result[j] = 1u << j;  // identity
    for (Mat sq = byte; n != 0; n >>= 1, sq = mat_mul(sq, sq))
        if (n & 1u) result = mat_mul(sq, result);
    return result;
}
using ShiftTable = std::array<std::array<std::uint32_t, 256>, 4>;
constexpr ShiftTable make_shift(std::size_t n) {
    const Mat m = zero_bytes_operator(n);
    ShiftTable t{};
    for (std::size_t k = 0; k < 4; ++k)
        for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = mat_times(m, b << (8 * k));
    return t;
}
inline std::uint32_t shift(const ShiftTable& t, std::uint32_t crc) {
    return t[0][crc & 0xffu] ^ t[1][(crc >> 8) & 0xffu] ^ t[2][(crc >> 16) & 0xffu] ^ t[3][crc >> 24];
}

// Block sizes of the 3-stream SSE4.2 loop. crc32q has a latency of 3 cycles and a throughput of 1 per cycle, so
// three independent streams keep the unit busy. kLong amortises the join on big buffers; kShort still pays off
// for one 1448-byte TCP segment (3 blocks of 384 bytes).
constexpr std::size_t kLong = 4096;
constexpr std::size_t kShort = 128;
constexpr ShiftTable kShiftLong = make_shift(kLong);
constexpr ShiftTable kShiftShort = make_shift(kShort);

inline std::uint64_t load64(const std::byte* p) {
    std::uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;  // x86-64 and the crc32q instruction are little-endian: no swap
}

std::uint32_t sw_update(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
    while (n >= 8) {
        const std::uint32_t lo = get_le32(p) ^ crc;
        const std::uint32_t hi = get_le32(p + 4);
        crc = kSlice8[7][lo & 0xffu] ^ kSlice8[6][(lo >> 8) & 0xffu] ^ kSlice8[5][(lo >> 16) & 0xffu] ^
              kSlice8[4][lo >> 24] ^ kSlice8[3][hi & 0xffu] ^ kSlice8[2][(hi >> 8) & 0xffu] ^
              kSlice8[1][(hi >> 16) & 0xffu] ^ kSlice8[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = kSlice8[0][(crc ^ std::to_integer<std::uint32_t>(*p++)) & 0xffu] ^ (crc >> 8);
    return crc;
}

#if SOFTRDMA_CRC32C_X86
// Three streams over 3*block bytes at src (copied to dst when Copy), joined into c.
template <bool Copy, std::size_t Block>
__attribute__((target("sse4.2"), always_inline)) inline std::uint64_t hw_triple(
    std::uint64_t c0, std::byte* dst, const std::byte* src, const ShiftTable& t) {
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < Block; i += 8) {
        const std::uint64_t w0 = load64(src + i);
        const std::uint64_t w1 = load64(src + Block + i);
        const std::uint64_t w2 = load64(src + 2 * Block + i);
        if constexpr (Copy) {
            std::memcpy(dst + i, &w0, 8);
            std::memcpy(dst + Block + i, &w1, 8);
            std::memcpy(dst + 2 * Block + i, &w2, 8);
        }
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
    }
    std::uint32_t c = shift(t, static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1);
    c = shift(t, c) ^ static_cast<std::uint32_t>(c2);
    return c;
}

template <bool Copy>
__attribute__((target("sse4.2"))) std::uint32_t hw_run(std::uint32_t crc, std::byte* dst, const std::byte* src,
                                                       std::size_t n) noexcept {
    std::uint64_t c = crc;
    while (n >= 3 * kLong) {
        c = hw_triple<Copy, kLong>(c, dst, src, kShiftLong);
        src += 3 * kLong;
        if constexpr (Copy) dst += 3 * kLong;
        n -= 3 * kLong;
    }
    while (n >= 3 * kShort) {
        c = hw_triple<Copy, kShort>(c, dst, src, kShiftShort);
        src += 3 * kShort;
        if constexpr (Copy) dst += 3 * kShort;
        n -= 3 * kShort;
    }
    while (n >= 8) {
        const std::uint64_t w = load64(src);
        if constexpr (Copy) std::memcpy(dst, &w, 8);
        c = _mm_crc32_u64(c, w);
        src += 8;
        if constexpr (Copy) dst += 8;
        n -= 8;
    }
    std::uint32_t c32 = static_cast<std::uint32_t>(c);
    while (n--) {
        const std::byte b = *src++;
        if constexpr (Copy) *dst++ = b;
        c32 = _mm_crc32_u8(c32, std::to_integer<std::uint8_t>(b));
    }
    return c32;
}
#endif

using UpdateFn = std::uint32_t (*)(std::uint32_t, const std::byte*, std::size_t) noexcept;
using CopyFn = std::uint32_t (*)(std::uint32_t, std::byte*, const std::byte*, std::size_t) noexcept;
struct Impl {
    UpdateFn update;
    CopyFn copy;
    const char* name;
};

const Impl& impl() noexcept {
    static const Impl chosen = [] {
        if (crc32c_hw_available()) return Impl{&crc32c_update_hw, &crc32c_copy_hw, "sse4.2"};
        return Impl{&crc32c_update_sw, &crc32c_copy_sw, "slice-by-8"};
    }();
    return chosen;
}

}  // namespace

bool crc32c_hw_available() noexcept {
#if SOFTRDMA_CRC32C_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
#else
    return false;
#endif
}

std::uint32_t crc32c_update_sw(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
    return sw_update(state, p, n);
}

std::uint32_t crc32c_copy_sw(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    // Copy a chunk that stays in L1, then CRC the copy while it is hot.
    constexpr std::size_t kChunk = 1024;
    while (n != 0) {
        const std::size_t k = n < kChunk ? n : kChunk;
        std::memcpy(dst, src, k);
        state = sw_update(state, dst, k);
        dst += k;
        src += k;
        n -= k;
    }
    return state;
}

#if SOFTRDMA_CRC32C_X86
std::uint32_t crc32c_update_hw(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
    return hw_run<false>(state, nullptr, p, n);
}
std::uint32_t crc32c_copy_hw(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    return hw_run<true>(state, dst, src, n);
}
#else
std::uint32_t crc32c_update_hw(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
    return sw_update(state, p, n);
}
std::uint32_t crc32c_copy_hw(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    return crc32c_copy_sw(state, dst, src, n);
}
#endif

std::uint32_t crc32c_update(std::uint32_t state, const std::byte* p, std::size_t n) noexcept {
    return impl().update(state, p, n);
}

std::uint32_t crc32c_copy(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    return impl().copy(state, dst, src, n);
}

void store_crc32c(std::byte* out, std::uint32_t crc) noexcept { put_le32(out, crc); }
std::uint32_t load_crc32c(const std::byte* in) noexcept { return get_le32(in); }

const char* crc32c_impl_name() noexcept { return impl().name; }

}  // namespace softrdma::mpa
