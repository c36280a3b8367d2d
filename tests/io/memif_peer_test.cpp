// SPDX-License-Identifier: MIT
// A memif client that breaks the ring format, against a memif server moving frames itself
// (PortConfig::memif_own_server_path, io/memif_guard.hpp MemifServerPath). Two processes over memif. The
// client (copy mode: its ring buffers are its own shared memory) writes straight into its rings what a broken
// or hostile client could: descriptors naming bytes outside its shared memory (past a region's end, a region
// that does not exist), a frame over 64 KiB, a frame of more descriptors than any frame needs, a ring head
// further ahead than the ring holds, and a posted RX buffer outside its memory. The server must drop exactly
// those frames, give the bad RX buffer back empty, count each fault once, deliver every sound frame intact and
// in order around them, and end with its mbufs back; the client checks what came back. DPDK's own memif
// server reads and writes wherever such a descriptor points. While it waits, the server pre-owns the buffers
// the client posted (one of them outside its memory), which must change none of that.
// Also against that server: borrowed frames giving their ring slots back (PortConfig::memif_borrow_rx), and a
// zero-copy client's RX buffers coming back round through about one ring's worth of its pool.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/prefetch.hpp"
#include "io/eal.hpp"
#include "io/memif_layout.hpp"
#include "io/port.hpp"
#include "tests/support/processes.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace mem = softrdma::io::detail;

namespace {

constexpr auto kWait = 10s;  // any one step: the link, a frame, the server taking what the client published

// Frames carry a tag and a sequence number, then pattern bytes: the server answers "go" with "reply" and
// "done" with "ack"; "data" frames are only checked.
enum Tag : std::uint32_t { data = 1, go = 2, reply = 3, done = 4, ack = 5 };
constexpr std::uint16_t kLen = 600;

// A frame of `len` bytes, chained over as many of the port's mbufs as it needs.
rte_mbuf* make_frame(io::Port& port, Tag tag, std::uint32_t seq, std::uint16_t len) {
    std::vector<std::byte> bytes(len);
    const std::uint32_t head[2] = {tag, seq};
    std::memcpy(bytes.data(), head, sizeof head);
    fill_pattern(tag * 1000u + seq, 0, std::span(bytes).subspan(8));
    rte_mbuf* first = nullptr;
    for (std::uint32_t off = 0; off < len;) {
        rte_mbuf* m = port.alloc();
        if (m == nullptr || (first != nullptr && rte_pktmbuf_chain(first, m) != 0)) {
            if (m != nullptr) rte_pktmbuf_free(m);
            if (first != nullptr) rte_pktmbuf_free(first);
            throw std::runtime_error("no mbuf");
        }
        if (first == nullptr) first = m;
        const auto n = static_cast<std::uint16_t>(std::min<std::uint32_t>(len - off, rte_pktmbuf_tailroom(m)));
        std::memcpy(rte_pktmbuf_append(m, n), bytes.data() + off, n);
        if (m != first) first->pkt_len += n;  // rte_pktmbuf_append counted it in m's own pkt_len only
        off += n;
    }
    return first;
}

void send(io::Port& port, Tag tag, std::uint32_t seq, std::uint16_t len = kLen) {
    rte_mbuf* m = make_frame(port, tag, seq, len);
    const auto deadline = Clock::now() + kWait;
    while (port.tx_burst(std::span(&m, 1)) != 1) {  // taken: the driver's (or the server path's) now
        if (Clock::now() >= deadline) {
            rte_pktmbuf_free(m);  // never taken: still ours
            throw std::runtime_error("the ring never took a frame");
        }
        std::this_thread::sleep_for(100us);
    }
}

// "" for a sound frame of `len` bytes with the pattern its tag and sequence number say; else what is wrong.
// Sets tag/seq. The mbuf stays the caller's.
std::string check(const rte_mbuf* m, std::uint32_t& tag, std::uint32_t& seq, std::uint32_t len = kLen) {
    std::string err;
    std::vector<std::byte> bytes(rte_pktmbuf_pkt_len(m));
    if (!bytes.empty()) {  // (rte_pktmbuf_read copies only a frame of several segments; else it points into it)
        const void* p = rte_pktmbuf_read(m, 0, static_cast<std::uint32_t>(bytes.size()), bytes.data());
        if (p != bytes.data()) std::memcpy(bytes.data(), p, bytes.size());
    }
    tag = seq = 0;
    if (bytes.size() != len) return "a frame of " + std::to_string(bytes.size()) + " bytes";
    std::uint32_t head[2];
    std::memcpy(head, bytes.data(), sizeof head);
    tag = head[0];
    seq = head[1];
    if (check_pattern(tag * 1000u + seq, 0, std::span(bytes).subspan(8)) >= 0)
        err = "content of frame " + std::to_string(tag) + "/" + std::to_string(seq);
    return err;
}

// check(), then frees the mbuf (ours since rx_burst).
std::string take(rte_mbuf* m, std::uint32_t& tag, std::uint32_t& seq) {
    std::string err = check(m, tag, seq);
    rte_pktmbuf_free(m);
    return err;
}

io::PortConfig config(const std::string& socket, bool server) {
    io::PortConfig cfg;
    cfg.backend = Backend::memif;
    cfg.memif_socket = socket;
    cfg.memif_server = server;
    cfg.memif_zero_copy = false;  // the client's ring buffers lie in its own region: it can point past them
    cfg.link_timeout = kWait;
    return cfg;
}

// Answers "go" and "done"; checks that exactly the sound frames arrived (data 0, data 1, go, data 2, done)
// and that its port counted `faults` peer faults; then its mbufs must be back.
int server_role(const std::string& socket, std::uint64_t faults) {
    io::EalConfig eal;
    eal.lcores = "0";
    auto port = io::open_port(config(socket, true), eal);
    const unsigned start_in_use = port->mbufs_in_use();
    const std::vector<std::pair<std::uint32_t, std::uint32_t>> want = {{data, 0}, {data, 1}, {go, 0}, {data, 2}, {done, 0}};
    std::vector<std::pair<std::uint32_t, std::uint32_t>> got;
    std::string err;
    const auto deadline = Clock::now() + 6 * kWait;
    while (Clock::now() < deadline && (got.empty() || got.back().first != done)) {
        std::array<rte_mbuf*, 32> burst;
        const unsigned n = port->rx_burst(burst);
        for (unsigned i = 0; i < n; ++i) {
            std::uint32_t tag = 0, seq = 0;
            const std::string e = take(burst[i], tag, seq);
            if (!e.empty() && err.empty()) err = e;
            got.emplace_back(tag, seq);

            if (tag == go) send(*port, reply, seq);
        }
        // Waiting: take the client's posted buffers for writing, the one it points outside its memory among
        // them (PortConfig::memif_pre_own). It must not count a fault, write anything, or move what tx() fills.
        if (n == 0) port->idle();
    }
    const std::uint64_t counted = port->counters().peer_faults;
    const std::uint64_t pre_owned = port->counters().tx_pre_owned;
    report("peer faults " + std::to_string(counted) + ", frames " + std::to_string(got.size()) + ", pre-owned " +
           std::to_string(pre_owned) + " bytes");
    // Every posted buffer the walk reached was taken, a line at a time, and never more than kPreOwnMax ahead
    // of a frame sent; on a CPU without PREFETCHW, nothing.
    const bool pre_owned_right = softrdma::base::cpu_has_prefetchw() ? pre_owned != 0 && pre_owned % 64 == 0 : pre_owned == 0;
    if (!pre_owned_right && err.empty()) err = "pre-owned " + std::to_string(pre_owned) + " bytes";
    if (got != want && err.empty()) err = "frames received are not the sound ones in order";
    if (counted != faults && err.empty()) err = "counted " + std::to_string(counted) + " peer faults, not " + std::to_string(faults);
    send(*port, ack, 0);
    // The client leaves once it has the ack; the link going down ends this side.
    const auto leave_by = Clock::now() + kWait;
    while (port->link_up() && Clock::now() < leave_by) std::this_thread::sleep_for(1ms);
    if (port->mbufs_in_use() != start_in_use && err.empty())
        err = "mbufs in use " + std::to_string(port->mbufs_in_use()) + ", " + std::to_string(start_in_use) + " at start";
    if (port->close() != io::Port::CloseResult::clean && err.empty()) err = "close not clean";
    if (!err.empty()) report(err);
    return err.empty() ? 0 : 2;
}

// The client's own view of its rings (copy mode: region 0 holds rings and buffers).
struct Rings {
    mem::MemifProcessPrivate* pp = nullptr;
    mem::MemifQueue* txq = nullptr;  // client-to-server: we advance head, the server tail
    mem::MemifQueue* rxq = nullptr;  // server-to-client: we post buffers (head), the server fills them (tail)
    explicit Rings(const io::Port& port) {
        const auto* dev = reinterpret_cast<const mem::EthDevHead*>(rte_eth_dev_allocated(port.name().c_str()));
        if (dev == nullptr) throw std::runtime_error("no device " + port.name());
        pp = static_cast<mem::MemifProcessPrivate*>(dev->process_private);
        txq = static_cast<mem::MemifQueue*>(dev->data->tx_queues[0]);
        rxq = static_cast<mem::MemifQueue*>(dev->data->rx_queues[0]);
        if (pp->regions_num == 0 || pp->regions[0] == nullptr) throw std::runtime_error("no regions mapped");
    }
    mem::MemifRingHead* ring(const mem::MemifQueue* q) const {
        return reinterpret_cast<mem::MemifRingHead*>(static_cast<std::byte*>(pp->regions[q->region]->addr) + q->ring_offset);
    }
    std::uint16_t mask(const mem::MemifQueue* q) const { return static_cast<std::uint16_t>((1u << q->log2_ring_size) - 1); }
    std::uint64_t region_size() const { return pp->regions[0]->region_size; }
};

// Publishes `bad` as frames on the client-to-server ring (the driver's next slots), waits until the server has
// taken them, and puts the slots' own descriptors back (the driver reuses their buffers).
void publish_raw(const Rings& r, const std::vector<mem::MemifDesc>& bad) {
    mem::MemifRingHead* ring = r.ring(r.txq);
    mem::MemifDesc* descs = mem::ring_desc(ring);
    const std::uint16_t mask = r.mask(r.txq);
    const std::uint16_t head = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
    std::vector<mem::MemifDesc> saved(bad.size());
    for (std::size_t i = 0; i < bad.size(); ++i) {
        mem::MemifDesc& d = descs[static_cast<std::uint16_t>(head + i) & mask];
        saved[i] = d;
        d = bad[i];
    }
    const auto end = static_cast<std::uint16_t>(head + bad.size());
    __atomic_store_n(&ring->head, end, __ATOMIC_RELEASE);
    const auto deadline = Clock::now() + kWait;
    while (__atomic_load_n(mem::ring_tail(ring), __ATOMIC_ACQUIRE) != end) {
        if (Clock::now() >= deadline) throw std::runtime_error("the server never took the raw descriptors");
        std::this_thread::sleep_for(100us);
    }
    for (std::size_t i = 0; i < bad.size(); ++i) descs[static_cast<std::uint16_t>(head + i) & mask] = saved[i];
}

// Receives until a frame tagged `tag` arrives; counts the empty frames before it. Throws on anything else.
unsigned await(io::Port& port, Tag tag) {
    unsigned empty = 0;
    const auto deadline = Clock::now() + kWait;
    while (Clock::now() < deadline) {
        std::array<rte_mbuf*, 8> burst;
        const unsigned n = port.rx_burst(std::span(burst).first(1));  // one at a time: nothing after `tag` is taken
        if (n == 0) continue;
        if (rte_pktmbuf_pkt_len(burst[0]) == 0) {
            rte_pktmbuf_free(burst[0]);  // ours since rx_burst
            ++empty;
            continue;
        }
        std::uint32_t t = 0, seq = 0;
        const std::string e = take(burst[0], t, seq);
        if (!e.empty()) throw std::runtime_error(e);
        if (t != tag) throw std::runtime_error("got frame tag " + std::to_string(t) + ", expected " + std::to_string(tag));
        return empty;
    }
    throw std::runtime_error("no frame tagged " + std::to_string(tag));
}

int client_role(const std::string& socket) {
    io::EalConfig eal;
    eal.lcores = "1";
    auto port = io::open_port(config(socket, false), eal);
    const Rings r(*port);
    const std::uint64_t region = r.region_size();
    send(*port, data, 0);
    // Frames described outside the client's memory, too long, or in too many descriptors: one fault each.
    const mem::MemifDesc past_end{.flags = 0, .region = 0, .length = 100,
                                  .offset = static_cast<std::uint32_t>(region - 10), .metadata = 0};
    const mem::MemifDesc no_region{.flags = 0, .region = 7, .length = 100, .offset = 0, .metadata = 0};
    const mem::MemifDesc too_long{.flags = 0, .region = 0, .length = 70000, .offset = 0, .metadata = 0};
    publish_raw(r, {past_end, no_region, too_long});
    std::vector<mem::MemifDesc> many(io::detail::MemifServerPath::kMaxDescs + 1,
                                     mem::MemifDesc{.flags = mem::kDescNext, .region = 0, .length = 16, .offset = 0, .metadata = 0});
    many.back().flags = 0;
    publish_raw(r, many);
    send(*port, data, 1);
    // A head further ahead than the ring holds: one fault while it lasts, nothing taken; then the real one.
    {
        mem::MemifRingHead* ring = r.ring(r.txq);
        const std::uint16_t head = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
        const auto size = static_cast<std::uint16_t>(r.mask(r.txq) + 1);
        __atomic_store_n(&ring->head, static_cast<std::uint16_t>(head + size + 5), __ATOMIC_RELEASE);
        std::this_thread::sleep_for(50ms);
        __atomic_store_n(&ring->head, head, __ATOMIC_RELEASE);
    }
    // A posted RX buffer outside our memory, the next the server fills: it must come back empty, and the reply
    // land in the buffer after it.
    mem::MemifRingHead* rx_ring = r.ring(r.rxq);
    mem::MemifDesc* rx_descs = mem::ring_desc(rx_ring);
    const std::uint16_t next = __atomic_load_n(mem::ring_tail(rx_ring), __ATOMIC_ACQUIRE);
    mem::MemifDesc& posted = rx_descs[next & r.mask(r.rxq)];
    const mem::MemifDesc saved = posted;
    posted.offset = static_cast<std::uint32_t>(region - 64);
    // And the one after the reply's, which the server fills only after we made it sound again, but its
    // pre-owning walk (PortConfig::memif_pre_own) starts there once the reply is sent: it must pass it without
    // counting a fault.
    mem::MemifDesc& later = rx_descs[static_cast<std::uint16_t>(next + 2) & r.mask(r.rxq)];
    const mem::MemifDesc sound = later;
    later.offset = static_cast<std::uint32_t>(region - 64);
    send(*port, go, 0);
    const unsigned empty = await(*port, reply);
    std::this_thread::sleep_for(20ms);  // the server waiting, its walk past `later`
    later = sound;
    posted = saved;  // the driver posts this buffer again; the server has given it back (the reply came after)
    report("empty frames before the reply: " + std::to_string(empty));
    if (empty != 1) throw std::runtime_error("expected one empty frame before the reply, got " + std::to_string(empty));
    send(*port, data, 2);
    send(*port, done, 0);
    await(*port, ack);
    return port->close() == io::Port::CloseResult::clean ? 0 : 2;
}

// ---- borrowed frames (PortConfig::memif_borrow_rx) ----

constexpr std::uint16_t kBig = 8000;  // borrowed: at least MemifServerPath::kBorrowMin
constexpr unsigned kHeld = 4;

io::PortConfig borrow_config(const std::string& socket, bool server) {
    io::PortConfig cfg = config(socket, server);
    cfg.memif_large_frames = true;  // one frame per ring buffer
    cfg.memif_borrow_rx = true;
    return cfg;
}

// Takes four large frames and keeps them: they arrive borrowed, intact. Frees the second, then the first, telling
// the client after each (it checks its ring's tail: nothing back while the first is out, then both; in between
// it publishes a head that would reuse slots still out: one peer fault). Once the client has gone (the driver
// unmapped its memory), the two still held must still read intact.
int borrow_server(const std::string& socket) {
    io::EalConfig eal;
    eal.lcores = "0";
    auto port = io::open_port(borrow_config(socket, true), eal);
    const unsigned start_in_use = port->mbufs_in_use();
    std::vector<rte_mbuf*> held;
    std::string err;
    auto fail = [&](const std::string& e) { if (err.empty()) err = e; };
    const auto deadline = Clock::now() + kWait;
    while (held.size() < kHeld && Clock::now() < deadline) {
        std::array<rte_mbuf*, kHeld> burst;
        const unsigned n = port->rx_burst(std::span(burst).first(kHeld - held.size()));
        held.insert(held.end(), burst.begin(), burst.begin() + n);
    }
    if (held.size() != kHeld) fail("received " + std::to_string(held.size()) + " frames");
    for (unsigned i = 0; i < held.size(); ++i) {
        std::uint32_t tag = 0, seq = 0;
        if (const std::string e = check(held[i], tag, seq, kBig); !e.empty()) fail(e);
        if (tag != data || seq != i) fail("frame " + std::to_string(i) + " out of order");
    }
    const PortCounters c = port->counters();
    report("borrowed " + std::to_string(c.rx_borrowed) + ", out " + std::to_string(c.rx_borrowed_out));
    if (c.rx_borrowed != kHeld || c.rx_borrowed_out != kHeld) fail("frames not borrowed as they arrived");
    if (held.size() == kHeld) {
        rte_pktmbuf_free(held[1]);  // ownership: ours since rx_burst
        send(*port, reply, 1);
        await(*port, go);  // the client has looked at its tail
        rte_pktmbuf_free(held[0]);
        send(*port, reply, 0);
        held.erase(held.begin(), held.begin() + 2);
    }
    const auto leave_by = Clock::now() + kWait;
    while (port->link_up() && Clock::now() < leave_by) std::this_thread::sleep_for(1ms);
    if (port->link_up()) fail("the client did not leave");
    std::this_thread::sleep_for(20ms);  // the driver's disconnect has unmapped the client's memory by now
    for (unsigned i = 0; i < held.size(); ++i) {
        std::uint32_t tag = 0, seq = 0;
        if (const std::string e = check(held[i], tag, seq, kBig); !e.empty()) fail("after the client left: " + e);
        if (seq != i + 2) fail("after the client left: frame " + std::to_string(seq));
        rte_pktmbuf_free(held[i]);
    }
    if (port->counters().rx_borrowed_out != 0) fail("borrowed frames still out after all were freed");
    if (port->counters().peer_faults != 1) fail("peer faults " + std::to_string(port->counters().peer_faults) + ", not 1");
    if (port->mbufs_in_use() != start_in_use)
        fail("mbufs in use " + std::to_string(port->mbufs_in_use()) + ", " + std::to_string(start_in_use) + " at start");
    if (port->close() != io::Port::CloseResult::clean) fail("close not clean");
    if (!err.empty()) report(err);
    return err.empty() ? 0 : 2;
}

// Sends four large frames and watches its client-to-server ring's tail, which says what the server gave back.
int borrow_client(const std::string& socket) {
    io::EalConfig eal;
    eal.lcores = "1";
    auto port = io::open_port(borrow_config(socket, false), eal);
    const Rings r(*port);
    const mem::MemifRingHead* ring = r.ring(r.txq);
    auto tail = [&] { return __atomic_load_n(mem::ring_tail(const_cast<mem::MemifRingHead*>(ring)), __ATOMIC_ACQUIRE); };
    const std::uint16_t t0 = tail();
    for (unsigned i = 0; i < kHeld; ++i) send(*port, data, i, kBig);
    await(*port, reply);  // the second frame freed: its slot waits behind the first's
    if (tail() != t0) throw std::runtime_error("slots given back while the first frame is held: tail " +
                                               std::to_string(tail() - t0));
    // A head less than a ring past what the server took, but more than a ring past what it gave back: it
    // would put frames into slots still out. One fault while it lasts, nothing taken; then the real head.
    {
        mem::MemifRingHead* txr = r.ring(r.txq);
        const std::uint16_t head = __atomic_load_n(&txr->head, __ATOMIC_RELAXED);
        __atomic_store_n(&txr->head, static_cast<std::uint16_t>(head + r.mask(r.txq)), __ATOMIC_RELEASE);
        std::this_thread::sleep_for(50ms);
        __atomic_store_n(&txr->head, head, __ATOMIC_RELEASE);
    }
    send(*port, go, 0);
    await(*port, reply);  // the first freed too: both go back, in ring order
    if (tail() != static_cast<std::uint16_t>(t0 + 2))
        throw std::runtime_error("tail moved by " + std::to_string(static_cast<std::uint16_t>(tail() - t0)) + ", not 2");
    report("tail held, then moved by 2");
    return port->close() == io::Port::CloseResult::clean ? 0 : 2;
}

// ---- a zero-copy client's RX buffers (io/port.cpp: large_rx_cache) ----

constexpr std::uint16_t kReuseLen = 60000;  // a large frame: one ring buffer each
constexpr std::uint32_t kReuseFrames = 2000;
// The client's RX pool holds 511 mbufs of 64 KiB; its ring posts 32 at a time. Frames freed as they come must
// come back round through a few more than one ring's worth, not through the whole pool.
constexpr std::size_t kReuseMaxBuffers = 96;

io::PortConfig reuse_config(const std::string& socket, bool server) {
    io::PortConfig cfg = config(socket, server);
    cfg.memif_large_frames = true;
    cfg.memif_zero_copy = !server;  // the server copies each frame into an mbuf the client posted
    return cfg;
}

// Sends kReuseFrames large frames as the client's ring takes them, then waits for the client to leave.
int reuse_server(const std::string& socket) {
    io::EalConfig eal;
    eal.lcores = "0";
    auto port = io::open_port(reuse_config(socket, true), eal);
    for (std::uint32_t seq = 0; seq < kReuseFrames; ++seq) send(*port, data, seq, kReuseLen);
    const auto leave_by = Clock::now() + kWait;
    while (port->link_up() && Clock::now() < leave_by) std::this_thread::sleep_for(1ms);
    return port->close() == io::Port::CloseResult::clean ? 0 : 2;
}

// Takes each frame as it comes (checked, then freed) and counts the distinct buffers they arrived in.
int reuse_client(const std::string& socket) {
    io::EalConfig eal;
    eal.lcores = "1";
    auto port = io::open_port(reuse_config(socket, false), eal);
    if (!port->memif_zero_copy()) throw std::runtime_error("the client is not in zero-copy mode");
    std::set<const void*> buffers;
    std::uint32_t got = 0;
    const auto deadline = Clock::now() + 6 * kWait;
    while (got < kReuseFrames) {
        if (Clock::now() >= deadline) throw std::runtime_error("only " + std::to_string(got) + " frames arrived");
        std::array<rte_mbuf*, 32> burst;
        const unsigned n = port->rx_burst(burst);
        for (unsigned i = 0; i < n; ++i) {
            buffers.insert(burst[i]->buf_addr);
            std::uint32_t tag = 0, seq = 0;
            const std::string e = check(burst[i], tag, seq, kReuseLen);
            rte_pktmbuf_free(burst[i]);  // ours since rx_burst
            if (!e.empty()) throw std::runtime_error(e);
            if (tag != data || seq != got) throw std::runtime_error("frame " + std::to_string(got) + " out of order");
            ++got;
        }
    }
    report("frames " + std::to_string(got) + " in " + std::to_string(buffers.size()) + " distinct RX buffers");
    if (buffers.size() > kReuseMaxBuffers)
        throw std::runtime_error(std::to_string(buffers.size()) + " distinct RX buffers, more than " +
                                 std::to_string(kReuseMaxBuffers));
    return port->close() == io::Port::CloseResult::clean ? 0 : 2;
}

// Runs the two roles on a fresh socket named after `name` (the client 200 ms after the server) and checks that
// both ended well within a minute.
template <typename Server, typename Client>
void run_pair(const std::string& name, Server server, Client client) {
    const std::string socket = "/run/" + unique_name(name) + ".sock";
    const auto outcomes = run_roles({{"server", [&] { return server(socket); }},
                                     {"client", [&] { return client(socket); }, 200ms}},
                                    60s);
    for (const auto& o : outcomes) {
        INFO(o.name << ": " << o.report);
        CHECK(o.exit_code == 0);
        CHECK_FALSE(o.timed_out);
    }
}

}  // namespace

TEST_CASE("a memif server borrowing frames gives each ring slot back when its frame is freed, in ring order, and "
          "reads held frames after the client left", "[io][memif][peer][borrow]") {
    run_pair("sr-memif-borrow", borrow_server, borrow_client);
}

TEST_CASE("a memif client writing descriptors outside its memory: the server drops those frames, counts them, "
          "delivers the rest", "[io][memif][peer]") {
    constexpr std::uint64_t kFaults = 3 + 1 + 1 + 1;  // three frames, the many-descriptor frame, the head, the RX buffer
    run_pair("sr-memif-peer", [](const std::string& socket) { return server_role(socket, kFaults); }, client_role);
}

TEST_CASE("a memif zero-copy client's RX buffers come back round through about one ring's worth, not the whole "
          "pool", "[io][memif][peer][zero-copy]") {
    if (!io::hugepages_available()) {
        WARN("skipped: memif zero-copy needs hugepages (scripts/setup reserves them)");
        return;
    }
    run_pair("sr-memif-reuse", reuse_server, reuse_client);
}
