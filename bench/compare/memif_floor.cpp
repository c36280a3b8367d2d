// SPDX-License-Identifier: MIT
// The raw floor of the memif link: two processes (a bouncer on core 0, a pinger on core 1), io/ only — no
// lwIP, no iWARP. What any stack over this link can at best reach on this machine.
//
//  - latency: the pinger sends one frame (Ethernet header + N bytes of payload), the bouncer sends the same
//    mbuf straight back; half the round trip, median / p99 / min over --iters round trips per size.
//  - streaming: the pinger sends frames of N bytes of payload one way for --stream-ms; the bouncer counts
//    them from the first to the last frame: payload GB/s (10^9 bytes/s) and million frames per second. That
//    --stream-reps times per size; the median repetition is reported (this machine is shared and noisy).
//
//   memif_floor [--sizes 64,256,...] [--stream-sizes 64,1500,9000] [--iters N] [--warmup N] [--stream-ms N]
//               [--stream-reps N] [--mtu 1500|9000] [--timeout S] [--json FILE] [--no-huge]
//
// Frames carry EtherType 0x88B5 (IEEE local experimental) and a small header after the Ethernet header.
// Sizes are payload bytes (the frame is 14 bytes longer); a size above the MTU is skipped.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <softrdma/log.hpp>

#include "cli.hpp"
#include "io/port.hpp"
#include "base/processes.hpp"

using namespace softrdma;
using namespace std::chrono_literals;

namespace {

constexpr std::uint16_t kEthHeader = 14;
constexpr std::uint16_t kEtherType = 0x88B5;
constexpr std::size_t kBurst = 32;

enum Kind : std::uint8_t { ping = 1, pong = 2, stream = 3, stream_end = 4, stream_ack = 5, quit = 6 };

// After the Ethernet header; fits in the smallest payload (64 bytes).
struct Header {
    std::uint8_t kind;
    std::uint8_t pad[3];
    std::uint32_t seq;
    std::uint64_t frames;  // stream_ack: frames counted
    std::uint64_t bytes;   // stream_ack: payload bytes counted
    std::uint64_t ns;      // stream_ack: first to last stream frame, nanoseconds
};
static_assert(sizeof(Header) == 32);
constexpr std::uint32_t kMinPayload = 64;

struct Options {
    std::vector<std::uint32_t> sizes{64, 128, 256, 512, 1024, 1500, 2048, 4096, 8192, 9000};
    std::vector<std::uint32_t> stream_sizes{64, 256, 1024, 1500, 4096, 9000};
    unsigned iters = 20000, warmup = 2000, stream_ms = 400, stream_reps = 5, timeout_s = 120;
    std::uint16_t mtu = 9000;
    std::string json;
    bool no_huge = false;
};

void write_eth(std::uint8_t* p, const io::MacAddress& dst, const io::MacAddress& src) {
    std::array<std::uint8_t, kEthHeader> eth{};
    std::copy(dst.begin(), dst.end(), eth.begin());
    std::copy(src.begin(), src.end(), eth.begin() + 6);
    eth[12] = kEtherType >> 8;
    eth[13] = kEtherType & 0xff;
    std::memcpy(p, eth.data(), eth.size());
}

Header* header_of(rte_mbuf* m) { return rte_pktmbuf_mtod_offset(m, Header*, kEthHeader); }

// A frame of `payload` bytes from the pool with Ethernet and our header written; nullptr if the pool is
// empty. Ownership: the caller's.
rte_mbuf* make_frame(io::Port& port, const io::MacAddress& dst, std::uint32_t payload, Kind kind, std::uint32_t seq) {
    rte_mbuf* m = port.alloc();
    if (m == nullptr) return nullptr;
    auto* p = reinterpret_cast<std::uint8_t*>(rte_pktmbuf_append(m, static_cast<std::uint16_t>(kEthHeader + payload)));
    if (p == nullptr) {  // larger than the mbuf: callers check sizes against mbuf_data_room() first
        rte_pktmbuf_free(m);
        return nullptr;
    }
    write_eth(p, dst, port.mac());
    Header h{};
    h.kind = kind;
    h.seq = seq;
    std::memcpy(p + kEthHeader, &h, sizeof h);
    return m;
}

bool ours(rte_mbuf* m) {
    if (rte_pktmbuf_data_len(m) < kEthHeader + sizeof(Header)) return false;
    const auto* p = rte_pktmbuf_mtod(m, const std::uint8_t*);
    return p[12] == (kEtherType >> 8) && p[13] == (kEtherType & 0xff);
}

// Sends one frame, retrying while the TX ring is full, until the deadline (TSC). False on timeout (the
// frame is freed then).
bool send_one(io::Port& port, rte_mbuf* m, std::uint64_t deadline) {
    while (port.tx_burst({&m, 1}) == 0) {
        if (rte_rdtsc() > deadline) {
            rte_pktmbuf_free(m);
            return false;
        }
    }
    return true;
}

io::PortConfig port_config(const std::string& socket, bool server, std::uint16_t mtu) {
    io::PortConfig p;
    p.backend = Backend::memif;
    p.memif_socket = socket;
    p.memif_server = server;
    p.mtu = mtu;
    // mbufs: io::Port's sizing rule (0). A pool of 4095 set here was ample until the memif client went
    // zero-copy by default (2026-11-28): its driver then keeps a ring of RX mbufs lent to the peer and a ring
    // of sent frames (io::Port::driver_held(), 2 x 2048), the whole pool; the pinger's stream stopped after a
    // ring's worth of frames and its end frame found no mbuf ("stream end not sent", scripts/compare's floor).
    return p;
}

// The bouncer: echoes pings, counts streams, until quit or the deadline.
int bouncer(const io::PortConfig& pc, const io::EalConfig& ec, unsigned timeout_s) {
    auto port = io::open_port(pc, ec);
    const std::uint64_t hz = rte_get_tsc_hz();
    const std::uint64_t deadline = rte_rdtsc() + hz * timeout_s;
    std::array<rte_mbuf*, kBurst> rx{}, tx{}, drop{};
    std::uint64_t frames = 0, bytes = 0, t_first = 0, t_last = 0;
    bool done = false;
    unsigned idle = 0;
    while (!done) {
        const std::uint16_t n = port->rx_burst(rx);
        if (n == 0) {
            if (++idle == 4096) {
                idle = 0;
                if (rte_rdtsc() > deadline) {
                    softrdma::procs::report("bouncer: deadline reached before quit");
                    return 1;
                }
            }
            continue;
        }
        std::size_t ntx = 0, ndrop = 0;
        const std::uint64_t now = rte_rdtsc();
        for (std::uint16_t i = 0; i < n; ++i) {
            rte_mbuf* m = rx[i];
            if (!ours(m)) {
                drop[ndrop++] = m;
                continue;
            }
            Header* h = header_of(m);
            switch (h->kind) {
                case ping:
                    h->kind = pong;
                    tx[ntx++] = m;
                    break;
                case stream:
                    if (frames == 0) t_first = now;
                    t_last = now;
                    ++frames;
                    bytes += rte_pktmbuf_pkt_len(m) - kEthHeader;
                    drop[ndrop++] = m;
                    break;
                case stream_end:
                    h->kind = stream_ack;
                    h->frames = frames;
                    h->bytes = bytes;
                    h->ns = static_cast<std::uint64_t>(static_cast<double>(t_last - t_first) * 1e9 /
                                                       static_cast<double>(hz));
                    frames = bytes = 0;
                    tx[ntx++] = m;
                    break;
                case quit:
                    done = true;
                    [[fallthrough]];
                default:
                    drop[ndrop++] = m;
            }
        }
        if (ndrop != 0) rte_pktmbuf_free_bulk(drop.data(), static_cast<unsigned>(ndrop));
        std::size_t sent = 0;
        while (sent < ntx) {
            sent += port->tx_burst(std::span(tx.data() + sent, ntx - sent));
            if (rte_rdtsc() > deadline) {
                rte_pktmbuf_free_bulk(tx.data() + sent, static_cast<unsigned>(ntx - sent));
                return 1;
            }
        }
    }
    // The pinger stopped polling when it sent quit; this end closes its port while the link is still up
    // (a clean stop) and leaves first.
    return 0;
}

// Waits for a frame of `kind` (and `seq` for pongs); returns it (the caller frees it) or nullptr at the
// deadline. Other frames are freed.
rte_mbuf* wait_for(io::Port& port, Kind kind, std::uint32_t seq, std::uint64_t deadline) {
    std::array<rte_mbuf*, kBurst> rx{};
    unsigned idle = 0;
    for (;;) {
        const std::uint16_t n = port.rx_burst(rx);
        rte_mbuf* found = nullptr;
        for (std::uint16_t i = 0; i < n; ++i) {
            if (found == nullptr && ours(rx[i]) && header_of(rx[i])->kind == kind &&
                (kind != pong || header_of(rx[i])->seq == seq))
                found = rx[i];
            else
                rte_pktmbuf_free(rx[i]);
        }
        if (found != nullptr) return found;
        if (n == 0 && ++idle == 1024) {
            idle = 0;
            if (rte_rdtsc() > deadline) return nullptr;
        }
    }
}

int pinger(const io::PortConfig& pc, const io::EalConfig& ec, const Options& o) {
    auto port = io::open_port(pc, ec);
    const std::uint64_t hz = rte_get_tsc_hz();
    const std::uint64_t end = rte_rdtsc() + hz * o.timeout_s;
    // The bouncer's MAC: memif derives it from role and id (io/port.cpp); ask nothing of the wire.
    const io::MacAddress peer{0x02, 0x53, 0x52, 0x00, 0x00, 0x01};
    const double ns_per_tick = 1e9 / static_cast<double>(hz);
    std::vector<std::uint64_t> rtt(o.iters);  // preallocated: nothing allocates in the timed loops
    const std::uint32_t max_payload = std::min<std::uint32_t>(o.mtu, port->mbuf_data_room() - kEthHeader);

    for (const std::uint32_t size : o.sizes) {
        if (size > max_payload || size < kMinPayload) {
            softrdma::procs::report("skip lat " + std::to_string(size));
            continue;
        }
        for (unsigned i = 0; i < o.warmup + o.iters; ++i) {
            rte_mbuf* m = make_frame(*port, peer, size, ping, i);
            const std::uint64_t t0 = rte_rdtsc();
            const std::uint64_t limit = std::min(end, t0 + 2 * hz);
            if (m == nullptr || !send_one(*port, m, limit)) throw std::runtime_error("ping not sent");
            rte_mbuf* r = wait_for(*port, pong, i, limit);
            const std::uint64_t t1 = rte_rdtsc();
            if (r == nullptr)
                throw std::runtime_error("no pong for ping " + std::to_string(i) + " of size " + std::to_string(size));
            rte_pktmbuf_free(r);
            if (i >= o.warmup) rtt[i - o.warmup] = t1 - t0;
        }
        std::sort(rtt.begin(), rtt.end());
        const auto ns = [&](double q) {
            return static_cast<double>(rtt[std::min<std::size_t>(
                       rtt.size() - 1, static_cast<std::size_t>(q * static_cast<double>(rtt.size())))]) *
                   ns_per_tick;
        };
        char line[160];
        std::snprintf(line, sizeof line, "lat %u %u %.1f %.1f %.1f", size, o.iters, ns(0.0), ns(0.5), ns(0.99));
        softrdma::procs::report(line);
    }

    std::array<rte_mbuf*, kBurst> burst{};
    for (const std::uint32_t size : o.stream_sizes) {
        if (size > max_payload || size < kMinPayload) {
            softrdma::procs::report("skip bw " + std::to_string(size));
            continue;
        }
        for (unsigned r = 0; r < o.stream_reps; ++r) {
            const std::uint64_t stop = rte_rdtsc() + hz * o.stream_ms / 1000;
            std::uint64_t sent = 0;
            while (rte_rdtsc() < stop) {
                if (rte_pktmbuf_alloc_bulk(port->pool(), burst.data(), kBurst) != 0) continue;
                for (rte_mbuf* m : burst) {
                    // Fits: size <= max_payload, checked above.
                    auto* p = reinterpret_cast<std::uint8_t*>(
                        rte_pktmbuf_append(m, static_cast<std::uint16_t>(kEthHeader + size)));
                    write_eth(p, peer, port->mac());
                    p[kEthHeader] = stream;
                }
                std::size_t done = 0;
                while (done < kBurst) {
                    done += port->tx_burst(std::span(burst.data() + done, kBurst - done));
                    if (rte_rdtsc() > end) throw std::runtime_error("stream stalled");
                }
                sent += kBurst;
            }
            rte_mbuf* m = make_frame(*port, peer, kMinPayload, stream_end, 0);
            const std::uint64_t limit = std::min(end, rte_rdtsc() + 5 * hz);
            if (m == nullptr || !send_one(*port, m, limit)) throw std::runtime_error("stream end not sent");
            rte_mbuf* ack = wait_for(*port, stream_ack, 0, limit);
            if (ack == nullptr) throw std::runtime_error("no stream ack");
            const Header h = *header_of(ack);
            rte_pktmbuf_free(ack);
            if (h.frames != sent)
                throw std::runtime_error("bouncer counted " + std::to_string(h.frames) + " of " + std::to_string(sent) +
                                         " frames");
            char line[160];
            std::snprintf(line, sizeof line, "bw %u %" PRIu64 " %" PRIu64 " %" PRIu64, size, h.frames, h.bytes, h.ns);
            softrdma::procs::report(line);
        }  // repetitions: the parent reports their median (one descheduled stretch spoils one, not all)
    }
    rte_mbuf* q = make_frame(*port, peer, kMinPayload, quit, 0);
    if (q != nullptr) send_one(*port, q, rte_rdtsc() + hz);
    // Not polling while the bouncer leaves (DPDK 22.11 memif can fault in rx_burst while a departing peer is
    // torn down; see tests/support/tcp_roles.cpp), and the port goes only once the link is down, so it is
    // not stopped under the driver's own teardown (io/port.cpp's destructor).
    for (int i = 0; i < 400 && port->link_up(); ++i) std::this_thread::sleep_for(5ms);
    return 0;
}

// A role ends with this process (scripts/compare stops a run by killing it): false if it is already gone.
bool die_with_parent(pid_t parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    return ::getppid() == parent;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has = i + 1 < argc;
        if (a == "--no-huge")
            o.no_huge = true;
        else if (a == "--sizes" && has)
            o.sizes = compare::parse_list(argv[++i]);
        else if (a == "--stream-sizes" && has)
            o.stream_sizes = compare::parse_list(argv[++i]);
        else if (a == "--iters" && has)
            o.iters = std::max(1u, static_cast<unsigned>(std::atoi(argv[++i])));
        else if (a == "--warmup" && has)
            o.warmup = static_cast<unsigned>(std::atoi(argv[++i]));
        else if (a == "--stream-reps" && has)
            o.stream_reps = std::max(1u, static_cast<unsigned>(std::atoi(argv[++i])));
        else if (a == "--stream-ms" && has)
            o.stream_ms = std::max(10u, static_cast<unsigned>(std::atoi(argv[++i])));
        else if (a == "--mtu" && has)
            o.mtu = static_cast<std::uint16_t>(std::atoi(argv[++i]));
        else if (a == "--timeout" && has)
            o.timeout_s = std::max(1u, static_cast<unsigned>(std::atoi(argv[++i])));
        else if (a == "--json" && has)
            o.json = argv[++i];
        else {
            std::fprintf(
                stderr,
                "usage: %s [--sizes 64,256,...] [--stream-sizes 64,1500,9000] [--iters N] [--warmup N] "
                "[--stream-ms N] [--stream-reps N] [--mtu 1500|9000] [--timeout S] [--json FILE] [--no-huge]\n",
                argv[0]);
            return 2;
        }
    }
    softrdma::log::set_level(softrdma::log::Level::warn);  // the children inherit it
    const std::string socket = "/run/" + softrdma::procs::unique_name("softrdma-floor-") + ".sock";
    io::PortConfig server = port_config(socket, true, o.mtu), client = port_config(socket, false, o.mtu);
    io::EalConfig es, ecl;
    es.lcores = "0";
    ecl.lcores = "1";
    if (o.no_huge) es.hugepages = ecl.hugepages = Hugepages::off;
    const pid_t parent = ::getpid();
    const auto out = softrdma::procs::run(
        {{"bouncer", [&] { return die_with_parent(parent) ? bouncer(server, es, o.timeout_s) : 1; }},
         {"pinger", [&] { return die_with_parent(parent) ? pinger(client, ecl, o) : 1; }, 200ms}},
        {.timeout = std::chrono::seconds(o.timeout_s + 15)});
    std::remove(socket.c_str());
    bool ok = true;
    for (const auto& r : out)
        if (r.exit_code != 0) {
            std::fprintf(stderr, "memif_floor: %s failed (exit %d%s):\n%s", r.name.c_str(), r.exit_code,
                         r.timed_out ? ", timed out" : "", r.report.c_str());
            ok = false;
        }
    if (!ok) return 1;

    std::string lat_json, bw_json;
    std::printf("# raw memif floor (io/ only), MTU %u, bouncer core 0, pinger core 1\n", o.mtu);
    std::printf("%-8s %10s %12s %12s %12s\n", "bytes", "iters", "half-RTT min", "median us", "p99 us");
    std::stringstream lines(out[1].report);
    std::string l;
    struct Rep {
        unsigned size;
        unsigned long long frames, bytes;
        double secs, gbs;
    };
    std::vector<Rep> reps;
    while (std::getline(lines, l)) {
        unsigned size = 0, iters = 0;
        double mn = 0, med = 0, p99 = 0;
        unsigned long long frames = 0, bytes = 0, ns = 0;
        char buf[256];
        if (std::sscanf(l.c_str(), "lat %u %u %lf %lf %lf", &size, &iters, &mn, &med, &p99) == 5) {
            std::printf("%-8u %10u %12.2f %12.2f %12.2f\n", size, iters, mn / 2000, med / 2000, p99 / 2000);
            std::snprintf(buf, sizeof buf,
                          "%s{\"bytes\":%u,\"iterations\":%u,\"half_rtt_min_us\":%.3f,\"half_rtt_median_us\":%.3f,"
                          "\"half_rtt_p99_us\":%.3f,\"rtt_median_us\":%.3f}",
                          lat_json.empty() ? "" : ",", size, iters, mn / 2000, med / 2000, p99 / 2000, med / 1000);
            lat_json += buf;
        } else if (std::sscanf(l.c_str(), "bw %u %llu %llu %llu", &size, &frames, &bytes, &ns) == 4) {
            const double secs = static_cast<double>(ns) / 1e9;
            reps.push_back({size, frames, bytes, secs, secs > 0 ? static_cast<double>(bytes) / secs / 1e9 : 0});
        }
    }
    std::printf("# one-way stream, payload bytes per frame, median of %u repetitions of %u ms (min..max GB/s)\n",
                o.stream_reps, o.stream_ms);
    for (std::size_t i = 0; i < reps.size();) {  // repetitions of one size are consecutive
        std::size_t j = i;
        while (j < reps.size() && reps[j].size == reps[i].size) ++j;
        std::vector<Rep> g(reps.begin() + static_cast<long>(i), reps.begin() + static_cast<long>(j));
        std::sort(g.begin(), g.end(), [](const Rep& a, const Rep& b) { return a.gbs < b.gbs; });
        const Rep& m = g[g.size() / 2];
        const double mpps = m.secs > 0 ? static_cast<double>(m.frames) / m.secs / 1e6 : 0;
        std::printf("%-8u %10llu frames %8.3f s %8.3f GB/s %8.3f Mpps  (%.3f..%.3f)\n", m.size, m.frames, m.secs, m.gbs,
                    mpps, g.front().gbs, g.back().gbs);
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%s{\"bytes\":%u,\"frames\":%llu,\"seconds\":%.6f,\"gb_s\":%.4f,\"mpps\":%.4f,"
                      "\"gb_s_min\":%.4f,\"gb_s_max\":%.4f,\"repetitions\":%zu}",
                      bw_json.empty() ? "" : ",", m.size, m.frames, m.secs, m.gbs, mpps, g.front().gbs, g.back().gbs,
                      g.size());
        bw_json += buf;
        i = j;
    }
    if (!o.json.empty()) {
        FILE* f = std::fopen(o.json.c_str(), "w");
        if (f == nullptr) {
            std::fprintf(stderr, "memif_floor: cannot write %s\n", o.json.c_str());
            return 1;
        }
        std::fprintf(f, "{\"tool\":\"memif_floor\",\"mtu\":%u,\"lat\":[%s],\"bw\":[%s]}\n", o.mtu, lat_json.c_str(),
                     bw_json.c_str());
        std::fclose(f);
    }
    return 0;
}
