// SPDX-License-Identifier: MIT
// threading::RxThread on its own, over a net_ring pair inside one (child) process: whole frames arrive in
// slots with every mbuf back in the pool at once; a followed TCP connection is placed in order across the
// handover (watch, handover, marker, go), a segment after a gap loses its payload, a resent one is not placed
// twice; and thread pinning.
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>

#include <arpa/inet.h>

#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include <rte_lcore.h>
#include <rte_mempool.h>

#include "base/tsan.hpp"
#include "io/port.hpp"
#include "tests/support/processes.hpp"
#include "threading/rx_thread.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace std::chrono_literals;

namespace {

ChildOutcome in_child(const std::function<int()>& body) { return run_roles({{"child", body}}, 60s).at(0); }

// Two ports back to back through net_ring (inside the child: each child has its own EAL).
std::array<std::unique_ptr<io::Port>, 2> ring_ports() {
    io::PortConfig a, b;
    a.backend = b.backend = Backend::ring;
    io::EalConfig eal;
    eal.lcores.assign(1, '0');  // (= "0" trips g++ 12's false -Wrestrict under -fsanitize=address)
    return io::open_ring_pair(a, b, eal);
}

threading::ThreadingConfig test_cfg() {
    threading::ThreadingConfig t;
    t.mode = ThreadingMode::rx_thread;
    t.rx_idle = {.spin_turns = 16, .then = IdlePolicy::Then::sleep, .sleep = 50us};
    t.rx_slots = 256;
    return t;
}

// Ethernet + IPv4 + TCP (no options) from 10.0.0.2:4000 to 10.0.0.1:5000 with `payload`; checksums left 0
// (the RX thread is built without TCP checksum checks here).
std::vector<std::uint8_t> tcp_frame(std::uint32_t seq, const std::vector<std::uint8_t>& payload) {
    std::vector<std::uint8_t> f(14 + 20 + 20 + payload.size(), 0);
    f[12] = 0x08;
    f[13] = 0x00;
    std::uint8_t* ip = f.data() + 14;
    ip[0] = 0x45;
    const std::uint16_t total = static_cast<std::uint16_t>(40 + payload.size());
    ip[2] = static_cast<std::uint8_t>(total >> 8);
    ip[3] = static_cast<std::uint8_t>(total);
    ip[8] = 64;
    ip[9] = 6;
    const std::uint32_t src = htonl(0x0a000002), dst = htonl(0x0a000001);
    std::memcpy(ip + 12, &src, 4);
    std::memcpy(ip + 16, &dst, 4);
    std::uint8_t* tcp = ip + 20;
    tcp[0] = 4000 >> 8;
    tcp[1] = 4000 & 0xff;
    tcp[2] = 5000 >> 8;
    tcp[3] = 5000 & 0xff;
    for (int i = 0; i < 4; ++i) tcp[4 + i] = static_cast<std::uint8_t>(seq >> (24 - 8 * i));
    tcp[12] = 5 << 4;
    tcp[13] = 0x18;  // PSH ACK
    std::memcpy(tcp + 20, payload.data(), payload.size());
    // The IP header checksum (the RX thread drops what lwIP would drop); the TCP checksum is left out (the
    // RX thread of this test does not verify it).
    std::uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += static_cast<std::uint32_t>(ip[i] << 8 | ip[i + 1]);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    ip[10] = static_cast<std::uint8_t>(~sum >> 8);
    ip[11] = static_cast<std::uint8_t>(~sum);
    return f;
}

// To the RX thread's port `rx` through the ring pair: what this thread wrote is released to the thread that
// receives it, as the stack does before it sends (base/tsan.hpp; nothing outside TSan builds).
bool send_frame(io::Port& tx, const io::Port& rx, const std::vector<std::uint8_t>& bytes) {
    rte_mbuf* m = tx.alloc();
    if (m == nullptr) return false;
    std::memcpy(rte_pktmbuf_append(m, static_cast<std::uint16_t>(bytes.size())), bytes.data(), bytes.size());
    wire_release(&rx);
    rte_mbuf* one[1] = {m};
    for (int i = 0; i < 1000; ++i)
        if (tx.tx_burst(one) == 1) return true;
    rte_pktmbuf_free(m);
    return false;
}

// Collects what the RX thread places (its thread only; read after stop(), which joins it).
struct Collect final : threading::FlowSink {
    std::vector<std::uint8_t> bytes;
    void rx_payload(std::span<const std::byte> b) noexcept override {
        for (std::byte x : b) bytes.push_back(std::to_integer<std::uint8_t>(x));  // test only: allocates
    }
};

}  // namespace

TEST_CASE("pin_this_thread pins, and refuses a core that does not exist", "[threading]") {
    bool ok = false;
    bool refused = false;
    std::thread t([&] {
        threading::pin_this_thread(0);
        cpu_set_t set;
        CPU_ZERO(&set);
        pthread_getaffinity_np(pthread_self(), sizeof set, &set);
        ok = CPU_COUNT(&set) == 1 && CPU_ISSET(0, &set);
        try {
            threading::pin_this_thread(1000);
        } catch (const std::system_error&) {
            refused = true;
        }
    });
    t.join();
    CHECK(ok);
    CHECK(refused);
}

TEST_CASE("the RX thread copies whole frames into slots and frees every mbuf at once", "[threading][ring]") {
    const auto out = in_child([] {
        auto ports = ring_ports();
        const unsigned start = ports[1]->mbufs_in_use();
        threading::RxThread rx(*ports[1], test_cfg(), 4);
        constexpr unsigned kFrames = 100;
        for (unsigned i = 0; i < kFrames; ++i) {
            std::vector<std::uint8_t> f(60 + i);
            for (std::size_t k = 0; k < f.size(); ++k) f[k] = static_cast<std::uint8_t>(i * 3 + k);
            f[12] = 0x88;  // not IPv4: forwarded whole
            if (!send_frame(*ports[0], *ports[1], f)) return 10;
        }
        std::vector<std::uint32_t> held;
        unsigned got = 0;
        const auto until = std::chrono::steady_clock::now() + 5s;
        while (got < kFrames && std::chrono::steady_clock::now() < until) {
            got += rx.drain(32, [&](const threading::RxThread::Frame& f) {
                const auto i = static_cast<unsigned>(held.size());  // frames arrive in order
                if (f.kind != threading::RxThread::Kind::frame || f.len != 60 + i) throw std::runtime_error("frame shape");
                for (std::uint32_t k = 0; k < f.len; ++k)
                    if (k != 12 && std::to_integer<std::uint8_t>(f.data[k]) != static_cast<std::uint8_t>(i * 3 + k))
                        throw std::runtime_error("frame bytes");
                held.push_back(f.slot);  // kept: the mbufs must be back anyway
            });
        }
        if (got != kFrames) return 11;
        // Every mbuf back in the pool while the application still holds all 100 slots.
        if (ports[1]->mbufs_in_use() != start) return 12;
        for (std::uint32_t s : held) rx.release(s);
        const threading::RxCounters c = rx.counters();
        if (c.frames != kFrames || c.dropped != 0 || c.tcp_payload_copied != 0) return 13;
        report("100 frames, mbufs back at once");
        return 0;
    });
    INFO(out.report);
    CHECK(out.exit_code == 0);
}

TEST_CASE("the RX thread runs as an lcore of its own and gives its mempool caches and id back", "[threading][ring]") {
    const auto out = in_child([] {
        auto ports = ring_ports();
        const unsigned start0 = ports[0]->mbufs_in_use(), start = ports[1]->mbufs_in_use();
        std::int32_t first = -1;
        for (int round = 0; round < 2; ++round) {
            {
                threading::RxThread rx(*ports[1], test_cfg(), 4);
                const std::int32_t lcore = rx.counters().lcore;
                // Registered (not LCORE_ID_ANY), and not the application's EAL lcore.
                if (lcore < 0 || static_cast<unsigned>(lcore) == rte_lcore_id()) return 10;
                if (round == 0) first = lcore;
                if (round == 1 && lcore != first) return 11;  // the id came back when the first thread ended
                for (unsigned i = 0; i < 64; ++i) {
                    std::vector<std::uint8_t> f(200, static_cast<std::uint8_t>(i));
                    f[12] = 0x88;
                    if (!send_frame(*ports[0], *ports[1], f)) return 12;
                }
                unsigned got = 0;
                const auto until = std::chrono::steady_clock::now() + 5s;
                while (got < 64 && std::chrono::steady_clock::now() < until)
                    got += rx.drain(32, [&](const threading::RxThread::Frame& f) { rx.release(f.slot); });
                if (got != 64) return 13;
            }
            // The thread freed the 64 mbufs (net_ring passes on the sender's, from ports[0]'s pool) into its own
            // cache; ending, it flushed its caches back to the pools.
            for (const auto& p : ports) {
                const rte_mempool_cache* c = rte_mempool_default_cache(p->pool(), static_cast<unsigned>(first));
                if (c == nullptr || c->len != 0) return 14;
            }
            if (ports[0]->mbufs_in_use() != start0 || ports[1]->mbufs_in_use() != start) return 15;
        }
        report("lcore " + std::to_string(first) + ", cache flushed, id reused");
        return 0;
    });
    INFO(out.report);
    CHECK(out.exit_code == 0);
}

TEST_CASE("a followed connection: exact handover, in-order placement, gaps and resends", "[threading][ring]") {
    const auto out = in_child([] {
        auto ports = ring_ports();
        threading::RxThread rx(*ports[1], test_cfg(), 4, /*verify_tcp_checksums=*/false);
        Collect sink;
        auto bytes = [](std::uint8_t first, std::size_t n) {
            std::vector<std::uint8_t> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(first + i);
            return v;
        };
        const std::uint64_t key = threading::flow_key(htonl(0x0a000002), 4000, 5000);
        std::vector<threading::RxThread::Frame> seen;
        auto pump = [&](unsigned want) {
            const auto until = std::chrono::steady_clock::now() + 3s;
            while (seen.size() < want && std::chrono::steady_clock::now() < until)
                rx.drain(32, [&](const threading::RxThread::Frame& f) {
                    seen.push_back(f);
                    if (f.kind != threading::RxThread::Kind::marker) rx.release(f.slot);
                });
            return seen.size() >= want;
        };
        const std::uint32_t isn = 1000;
        if (!rx.watch(0, key, isn)) return 10;
        // Forwarded whole while watched: bytes 0..99, then a segment after a gap (payload dropped).
        if (!send_frame(*ports[0], *ports[1], tcp_frame(isn, bytes(0, 100)))) return 11;
        if (!send_frame(*ports[0], *ports[1], tcp_frame(isn + 300, bytes(44, 50)))) return 11;
        if (!pump(2)) return 12;
        if (seen[0].kind != threading::RxThread::Kind::frame || seen[0].len != 154) return 13;
        if (seen[1].kind != threading::RxThread::Kind::gap || seen[1].len != 54 || seen[1].flow != 0) return 14;
        // Handover: frames arriving now are held until go().
        if (!rx.handover(0, &sink)) return 15;
        if (!send_frame(*ports[0], *ports[1], tcp_frame(isn + 100, bytes(100, 100)))) return 16;
        if (!pump(3)) return 17;
        if (seen[2].kind != threading::RxThread::Kind::marker) return 18;
        std::this_thread::sleep_for(20ms);  // the held frame stays held
        if (rx.drain(8, [&](const threading::RxThread::Frame& f) { seen.push_back(f); }) != 0) return 19;
        if (!rx.go(0)) return 20;
        if (!pump(4)) return 21;
        if (seen[3].kind != threading::RxThread::Kind::headers || seen[3].payload_len != 100 || seen[3].len != 54) return 22;
        // In order after the handover; a resend overlapping what was placed adds only the new part.
        if (!send_frame(*ports[0], *ports[1], tcp_frame(isn + 150, bytes(150, 100)))) return 23;  // 200..249 new
        if (!send_frame(*ports[0], *ports[1], tcp_frame(isn + 100, bytes(100, 100)))) return 23;  // all old: placed already
        if (!pump(6)) return 24;
        std::atomic<bool> done{false};
        if (!rx.remove(0, done)) return 25;
        for (int i = 0; i < 1000 && !done.load(); ++i) std::this_thread::sleep_for(1ms);
        if (!done.load()) return 26;
        rx.stop();
        // The sink saw exactly bytes 100..249 of the stream (0..99 went to the application as a whole frame).
        if (sink.bytes != bytes(100, 150)) return 27;
        const threading::RxCounters c = rx.counters();
        if (c.tcp_payload_placed != 150 || c.tcp_payload_copied != 100 || c.out_of_order != 1) return 28;
        report("handover exact; placed 150, copied 100, one gap");
        return 0;
    });
    INFO(out.report);
    CHECK(out.exit_code == 0);
}
