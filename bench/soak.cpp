// SPDX-License-Identifier: MIT
// soak: a long run of every operation on many QPs over memif with fault injection on, every byte checked, and
// the process's health (resident memory, pools, progress) watched once a second; ends with one verdict line.
//
//   soak [--seconds S | --minutes M] [--qps N] [--threading rtc|rx_thread] [--faults RATE|off] [--seed N]
//        [--min-size B] [--max-size B] [--depth D] [--stall S] [--self-test-corrupt]
//
// Two processes (base/processes.hpp): a server (core 0) and a client (core 1) over DPDK memif, N QPs connected
// through the CM with RFC 7306 agreed. Fault injection (io/faults.hpp) on the client's port, both directions,
// every kind at RATE (default 0.5 %); TCP checksums on at both ends.
//
// What each client QP keeps in flight (`--depth` chains, each in a slot of its own, plus the server's acks):
//   send / send_imm / write_imm  "consuming" messages: they take one of the server's posted receives. The k-th
//       such message on QP q has length, content seed and immediate data derived from (seed, q, k), so the
//       server verifies byte_len, every byte, the immediate data, and for write_imm the WRITE's bytes in the
//       slot the immediate data names. The server then reposts the receive and answers with an ack SEND whose
//       length and content derive from (seed, q, j): the client verifies those. A consuming message stays in
//       flight until its ack arrives (credit: never more than the server has receives posted).
//   write + read-back            a WRITE to the QP's remote slot, a READ of the same bytes into a separate sink
//                                behind it on the same QP; the sink must hold what was written.
//   read                         a READ of a read-only area the server filled at start (pattern, offset).
//   fetch-add / cmp-swap         on the QP's own 8-byte word at the server: the client keeps a model of the
//       word (updated at post time; atomics on one QP execute in posting order), so each returned old value is
//       predicted exactly. A sixteenth of the compare-and-swaps are meant to fail (compare != current). At the
//       end a READ of the word must equal the model.
// Sizes are log-uniform between --min-size and --max-size (1 B .. 256 KiB).
//
// Verdict rules (FAIL on any):
//   - a byte, length, immediate or atomic value that differs from what it must be (mismatches);
//   - a work completion with an error status, or a post refused (before teardown; receives flushed by the
//     orderly disconnect at the end are expected and counted apart);
//   - no completion at all for --stall seconds (default 10) on either side (a stall);
//   - resident memory (/proc/self/statm) above its value at the end of warm-up by more than
//     kRssSlackKiB + 1 % (warm-up: the first 10 % of the run, at least 5 s, at most 60 s); checked every second
//     after warm-up; under ThreadSanitizer above its value at the run's start by more than kRssSlackKiB + 1 %;
//   - more than kAllocsPerSecond operator-new calls a second after warm-up (plain build only): the data path
//     allocates nothing;
//   - lwIP's pools or DPDK's mbufs not back to their starting occupancy after the QPs are torn down;
//   - the two sides disagreeing on counts (consuming messages sent vs received, acks sent vs received);
//   - a process that crashes, fails, or outlives its deadline (run + 120 s).
// --self-test-corrupt flips one byte of one SEND after it was filled: the run must then FAIL (the check works).
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <softrdma/diagnostics.hpp>
#include <softrdma/log.hpp>
#include <softrdma/verbs.hpp>

#include "base/processes.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/tcp_roles.hpp"
#include "verbs/engine.hpp"  // white-box: the stack (pools) and port (fault counters) behind a Context

using namespace softrdma;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- allocations ----------------------------------------------------------------------------------------
// Every operator new in the process is counted (the library's too: this definition interposes on the global
// one; new[], nothrow and sized variants all come through these two in libstdc++). Not in the sanitizer
// builds, whose runtimes own operator new. After warm-up the run must allocate next to nothing: the library
// allocates nothing per operation, and neither does this harness apart from its once-a-second report. (This
// matters beyond the rule: under ASan every freed block sits in the quarantine, so per-completion strings made
// the ASan soak's RSS climb ~400 KiB/s, past its bound.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define SOAK_COUNTS_ALLOCATIONS 1
namespace {
std::atomic<std::uint64_t> g_allocations{0};
}
void* operator new(std::size_t n) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n != 0 ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t al) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    const auto a = static_cast<std::size_t>(al);
    if (void* p = std::aligned_alloc(a, (std::max<std::size_t>(n, 1) + a - 1) / a * a)) return p;
    throw std::bad_alloc();
}
#endif

namespace {

// Allocations allowed per second after warm-up (the once-a-second report makes ~20; one per operation would be
// thousands).
constexpr std::uint64_t kAllocsPerSecond = 200;
std::uint64_t allocations() {
#ifdef SOAK_COUNTS_ALLOCATIONS
    return g_allocations.load(std::memory_order_relaxed);
#else
    return 0;
#endif
}

// Allowed RSS growth after warm-up, plus 1 % of the warm-up RSS. The plain build touches all its memory within
// warm-up (a 30-s run: +0 KiB after it), and ASan's too. Mbuf and pool leaks are caught by the pool checks, heap
// leaks by the allocation count (plain) and LeakSanitizer (ASan), not by this bound.
//
// Under ThreadSanitizer the run is ~30x slower, so pool objects, mbufs and (on the memif server) the client's
// lent buffers are still being used for the first time long after warm-up, each new page bringing its shadow
// (4x) and meta-shadow, plus a runtime sync object per address used atomically (each mbuf's reference count).
// How much of that comes after warm-up depends on how far the run got in its first 5 s: in 30-s runs the growth
// after warm-up was 69-197 MiB (a slow clean-clone run failed the former bound of 188 MiB), while the growth
// from the run's start (connections up, no operation yet) was 272-306 MiB (rtc) and 312-380 MiB (rx_thread; the
// server the most), levelling off to ~1 MiB/s at the end in every run, fast or slow: it is bounded by the memory
// there is to touch. So under TSan the bound is taken from the start, with that much room; it catches a runaway
// only (a leak of more than ~4 MiB/s), which the plain and ASan soaks would catch long before. It is sized for
// the suite's 30-s TSan runs: a TSan soak of several minutes may outgrow it at that last ~1 MiB/s.
#if defined(__SANITIZE_THREAD__)
constexpr bool kRssFromStart = true;
constexpr std::uint64_t kRssSlackKiB = 512 * 1024;
#else
constexpr bool kRssFromStart = false;
constexpr std::uint64_t kRssSlackKiB = 8192;
#endif
constexpr auto kDrainLimit = 60s;             // finishing what is in flight at the end (faults: TCP backoff)

struct Options {
    unsigned seconds = 600;
    unsigned qps = 16;
    unsigned depth = 8;  // chains per QP (and receives per QP on each side)
    ThreadingMode threading = ThreadingMode::rx_thread;
    double fault_rate = 0.005;
    std::uint64_t seed = 1;
    std::uint32_t min_size = 1;
    std::uint32_t max_size = 256u << 10;
    unsigned stall_s = 10;
    bool corrupt_self_test = false;
    bool large_segments = verbs::ContextConfig{}.large_segments;  // on by default (both threading modes)
    std::uint16_t tcp_port = 7600;
};

const char* usage =
    "usage: soak [--seconds S | --minutes M] [--qps N] [--threading rtc|rx_thread] [--faults RATE|off]\n"
    "            [--seed N] [--min-size B] [--max-size B] [--depth D] [--stall S] [--self-test-corrupt]\n"
    "            [--large-segments | --mtu-segments]\n"
    "  --seconds/--minutes  run time (default 10 minutes)\n"
    "  --qps N              QPs, each connected through the CM (default 16)\n"
    "  --threading MODE     rtc (run to completion) or rx_thread (default)\n"
    "  --faults RATE|off    drop/duplicate/reorder/delay/corrupt rate per frame, both directions of the\n"
    "                       client's port (default 0.005)\n"
    "  --seed N             content, sizes and fault seed (default 1)\n"
    "  --min-size/--max-size  message sizes, log-uniform (default 1 .. 262144)\n"
    "  --depth D            operations in flight per QP (default 8, at most 16)\n"
    "  --stall S            FAIL after S seconds without a completion (default 10)\n"
    "  --self-test-corrupt  corrupt one SEND on purpose: the verdict must be FAIL\n"
    "  --large-segments     TCP segments up to 64 KiB (memif; ContextConfig::large_segments; the default)\n"
    "  --mtu-segments       MTU-sized TCP segments instead\n";

// ---- deterministic parameters ----------------------------------------------------------------------------
std::uint64_t mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
std::uint64_t h(std::uint64_t seed, std::uint64_t q, std::uint64_t k, std::uint64_t what) {
    return mix(mix(mix(seed ^ (what << 56)) + q) + k);
}
// Log-uniform in [lo, hi].
std::uint32_t size_from(std::uint64_t r, std::uint32_t lo, std::uint32_t hi) {
    const double a = std::log2(static_cast<double>(lo)), b = std::log2(static_cast<double>(hi) + 1);
    const double u = static_cast<double>(r >> 11) / static_cast<double>(1ull << 53);
    const auto v = static_cast<std::uint64_t>(std::exp2(a + u * (b - a)));
    return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(v, lo, hi));
}

enum What : std::uint64_t { kMsgLen = 1, kMsgSeed, kMsgImm, kAckLen, kAckSeed, kOpLen, kOpSeed, kOpPick, kRoSeed };

// ---- layout ---------------------------------------------------------------------------------------------
// Server, per QP: [write slots: depth x max][read-only area: 2 x max][atomic word: 8][receives: depth x max]
//                 [ack sources: depth x max]
// Client, per QP: [sources: depth x max][sinks: depth x max][receives: depth x max]
struct Layout {
    std::size_t max, depth;
    std::size_t srv_slots() const { return 0; }
    std::size_t srv_ro() const { return depth * max; }
    std::size_t srv_word() const { return srv_ro() + 2 * max; }
    std::size_t srv_recv() const { return srv_word() + 64; }
    std::size_t srv_ack() const { return srv_recv() + depth * max; }
    std::size_t srv_bytes() const { return srv_ack() + depth * max; }
    std::size_t cli_src() const { return 0; }
    std::size_t cli_sink() const { return depth * max; }
    std::size_t cli_recv() const { return 2 * depth * max; }
    std::size_t cli_bytes() const { return 3 * depth * max; }
};

struct Hello {  // MPA private data, both ways
    std::uint32_t q{0};
    std::uint32_t rkey{0};
    std::uint64_t addr{0};
};

std::uint64_t wr_id(std::uint32_t q, std::uint32_t slot, std::uint32_t tag) {
    return static_cast<std::uint64_t>(q) << 40 | static_cast<std::uint64_t>(slot) << 8 | tag;
}
std::uint32_t wr_q(std::uint64_t id) { return static_cast<std::uint32_t>(id >> 40); }
std::uint32_t wr_slot(std::uint64_t id) { return static_cast<std::uint32_t>((id >> 8) & 0xffffffff); }
std::uint32_t wr_tag(std::uint64_t id) { return static_cast<std::uint32_t>(id & 0xff); }
// Tags: 1 a receive, 2 a server's ack SEND, 9 the client's final READ, kChainTag + kind a client chain's WR.
constexpr std::uint32_t kChainTag = 32;

// ---- health --------------------------------------------------------------------------------------------
std::uint64_t rss_kib() {
    std::ifstream f("/proc/self/statm");
    std::uint64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) / 1024;
}

struct Health {
    explicit Health(const Options& opts) : o(opts) {}
    const Options& o;
    Clock::time_point t0 = Clock::now();
    std::uint64_t rss_start = rss_kib(), rss_warm = 0, rss_max_after = 0, rss_now = 0;
    std::uint64_t allocs_warm = 0, allocs_after = 0;  // operator new calls: at the end of warm-up, since then
    double warm_at = 0;
    Clock::time_point last_progress = Clock::now();
    std::uint64_t last_completions = 0;
    std::string failure;

    // The run proper starts now (after the connections are set up).
    void restart() {
        t0 = last_progress = Clock::now();
        rss_start = rss_kib();
    }
    double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
    double warmup_s() const { return std::clamp(o.seconds * 0.1, 5.0, 60.0); }
    std::uint64_t rss_base() const { return kRssFromStart ? rss_start : rss_warm; }
    std::uint64_t rss_bound() const { return rss_base() + kRssSlackKiB + rss_base() / 100; }
    void fail(const std::string& why) {
        if (failure.empty()) failure = why;
    }
    // Once a second: RSS rule and stall rule.
    void tick(std::uint64_t completions, bool expecting_progress) {
        rss_now = rss_kib();
        if (rss_warm == 0 && elapsed() >= warmup_s()) {
            rss_warm = rss_now;
            allocs_warm = allocations();
            warm_at = elapsed();
        }
        if (rss_warm != 0) {
            allocs_after = allocations() - allocs_warm;
            const auto allowed = static_cast<std::uint64_t>(kAllocsPerSecond * (elapsed() - warm_at + 1));
            if (allocs_after > allowed)
                fail(std::to_string(allocs_after) + " allocations in the " +
                     std::to_string(static_cast<int>(elapsed() - warm_at)) + " s after warm-up (at most " +
                     std::to_string(kAllocsPerSecond) + " a second)");
            rss_max_after = std::max(rss_max_after, rss_now);
            if (rss_now > rss_bound())
                fail("RSS " + std::to_string(rss_now) + " KiB above the bound " + std::to_string(rss_bound()) +
                     (kRssFromStart ? " KiB (start " + std::to_string(rss_start) : " KiB (warm-up " + std::to_string(rss_warm)) +
                     " KiB)");
        }
        progress(completions, expecting_progress);
    }
    void progress(std::uint64_t completions, bool expecting_progress) {
        if (completions != last_completions || !expecting_progress) {
            last_completions = completions;
            last_progress = Clock::now();
        } else if (Clock::now() - last_progress > std::chrono::seconds(o.stall_s)) {
            fail("stall: no completion for " + std::to_string(o.stall_s) + " s at " +
                 std::to_string(static_cast<int>(elapsed())) + " s");
        }
    }
    std::string rss_text() const {
        return "rss " + std::to_string(rss_now) + " KiB (" +
               (rss_warm != 0 ? "+" + std::to_string(static_cast<long long>(rss_now) -
                                                     static_cast<long long>(rss_base())) +
                                    (kRssFromStart ? " since start" : " since warm-up") + allocs_text()
                              : "warming up") + ")";
    }
    std::string allocs_text() const {
#ifdef SOAK_COUNTS_ALLOCATIONS
        return ", " + std::to_string(allocs_after) + " allocations";
#else
        return {};
#endif
    }
};

std::string pools_text(verbs::Context& ctx) {
    const auto u = ctx.impl().stack().pool_usage();
    std::uint64_t objs = 0;
    for (const auto& [name, n] : u.pools) objs += n;
    return "mbufs " + std::to_string(u.mbufs_in_use) + " lwip-pool-objs " + std::to_string(objs) + " heap " +
           std::to_string(u.heap_used);
}

std::string mib(std::uint64_t b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1 << 20));
    return s;
}

verbs::ContextConfig context_config(const test::PeerConfig& pc, const Options& o) {
    verbs::ContextConfig cc;
    cc.port = pc.port;
    cc.eal = pc.eal;
    cc.ip = pc.stack.ip;
    cc.max_qp = std::max(64u, o.qps + 8);
    cc.tcp_checksums = verbs::ContextConfig::Checksums::on;  // faults on one side: both must agree
    cc.threading.mode = o.threading;
    cc.large_segments = o.large_segments;
    // Two processes with two threads each on two cores: an idle RX thread sleeps rather than spin.
    cc.threading.rx_idle = {.spin_turns = 64, .then = IdlePolicy::Then::sleep, .sleep = 50us};
    return cc;
}

verbs::ConnParam conn_param(const Hello& me) {
    verbs::ConnParam cp{.responder_resources = 16, .initiator_depth = 16, .rfc7306 = true};
    cp.private_data = {reinterpret_cast<const std::byte*>(&me), sizeof me};
    cp.connect_retry = 10s;
    return cp;
}

Hello hello_from(const PrivateData& pd) {
    Hello h;
    if (pd.size != sizeof h) throw std::runtime_error("private data of " + std::to_string(pd.size) + " bytes");
    std::memcpy(&h, pd.bytes.data(), sizeof h);
    return h;
}

// Idle turns: spin a little, then give the core away (two busy processes share two cores).
struct Idle {
    unsigned turns = 0;
    void operator()(bool busy) {
        if (busy) {
            turns = 0;
        } else if (++turns > 64) {
            std::this_thread::yield();
        }
    }
};

// The pools after teardown (as tests/support's finish_checks): every connection closed, TIME_WAIT dropped.
// Driven through the Context: with an RX thread only it takes received frames to lwIP.
std::string pools_back(verbs::Context& ctx, const stack::PoolUsage& baseline) {
    auto& st = ctx.impl().stack();
    ctx.run_until([&] { return st.active_pcbs() == 0; }, 10s);
    ctx.run_until([] { return false; }, 20ms);
    st.purge_time_wait();
    ctx.run_until([] { return false; }, 30ms);
    return baseline.diff(st.pool_usage());
}

// On a failure: what the RX thread dropped or found out of order, and lwIP's TCP/IP counters (retransmissions,
// drops, checksum errors), to tell a lost segment from a stuck connection.
std::string internals_text(verbs::Context& ctx) {
    std::string out;
    if (const auto r = verbs::diagnostics::rx_thread(ctx))
        out += "rx_thread frames=" + std::to_string(r->frames) + " dropped=" + std::to_string(r->dropped) +
               " out_of_order=" + std::to_string(r->out_of_order) + " stalled_turns=" +
               std::to_string(r->stalled_turns) + " lcore=" + std::to_string(r->lcore) + "; ";
    return out + "lwip " + ctx.impl().stack().protocol_counters();
}

std::string faults_text(const FaultCounters& f) {
    return std::to_string(f.dropped) + "/" + std::to_string(f.duplicated) + "/" + std::to_string(f.reordered) + "/" +
           std::to_string(f.delayed) + "/" + std::to_string(f.corrupted);
}
std::uint64_t faults_sum(const FaultCounters& f) {
    return f.dropped + f.duplicated + f.reordered + f.delayed + f.corrupted;
}

// ================================================ server ===================================================
struct ServerQp {
    std::vector<std::byte> buf;
    std::unique_ptr<verbs::MemoryRegion> mr;
    std::unique_ptr<verbs::QueuePair> qp;
    std::unique_ptr<verbs::CmId> id;
    std::uint64_t k = 0;           // consuming messages received
    std::uint64_t j = 0;           // acks posted
    std::uint64_t acks_done = 0;   // ack completions
    std::uint64_t acks_owed = 0;   // to post when an ack source frees
    bool connected = false, ended = false, disconnected = false;
};

int run_server(const test::PeerConfig& pc, const Options& o) {
    const Layout L{(o.max_size + 63u) & ~63u, o.depth};
    const std::uint32_t cqe = o.qps * (2 * o.depth + 8);
    auto ctx = verbs::Context::open(context_config(pc, o));
    const auto baseline = ctx->impl().stack().pool_usage();
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(cqe);
    std::vector<ServerQp> qs(o.qps);
    const std::uint32_t access = verbs::access::local_write | verbs::access::remote_write |
                                 verbs::access::remote_read | verbs::access::remote_atomic;
    Health health{o};
    std::uint64_t recv_n = 0, recv_imm_n = 0, write_imm_n = 0, bytes_in = 0, bytes_out = 0, verified = 0;
    std::uint64_t mismatches = 0, wr_errors = 0, flushed_at_end = 0;
    std::string first_mismatch;
    auto mismatch = [&](const std::string& what) {
        if (mismatches++ == 0) first_mismatch = what;
    };
    for (std::uint32_t q = 0; q < o.qps; ++q) {
        auto& s = qs[q];
        s.buf.resize(L.srv_bytes());
        test::fill_pattern(h(o.seed, q, 0, kRoSeed), 0, std::span(s.buf).subspan(L.srv_ro(), 2 * L.max));
        s.mr = pd->reg_mr(s.buf, access);
        s.qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(),
                              .cap = {.max_send_wr = 2 * o.depth + 4, .max_recv_wr = o.depth + 4}});
        for (std::uint32_t r = 0; r < o.depth; ++r) {
            const verbs::Sge sge = s.mr->sge(L.srv_recv() + r * L.max, static_cast<std::uint32_t>(L.max));
            const verbs::RecvWr wr{.wr_id = wr_id(q, r, 1), .sg_list = {&sge, 1}};
            if (!s.qp->post_recv({&wr, 1}).ok()) throw std::runtime_error("post_recv at start");
        }
    }
    auto listener = ctx->listen(pc.tcp_port);
    // Connections: every QP's request, accepted with the region's address.
    unsigned established = 0;
    const auto setup_deadline = Clock::now() + 30s;
    while (established < o.qps) {
        if (Clock::now() > setup_deadline) throw std::runtime_error("setup: " + std::to_string(established) + " of " +
                                                                    std::to_string(o.qps) + " QPs connected");
        auto ev = ctx->wait_cm_event(1s);
        if (!ev) continue;
        if (ev->type == verbs::CmEventType::connect_request) {
            const Hello peer = hello_from(ev->private_data);
            if (peer.q >= o.qps || qs[peer.q].id) throw std::runtime_error("bad QP index in a request");
            auto& s = qs[peer.q];
            s.id = std::move(ev->request);
            const Hello me{peer.q, s.mr->rkey(), s.mr->addr()};
            if (!s.id->accept(*s.qp, conn_param(me))) throw std::runtime_error("accept refused");
        } else if (ev->type == verbs::CmEventType::established) {
            for (auto& s : qs)
                if (s.id.get() == ev->id) s.connected = true;
            ++established;
        } else {
            throw std::runtime_error(std::string("setup: CM event ") + verbs::to_string(ev->type) + " " + ev->reason);
        }
    }
    health.restart();

    auto post_acks = [&](std::uint32_t q) {
        auto& s = qs[q];
        while (s.acks_owed > 0 && s.j - s.acks_done < o.depth && !s.ended) {
            const std::uint32_t slot = static_cast<std::uint32_t>(s.j % o.depth);
            const std::uint32_t len = size_from(h(o.seed, q, s.j, kAckLen), o.min_size, o.max_size);
            test::fill_pattern(h(o.seed, q, s.j, kAckSeed), 0,
                               std::span(s.buf).subspan(L.srv_ack() + slot * L.max, len));
            const verbs::Sge sge = s.mr->sge(L.srv_ack() + slot * L.max, len);
            const verbs::SendWr wr{.wr_id = wr_id(q, slot, 2), .opcode = verbs::WrOpcode::send,
                                   .send_flags = verbs::send_flags::signaled, .sg_list = {&sge, 1}};
            const auto r = s.qp->post_send({&wr, 1});
            if (!r.ok()) {
                ++wr_errors;
                health.fail(std::string("server post_send (ack): ") + verbs::to_string(r.err));
                s.ended = true;
                return;
            }
            ++s.j;
            --s.acks_owed;
            bytes_out += len;
        }
    };

    std::array<verbs::WorkCompletion, 32> wcs;
    unsigned ended = 0;
    std::uint64_t completions = 0;
    auto next_tick = Clock::now() + 1s;
    const auto deadline = Clock::now() + std::chrono::seconds(o.seconds) + kDrainLimit + 30s;
    Idle idle;
    while (ended < o.qps && Clock::now() < deadline) {
        const unsigned frames = ctx->poll();
        const std::size_t n = cq->poll(wcs);
        idle(frames != 0 || n != 0);
        for (std::size_t i = 0; i < n; ++i) {
            const auto& wc = wcs[i];
            ++completions;
            const std::uint32_t q = wr_q(wc.wr_id), slot = wr_slot(wc.wr_id), tag = wr_tag(wc.wr_id);
            auto& s = qs.at(q);
            if (wc.status != verbs::WcStatus::success) {
                // Receives flushed by the client's orderly disconnect at the end are expected.
                if (tag == 1 && wc.status == verbs::WcStatus::wr_flush_err && s.qp->state() == verbs::QpState::err) {
                    ++flushed_at_end;
                } else {
                    ++wr_errors;
                    health.fail("server WR on QP " + std::to_string(q) + ": " + verbs::to_string(wc.status));
                }
                continue;
            }
            if (tag == 2) {  // an ack went out
                ++s.acks_done;
                continue;
            }
            // A consuming message: the k-th on this QP.
            const std::uint64_t k = s.k++;
            const std::uint32_t len = size_from(h(o.seed, q, k, kMsgLen), o.min_size, o.max_size);
            const std::uint64_t pseed = h(o.seed, q, k, kMsgSeed);
            // Built only for a mismatch's message: the run allocates nothing per completion (see kAllocsPerSecond).
            const auto where = [&] { return "QP " + std::to_string(q) + " message " + std::to_string(k); };
            if (wc.opcode == verbs::WcOpcode::recv) {
                const bool imm = (wc.wc_flags & verbs::wc_flags::with_imm) != 0;
                (imm ? recv_imm_n : recv_n)++;
                bytes_in += wc.byte_len;
                if (wc.byte_len != len) mismatch(where() + ": SEND of " + std::to_string(wc.byte_len) + " bytes, want " + std::to_string(len));
                else if (const auto bad = test::check_pattern(pseed, 0, std::span(s.buf).subspan(L.srv_recv() + slot * L.max, len)); bad >= 0)
                    mismatch(where() + ": SEND byte " + std::to_string(bad) + " differs");
                else if (imm && wc.imm_data != h(o.seed, q, k, kMsgImm)) mismatch(where() + ": immediate data differs");
                else verified += len;
            } else if (wc.opcode == verbs::WcOpcode::recv_rdma_with_imm) {
                ++write_imm_n;
                const std::uint64_t imm = wc.imm_data;
                const std::uint32_t wlen = static_cast<std::uint32_t>(imm & 0xffffff);
                const std::uint32_t wslot = static_cast<std::uint32_t>((imm >> 24) & 0xff);
                const std::uint32_t wk = static_cast<std::uint32_t>(imm >> 32);
                bytes_in += wlen;
                if (wk != static_cast<std::uint32_t>(k) || wlen != len || wslot >= o.depth)
                    mismatch(where() + ": WRITE_WITH_IMM's immediate data " + std::to_string(imm) + " unexpected");
                else if (const auto bad = test::check_pattern(pseed, 0, std::span(s.buf).subspan(L.srv_slots() + wslot * L.max, len)); bad >= 0)
                    mismatch(where() + ": WRITE byte " + std::to_string(bad) + " differs");
                else verified += len;
            } else {
                mismatch(where() + ": unexpected completion opcode " + verbs::to_string(wc.opcode));
            }
            // The receive goes back before the ack that lets the client send again.
            const verbs::Sge sge = s.mr->sge(L.srv_recv() + slot * L.max, static_cast<std::uint32_t>(L.max));
            const verbs::RecvWr rwr{.wr_id = wr_id(q, slot, 1), .sg_list = {&sge, 1}};
            if (const auto r = s.qp->post_recv({&rwr, 1}); !r.ok()) {
                ++wr_errors;
                health.fail(std::string("server post_recv: ") + verbs::to_string(r.err));
            }
            ++s.acks_owed;
            post_acks(q);
        }
        for (std::uint32_t q = 0; q < o.qps; ++q)
            if (qs[q].acks_owed != 0) post_acks(q);
        while (auto ev = ctx->get_cm_event()) {
            if (ev->type == verbs::CmEventType::disconnected) {
                for (auto& s : qs)
                    if (s.id.get() == ev->id && !s.disconnected) {
                        s.disconnected = s.ended = true;
                        ++ended;
                    }
            } else {
                health.fail(std::string("server: CM event ") + verbs::to_string(ev->type) + " during the run");
            }
        }
        if (Clock::now() >= next_tick) {
            next_tick += 1s;
            health.tick(completions, ended == 0);
            const auto rx = ctx->impl().port().rx_fault_counters(), tx = ctx->impl().port().tx_fault_counters();
            std::printf("soak server %4.0f s | recv %" PRIu64 " recv_imm %" PRIu64 " write_imm %" PRIu64
                        " acks %" PRIu64 " | in %s out %s verified %s | bad %" PRIu64 " wr_err %" PRIu64
                        " | %s | %s | faults rx %s tx %s\n",
                        health.elapsed(), recv_n, recv_imm_n, write_imm_n, [&] {
                            std::uint64_t a = 0;
                            for (auto& s : qs) a += s.acks_done;
                            return a;
                        }(), mib(bytes_in).c_str(), mib(bytes_out).c_str(), mib(verified).c_str(), mismatches,
                        wr_errors, health.rss_text().c_str(), pools_text(*ctx).c_str(), faults_text(rx).c_str(),
                        faults_text(tx).c_str());
        } else {
            health.progress(completions, ended == 0);
        }
    }
    if (ended < o.qps) health.fail("server: " + std::to_string(o.qps - ended) + " QPs never disconnected");
    // What the disconnects flushed.
    ctx->run_until([&] {
        const std::size_t n = cq->poll(wcs);
        for (std::size_t i = 0; i < n; ++i) {
            if (wcs[i].status == verbs::WcStatus::wr_flush_err && wr_tag(wcs[i].wr_id) == 1) ++flushed_at_end;
            else if (wcs[i].status != verbs::WcStatus::success) ++wr_errors, health.fail("server WR failed at teardown");
            else if (wr_tag(wcs[i].wr_id) == 2) ++qs.at(wr_q(wcs[i].wr_id)).acks_done;
        }
        return false;
    }, 200ms);
    std::uint64_t acks = 0, acks_done = 0, consumed = 0;
    for (auto& s : qs) acks += s.j, acks_done += s.acks_done, consumed += s.k;
    if (acks != acks_done) health.fail("server: " + std::to_string(acks - acks_done) + " acks never completed");
    if (cq->overruns() != 0) health.fail("server: CQ overruns");
    const std::uint64_t rss_end = rss_kib();
    for (auto& s : qs) s.id.reset(), s.qp.reset(), s.mr.reset();
    listener.reset();
    cq.reset();
    pd.reset();
    const std::string diff = pools_back(*ctx, baseline);
    if (!diff.empty()) health.fail("server pools not back to start: " + diff);
    if (mismatches != 0) health.fail("server: " + std::to_string(mismatches) + " mismatches, first: " + first_mismatch);
    if (wr_errors != 0) health.fail("server: " + std::to_string(wr_errors) + " WR errors");
    procs::report("figures consumed=" + std::to_string(consumed) + " acks=" + std::to_string(acks) +
                  " recv=" + std::to_string(recv_n) + " recv_imm=" + std::to_string(recv_imm_n) +
                  " write_imm=" + std::to_string(write_imm_n) + " bytes_in=" + std::to_string(bytes_in) +
                  " bytes_out=" + std::to_string(bytes_out) + " verified=" + std::to_string(verified) +
                  " flushed_at_end=" + std::to_string(flushed_at_end) + " rss_start=" +
                  std::to_string(health.rss_start) + " rss_warm=" + std::to_string(health.rss_warm) +
                  " rss_end=" + std::to_string(rss_end) + " allocs=" + std::to_string(health.allocs_after));
    if (!health.failure.empty()) {
        procs::report("internals " + internals_text(*ctx));
        procs::report("fail " + health.failure);
        return 1;
    }
    return 0;
}

// ================================================ client ===================================================
enum Kind : std::uint8_t { kSend, kSendImm, kWriteImm, kWriteRead, kRead, kFetchAdd, kCas, kKinds };
const char* kind_name[kKinds] = {"send", "send_imm", "write_imm", "write+read", "read", "fetch_add", "cmp_swap"};

struct Chain {
    bool busy = false;
    Kind kind = kSend;
    unsigned wcs_left = 0;   // our own completions still to come
    bool await_ack = false;  // a consuming message: the server's ack still to come
    std::uint32_t len = 0;
    std::uint64_t pseed = 0;
    std::uint64_t ro_offset = 0;
    std::uint64_t expect_old = 0;
};

struct ClientQp {
    std::vector<std::byte> buf;
    std::unique_ptr<verbs::MemoryRegion> mr;
    std::unique_ptr<verbs::QueuePair> qp;
    std::unique_ptr<verbs::CmId> id;
    Hello remote{};
    std::vector<Chain> chains;
    std::vector<std::uint32_t> ack_fifo;  // slots of consuming messages awaiting their ack, in order (ring)
    std::size_t fifo_head = 0, fifo_len = 0;
    std::uint64_t k = 0;       // consuming messages sent
    std::uint64_t j = 0;       // acks received
    std::uint64_t ops = 0;     // other operations started (their parameters' index)
    std::uint64_t picks = 0;   // chains started (the choice of kind)
    std::uint64_t word = 0;    // model of the atomic word
    bool dead = false, ended = false, connected = false;
};

int run_client(const test::PeerConfig& base, const Options& o) {
    test::PeerConfig pc = base;
    if (o.fault_rate > 0) {
        const FaultRates r{.drop = o.fault_rate, .duplicate = o.fault_rate, .reorder = o.fault_rate,
                           .delay = o.fault_rate, .corrupt = o.fault_rate};
        pc.port.faults.rx = pc.port.faults.tx = r;
        pc.port.faults.seed = o.seed;
    }
    const Layout L{(o.max_size + 63u) & ~63u, o.depth};
    const std::uint32_t cqe = o.qps * (3 * o.depth + 8);
    auto ctx = verbs::Context::open(context_config(pc, o));
    if ((o.fault_rate > 0) != ctx->impl().port().faults_on()) throw std::runtime_error("fault injection not as asked");
    const auto baseline = ctx->impl().stack().pool_usage();
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(cqe);
    std::vector<ClientQp> qs(o.qps);
    Health health{o};
    std::array<std::uint64_t, kKinds> done{};
    std::uint64_t bytes = 0, verified = 0, acks_n = 0, mismatches = 0, wr_errors = 0, flushed_at_end = 0;
    std::string first_mismatch;
    auto mismatch = [&](const std::string& what) {
        if (mismatches++ == 0) first_mismatch = what;
    };
    auto post_recv = [&](std::uint32_t q, std::uint32_t r) {
        auto& c = qs[q];
        const verbs::Sge sge = c.mr->sge(L.cli_recv() + r * L.max, static_cast<std::uint32_t>(L.max));
        const verbs::RecvWr wr{.wr_id = wr_id(q, r, 1), .sg_list = {&sge, 1}};
        if (const auto res = c.qp->post_recv({&wr, 1}); !res.ok()) {
            ++wr_errors;
            health.fail(std::string("client post_recv: ") + verbs::to_string(res.err));
        }
    };
    for (std::uint32_t q = 0; q < o.qps; ++q) {
        auto& c = qs[q];
        c.buf.resize(L.cli_bytes());
        c.mr = pd->reg_mr(c.buf, verbs::access::local_write);
        c.qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(),
                              .cap = {.max_send_wr = 2 * o.depth + 4, .max_recv_wr = o.depth + 4}});
        c.chains.resize(o.depth);
        c.ack_fifo.resize(o.depth);
        for (std::uint32_t r = 0; r < o.depth; ++r) post_recv(q, r);
    }
    // Connect every QP.
    for (std::uint32_t q = 0; q < o.qps; ++q) {
        const Hello me{q, qs[q].mr->rkey(), qs[q].mr->addr()};
        qs[q].id = ctx->connect(pc.peer, pc.tcp_port, *qs[q].qp, conn_param(me));
    }
    unsigned established = 0;
    const auto setup_deadline = Clock::now() + 30s;
    while (established < o.qps) {
        if (Clock::now() > setup_deadline) throw std::runtime_error("setup: " + std::to_string(established) + " of " +
                                                                    std::to_string(o.qps) + " QPs connected");
        auto ev = ctx->wait_cm_event(1s);
        if (!ev) continue;
        if (ev->type != verbs::CmEventType::established)
            throw std::runtime_error(std::string("setup: CM event ") + verbs::to_string(ev->type) + " " + ev->reason);
        for (auto& c : qs)
            if (c.id.get() == ev->id) {
                c.remote = hello_from(ev->private_data);
                c.connected = true;
            }
        ++established;
    }
    health.restart();
    const auto end_at = Clock::now() + std::chrono::seconds(o.seconds);
    bool corrupted_once = false;

    auto post = [&](std::uint32_t q, const verbs::SendWr& wr) {
        const auto r = qs[q].qp->post_send({&wr, 1});
        if (r.ok()) return true;
        ++wr_errors;
        health.fail("client post_send (" + std::string(verbs::to_string(wr.opcode)) + ") on QP " + std::to_string(q) +
                    ": " + verbs::to_string(r.err));
        qs[q].dead = true;
        return false;
    };
    // Starts a chain in a free slot of QP q; false if none could start.
    auto start = [&](std::uint32_t q, std::uint32_t slot) {
        auto& c = qs[q];
        Chain& ch = c.chains[slot];
        const std::uint64_t pick = h(o.seed, q, c.picks++, kOpPick);
        Kind kind = static_cast<Kind>(pick % kKinds);
        const bool consuming = kind == kSend || kind == kSendImm || kind == kWriteImm;
        if (consuming && c.fifo_len >= o.depth) kind = kWriteRead;  // no credit: something else
        ch = Chain{.busy = true, .kind = kind};
        const std::uint64_t src = L.cli_src() + slot * L.max, sink = L.cli_sink() + slot * L.max;
        const std::uint64_t raddr = c.remote.addr;
        const std::uint32_t rkey = c.remote.rkey;
        if (kind == kSend || kind == kSendImm || kind == kWriteImm) {
            const std::uint64_t k = c.k;
            ch.len = size_from(h(o.seed, q, k, kMsgLen), o.min_size, o.max_size);
            ch.pseed = h(o.seed, q, k, kMsgSeed);
            auto out = std::span(c.buf).subspan(src, ch.len);
            test::fill_pattern(ch.pseed, 0, out);
            if (o.corrupt_self_test && !corrupted_once && kind == kSend && health.elapsed() > 2) {
                out[ch.len / 2] ^= std::byte{0x40};
                corrupted_once = true;
                std::printf("soak client: --self-test-corrupt: flipped a bit of SEND %" PRIu64 " on QP %u\n", k, q);
            }
            const verbs::Sge sge = c.mr->sge(src, ch.len);
            verbs::SendWr wr{.wr_id = wr_id(q, slot, kChainTag + kind), .send_flags = verbs::send_flags::signaled,
                             .sg_list = {&sge, 1}};
            if (kind == kSend) {
                wr.opcode = verbs::WrOpcode::send;
            } else if (kind == kSendImm) {
                wr.opcode = verbs::WrOpcode::send_with_imm;
                wr.imm_data = h(o.seed, q, k, kMsgImm);
            } else {
                wr.opcode = verbs::WrOpcode::rdma_write_with_imm;
                wr.imm_data = (k & 0xffffffffull) << 32 | static_cast<std::uint64_t>(slot) << 24 | ch.len;
                wr.rdma = {raddr + L.srv_slots() + slot * L.max, rkey};
            }
            if (!post(q, wr)) return (ch.busy = false);
            ++c.k;
            ch.wcs_left = 1;
            ch.await_ack = true;
            c.ack_fifo[(c.fifo_head + c.fifo_len++) % o.depth] = slot;
            bytes += ch.len;
            return true;
        }
        const std::uint64_t op = c.ops++;
        if (kind == kWriteRead) {
            ch.len = size_from(h(o.seed, q, op, kOpLen), o.min_size, o.max_size);
            ch.pseed = h(o.seed, q, op, kOpSeed);
            test::fill_pattern(ch.pseed, 0, std::span(c.buf).subspan(src, ch.len));
            const verbs::Sge w = c.mr->sge(src, ch.len), r = c.mr->sge(sink, ch.len);
            const verbs::SendWr ww{.wr_id = wr_id(q, slot, kChainTag + kWriteRead), .opcode = verbs::WrOpcode::rdma_write,
                                   .send_flags = verbs::send_flags::signaled, .sg_list = {&w, 1},
                                   .rdma = {raddr + L.srv_slots() + slot * L.max, rkey}};
            const verbs::SendWr rw{.wr_id = wr_id(q, slot, kChainTag + kWriteRead), .opcode = verbs::WrOpcode::rdma_read,
                                   .send_flags = verbs::send_flags::signaled, .sg_list = {&r, 1},
                                   .rdma = {raddr + L.srv_slots() + slot * L.max, rkey}};
            if (!post(q, ww)) return (ch.busy = false);
            ch.wcs_left = 1;
            bytes += ch.len;
            if (!post(q, rw)) return true;  // the WRITE's completion still comes
            ch.wcs_left = 2;
            bytes += ch.len;
        } else if (kind == kRead) {
            ch.len = size_from(h(o.seed, q, op, kOpLen), o.min_size, o.max_size);
            ch.ro_offset = h(o.seed, q, op, kOpSeed) % L.max;
            const verbs::Sge r = c.mr->sge(sink, ch.len);
            const verbs::SendWr rw{.wr_id = wr_id(q, slot, kChainTag + kRead), .opcode = verbs::WrOpcode::rdma_read,
                                   .send_flags = verbs::send_flags::signaled, .sg_list = {&r, 1},
                                   .rdma = {raddr + L.srv_ro() + ch.ro_offset, rkey}};
            if (!post(q, rw)) return (ch.busy = false);
            ch.wcs_left = 1;
            bytes += ch.len;
        } else {  // atomics on the QP's own word; the result lands in the slot's sink
            const std::uint64_t r = h(o.seed, q, op, kOpSeed);
            const verbs::Sge s = c.mr->sge(sink, 8);
            verbs::SendWr aw{.wr_id = wr_id(q, slot, kChainTag + kind), .send_flags = verbs::send_flags::signaled,
                             .sg_list = {&s, 1}};
            aw.atomic.remote_addr = raddr + L.srv_word();
            aw.atomic.rkey = rkey;
            ch.expect_old = c.word;
            std::memset(c.buf.data() + sink, 0xa5, 8);
            if (kind == kFetchAdd) {
                aw.opcode = verbs::WrOpcode::atomic_fetch_and_add;
                aw.atomic.compare_add = (r & 0xffff) + 1;
                if (!post(q, aw)) return (ch.busy = false);
                c.word += aw.atomic.compare_add;
            } else {
                aw.opcode = verbs::WrOpcode::atomic_cmp_and_swp;
                const bool succeed = (r >> 60) != 0;  // 1 in 16 meant to fail
                aw.atomic.compare_add = succeed ? c.word : c.word ^ (r | 1);
                aw.atomic.swap = mix(r);
                if (!post(q, aw)) return (ch.busy = false);
                if (succeed) c.word = aw.atomic.swap;
            }
            ch.len = 8;
            ch.wcs_left = 1;
            bytes += 8;
        }
        return true;
    };
    auto finish = [&](std::uint32_t q, std::uint32_t slot) {
        auto& c = qs[q];
        Chain& ch = c.chains[slot];
        if (ch.wcs_left != 0 || ch.await_ack) return;
        ch.busy = false;
        ++done[ch.kind];
    };
    // A completion of our own WR.
    auto on_send_wc = [&](const verbs::WorkCompletion& wc) {
        const std::uint32_t q = wr_q(wc.wr_id), slot = wr_slot(wc.wr_id);
        auto& c = qs.at(q);
        Chain& ch = c.chains.at(slot);
        if (!ch.busy || ch.wcs_left == 0) {
            mismatch("completion for an idle slot (QP " + std::to_string(q) + ")");
            return;
        }
        --ch.wcs_left;
        if (wc.status != verbs::WcStatus::success) {
            ++wr_errors;
            health.fail("client " + std::string(kind_name[ch.kind]) + " on QP " + std::to_string(q) + ": " +
                        verbs::to_string(wc.status));
            c.dead = true;
            finish(q, slot);
            return;
        }
        const auto where = [&] { return std::string(kind_name[ch.kind]) + " on QP " + std::to_string(q); };
        const std::uint64_t sink = L.cli_sink() + slot * L.max;
        if (ch.kind == kWriteRead && wc.opcode == verbs::WcOpcode::rdma_read) {
            if (const auto bad = test::check_pattern(ch.pseed, 0, std::span(c.buf).subspan(sink, ch.len)); bad >= 0)
                mismatch(where() + ": byte " + std::to_string(bad) + " of " + std::to_string(ch.len) + " read back differs");
            else verified += ch.len;
        } else if (ch.kind == kRead) {
            if (const auto bad = test::check_pattern(h(o.seed, q, 0, kRoSeed), ch.ro_offset,
                                                     std::span(c.buf).subspan(sink, ch.len)); bad >= 0)
                mismatch(where() + ": byte " + std::to_string(bad) + " differs");
            else verified += ch.len;
        } else if (ch.kind == kFetchAdd || ch.kind == kCas) {
            std::uint64_t got;
            std::memcpy(&got, c.buf.data() + sink, 8);
            if (got != ch.expect_old) mismatch(where() + ": old value " + std::to_string(got) + ", want " + std::to_string(ch.expect_old));
            else verified += 8;
        }
        finish(q, slot);
    };
    auto on_recv_wc = [&](const verbs::WorkCompletion& wc) {
        const std::uint32_t q = wr_q(wc.wr_id), r = wr_slot(wc.wr_id);
        auto& c = qs.at(q);
        if (wc.status != verbs::WcStatus::success) {
            if (wc.status == verbs::WcStatus::wr_flush_err && c.ended) {
                ++flushed_at_end;
            } else {
                ++wr_errors;
                health.fail("client receive on QP " + std::to_string(q) + ": " + verbs::to_string(wc.status));
                c.dead = true;
            }
            return;
        }
        const std::uint64_t j = c.j++;
        ++acks_n;
        const std::uint32_t len = size_from(h(o.seed, q, j, kAckLen), o.min_size, o.max_size);
        bytes += wc.byte_len;
        if (wc.opcode != verbs::WcOpcode::recv || wc.byte_len != len)
            mismatch("ack " + std::to_string(j) + " on QP " + std::to_string(q) + ": " + std::to_string(wc.byte_len) +
                     " bytes, want " + std::to_string(len));
        else if (const auto bad = test::check_pattern(h(o.seed, q, j, kAckSeed), 0,
                                                      std::span(c.buf).subspan(L.cli_recv() + r * L.max, len)); bad >= 0)
            mismatch("ack " + std::to_string(j) + " on QP " + std::to_string(q) + ": byte " + std::to_string(bad) + " differs");
        else verified += len;
        post_recv(q, r);
        if (c.fifo_len == 0) {
            mismatch("an ack nobody waits for on QP " + std::to_string(q));
            return;
        }
        const std::uint32_t slot = c.ack_fifo[c.fifo_head];
        c.fifo_head = (c.fifo_head + 1) % o.depth;
        --c.fifo_len;
        c.chains[slot].await_ack = false;
        finish(q, slot);
    };

    std::array<verbs::WorkCompletion, 32> wcs;
    std::uint64_t completions = 0;
    auto next_tick = Clock::now() + 1s;
    bool draining = false;
    Clock::time_point drain_deadline{};
    Idle idle;
    auto busy_chains = [&] {
        std::size_t b = 0;
        for (auto& c : qs)
            if (!c.dead)
                for (auto& ch : c.chains) b += ch.busy;
        return b;
    };
    auto line = [&](const char* tag) {
        const auto rx = ctx->impl().port().rx_fault_counters(), tx = ctx->impl().port().tx_fault_counters();
        std::string ops;
        for (int k = 0; k < kKinds; ++k) ops += std::string(k ? " " : "") + kind_name[k] + " " + std::to_string(done[k]);
        std::printf("soak client %4.0f s%s | %s acks %" PRIu64 " | moved %s verified %s | bad %" PRIu64
                    " wr_err %" PRIu64 " | %s | %s | faults (drop/dup/reorder/delay/corrupt) rx %s tx %s\n",
                    health.elapsed(), tag, ops.c_str(), acks_n, mib(bytes).c_str(), mib(verified).c_str(), mismatches,
                    wr_errors, health.rss_text().c_str(), pools_text(*ctx).c_str(), faults_text(rx).c_str(),
                    faults_text(tx).c_str());
    };
    for (;;) {
        const unsigned frames = ctx->poll();
        const std::size_t n = cq->poll(wcs);
        idle(frames != 0 || n != 0);
        for (std::size_t i = 0; i < n; ++i) {
            ++completions;
            if (wr_tag(wcs[i].wr_id) == 1) on_recv_wc(wcs[i]);
            else on_send_wc(wcs[i]);
        }
        if (!draining && (Clock::now() >= end_at || !health.failure.empty())) {
            draining = true;
            drain_deadline = Clock::now() + kDrainLimit;
        }
        if (!draining) {
            for (std::uint32_t q = 0; q < o.qps; ++q) {
                if (qs[q].dead) continue;
                for (std::uint32_t s = 0; s < o.depth && !qs[q].dead; ++s)
                    if (!qs[q].chains[s].busy) start(q, s);
            }
        } else {
            if (busy_chains() == 0) break;  // (chains of a dead QP never end: its failure is recorded)
            if (Clock::now() > drain_deadline) {
                health.fail("drain: " + std::to_string(busy_chains()) + " operations still in flight after " +
                            std::to_string(kDrainLimit.count()) + " s");
                break;
            }
        }
        while (auto ev = ctx->get_cm_event()) {
            health.fail(std::string("client: CM event ") + verbs::to_string(ev->type) + " during the run: " + ev->reason);
            for (auto& c : qs)
                if (c.id.get() == ev->id) c.dead = true;
        }
        if (Clock::now() >= next_tick) {
            next_tick += 1s;
            health.tick(completions, true);
            line("");
        } else {
            health.progress(completions, true);
        }
    }
    // The atomic words: a READ of each must equal the model.
    std::uint64_t words_checked = 0;
    for (std::uint32_t q = 0; q < o.qps && health.failure.empty(); ++q) {
        auto& c = qs[q];
        const std::uint64_t sink = L.cli_sink();
        std::memset(c.buf.data() + sink, 0x5a, 8);
        const verbs::Sge r = c.mr->sge(sink, 8);
        const verbs::SendWr rw{.wr_id = wr_id(q, 0, 9), .opcode = verbs::WrOpcode::rdma_read,
                               .send_flags = verbs::send_flags::signaled, .sg_list = {&r, 1},
                               .rdma = {c.remote.addr + L.srv_word(), c.remote.rkey}};
        if (!post(q, rw)) break;
        verbs::WorkCompletion wc{};
        if (!ctx->run_until([&] { return cq->poll({&wc, 1}) == 1; }, 30s)) {
            health.fail("final READ of the atomic word: no completion");
            break;
        }
        if (wc.status != verbs::WcStatus::success) {
            ++wr_errors;
            health.fail(std::string("final READ of the atomic word: ") + verbs::to_string(wc.status));
            break;
        }
        std::uint64_t got;
        std::memcpy(&got, c.buf.data() + sink, 8);
        if (got != c.word) mismatch("QP " + std::to_string(q) + ": atomic word " + std::to_string(got) + ", want " + std::to_string(c.word));
        else ++words_checked;
    }
    health.tick(completions, false);
    line(" end");
    // Orderly teardown: disconnect every QP, wait for the events, take the flushed receives.
    for (auto& c : qs) {
        c.ended = true;
        c.id->disconnect();
    }
    unsigned disconnected = 0;
    ctx->run_until([&] {
        while (auto ev = ctx->get_cm_event())
            if (ev->type == verbs::CmEventType::disconnected) ++disconnected;
        const std::size_t n = cq->poll(wcs);
        for (std::size_t i = 0; i < n; ++i)
            if (wr_tag(wcs[i].wr_id) == 1) on_recv_wc(wcs[i]);
            else on_send_wc(wcs[i]);
        return disconnected == o.qps;
    }, 20s);
    if (disconnected != o.qps) health.fail("teardown: " + std::to_string(o.qps - disconnected) + " QPs never disconnected");
    ctx->run_until([&] {
        const std::size_t n = cq->poll(wcs);
        for (std::size_t i = 0; i < n; ++i)
            if (wr_tag(wcs[i].wr_id) == 1) on_recv_wc(wcs[i]);
            else on_send_wc(wcs[i]);
        return false;
    }, 200ms);
    if (flushed_at_end != static_cast<std::uint64_t>(o.qps) * o.depth)
        health.fail("teardown: " + std::to_string(flushed_at_end) + " receives flushed, want " +
                    std::to_string(o.qps * o.depth));
    if (cq->overruns() != 0) health.fail("client: CQ overruns");
    const std::uint64_t rss_end = rss_kib();
    for (auto& c : qs) c.id.reset(), c.qp.reset(), c.mr.reset();
    cq.reset();
    pd.reset();
    const std::string diff = pools_back(*ctx, baseline);
    if (!diff.empty()) health.fail("client pools not back to start: " + diff);
    if (mismatches != 0) health.fail("client: " + std::to_string(mismatches) + " mismatches, first: " + first_mismatch);
    if (wr_errors != 0) health.fail("client: " + std::to_string(wr_errors) + " WR errors");
    const auto rx = ctx->impl().port().rx_fault_counters(), tx = ctx->impl().port().tx_fault_counters();
    std::uint64_t consumed = 0, total = 0;
    for (auto& c : qs) consumed += c.k;
    for (auto d : done) total += d;
    std::string per_kind;
    for (int k = 0; k < kKinds; ++k) per_kind += std::string(" ") + kind_name[k] + "=" + std::to_string(done[k]);
    procs::report("figures ops=" + std::to_string(total) + per_kind + " consumed=" + std::to_string(consumed) +
                  " acks=" + std::to_string(acks_n) + " bytes=" + std::to_string(bytes) + " verified=" +
                  std::to_string(verified) + " words=" + std::to_string(words_checked) + " faults=" +
                  std::to_string(faults_sum(rx) + faults_sum(tx)) + " faults_rx=" + faults_text(rx) + " faults_tx=" +
                  faults_text(tx) + " rss_start=" + std::to_string(health.rss_start) + " rss_warm=" +
                  std::to_string(health.rss_warm) + " rss_max=" + std::to_string(health.rss_max_after) +
                  " rss_end=" + std::to_string(rss_end) + " allocs=" + std::to_string(health.allocs_after) + " seconds=" + std::to_string(static_cast<int>(health.elapsed())));
    if (!health.failure.empty()) {
        procs::report("internals " + internals_text(*ctx));
        procs::report("fail " + health.failure);
        return 1;
    }
    return 0;
}

// ================================================ parent ===================================================
std::map<std::string, std::string> figures(const std::string& report) {
    std::map<std::string, std::string> m;
    std::istringstream in(report);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("figures ", 0) != 0) continue;
        std::istringstream words(line.substr(8));
        std::string w;
        while (words >> w)
            if (const auto eq = w.find('='); eq != std::string::npos) m[w.substr(0, eq)] = w.substr(eq + 1);
    }
    return m;
}
std::vector<std::string> failures(const std::string& report) {
    std::vector<std::string> v;
    std::istringstream in(report);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("fail ", 0) == 0 || line.rfind("exception: ", 0) == 0) v.push_back(line);
    return v;
}
std::uint64_t num(const std::map<std::string, std::string>& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
            return argv[++i];
        };
        auto number = [&]() {
            const std::string v = value();
            char* end = nullptr;
            const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0') throw std::invalid_argument(a + ": not a number: " + v);
            return n;
        };
        if (a == "--seconds") o.seconds = static_cast<unsigned>(number());
        else if (a == "--minutes") o.seconds = static_cast<unsigned>(number() * 60);
        else if (a == "--qps") o.qps = static_cast<unsigned>(number());
        else if (a == "--depth") o.depth = static_cast<unsigned>(number());
        else if (a == "--seed") o.seed = number();
        else if (a == "--min-size") o.min_size = static_cast<std::uint32_t>(number());
        else if (a == "--max-size") o.max_size = static_cast<std::uint32_t>(number());
        else if (a == "--stall") o.stall_s = static_cast<unsigned>(number());
        else if (a == "--port") o.tcp_port = static_cast<std::uint16_t>(number());
        else if (a == "--self-test-corrupt") o.corrupt_self_test = true;
        else if (a == "--large-segments") o.large_segments = true;
        else if (a == "--mtu-segments") o.large_segments = false;
        else if (a == "--threading") {
            const std::string v = value();
            if (v == "rtc" || v == "run_to_completion") o.threading = ThreadingMode::run_to_completion;
            else if (v == "rx_thread") o.threading = ThreadingMode::rx_thread;
            else throw std::invalid_argument("--threading: rtc or rx_thread");
        } else if (a == "--faults") {
            const std::string v = value();
            if (v == "off") o.fault_rate = 0;
            else {
                char* end = nullptr;
                o.fault_rate = std::strtod(v.c_str(), &end);
                if (*end != '\0' || o.fault_rate < 0 || o.fault_rate > 0.2)
                    throw std::invalid_argument("--faults: a rate in [0, 0.2] or off");
            }
        } else if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            return false;
        } else {
            throw std::invalid_argument("unknown flag " + a);
        }
    }
    if (o.seconds == 0 || o.qps == 0 || o.qps > 256) throw std::invalid_argument("--seconds > 0, --qps in 1..256");
    if (o.depth == 0 || o.depth > 16) throw std::invalid_argument("--depth in 1..16 (the ORD/IRD agreed is 16)");
    if (o.min_size == 0 || o.min_size > o.max_size || o.max_size > (4u << 20))
        throw std::invalid_argument("sizes: 1 <= --min-size <= --max-size <= 4 MiB");
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    try {
        if (!parse(argc, argv, o)) return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "soak: %s\n%s", e.what(), usage);
        return 2;
    }
    softrdma::log::set_level(softrdma::log::Level::warn);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const char* mode = o.threading == ThreadingMode::rx_thread ? "rx_thread" : "rtc";
    std::printf("soak: %u s, %u QPs x depth %u, %s, sizes %u..%u B, faults %s, seed %" PRIu64 "%s\n", o.seconds,
                o.qps, o.depth, mode, o.min_size, o.max_size,
                o.fault_rate > 0 ? (std::to_string(o.fault_rate) + " each kind, both directions (client port)").c_str()
                                 : "off",
                o.seed, o.corrupt_self_test ? ", SELF-TEST: one SEND corrupted" : "");
    auto [server, client] = test::memif_pair();
    server.tcp_port = client.tcp_port = o.tcp_port;
    auto orphan_guard = [] { ::prctl(PR_SET_PDEATHSIG, SIGTERM); };
    const auto t0 = Clock::now();
    const auto out = procs::run(
        {{"server", [&, s = server] { orphan_guard(); return run_server(s, o); }},
         {"client", [&, c = client] { orphan_guard(); return run_client(c, o); }, 200ms}},
        {.timeout = std::chrono::seconds(o.seconds + 120), .grace_after_failure = std::chrono::seconds(90)});
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<std::string> why;
    for (const auto& r : out) {
        if (r.timed_out) why.push_back(r.name + " killed at its deadline");
        else if (r.exit_code != 0 && failures(r.report).empty())
            why.push_back(r.name + " ended with exit code " + std::to_string(r.exit_code));
        for (const auto& f : failures(r.report)) why.push_back(r.name + ": " + f);
    }
    const auto s = figures(out[0].report), c = figures(out[1].report);
    if (why.empty()) {
        if (s.empty() || c.empty()) why.push_back("a side reported no figures");
        else if (num(s, "consumed") != num(c, "consumed"))
            why.push_back("client sent " + std::to_string(num(c, "consumed")) + " SEND/WRITE_WITH_IMM messages, server received " +
                          std::to_string(num(s, "consumed")));
        else if (num(s, "acks") != num(c, "acks"))
            why.push_back("server sent " + std::to_string(num(s, "acks")) + " acks, client received " + std::to_string(num(c, "acks")));
    }
    const std::string ops = c.count("ops") ? c.at("ops") : "0";
#ifdef SOAK_COUNTS_ALLOCATIONS
    constexpr bool allocations_counted = true;
#else
    constexpr bool allocations_counted = false;
#endif
    char figs[1280];
    std::snprintf(figs, sizeof figs,
                  "%s, %.0f s, %u QPs: %s operations (send %s, send_imm %s, write_imm %s, write+read %s, read %s, "
                  "fetch_add %s, cmp_swap %s), client moved %s and verified %s, server verified %s, %s faults "
                  "injected (rx %s, tx %s), 0 lost; RSS client %" PRIu64 " -> %" PRIu64 " KiB (warm-up %" PRIu64
                  ", max %" PRIu64 "), server %" PRIu64 " -> %" PRIu64 " KiB; allocations after warm-up client %" PRIu64
                  ", server %" PRIu64 "%s; pools back to start",
                  mode, secs, o.qps, ops.c_str(), c.count("send") ? c.at("send").c_str() : "0",
                  c.count("send_imm") ? c.at("send_imm").c_str() : "0",
                  c.count("write_imm") ? c.at("write_imm").c_str() : "0",
                  c.count("write+read") ? c.at("write+read").c_str() : "0", c.count("read") ? c.at("read").c_str() : "0",
                  c.count("fetch_add") ? c.at("fetch_add").c_str() : "0",
                  c.count("cmp_swap") ? c.at("cmp_swap").c_str() : "0", mib(num(c, "bytes")).c_str(),
                  mib(num(c, "verified")).c_str(), mib(num(s, "verified")).c_str(),
                  c.count("faults") ? c.at("faults").c_str() : "0",
                  c.count("faults_rx") ? c.at("faults_rx").c_str() : "-",
                  c.count("faults_tx") ? c.at("faults_tx").c_str() : "-", num(c, "rss_start"), num(c, "rss_end"),
                  num(c, "rss_warm"), num(c, "rss_max"), num(s, "rss_start"), num(s, "rss_end"), num(c, "allocs"),
                  num(s, "allocs"), allocations_counted ? "" : " (not counted in sanitizer builds)");
    if (why.empty()) {
        std::printf("soak: PASS — %s\n", figs);
        return 0;
    }
    for (const auto& r : out)
        if (!r.report.empty()) std::printf("--- %s report:\n%s", r.name.c_str(), r.report.c_str());
    std::string all;
    for (const auto& w : why) all += (all.empty() ? "" : "; ") + w;
    std::printf("soak: FAIL — %s\n", all.c_str());
    return 1;
}
