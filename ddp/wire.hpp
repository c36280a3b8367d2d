// SPDX-License-Identifier: MIT
// Big-endian field access on byte spans: the only way ddp/ and rdmap/ touch wire bytes.
//
// Every iWARP header field is big-endian (RFC 5041 section 4, RFC 5040 section 4). No struct overlays, no
// bit fields: each accessor names its offset, and the span bounds the access (the caller checks the size
// once per header with a static or runtime length check; the accessors assert it in debug builds).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>

namespace softrdma::ddp {

inline std::uint16_t load_be16(std::span<const std::byte> b, std::size_t off) {
    assert(off + 2 <= b.size());
    return static_cast<std::uint16_t>((std::to_integer<std::uint16_t>(b[off]) << 8) |
                                      std::to_integer<std::uint16_t>(b[off + 1]));
}

inline std::uint32_t load_be32(std::span<const std::byte> b, std::size_t off) {
    assert(off + 4 <= b.size());
    return (std::to_integer<std::uint32_t>(b[off]) << 24) | (std::to_integer<std::uint32_t>(b[off + 1]) << 16) |
           (std::to_integer<std::uint32_t>(b[off + 2]) << 8) | std::to_integer<std::uint32_t>(b[off + 3]);
}

inline std::uint64_t load_be64(std::span<const std::byte> b, std::size_t off) {
    return (std::uint64_t{load_be32(b, off)} << 32) | load_be32(b, off + 4);
}

inline void store_be16(std::span<std::byte> b, std::size_t off, std::uint16_t v) {
    assert(off + 2 <= b.size());
    b[off] = static_cast<std::byte>(v >> 8);
    b[off + 1] = static_cast<std::byte>(v);
}

inline void store_be32(std::span<std::byte> b, std::size_t off, std::uint32_t v) {
    assert(off + 4 <= b.size());
    b[off] = static_cast<std::byte>(v >> 24);
    b[off + 1] = static_cast<std::byte>(v >> 16);
    b[off + 2] = static_cast<std::byte>(v >> 8);
    b[off + 3] = static_cast<std::byte>(v);
}

inline void store_be64(std::span<std::byte> b, std::size_t off, std::uint64_t v) {
    store_be32(b, off, static_cast<std::uint32_t>(v >> 32));
    store_be32(b, off + 4, static_cast<std::uint32_t>(v));
}

}  // namespace softrdma::ddp
