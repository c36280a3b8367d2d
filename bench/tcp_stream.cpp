// SPDX-License-Identifier: MIT
// TCP stream benchmark: lwIP on DPDK between two processes on this machine over memif, before any iWARP
// layer. Forks a receiver (core 0) and a sender (core 1), streams verified pattern bytes, and prints the
// receiver's throughput; repeats and reports the median.
//
//   tcp_stream [--mtu 1500|9000]... [--mib N] [--connections N] [--runs N] [--yield-after N] [--no-huge]
//              [--large-segments] [--verbose]
// --large-segments: memif's large frames with TCP segments up to 64 KiB (StackConfig::large_segments, as
// softrdma's verbs use by default on memif) instead of MTU-sized ones.
// --yield-after: idle poll turns before yielding the core (0 = spin only; see stack::StackConfig).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <softrdma/log.hpp>

#include "tests/support/processes.hpp"
#include "tests/support/tcp_roles.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace std::chrono_literals;

namespace {
double field(const std::string& report, const std::string& key) {
    const auto at = report.find(key + "=");
    return at == std::string::npos ? -1.0 : std::atof(report.c_str() + at + key.size() + 1);
}
}  // namespace

int main(int argc, char** argv) {
    std::vector<unsigned> mtus;
    std::uint64_t mib = 512;
    unsigned connections = 1, runs = 3;
    bool verbose = false, no_huge = false, large = false;
    unsigned yield_after = 0;  // idle turns before a poller yields its core; 0 = spin (each process has a core)
    for (int i = 1; i < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--verbose" || a == "--no-huge" || a == "--large-segments") {
            (a == "--verbose" ? verbose : a == "--no-huge" ? no_huge : large) = true;
            --i;
            continue;
        }
        if (i + 1 >= argc) return 2;
        const unsigned v = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
        if (a == "--yield-after") yield_after = v;
        else if (a == "--mtu") mtus.push_back(v);
        else if (a == "--mib") mib = v;
        else if (a == "--connections") connections = std::max(1u, v);
        else if (a == "--runs") runs = std::max(1u, v);
        else {
            std::fprintf(stderr, "usage: %s [--mtu 1500|9000]... [--mib N] [--connections N] [--runs N] [--yield-after N] [--no-huge] [--large-segments] [--verbose]\n", argv[0]);
            return 2;
        }
    }
    if (mtus.empty()) mtus = {1500, 9000};
    if (!verbose) softrdma::log::set_level(softrdma::log::Level::warn);  // the children inherit it
    std::printf("# lwIP TCP over DPDK memif, two processes (receiver core 0, sender core 1), %llu MiB x %u "
                "connection(s)%s, content verified\n", static_cast<unsigned long long>(mib), connections,
                large ? ", large segments" : "");
    std::printf("%-6s %-5s %12s %12s %12s\n", "MTU", "runs", "median MB/s", "min MB/s", "max MB/s");
    int rc = 0;
    for (const unsigned mtu : mtus) {
        std::vector<double> mbps;
        for (unsigned r = 0; r < runs; ++r) {
            auto [server, client] = memif_pair(static_cast<std::uint16_t>(mtu));
            server.stack.idle = client.stack.idle =
                yield_after == 0 ? IdlePolicy::spin_only() : IdlePolicy{.spin_turns = yield_after};
            if (no_huge) server.eal.hugepages = client.eal.hugepages = Hugepages::off;
            if (large)
                for (PeerConfig* c : {&server, &client}) c->port.memif_large_frames = c->stack.large_segments = true;
            const std::uint64_t bytes = (mib << 20) / connections;
            const auto out = run_roles({{"receiver", [&] { return stream_server(server, bytes, connections); }},
                                        {"sender", [&] { return stream_client(client, bytes, connections); }, 200ms}},
                                       300s);
            bool ok = true;
            for (const auto& o : out)
                if (o.exit_code != 0) {
                    std::fprintf(stderr, "%s failed (exit %d%s):\n%s", o.name.c_str(), o.exit_code,
                                 o.timed_out ? ", timed out" : "", o.report.c_str());
                    ok = false;
                }
            if (verbose)
                for (const auto& o : out) std::printf("## %s\n%s", o.name.c_str(), o.report.c_str());
            if (!ok) {
                rc = 1;
                break;
            }
            mbps.push_back(field(out[0].report, "MBps"));
        }
        if (mbps.empty()) continue;
        std::sort(mbps.begin(), mbps.end());
        std::printf("%-6u %-5zu %12.0f %12.0f %12.0f\n", mtu, mbps.size(), mbps[mbps.size() / 2], mbps.front(),
                    mbps.back());
        std::fflush(stdout);
    }
    return rc;
}
