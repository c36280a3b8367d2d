// SPDX-License-Identifier: MIT
// Command-line helpers shared by the comparison programs (memif_floor, kernel_tcp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace softrdma::compare {

// "64,256,1024" -> {64, 256, 1024}
inline std::vector<std::uint32_t> parse_list(const char* s) {
    std::vector<std::uint32_t> v;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ','))
        v.push_back(static_cast<std::uint32_t>(std::strtoul(item.c_str(), nullptr, 10)));
    return v;
}

}  // namespace softrdma::compare
