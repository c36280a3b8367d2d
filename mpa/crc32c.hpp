// SPDX-License-Identifier: MIT
// CRC32c (Castagnoli, reflected polynomial 0x82F63B78) for the MPA FPDU CRC (RFC 5044 section 4.4, which takes
// the iSCSI CRC of RFC 3720 section 12.1 and appendix B.4).
//
// State convention: a running CRC is a 32-bit "register". Start with kCrc32cInit (all ones), feed bytes with
// crc32c_update (or crc32c_copy, which also copies), finish with crc32c_final (inverts). On the wire the final
// value is stored least significant byte first (store_crc32c): RFC 3720 B.4 lists 32 zero bytes -> aa 36 91 8a,
// and real siw FPDUs (tests/mpa/crc32c_test.cpp) carry the same order.
//
// Two implementations are chosen at run time: slice-by-8 tables (portable) and SSE4.2 crc32q with three
// interleaved streams per block, joined with precomputed "append N zero bytes" tables (no pclmul needed).
// Data-path safe: no allocation, no locks, no exceptions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace softrdma::mpa {

inline constexpr std::uint32_t kCrc32cInit = 0xFFFFFFFFu;

constexpr std::uint32_t crc32c_final(std::uint32_t state) { return ~state; }

// Running CRC over n bytes at p. Dispatches to the fastest implementation available on this CPU.
std::uint32_t crc32c_update(std::uint32_t state, const std::byte* p, std::size_t n) noexcept;
inline std::uint32_t crc32c_update(std::uint32_t state, std::span<const std::byte> bytes) noexcept {
    return crc32c_update(state, bytes.data(), bytes.size());
}

// Copies n bytes from src to dst (non-overlapping) and returns the running CRC of those bytes: the payload is
// read once. Placement (DDP) uses it to copy into the target buffer while checking the FPDU CRC.
std::uint32_t crc32c_copy(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept;

// One-shot CRC32c of a buffer (init, update, final).
inline std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
    return crc32c_final(crc32c_update(kCrc32cInit, bytes));
}

// Stores / loads a final CRC value in MPA wire byte order (least significant byte first).
void store_crc32c(std::byte* out, std::uint32_t crc) noexcept;
std::uint32_t load_crc32c(const std::byte* in) noexcept;

// Small incremental helper for callers that prefer an object.
class Crc32c {
public:
    void update(std::span<const std::byte> bytes) noexcept { state_ = crc32c_update(state_, bytes); }
    void copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
        state_ = crc32c_copy(state_, dst, src, n);
    }
    std::uint32_t value() const noexcept { return crc32c_final(state_); }
    std::uint32_t state() const noexcept { return state_; }
    void reset() noexcept { state_ = kCrc32cInit; }

private:
    std::uint32_t state_ = kCrc32cInit;
};

// Both implementations, exposed so that tests and benchmarks can compare them. The *_hw functions may only be
// called when crc32c_hw_available() is true.
bool crc32c_hw_available() noexcept;
std::uint32_t crc32c_update_sw(std::uint32_t state, const std::byte* p, std::size_t n) noexcept;
std::uint32_t crc32c_update_hw(std::uint32_t state, const std::byte* p, std::size_t n) noexcept;
std::uint32_t crc32c_copy_sw(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept;
std::uint32_t crc32c_copy_hw(std::uint32_t state, std::byte* dst, const std::byte* src, std::size_t n) noexcept;

// Name of the implementation crc32c_update dispatches to ("sse4.2" or "slice-by-8"), for logs and benchmarks.
const char* crc32c_impl_name() noexcept;

}  // namespace softrdma::mpa
