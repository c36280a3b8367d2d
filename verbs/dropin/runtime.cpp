// SPDX-License-Identifier: MIT
#include "verbs/dropin/runtime.hpp"

#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string_view>

#include "verbs/engine.hpp"
#include <softrdma/diagnostics.hpp>
#include <softrdma/log.hpp>

namespace softrdma::dropin {
namespace {

std::string trim(std::string s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    const auto e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string{} : s.substr(b, e - b + 1);
}

constexpr const char* kKeys[] = {"backend",   "memif_socket", "memif_role",      "iface",         "ip",
                                 "netmask",   "gateway",      "mac",             "mtu",           "threading",
                                 "hugepages", "lcores",       "max_qp",          "max_mr",        "link_timeout_ms",
                                 "progress_interval_us", "connect_retry_ms", "peer_to_peer", "crc", "log",
                                 "keepalive_idle_ms", "keepalive_interval_ms", "keepalive_probes", "user_timeout_ms", "stats", "rfc7306"};

bool known(const std::string& k) {
    for (const char* n : kKeys)
        if (k == n) return true;
    return false;
}

// KEY=VALUE lines from SOFTRDMA_CONFIG, then SOFTRDMA_<KEY> from the environment.
std::map<std::string, std::string> gather() {
    std::map<std::string, std::string> kv;
    if (const char* path = std::getenv("SOFTRDMA_CONFIG"); path != nullptr && *path != '\0') {
        std::ifstream f(path);
        if (!f) throw std::runtime_error(std::string("SOFTRDMA_CONFIG: cannot read ") + path);
        std::string line;
        for (unsigned n = 1; std::getline(f, line); ++n) {
            line = trim(line.substr(0, line.find('#')));
            if (line.empty()) continue;
            const auto eq = line.find('=');
            if (eq == std::string::npos)
                throw std::runtime_error(std::string(path) + ":" + std::to_string(n) + ": not KEY=VALUE");
            std::string k = trim(line.substr(0, eq));
            for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            if (!known(k)) throw std::runtime_error(std::string(path) + ":" + std::to_string(n) + ": unknown key " + k);
            kv[k] = trim(line.substr(eq + 1));
        }
    }
    for (const char* k : kKeys) {
        std::string env = "SOFTRDMA_";
        for (const char* p = k; *p != '\0'; ++p) env += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
        if (const char* v = std::getenv(env.c_str()); v != nullptr) kv[k] = v;
    }
    return kv;
}

// KEY's value, a decimal number in [lo, hi] (the default when unset). strtoul alone would take "-1" (as its
// wrap-around) and the callers' narrowing would then wrap again: a value out of range is refused, naming both.
unsigned long number(const std::map<std::string, std::string>& kv, const std::string& k, unsigned long dflt,
                     unsigned long lo, unsigned long hi) {
    const auto it = kv.find(k);
    if (it == kv.end()) return dflt;
    const std::string& text = it->second;
    char* end = nullptr;
    errno = 0;
    const unsigned long v = std::strtoul(text.c_str(), &end, 10);
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])) || errno != 0 || *end != '\0')
        throw std::runtime_error(k + ": not a number: " + text);
    if (v < lo || v > hi)
        throw std::runtime_error(k + ": must be " + std::to_string(lo) + " .. " + std::to_string(hi) + ", not " + text);
    return v;
}

constexpr unsigned long kDayMs = 24ul * 3600 * 1000;  // the longest time a key takes, in ms

MacAddress parse_mac(const std::string& s) {
    MacAddress m{};
    unsigned b[6];
    if (std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]) != 6)
        throw std::runtime_error("mac: not aa:bb:cc:dd:ee:ff: " + s);
    for (int i = 0; i < 6; ++i) m[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(b[i]);
    return m;
}

std::atomic<bool> g_reported{false};
std::mutex g_open_mu;
bool g_open_failed = false;

}  // namespace

Settings read_settings() {
    const auto kv = gather();
    if (kv.find("backend") == kv.end() && kv.find("ip") == kv.end())
        throw std::runtime_error(
            "not configured: run the program under softrdma-run, or set SOFTRDMA_CONFIG (a file of KEY=VALUE "
            "lines) or SOFTRDMA_BACKEND and SOFTRDMA_IP");
    auto get = [&](const char* k, const std::string& dflt) {
        const auto it = kv.find(k);
        return it == kv.end() ? dflt : it->second;
    };
    Settings s;
    verbs::ContextConfig& cc = s.context;
    const std::string backend = get("backend", "memif");
    if (backend == "memif") {
        cc.port.backend = Backend::memif;
        cc.port.memif_socket = get("memif_socket", cc.port.memif_socket);
        const std::string role = get("memif_role", "");
        if (role != "server" && role != "client")
            throw std::runtime_error("memif_role: server or client (one end of the memif link is its server), not '" + role + "'");
        cc.port.memif_server = role == "server";
        // A server program (perftest's, rping -s, qperf's per-test child) opens its device and waits for a
        // client as long as it likes, as on a NIC: the memif server does not wait for its client's process.
        cc.port.wait_for_link = !cc.port.memif_server;
        // And a client follows its server through restarts (qperf's server forks a new memif server per test).
        cc.port.memif_reconnect = !cc.port.memif_server;
    } else if (backend == "af_packet") {
        cc.port.backend = Backend::af_packet;
        cc.port.iface = get("iface", "");
        if (cc.port.iface.empty()) throw std::runtime_error("iface: af_packet needs an interface");
    } else {
        throw std::runtime_error("backend: memif or af_packet, not '" + backend + "'");
    }
    const std::string ip = get("ip", "");
    if (ip.empty()) throw std::runtime_error("ip: this host's IPv4 address is needed");
    try {
        cc.ip.address = Ipv4::parse(ip);
        if (kv.count("netmask") != 0) cc.ip.netmask = Ipv4::parse(kv.at("netmask"));
        if (kv.count("gateway") != 0) cc.ip.gateway = Ipv4::parse(kv.at("gateway"));
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(std::string("ip/netmask/gateway: ") + e.what());
    }
    if (kv.count("mac") != 0) {
        cc.port.has_mac = true;
        cc.port.mac = parse_mac(kv.at("mac"));
    }
    cc.port.mtu = static_cast<std::uint16_t>(number(kv, "mtu", 1500, 576, 65535));  // the port checks its device's maximum
    cc.port.link_timeout = std::chrono::milliseconds(number(kv, "link_timeout_ms", 10000, 1, kDayMs));
    const std::string th = get("threading", "run_to_completion");
    if (th == "rx_thread") cc.threading.mode = ThreadingMode::rx_thread;
    else if (th != "run_to_completion") throw std::runtime_error("threading: run_to_completion or rx_thread, not '" + th + "'");
    cc.threading.rx_idle = {.spin_turns = 64, .then = IdlePolicy::Then::sleep, .sleep = std::chrono::microseconds(50)};
    const std::string hp = get("hugepages", "auto");
    if (hp == "off") cc.eal.hugepages = Hugepages::off;
    else if (hp == "on") cc.eal.hugepages = Hugepages::required;
    else if (hp != "auto") throw std::runtime_error("hugepages: auto, on or off, not '" + hp + "'");
    cc.eal.no_huge_memory_mb = 256;
    cc.eal.lcores = get("lcores", "");
    cc.max_qp = static_cast<std::uint32_t>(number(kv, "max_qp", 1024, 1, 65535));  // as the C++ API (ContextConfig): perftest -q N, N QPs
    cc.max_mr = static_cast<std::uint32_t>(number(kv, "max_mr", 1024, 1, (1u << 24) - 1));
    s.progress_interval = std::chrono::microseconds(number(kv, "progress_interval_us", 500, 0, 1000000));
    s.connect_retry = std::chrono::milliseconds(number(kv, "connect_retry_ms", 5000, 0, kDayMs));
    const verbs::Liveness dl{};
    s.liveness.keepalive_idle = std::chrono::milliseconds(number(kv, "keepalive_idle_ms", static_cast<unsigned long>(dl.keepalive_idle.count()), 1, kDayMs));
    s.liveness.keepalive_interval =
        std::chrono::milliseconds(number(kv, "keepalive_interval_ms", static_cast<unsigned long>(dl.keepalive_interval.count()), 1, kDayMs));
    s.liveness.keepalive_probes = static_cast<unsigned>(number(kv, "keepalive_probes", dl.keepalive_probes, 0, 1000));
    s.liveness.user_timeout = std::chrono::milliseconds(number(kv, "user_timeout_ms", static_cast<unsigned long>(dl.user_timeout.count()), 0, kDayMs));
    const std::string lv = get("log", "warn");  // the program's own output stays readable: warnings and errors
    bool found = false;
    for (auto l : {log::Level::trace, log::Level::debug, log::Level::info, log::Level::warn, log::Level::error, log::Level::off})
        if (lv == log::to_string(l)) {
            s.log = l;
            found = true;
        }
    if (!found) throw std::runtime_error("log: trace, debug, info, warn, error or off, not '" + lv + "'");
    const std::string p2p = get("peer_to_peer", "on");
    if (p2p != "on" && p2p != "off") throw std::runtime_error("peer_to_peer: on or off, not '" + p2p + "'");
    s.peer_to_peer = p2p == "on";
    const std::string r7306 = get("rfc7306", "off");
    if (r7306 != "on" && r7306 != "off") throw std::runtime_error("rfc7306: on or off, not '" + r7306 + "'");
    s.rfc7306 = r7306 == "on";
    const std::string stats = get("stats", "off");
    if (stats != "on" && stats != "off") throw std::runtime_error("stats: on or off, not '" + stats + "'");
    s.stats = stats == "on";
    const std::string crc = get("crc", "off");
    if (crc == "preferred") s.crc = CrcPolicy::preferred;
    else if (crc == "required") s.crc = CrcPolicy::required;
    else if (crc != "off") throw std::runtime_error("crc: off, preferred or required, not '" + crc + "'");
    return s;
}

bool Runtime::configured() noexcept {
    try {
        (void)read_settings();
        return true;
    } catch (const std::exception& e) {
        if (!g_reported.exchange(true)) std::fprintf(stderr, "softrdma: %s\n", e.what());
        return false;
    }
}

std::atomic<Runtime*> Runtime::instance_{nullptr};

Runtime* Runtime::open() noexcept {
    std::lock_guard<std::mutex> lk(g_open_mu);
    if (Runtime* rt = Runtime::instance_.load(std::memory_order_acquire)) return rt;
    if (g_open_failed) {
        errno = ENODEV;
        return nullptr;
    }
    try {
        auto* rt = new Runtime(read_settings());
        Runtime::instance_.store(rt, std::memory_order_release);
        std::atexit([] { Runtime::instance_.load(std::memory_order_acquire)->shutdown(); });
        return rt;
    } catch (const std::exception& e) {
        g_open_failed = true;
        if (!g_reported.exchange(true)) std::fprintf(stderr, "softrdma: cannot open device softrdma0: %s\n", e.what());
        errno = ENODEV;
        return nullptr;
    }
}

Runtime::Runtime(const Settings& s) : settings_(s) {
    log::set_level(s.log);
    // Every thread the library starts (DPDK's interrupt and control threads, the link watcher, the RX thread,
    // the progress thread below) inherits a mask blocking all signals: a signal meant for the program goes to
    // the program's own threads, as with the kernel's libraries, which start none. Otherwise SIGALRM (qperf's
    // end of test) could run its handler on one of ours while the program's thread waits in
    // ibv_get_cq_event and never learns of it (SignalWindow). The caller's mask is back when this returns.
    const SignalWindow inherited;
    // The cores this process may use, before the EAL pins the calling thread to its lcore.
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed);
    ctx_ = verbs::Context::open(s.context);
    if (s.progress_interval.count() <= 0) return;
    // The progress thread stays off the core the engine was pinned to when another is allowed: each wake-up
    // there would preempt the very thread it is meant to help.
    cpu_set_t pinned;
    CPU_ZERO(&pinned);
    pthread_getaffinity_np(pthread_self(), sizeof pinned, &pinned);
    cpu_set_t others;
    CPU_XOR(&others, &allowed, &pinned);
    CPU_AND(&others, &others, &allowed);
    const cpu_set_t where = CPU_COUNT(&others) > 0 ? others : allowed;
    progress_ = std::make_unique<std::thread>([this, where] {
        pthread_setaffinity_np(pthread_self(), sizeof where, &where);
        // Sleeps as long as asked: the default timer slack (50 us) would stretch each 100 us interval by half.
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        progress_loop();
    });
}

// At exit: connections still open are reset, those ending in order get their FIN (close_linger). The lock is
// kept: a thread still calling verbs waits on it until the process is gone.
void Runtime::shutdown() noexcept {
    stop_ = true;
    if (progress_) progress_->join();
    mu_.lock();
    adopt();
    if (settings_.stats) print_stats();
    ctx_.reset();
}

// One line on stderr: what the stack and the port moved, and how (key stats).
void Runtime::print_stats() const noexcept {
    const StackCounters s = verbs::diagnostics::stack(*ctx_);
    const PortCounters p = verbs::diagnostics::port(*ctx_);
    auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
    std::fflush(stdout);  // after the program's own output (exit() flushes stdio only after the atexit handlers)
    std::fprintf(stderr,
                 "softrdma: stats: frames rx %llu tx %llu (tx refused by the ring %llu, dropped %llu, deferred %llu); "
                 "TCP payload copied by lwIP %llu, copied into mbufs %llu, sent from application memory %llu\n",
                 u(s.rx_frames), u(s.tx_frames), u(p.tx_refused), u(s.tx_dropped), u(s.tx_deferred), u(s.tx_copied_in),
                 u(s.tx_copied_out), u(s.tx_from_source));
}

// The signals a fault raises on the thread that faulted: never blocked (a fault raising a blocked one kills
// the process outright, before DPDK's SIGBUS recovery while it maps hugepages or a sanitizer's report), and
// never meant for another thread.
constexpr int kSynchronous[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};

SignalWindow::SignalWindow() noexcept {
    sigset_t all;
    sigfillset(&all);  // glibc keeps its own internal signals out of it
    for (int sig : kSynchronous) sigdelset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &old_);
}

SignalWindow::~SignalWindow() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

// Pending signals are taken off the queues (sigtimedwait, so another thread waiting the same way does not see
// a process-directed one too, as only one thread's read() would end), sent again to this thread alone
// (rt_tgsigqueueinfo, with what they carried) and let through: their handlers run here, outside the engine's
// lock, before the mask is set back. A signal arriving meanwhile stays blocked and pending for the next look.
bool SignalWindow::interrupted() noexcept {
    sigset_t pending;
    if (sigpending(&pending) != 0) return false;
    sigset_t ours;
    sigemptyset(&ours);
    bool any = false;
    for (int sig = 1; sig < NSIG; ++sig)
        if (sigismember(&pending, sig) == 1 && sigismember(&old_, sig) != 1) {  // not blocked by the caller
            sigaddset(&ours, sig);
            any = true;
        }
    if (!any) return false;
    constexpr unsigned kTake = 16;  // more queued real-time signals wait for the next look
    siginfo_t taken[kTake];
    unsigned n = 0;
    const timespec now{};
    while (n < kTake) {
        siginfo_t si{};
        if (sigtimedwait(&ours, &si, &now) <= 0) break;
        taken[n++] = si;
    }
    const pid_t pid = ::getpid(), tid = static_cast<pid_t>(::syscall(SYS_gettid));
    sigset_t let;
    sigemptyset(&let);
    bool restart = true;
    for (unsigned i = 0; i < n; ++i) {
        const int sig = taken[i].si_signo;
        if (::syscall(SYS_rt_tgsigqueueinfo, pid, tid, sig, &taken[i]) != 0) continue;
        sigaddset(&let, sig);
        // Only a handler of the program's without SA_RESTART ends a read(); a default action either ends the
        // process, stops it (the read goes on after) or ignores the signal.
        struct sigaction sa{};
        const bool handler = sigaction(sig, nullptr, &sa) == 0 &&
                             ((sa.sa_flags & SA_SIGINFO) != 0 || (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN));
        if (handler && (sa.sa_flags & SA_RESTART) == 0) restart = false;
    }
    if (n == 0) return false;  // another thread took them first
    pthread_sigmask(SIG_UNBLOCK, &let, nullptr);  // delivered before this call returns
    pthread_sigmask(SIG_BLOCK, &let, nullptr);
    return !restart;
}

void Runtime::adopt() noexcept { ctx_->impl().adopt_thread(); }

unsigned Runtime::turn() noexcept {
    posted_since_turn_ = false;
    // Under the lock: only one thread writes it (no locked add); the progress thread only reads.
    turns_.store(turns_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const unsigned frames = ctx_->poll();
    for (const std::atomic<Hook>& slot : hooks_)
        if (Hook h = slot.load(std::memory_order_acquire); h != nullptr) h();
    return frames;
}

void Runtime::flush() noexcept {
    ctx_->flush();
    for (const std::atomic<Hook>& slot : hooks_)
        if (Hook h = slot.load(std::memory_order_acquire); h != nullptr) h();
}

// Turns on behalf of programs that are not calling verbs: one waiting on a channel's fd with poll/epoll, one
// spinning on memory a peer WRITEs (ib_write_lat). It wakes every `gap`:
//  - the application turned since the last wake-up: the turn is left to it;
//  - otherwise it turns. Finding frames brings the gap down to kMinProgressGap: someone relies on these turns
//    (a memory spinner's peer is replying), and for kProgressHotWindow after the last frame it found the gap
//    stays there. Outside that window each wake-up lengthens it (slowly to 8 times the shortest, doubling
//    when the application turned, then up to progress_interval): a program polling its CQ hard sees one
//    cheap wake-up per progress_interval.
// The shortest gap is a measured compromise on a machine whose cores are all busy: 8 us (13 us with the
// sleep's own cost) served ib_write_lat at 22 us half round trip, 2 us made the thread a CPU hog (400 us).
void Runtime::progress_loop() {
    using clock = std::chrono::steady_clock;
    const auto longest = settings_.progress_interval;
    auto gap = longest;
    auto last_found = clock::now() - kProgressHotWindow;
    std::uint64_t seen = turns_.load(std::memory_order_relaxed);
    while (!stop_.load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(gap);
        if (const std::uint64_t now = turns_.load(std::memory_order_relaxed); now != seen) {
            seen = now;
            if (clock::now() - last_found >= kProgressHotWindow) gap = std::min(gap * 2, longest);
            continue;
        }
        bool found = false;
        if (std::unique_lock<std::mutex> lk(mu_, std::try_to_lock); lk.owns_lock()) {
            adopt();
            found = turn() != 0;
            seen = turns_.load(std::memory_order_relaxed);
        }
        const auto now = clock::now();
        if (found) {
            gap = kMinProgressGap;
            last_found = now;
        } else if (now - last_found >= kProgressHotWindow) {
            gap = std::min(gap < 8 * kMinProgressGap ? gap + kMinProgressGap : gap * 2, longest);
        }
    }
}

}  // namespace softrdma::dropin
