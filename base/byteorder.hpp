// SPDX-License-Identifier: MIT
// Byte order on the wire: the one set of accessors every layer uses (iWARP headers are big-endian, RFC 5041
// section 4 and RFC 5040 section 4; MPA's CRC32c is stored least-significant byte first, as siw does). No struct
// overlays, no bit fields: each accessor names its offset.
//   load/store_be16/32/64(span, offset)  bounds asserted in debug builds (the caller checks a header's size once)
//   get/put_be16/32, get/put_le32(pointer)  for hot paths that already know their bounds
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>

namespace softrdma {

constexpr std::uint16_t get_be16(const std::byte* p) {
    return static_cast<std::uint16_t>((std::to_integer<unsigned>(p[0]) << 8) | std::to_integer<unsigned>(p[1]));
}
constexpr std::uint32_t get_be32(const std::byte* p) {
    return std::uint32_t{get_be16(p)} << 16 | get_be16(p + 2);
}
constexpr void put_be16(std::byte* p, std::uint16_t v) {
    p[0] = static_cast<std::byte>(v >> 8);
    p[1] = static_cast<std::byte>(v);
}
constexpr std::uint32_t get_le32(const std::byte* p) {
    return std::to_integer<std::uint32_t>(p[0]) | (std::to_integer<std::uint32_t>(p[1]) << 8) |
           (std::to_integer<std::uint32_t>(p[2]) << 16) | (std::to_integer<std::uint32_t>(p[3]) << 24);
}
constexpr void put_le32(std::byte* p, std::uint32_t v) {
    p[0] = static_cast<std::byte>(v);
    p[1] = static_cast<std::byte>(v >> 8);
    p[2] = static_cast<std::byte>(v >> 16);
    p[3] = static_cast<std::byte>(v >> 24);
}

inline std::uint16_t load_be16(std::span<const std::byte> b, std::size_t off) {
    assert(off + 2 <= b.size());
    return get_be16(b.data() + off);
}
inline std::uint32_t load_be32(std::span<const std::byte> b, std::size_t off) {
    assert(off + 4 <= b.size());
    return get_be32(b.data() + off);
}
inline std::uint64_t load_be64(std::span<const std::byte> b, std::size_t off) {
    return (std::uint64_t{load_be32(b, off)} << 32) | load_be32(b, off + 4);
}
inline void store_be16(std::span<std::byte> b, std::size_t off, std::uint16_t v) {
    assert(off + 2 <= b.size());
    put_be16(b.data() + off, v);
}
inline void store_be32(std::span<std::byte> b, std::size_t off, std::uint32_t v) {
    assert(off + 4 <= b.size());
    put_be16(b.data() + off, static_cast<std::uint16_t>(v >> 16));
    put_be16(b.data() + off + 2, static_cast<std::uint16_t>(v));
}
inline void store_be64(std::span<std::byte> b, std::size_t off, std::uint64_t v) {
    store_be32(b, off, static_cast<std::uint32_t>(v >> 32));
    store_be32(b, off + 4, static_cast<std::uint32_t>(v));
}

}  // namespace softrdma
