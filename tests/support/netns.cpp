// SPDX-License-Identifier: MIT
#include "tests/support/netns.hpp"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

namespace softrdma::test {
namespace {
void sh(const std::string& cmd) {
    if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("command failed: " + cmd);
}
}  // namespace

bool VethPair::can_create(std::string& why_not) {
    if (::geteuid() != 0) {
        why_not = "needs root to create network namespaces (run the tests as root)";
        return false;
    }
    if (std::system("command -v ip >/dev/null 2>&1") != 0) {
        why_not = "needs iproute2's ip command (scripts/setup installs it)";
        return false;
    }
    return true;
}

VethPair::VethPair(unsigned mtu) {
    const std::string tag = std::to_string(::getpid() % 100000);
    ns_a = "srA" + tag;
    ns_b = "srB" + tag;
    if_a = "srva" + tag;  // <= 15 characters
    if_b = "srvb" + tag;
    std::system(("ip netns del " + ns_a + " >/dev/null 2>&1; ip netns del " + ns_b + " >/dev/null 2>&1").c_str());
    sh("ip netns add " + ns_a);
    sh("ip netns add " + ns_b);
    sh("ip link add " + if_a + " netns " + ns_a + " type veth peer name " + if_b + " netns " + ns_b);
    for (const auto& [ns, ifn] : {std::pair{ns_a, if_a}, std::pair{ns_b, if_b}}) {
        // No kernel IPv6 chatter on the link, and no kernel IP address: only our stacks speak on it.
        sh("ip netns exec " + ns + " sysctl -w net.ipv6.conf.all.disable_ipv6=1");
        sh("ip -n " + ns + " link set " + ifn + " mtu " + std::to_string(mtu) + " up");
    }
}

VethPair::~VethPair() {
    // Deleting the namespaces deletes the veth pair inside them.
    std::system(("ip netns del " + ns_a + " >/dev/null 2>&1").c_str());
    std::system(("ip netns del " + ns_b + " >/dev/null 2>&1").c_str());
}

}  // namespace softrdma::test
