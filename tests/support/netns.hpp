// SPDX-License-Identifier: MIT
// Two network namespaces joined by a veth pair, created for one test and removed by the destructor.
// Needs root (CAP_NET_ADMIN); tests check can_create() first and skip with a reason otherwise.
#pragma once

#include <string>

namespace softrdma::test {

class VethPair {
public:
    explicit VethPair(unsigned mtu = 1500);
    ~VethPair();
    VethPair(const VethPair&) = delete;
    VethPair& operator=(const VethPair&) = delete;

    static bool can_create(std::string& why_not);

    std::string ns_a, ns_b;      // namespace names (under /run/netns)
    std::string if_a, if_b;      // interface names inside them
};

}  // namespace softrdma::test
