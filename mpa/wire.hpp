// SPDX-License-Identifier: MIT
// Explicit big/little-endian reads and writes on byte pointers (no bit fields, no host-order structs on the wire).
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::mpa::wire {

constexpr std::uint16_t get_be16(const std::byte* p) {
    return static_cast<std::uint16_t>((std::to_integer<unsigned>(p[0]) << 8) | std::to_integer<unsigned>(p[1]));
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

}  // namespace softrdma::mpa::wire
