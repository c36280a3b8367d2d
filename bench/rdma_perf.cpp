// SPDX-License-Identifier: MIT
// rdma_perf: perftest-style latency and bandwidth tests (SEND, WRITE, READ, fetch-and-add) over softrdma
// verbs, between two processes.
//
//   rdma_perf [--test send|write|read|atomic] [--lat|--bw] [-s SIZE | -a] [-n ITERS] [-t DEPTH] ...
//
// --local (default): forks a server (core 0) and a client (core 1) on this machine, talking over DPDK memif.
// --server / --client PEER: one end per invocation, for runs over af_packet or a PCI device (or memif
// between two shells). The client prints perftest's table and writes --json; the server takes the test
// parameters from the client's MPA private data. `rdma_perf --help` lists every flag.
#include <signal.h>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <softrdma/log.hpp>

#include "bench/perf/options.hpp"
#include "bench/perf/session.hpp"
#include "bench/perf/stats.hpp"
#include "base/processes.hpp"
#include "tests/support/tcp_roles.hpp"

using namespace softrdma;
using namespace softrdma::perf;
using namespace std::chrono_literals;

namespace {

test::PeerConfig remote_config(const Options& o) {
    test::PeerConfig c;
    const bool server = o.mode == Mode::server;
    c.port.backend = o.backend;
    c.port.mtu = o.mtu;
    c.port.memif_socket = o.memif_socket;
    c.port.memif_server = server;
    c.port.iface = o.iface;
    c.port.device = o.device;
    c.eal.lcores = o.cpu;
    if (o.no_huge) c.eal.hugepages = Hugepages::off;
    c.stack.ip.address = Ipv4::parse(!o.addr.empty() ? o.addr : (server ? "198.18.0.1" : "198.18.0.2"));
    c.stack.ip.netmask = Ipv4::parse(o.netmask);
    if (!server) c.peer = Ipv4::parse(o.peer);
    c.tcp_port = o.tcp_port;
    return c;
}

// --local's two cores from --cpu "SERVER,CLIENT", left as they are without it (test::memif_pair's): false
// (and a message) when malformed.
bool local_cores(const Options& o, std::string& server, std::string& client) {
    if (o.cpu.empty()) return true;
    const auto comma = o.cpu.find(',');
    if (comma == std::string::npos) {
        std::fprintf(stderr, "rdma_perf: --local and --core-rtt take two cores with --cpu: SERVER,CLIENT\n");
        return false;
    }
    server = o.cpu.substr(0, comma);
    client = o.cpu.substr(comma + 1);
    return true;
}

// The host's cross-core cost (see core_round_trip_ns) between two cores given as numbers; nullopt when either
// is not one core number, or they are the same.
std::optional<double> cores_round_trip(const std::string& sa, const std::string& sb) {
    char* end_a = nullptr;
    char* end_b = nullptr;
    const unsigned long a = std::strtoul(sa.c_str(), &end_a, 10);
    const unsigned long b = std::strtoul(sb.c_str(), &end_b, 10);
    if (*end_a != '\0' || *end_b != '\0' || end_a == sa.c_str() || end_b == sb.c_str() || a == b)
        return std::nullopt;
    return core_round_trip_ns(static_cast<unsigned>(a), static_cast<unsigned>(b));
}

// --core-rtt: the probe alone, so a caller can tell the host's spell before and after anything it measures.
int run_core_rtt(const Options& o) {
    auto [server, client] = test::memif_pair(o.mtu);  // the cores --local would use
    std::string& a = server.eal.lcores;
    std::string& b = client.eal.lcores;
    if (!local_cores(o, a, b)) return 2;
    const std::optional<double> ns = cores_round_trip(a, b);
    if (!ns) {
        std::fprintf(stderr, "rdma_perf: --core-rtt: cores %s and %s could not be measured (two different core "
                     "numbers this process may run on)\n", a.c_str(), b.c_str());
        return 1;
    }
    std::printf("core_rtt_ns %.1f (cores %s,%s)\n", *ns, a.c_str(), b.c_str());
    if (!o.json.empty()) {
        std::FILE* f = std::fopen(o.json.c_str(), "w");
        if (f == nullptr || std::fprintf(f, "{\"tool\":\"rdma_perf\",\"kind\":\"core_rtt\",\"core_rtt_ns\":%.1f}\n", *ns) < 0 ||
            std::fclose(f) != 0) {
            std::fprintf(stderr, "rdma_perf: cannot write %s\n", o.json.c_str());
            return 1;
        }
    }
    return 0;
}

int run_local(Options o, double tpu) {
    auto [server, client] = test::memif_pair(o.mtu);
    server.tcp_port = client.tcp_port = o.tcp_port;
    if (o.no_huge) server.eal.hugepages = client.eal.hugepages = Hugepages::off;
    if (!local_cores(o, server.eal.lcores, client.eal.lcores)) return 2;
    // The host's cross-core cost, for the banner, between the cores the two ends run on.
    o.core_rtt_ns = cores_round_trip(server.eal.lcores, client.eal.lcores);
    // A child ends with its parent (killed by a caller's timeout): no orphan keeps polling a core.
    auto orphan_guard = [] { ::prctl(PR_SET_PDEATHSIG, SIGTERM); };
    const auto out = procs::run({{"server", [&, s = server] { orphan_guard(); return run_server(s, o, tpu); }},
                                 {"client", [&, c = client] { orphan_guard(); return run_client(c, o, tpu); }, 200ms}},
                                {.timeout = std::chrono::seconds(o.deadline_s)});
    int rc = 0;
    for (const auto& r : out) {
        if (r.exit_code == 0) continue;
        std::fprintf(stderr, "rdma_perf: %s failed (exit %d%s)%s%s\n", r.name.c_str(), r.exit_code,
                     r.timed_out ? ", killed at --deadline" : "", r.report.empty() ? "" : ":\n",
                     r.report.c_str());
        rc = 1;
    }
    return rc;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    int code = 0;
    if (!parse(argc, argv, o, code)) return code;
    if (!o.verbose) softrdma::log::set_level(softrdma::log::Level::warn);  // the children inherit it
    const double tpu = calibrate_tsc();
    try {
        switch (o.mode) {
        case Mode::local: return run_local(o, tpu);
        case Mode::server: return run_server(remote_config(o), o, tpu);
        case Mode::client: return run_client(remote_config(o), o, tpu);
        case Mode::core_rtt: return run_core_rtt(o);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdma_perf: %s\n", e.what());
    }
    return 1;
}
