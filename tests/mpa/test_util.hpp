// SPDX-License-Identifier: MIT
// Small helpers shared by the mpa tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

namespace softrdma::mpa::test {

inline std::vector<std::byte> hex(std::string_view s) {
    std::vector<std::byte> out;
    auto nib = [](char c) -> unsigned {
        if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
        if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
        return static_cast<unsigned>(c - 'A' + 10);
    };
    for (std::size_t i = 0; i + 1 < s.size();) {
        if (s[i] == ' ') {
            ++i;
            continue;
        }
        out.push_back(static_cast<std::byte>((nib(s[i]) << 4) | nib(s[i + 1])));
        i += 2;
    }
    return out;
}

inline std::vector<std::byte> random_bytes(std::mt19937& rng, std::size_t n) {
    std::vector<std::byte> v(n);
    for (auto& b : v) b = static_cast<std::byte>(rng() & 0xffu);
    return v;
}

inline std::vector<std::byte> bytes_of(std::string_view s) {
    std::vector<std::byte> v(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) v[i] = static_cast<std::byte>(s[i]);
    return v;
}

}  // namespace softrdma::mpa::test
