// SPDX-License-Identifier: MIT
// io layer: frames through a net_ring pair inside one process (content, counters, mbufs returned, the pcap
// capture), and bad configurations that must fail with one clear error and a non-zero exit, never a crash
// or a hang. Each case runs in a child process: DPDK's EAL starts once per process.
#include <catch2/catch.hpp>

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <vector>

#include "io/faults.hpp"
#include "io/port.hpp"
#include "tests/support/processes.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace std::chrono_literals;

namespace {

// Runs `body` in a child; returns its outcome.
ChildOutcome in_child(const std::function<int()>& body, std::chrono::seconds timeout = 60s) {
    return run_roles({{"child", body}}, timeout).at(0);
}

// A child that opens a port with `cfg` and must fail with io::Error; reports the message.
// A child that runs `prepare` (0 = go on, else that exit code), then `open`, which must throw io::Error;
// the child reports the message.
ChildOutcome expect_io_error(const std::function<int()>& prepare, const std::function<void()>& open) {
    return in_child([=] {
        if (const int rc = prepare()) return rc;
        try {
            open();
            report("opened unexpectedly");
            return 0;
        } catch (const io::Error& e) {
            report(std::string("error: ") + e.what());
            return 1;
        }
    });
}

ChildOutcome expect_open_failure(const io::PortConfig& cfg, const io::EalConfig& eal = {}) {
    return expect_io_error([] { return 0; }, [=] { io::open_port(cfg, eal); });
}

// The child failed the way a user should see it: exit code 1 and a message containing `needle`.
void check_failed_with(const ChildOutcome& out, const std::string& needle) {
    INFO(out.report);
    CHECK_FALSE(out.timed_out);
    CHECK(out.exit_code == 1);
    CHECK(out.report.find(needle) != std::string::npos);
}

// In a child: this process alone stops seeing hugetlbfs (a private mount namespace without those mounts),
// so DPDK finds no hugepages. Needs root.
bool hide_hugetlbfs() {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        return false;
    std::ifstream mounts("/proc/mounts");
    std::string dev, dir, type, rest;
    std::vector<std::string> huge;
    while (mounts >> dev >> dir >> type && std::getline(mounts, rest))
        if (type == "hugetlbfs") huge.push_back(dir);
    for (const auto& d : huge) ::umount2(d.c_str(), MNT_DETACH);
    return true;
}

std::vector<std::vector<std::byte>> read_pcap(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<std::vector<std::byte>> frames;
    std::uint32_t header[6];
    if (!in.read(reinterpret_cast<char*>(header), sizeof header) || header[0] != 0xa1b23c4d) return frames;
    std::uint32_t rec[4];
    while (in.read(reinterpret_cast<char*>(rec), sizeof rec)) {
        std::vector<std::byte> f(rec[2]);
        in.read(reinterpret_cast<char*>(f.data()), static_cast<std::streamsize>(f.size()));
        frames.push_back(std::move(f));
    }
    return frames;
}

}  // namespace

TEST_CASE("a net_ring pair carries frames both ways and returns every mbuf", "[io][ring]") {
    const std::string capture = "/tmp/" + unique_name("softrdma-io-capture-") + ".pcap";
    const auto out = in_child([&] {
        io::PortConfig a, b;
        a.backend = b.backend = Backend::ring;
        a.capture_path = capture;
        io::EalConfig eal;
        eal.lcores = "0";
        auto ports = io::open_ring_pair(a, b, eal);
        const unsigned start_a = ports[0]->mbufs_in_use(), start_b = ports[1]->mbufs_in_use();
        constexpr unsigned kFrames = 100;
        for (unsigned dir = 0; dir < 2; ++dir) {
            io::Port& tx = *ports[dir];
            io::Port& rx = *ports[1 - dir];
            std::vector<rte_mbuf*> frames;
            for (unsigned i = 0; i < kFrames; ++i) {
                rte_mbuf* m = tx.alloc();
                if (m == nullptr) return 10;
                const std::uint16_t len = static_cast<std::uint16_t>(60 + i);
                auto* p = static_cast<std::uint8_t*>(static_cast<void*>(rte_pktmbuf_append(m, len)));
                for (unsigned k = 0; k < len; ++k) p[k] = static_cast<std::uint8_t>(i * 7 + k + dir);
                frames.push_back(m);
            }
            unsigned sent = 0;
            while (sent < kFrames) sent += tx.tx_burst(std::span(frames).subspan(sent));
            unsigned got = 0;
            rte_mbuf* burst[32];
            for (int spins = 0; got < kFrames && spins < 100000; ++spins) {
                const unsigned n = rx.rx_burst(burst);
                for (unsigned j = 0; j < n; ++j, ++got) {
                    const std::uint16_t len = static_cast<std::uint16_t>(60 + got);
                    if (rte_pktmbuf_pkt_len(burst[j]) != len) return 11;
                    const auto* p = rte_pktmbuf_mtod(burst[j], const std::uint8_t*);
                    for (unsigned k = 0; k < len; ++k)
                        if (p[k] != static_cast<std::uint8_t>(got * 7 + k + dir)) return 12;
                    rte_pktmbuf_free(burst[j]);  // ours since rx_burst
                }
            }
            if (got != kFrames) return 13;
            if (tx.counters().tx_packets != kFrames || rx.counters().rx_packets != kFrames) return 14;
        }
        ports[0]->flush_capture();
        if (ports[0]->mbufs_in_use() != start_a || ports[1]->mbufs_in_use() != start_b) return 15;
        report("ok");
        return 0;
    });
    INFO(out.report);
    REQUIRE(out.exit_code == 0);
    // Port A's capture holds what it sent (first 100) and then what it received (next 100), in order.
    const auto frames = read_pcap(capture);
    REQUIRE(frames.size() == 200);
    CHECK(frames[0].size() == 60);
    CHECK(frames[99].size() == 159);
    CHECK(frames[100][0] == std::byte{1});  // direction 1, frame 0, byte 0
    if (std::system("command -v tshark >/dev/null 2>&1") == 0) {
        const std::string cmd = "tshark -r " + capture + " 2>/dev/null | wc -l";
        FILE* f = ::popen(cmd.c_str(), "r");
        char line[64] = {};
        REQUIRE(f != nullptr);
        CHECK(std::fgets(line, sizeof line, f) != nullptr);
        ::pclose(f);
        CHECK(std::atoi(line) == 200);  // tshark opens our capture and sees every frame
    }
    std::remove(capture.c_str());
}

TEST_CASE("bad io configurations fail with one clear error", "[io][errors]") {
    SECTION("unknown device") {
        io::PortConfig cfg;
        cfg.backend = Backend::device;
        cfg.device = "net_nosuchdriver0";
        check_failed_with(expect_open_failure(cfg), "net_nosuchdriver0");
    }
    SECTION("a memif vdev string as a device (memif needs the memif backend's care)") {
        io::PortConfig cfg;
        cfg.backend = Backend::device;
        cfg.device = "net_memif7,role=server,socket=/run/softrdma-raw.sock";
        check_failed_with(expect_open_failure(cfg), "memif is opened with the memif backend");
    }
    SECTION("af_packet on an interface that does not exist") {
        io::PortConfig cfg;
        cfg.backend = Backend::af_packet;
        cfg.iface = "srnosuch0";
        check_failed_with(expect_open_failure(cfg), "does the af_packet interface 'srnosuch0' exist");
    }
    SECTION("memif peer that never appears") {
        io::PortConfig cfg;
        cfg.memif_socket = "/run/" + unique_name("softrdma-nopeer-") + ".sock";
        cfg.memif_server = false;
        cfg.link_timeout = 1500ms;
        const auto started = std::chrono::steady_clock::now();
        check_failed_with(expect_open_failure(cfg), "server process running");
        CHECK(std::chrono::steady_clock::now() - started < 20s);
    }
    SECTION("memif server whose client never comes") {
        io::PortConfig cfg;
        cfg.memif_socket = "/run/" + unique_name("softrdma-noclient-") + ".sock";
        cfg.link_timeout = 1s;
        check_failed_with(expect_open_failure(cfg), "peer never appeared");
    }
    SECTION("MTU below IPv4's minimum") {
        io::PortConfig cfg;
        cfg.backend = Backend::ring;
        cfg.mtu = 100;
        check_failed_with(expect_io_error([] { return 0; }, [=] { io::open_ring_pair(cfg, cfg); }), "minimum");
    }
    SECTION("hugepages required but absent") {
        if (::geteuid() != 0) {
            WARN("skipped: hiding hugetlbfs needs root (a private mount namespace)");
            return;
        }
        const auto hide = [] { return !hide_hugetlbfs() ? 20 : io::hugepages_available() ? 21 : 0; };
        const auto open = [] {
            io::PortConfig cfg;
            cfg.backend = Backend::ring;
            io::EalConfig eal;
            eal.hugepages = Hugepages::required;
            io::open_ring_pair(cfg, cfg, eal);
        };
        check_failed_with(expect_io_error(hide, open), "run scripts/setup");
    }
    SECTION("no hugepages: automatic mode runs without them") {
        if (::geteuid() != 0) {
            WARN("skipped: hiding hugetlbfs needs root (a private mount namespace)");
            return;
        }
        const auto out = in_child([] {
            if (!hide_hugetlbfs()) return 20;
            io::PortConfig cfg;
            cfg.backend = Backend::ring;
            auto ports = io::open_ring_pair(cfg, cfg);  // Hugepages::automatic
            return io::eal_without_hugepages() && ports[0]->link_up() ? 0 : 22;
        });
        INFO(out.report);
        CHECK(out.exit_code == 0);
    }
    SECTION("a core list this machine does not have") {
        io::PortConfig cfg;
        cfg.backend = Backend::device;
        cfg.device = "net_null0";
        io::EalConfig eal;
        eal.lcores = "250";
        check_failed_with(expect_open_failure(cfg, eal), "core list");
    }
}

// Fault injection, each fault alone at rate 1 on the TX side of a net_ring pair: what arrives is exactly what
// the fault says, and every mbuf (held ones included) is back when the port is done. Then the RX side, and
// the configuration's errors.
TEST_CASE("fault injection: drop, duplicate, corrupt, delay and reorder do what they say; bad settings are "
          "refused by name", "[io][faults]") {
    const auto out = in_child([&] {
        constexpr unsigned kFrames = 40;
        constexpr std::uint16_t kLen = 100;
        struct Case {
            const char* name;
            FaultRates rates;
            bool on_rx;
        };
        const Case cases[] = {
            {"drop", {.drop = 1}, false},      {"duplicate", {.duplicate = 1}, false},
            {"corrupt", {.corrupt = 1}, false}, {"delay", {.delay = 1}, false},
            {"reorder", {.reorder = 0.5}, false}, {"rx drop", {.drop = 1}, true},
            {"rx duplicate", {.duplicate = 1}, true},
        };
        io::EalConfig eal;
        eal.lcores = "0";
        for (const Case& c : cases) {
            io::PortConfig a, b;
            a.backend = b.backend = Backend::ring;
            (c.on_rx ? b.faults.rx : a.faults.tx) = c.rates;
            a.faults.delay = b.faults.delay = std::chrono::microseconds(2000);
            auto ports = io::open_ring_pair(a, b, eal);
            io::Port& tx = *ports[0];
            io::Port& rx = *ports[1];
            const unsigned start_a = tx.mbufs_in_use(), start_b = rx.mbufs_in_use();
            std::vector<rte_mbuf*> frames;
            for (unsigned i = 0; i < kFrames; ++i) {
                rte_mbuf* m = tx.alloc();
                auto* p = static_cast<std::uint8_t*>(static_cast<void*>(rte_pktmbuf_append(m, kLen)));
                for (unsigned k = 0; k < kLen; ++k) p[k] = static_cast<std::uint8_t>(i);
                frames.push_back(m);
            }
            if (tx.tx_burst(frames) != kFrames) return 20;  // with faults every frame is taken
            std::vector<std::vector<std::uint8_t>> got;
            const auto t0 = std::chrono::steady_clock::now();
            rte_mbuf* burst[32];
            while (std::chrono::steady_clock::now() - t0 < 20ms) {
                tx.tx_release_held();
                const unsigned n = rx.rx_burst(burst);
                for (unsigned j = 0; j < n; ++j) {
                    const auto* p = rte_pktmbuf_mtod(burst[j], const std::uint8_t*);
                    got.emplace_back(p, p + rte_pktmbuf_pkt_len(burst[j]));
                    rte_pktmbuf_free(burst[j]);
                }
            }
            const std::string name = c.name;
            std::size_t in_order = 0;
            for (std::size_t i = 1; i < got.size(); ++i)
                if (got[i][20] >= got[i - 1][20]) ++in_order;
            bool ok = true;
            if (name == "drop" || name == "rx drop") ok = got.empty();
            else if (name == "duplicate" || name == "rx duplicate") {
                ok = got.size() == 2 * kFrames;
                for (std::size_t i = 0; ok && i < got.size(); ++i) ok = got[i][20] == i / 2;
            } else if (name == "corrupt") {
                ok = got.size() == kFrames;  // one bit flipped past byte 14 of each frame, none before
                for (std::size_t i = 0; ok && i < got.size(); ++i) {
                    unsigned bits = 0;
                    for (unsigned k = 0; k < kLen; ++k) bits += static_cast<unsigned>(__builtin_popcount(got[i][k] ^ static_cast<std::uint8_t>(i)));
                    for (unsigned k = 0; k < 14; ++k) ok = ok && got[i][k] == i;
                    ok = ok && bits == 1;
                }
            } else if (name == "delay") {
                ok = got.size() == kFrames;
                for (std::size_t i = 0; ok && i < got.size(); ++i) ok = got[i][20] == i;
            } else if (name == "reorder") {
                ok = got.size() == kFrames && in_order + 1 < got.size();  // all there, some overtaken
            }
            const FaultCounters f = c.on_rx ? rx.rx_fault_counters() : tx.tx_fault_counters();
            report(name + ": " + std::to_string(got.size()) + " frames; dropped " + std::to_string(f.dropped) +
                   " duplicated " + std::to_string(f.duplicated) + " corrupted " + std::to_string(f.corrupted) +
                   " delayed " + std::to_string(f.delayed) + " reordered " + std::to_string(f.reordered));
            if (!ok) return 21;
            if (tx.faults_held() != 0 || rx.faults_held() != 0) return 22;
            if (tx.mbufs_in_use() != start_a || rx.mbufs_in_use() != start_b) return 23;
        }
        // Settings: parsed, or refused by name.
        const FaultConfig f = io::parse_faults("rx_drop=0.01,tx_corrupt=0.5,delay_us=50,seed=9");
        if (f.rx.drop != 0.01 || f.tx.corrupt != 0.5 || f.delay.count() != 50 || f.seed != 9 || f.tx.drop != 0) return 24;
        if (!io::parse_faults("all=0.02").any() || io::parse_faults("").any()) return 25;
        for (const char* bad : {"rx_drop=2", "rx_drop=-1", "rx_drop=x", "nonsense=0.1", "rx_drop"}) {
            try {
                (void)io::parse_faults(bad);
                return 26;
            } catch (const std::invalid_argument& e) {
                report(std::string("refused: ") + e.what());
            }
        }
        report("ok");
        return 0;
    });
    INFO(out.report);
    CHECK_FALSE(out.timed_out);
    CHECK(out.exit_code == 0);
    CHECK(out.report.find("refused: faults: unknown key 'nonsense'") != std::string::npos);
}

// With faults on, the port takes every frame; those a full TX ring refuses wait in the injector's queue and go
// first at the next burst (io::FaultInjector::requeue): a net_ring pair (4095 frames a ring) sent 4200 frames
// unread delivers all 4200 once each, in order. (They were dropped: on a memif zero-copy client, whose ring
// holds a 64 KiB frame of 2 KiB mbufs only when empty, a slow peer turned into heavy loss and a stalled stream.)
TEST_CASE("fault injection keeps what a full TX ring refuses for the next burst, in order", "[io][faults]") {
    const auto out = in_child([&] {
        constexpr unsigned kFrames = 4200;
        constexpr std::uint16_t kLen = 64;
        io::EalConfig eal;
        eal.lcores = "0";
        io::PortConfig a, b;
        a.backend = b.backend = Backend::ring;
        a.faults.tx.delay = 1e-12;  // on, and (seed 1) never hit
        auto ports = io::open_ring_pair(a, b, eal);
        io::Port& tx = *ports[0];
        io::Port& rx = *ports[1];
        const unsigned start_a = tx.mbufs_in_use(), start_b = rx.mbufs_in_use();
        for (unsigned i = 0; i < kFrames; i += 300) {
            std::vector<rte_mbuf*> frames;
            for (unsigned j = i; j < std::min(i + 300, kFrames); ++j) {
                rte_mbuf* m = tx.alloc();
                if (m == nullptr) return 30;
                auto* p = static_cast<std::uint8_t*>(static_cast<void*>(rte_pktmbuf_append(m, kLen)));
                std::memset(p, 0, kLen);
                std::memcpy(p + 16, &j, sizeof j);
                frames.push_back(m);
            }
            if (tx.tx_burst(frames) != frames.size()) return 31;  // with faults every frame is taken
        }
        report("held after sending: " + std::to_string(tx.faults_held()));
        if (tx.faults_held() == 0) return 32;  // the ring was full: some wait
        std::vector<unsigned> got;
        rte_mbuf* burst[32];
        const auto t0 = std::chrono::steady_clock::now();
        while (got.size() < kFrames && std::chrono::steady_clock::now() - t0 < 2s) {
            tx.tx_release_held();
            const unsigned n = rx.rx_burst(burst);
            for (unsigned j = 0; j < n; ++j) {
                unsigned v = 0;
                std::memcpy(&v, rte_pktmbuf_mtod_offset(burst[j], const std::uint8_t*, 16), sizeof v);
                got.push_back(v);
                rte_pktmbuf_free(burst[j]);
            }
        }
        report("received " + std::to_string(got.size()) + " of " + std::to_string(kFrames));
        if (got.size() != kFrames) return 33;
        for (unsigned i = 0; i < kFrames; ++i)
            if (got[i] != i) return 34;
        if (tx.faults_held() != 0) return 35;
        if (tx.mbufs_in_use() != start_a || rx.mbufs_in_use() != start_b) return 36;
        return 0;
    });
    INFO(out.report);
    CHECK_FALSE(out.timed_out);
    CHECK(out.exit_code == 0);
}
