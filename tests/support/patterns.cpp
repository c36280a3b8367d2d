// SPDX-License-Identifier: MIT
#include "tests/support/processes.hpp"

#include <cstring>

namespace softrdma::test {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t word_index) {
    return mix(seed * 0x100000001b3ull + word_index);
}
}  // namespace

// Word-at-a-time: one mix and one 8-byte store or compare per word, bytes only at the unaligned ends, so
// the pattern costs far less than the transfer it checks.
void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) {
    std::size_t i = 0;
    for (; i < out.size() && ((offset + i) & 7) != 0; ++i)
        out[i] = static_cast<std::byte>(pattern_word(seed, (offset + i) >> 3) >> (8 * ((offset + i) & 7)));
    for (; i + 8 <= out.size(); i += 8) {
        const std::uint64_t w = pattern_word(seed, (offset + i) >> 3);
        std::memcpy(out.data() + i, &w, 8);
    }
    for (; i < out.size(); ++i)
        out[i] = static_cast<std::byte>(pattern_word(seed, (offset + i) >> 3) >> (8 * ((offset + i) & 7)));
}

long long check_pattern(std::uint64_t seed, std::uint64_t offset, std::span<const std::byte> in) {
    std::size_t i = 0;
    auto byte_at = [&](std::size_t k) {
        return static_cast<std::byte>(pattern_word(seed, (offset + k) >> 3) >> (8 * ((offset + k) & 7)));
    };
    for (; i < in.size() && ((offset + i) & 7) != 0; ++i)
        if (in[i] != byte_at(i)) return static_cast<long long>(i);
    for (; i + 8 <= in.size(); i += 8) {
        const std::uint64_t w = pattern_word(seed, (offset + i) >> 3);
        std::uint64_t got;
        std::memcpy(&got, in.data() + i, 8);
        if (got != w) break;  // the byte loop below finds the exact index
    }
    for (; i < in.size(); ++i)
        if (in[i] != byte_at(i)) return static_cast<long long>(i);
    return -1;
}

}  // namespace softrdma::test
