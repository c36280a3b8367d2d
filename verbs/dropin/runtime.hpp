// SPDX-License-Identifier: MIT
// The drop-in libibverbs/librdmacm's process-wide state (internal): the configuration read from the
// environment (set by softrdma-run, or by hand), the one softrdma Context behind the one device "softrdma0",
// and the lock every verbs entry point takes.
//
// Progress. Stock programs only call verbs, never Context::poll(). So: every data-path call that can make
// progress runs one engine turn (ibv_post_send / ibv_post_recv push the work out at once, ibv_poll_cq polls
// the network before it reads the CQ), and every blocking call (ibv_get_cq_event, rdma_get_cm_event) polls
// while it waits. A program that waits on a channel's fd with poll/epoll, or spins on memory a peer writes, is
// served by the progress thread: when no verbs call has turned since its last wake-up it turns itself, every
// 8 us while its turns find frames (and 1 ms beyond), backing off to `progress_interval` (default 500 us)
// while they do not or while the application's own calls turn (Runtime::progress_loop). It runs off the core
// the engine is pinned to when the process may use another.
//
// Threads. libibverbs promises thread safety (rping runs its CM, CQ and main threads on one context); the
// engine is single-threaded. One mutex serializes every call into the engine; the thread holding it becomes
// the stack's owner for that call (uncontended: one atomic exchange each way). The C++ API
// (<softrdma/verbs.hpp>) has no lock.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <softrdma/log.hpp>
#include <softrdma/verbs.hpp>

namespace softrdma::dropin {

// The configuration: SOFTRDMA_CONFIG names a file of KEY=VALUE lines; SOFTRDMA_<KEY> variables override it.
// Keys (README "Unmodified verbs programs"): backend (memif | af_packet), memif_socket, memif_role (server |
// client), iface, ip, netmask, gateway, mac, mtu, threading (run_to_completion | rx_thread), hugepages (auto |
// on | off), lcores, max_qp, max_mr, link_timeout_ms, progress_interval_us, connect_retry_ms, peer_to_peer (on | off), log, crc (off |
// preferred | required), keepalive_idle_ms, keepalive_interval_ms, keepalive_probes, user_timeout_ms, stats (off | on), rfc7306 (off | on). Throws std::runtime_error with the offending key on anything unknown or malformed, or
// when nothing is configured at all.
struct Settings {
    verbs::ContextConfig context;
    // The longest gap between the progress thread's turns (key progress_interval_us; 0: no progress thread).
    std::chrono::microseconds progress_interval{500};
    // rdma_connect asks for RFC 6581 peer-to-peer mode (an RTR from the initiator), as the iWARP RNIC drivers
    // do by default (cxgb4's peer2peer=1): without it a responder may not send before the initiator has
    // (RFC 5044 section 7.1.2), and programs whose server speaks first (ucmatose, perftest's servers) stall.
    bool peer_to_peer{true};
    CrcPolicy crc{CrcPolicy::off};
    // rdma_connect to a port nobody listens on yet is tried again for this long (ConnParam::connect_retry):
    // two processes started together over memif meet only when both are up, and the client may get there
    // before the server's rdma_listen. Key connect_retry_ms.
    std::chrono::milliseconds connect_retry{5000};
    // Dead-peer detection of every connection (ConnParam::liveness; keys keepalive_idle_ms,
    // keepalive_interval_ms, keepalive_probes (0: off), user_timeout_ms (0: off)).
    verbs::Liveness liveness{};
    log::Level log{log::Level::warn};  // key log: the library's messages on stderr from this level up
    // RFC 7306 (immediate data, atomics) on every connection (ConnParam::rfc7306; key rfc7306, on | off).
    // Nothing in MPA carries the agreement, so both ends set it: between softrdma hosts, not toward siw or
    // Chelsio, which answer an RFC 7306 message with TERMINATE. On, the device reports IBV_ATOMIC_HCA.
    bool rfc7306{false};
    bool stats{false};  // key stats (on | off): one line of counters on stderr at exit (Runtime::print_stats)
};
Settings read_settings();

class Runtime {
public:
    // The process's runtime; opens the Context on first use. nullptr (with errno set and one message on
    // stderr, the first time) when it cannot.
    static Runtime* get() noexcept {
        if (Runtime* rt = instance_.load(std::memory_order_acquire)) return rt;
        return open();
    }
    // Whether a configuration exists at all (the device list is empty without one).
    static bool configured() noexcept;

    verbs::Context& ctx() noexcept { return *ctx_; }
    std::mutex& lock() noexcept { return mu_; }
    // Under lock(): makes the calling thread the engine's thread for this call, then one turn.
    void adopt() noexcept;
    unsigned turn() noexcept;
    void flush() noexcept;  // the TX part of a turn (Context::flush), then the hooks
    // After ibv_post_send. The first post since the last turn goes onto the wire at once (a ping-pong's
    // message: the application may not poll for a while, and receiving first would put a memif poll between
    // the post and the wire); further posts before the next turn wait for it (ibv_poll_cq, a blocking call or
    // the progress thread), so a stream of posts leaves in full segments rather than one frame per message.
    void flush_post() noexcept {
        if (posted_since_turn_) return;
        posted_since_turn_ = true;
        flush();
    }
    const Settings& settings() const noexcept { return settings_; }
    void shutdown() noexcept;
    // Work each library does after every turn, under the lock: libibverbs turns CQ events into channel events,
    // librdmacm sorts the Context's CM events onto their event channels. Control path (set once each), from any
    // thread and without the lock (each library's entry points call it): the slots are atomic, claimed once.
    using Hook = void (*)() noexcept;
    void add_after_turn(Hook h) noexcept {
        for (std::atomic<Hook>& slot : hooks_) {
            Hook cur = slot.load(std::memory_order_acquire);
            if (cur == nullptr && slot.compare_exchange_strong(cur, h, std::memory_order_acq_rel)) return;
            if (cur == h) return;  // already there (or another thread just put it there)
        }
    }

private:
    static Runtime* open() noexcept;
    // Never freed: other threads may still be inside a verbs call at exit. Read without a lock on every verbs
    // call (acquire: the Runtime it names is fully built); written once, under the opening lock.
    static std::atomic<Runtime*> instance_;

    explicit Runtime(const Settings& s);
    void print_stats() const noexcept;
    void progress_loop();

    Settings settings_;
    std::unique_ptr<verbs::Context> ctx_;
    std::mutex mu_;
    std::atomic<std::uint64_t> turns_{0};
    bool posted_since_turn_{false};  // under the lock
    std::atomic<bool> stop_{false};
    std::unique_ptr<std::thread> progress_;
    std::array<std::atomic<Hook>, 2> hooks_{};
};

// The shortest gap between the progress thread's turns, while its turns keep finding frames (runtime.cpp).
inline constexpr std::chrono::microseconds kMinProgressGap{8};
// How long after its last turn that found frames the progress thread keeps that shortest gap.
inline constexpr std::chrono::milliseconds kProgressHotWindow{1};

// Holds the runtime's lock and adopts the engine for the calling thread.
class Guard {
public:
    explicit Guard(Runtime& rt) : rt_(rt), lk_(rt.lock()) { rt_.adopt(); }
    Runtime& rt() noexcept { return rt_; }
    // Early, before a call that takes the lock itself (a synchronous rdma_cm id's wait for its event).
    void unlock() { lk_.unlock(); }

private:
    Runtime& rt_;
    std::unique_lock<std::mutex> lk_;
};

// Signals during a blocking call. The kernel's blocking verbs calls (ibv_get_cq_event, rdma_get_cm_event)
// sit in read(), which a signal handler interrupts with EINTR unless it was installed with SA_RESTART; qperf
// ends each timed test that way (SIGALRM sets its flag, the wait returns EINTR). A thread turning the engine
// in user space would run such a handler unnoticed, so while it waits its signals are blocked: between turns
// it looks for pending ones, takes them for itself, lets them run and then either fails the call
// with EINTR or, when every one had SA_RESTART, waits on. Constructed blocks every signal but those a fault
// raises on its own thread (SIGSEGV, SIGBUS...); destroyed restores the thread's mask.
class SignalWindow {
public:
    SignalWindow() noexcept;
    ~SignalWindow();
    SignalWindow(const SignalWindow&) = delete;
    SignalWindow& operator=(const SignalWindow&) = delete;
    // Runs the handlers of signals pending now; true when one of them should interrupt the call.
    bool interrupted() noexcept;

private:
    sigset_t old_{};
};

enum class Wait { done, timed_out, interrupted };

// Runs `step` under the lock, one engine turn at a time, until it returns true (done), `timeout` (negative:
// none) passes (timed_out) or a signal handler without SA_RESTART ran (interrupted: see SignalWindow);
// between turns the lock is released and the thread idles (spin, then sleep).
template <class Step>
Wait wait_for(Runtime& rt, int timeout_ms, Step&& step);

}  // namespace softrdma::dropin

#include <thread>

namespace softrdma::dropin {

// How long a waiting thread stays hot (turns back to back, yielding the core between them) after the last
// frame arrived: a peer in the middle of a ping-pong (a READ target waiting inside a blocking call, as
// perftest's read servers do) is served at once; one that has gone quiet costs a 20 us sleep per turn.
inline constexpr auto kHotWindow = std::chrono::milliseconds(1);

// Hot, the pending signals are looked at every kSignalCheckTurns turns (a system call each; a turn with its
// yield is ~1.5 us on the AMD VM); quiet, after every sleep.
inline constexpr unsigned kSignalCheckTurns = 8;

template <class Step>
Wait wait_for(Runtime& rt, int timeout_ms, Step&& step) {
    auto now = std::chrono::steady_clock::now();
    const auto deadline = now + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
    auto last_frame = now;
    // A blocking call keeps its signals blocked from its first turn on (two system calls): one arriving
    // during a turn is seen at the next look instead of running unnoticed, under the engine's lock.
    std::optional<SignalWindow> signals;
    if (timeout_ms != 0) signals.emplace();
    for (unsigned turns = 0;; ++turns) {
        {
            Guard g(rt);
            if (step()) return Wait::done;
            const unsigned frames = rt.turn();
            if (step()) return Wait::done;
            now = std::chrono::steady_clock::now();
            if (frames != 0) last_frame = now;
        }
        if (timeout_ms >= 0 && now >= deadline) return Wait::timed_out;
        // Two busy processes may share the cores: hot, give the core away between turns; quiet, sleep.
        const bool hot = now - last_frame < kHotWindow;
        if (hot) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (signals && (!hot || turns % kSignalCheckTurns == 0) && signals->interrupted()) return Wait::interrupted;
    }
}

}  // namespace softrdma::dropin
