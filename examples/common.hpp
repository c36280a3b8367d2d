// SPDX-License-Identifier: MIT
// Plumbing shared by the examples, kept apart so that each example file shows only the RDMA part:
//   - the command line of the network side (role, backend, addresses, hugepages, timeout);
//   - the verbs::ContextConfig for one end;
//   - the --local runner: both ends on this machine, each in its own forked process, over DPDK memif;
//   - bounded waits (every wait in the examples ends, with an error, after a time limit);
//   - latency statistics (percentiles of preallocated samples).
#pragma once

#include <endian.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/idle.hpp"
#include "base/processes.hpp"
#include "io/eal.hpp"
#include <softrdma/diagnostics.hpp>
#include <softrdma/log.hpp>
#include <softrdma/verbs.hpp>

namespace examples {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace verbs = softrdma::verbs;

// ---- the network side of the command line ---------------------------------------------------------------
enum class Role { local, server, client };

struct NetOptions {
    Role role = Role::local;          // no --server/--client: both ends here (--local)
    std::string memif_socket = "/run/softrdma-memif.sock";  // memif (default backend): shared by both ends
    std::string af_packet;            // --af-packet IFACE: a Linux interface instead of memif
    std::string ip;                   // this end's IPv4 address ("" = 198.18.0.1 server, .2 client)
    std::string peer_ip;              // client: the server's address ("" = 198.18.0.1)
    std::uint16_t port = 7471;        // TCP port the server listens on (MPA runs over it)
    bool no_huge = false;             // run DPDK without hugepages
    std::string lcores;               // DPDK core list for this process ("" = core 0)
    unsigned timeout_s = 60;          // every wait ends with an error after this
    bool local_child = false;         // set by run_local: this process is one end of --local
    // run_to_completion: one thread does everything inside Context::poll(); rx_thread: a dedicated thread
    // polls DPDK and copies frames in, the application thread runs the protocol and TX.
    softrdma::ThreadingMode threading = softrdma::ThreadingMode::run_to_completion;
};

inline std::string net_usage(const NetOptions& defaults) {
    return "  --local                 both ends on this machine over memif (default)\n"
           "  --server | --client     one end; run the other with the other flag\n"
           "  --memif PATH            memif socket shared by both ends (default /run/softrdma-memif.sock)\n"
           "  --af-packet IFACE       use a Linux interface (veth, tap, NIC) instead of memif\n"
           "  --ip A.B.C.D            this end's address (default 198.18.0.1 server, 198.18.0.2 client)\n"
           "  --peer-ip A.B.C.D       client: the server's address (default 198.18.0.1)\n"
           "  --port N                TCP port of the server (default " + std::to_string(defaults.port) + ")\n"
           "  --lcores LIST           DPDK cores for this process (default: 0; --local uses 0 and 1)\n"
           "  --no-huge               run DPDK without hugepages\n"
           "  --timeout S             give up after S seconds without progress (default 60)\n";
}

// Walks argv; the example's own flags are tried first (its callback returns true when it took argv[i],
// advancing i past a value), then the network flags. Throws std::invalid_argument on anything unknown.
class Args {
public:
    Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
    // The value after argv[i] (and moves i onto it).
    const char* value(int& i) const {
        if (i + 1 >= argc_) throw std::invalid_argument(std::string(argv_[i]) + " needs a value");
        return argv_[++i];
    }
    unsigned long number(int& i) const {
        const char* v = value(i);
        char* end = nullptr;
        const unsigned long n = std::strtoul(v, &end, 10);
        if (end == v || *end != '\0') throw std::invalid_argument(std::string(argv_[i - 1]) + ": not a number: " + v);
        return n;
    }
    void parse(NetOptions& net, const std::function<bool(const std::string&, int&)>& own) const {
        for (int i = 1; i < argc_; ++i) {
            const std::string a = argv_[i];
            if (own(a, i)) continue;
            if (a == "--local") net.role = Role::local;
            else if (a == "--server") net.role = Role::server;
            else if (a == "--client") net.role = Role::client;
            else if (a == "--memif") net.memif_socket = value(i);
            else if (a == "--af-packet") net.af_packet = value(i);
            else if (a == "--ip") net.ip = value(i);
            else if (a == "--peer-ip") net.peer_ip = value(i);
            else if (a == "--port") net.port = static_cast<std::uint16_t>(number(i));
            else if (a == "--lcores") net.lcores = value(i);
            else if (a == "--no-huge") net.no_huge = true;
            else if (a == "--timeout") net.timeout_s = static_cast<unsigned>(std::max(1ul, number(i)));
            else throw std::invalid_argument("unknown flag " + a);
        }
        if (net.role == Role::local && !net.af_packet.empty())
            throw std::invalid_argument("--local runs over memif; use --server/--client with --af-packet");
    }

private:
    int argc_;
    char** argv_;
};

// The Context of one end: port (memif or af_packet), EAL, lwIP address. Small tables: one QP, a few MRs.
inline verbs::ContextConfig context_config(const NetOptions& o) {
    const bool server = o.role == Role::server;
    verbs::ContextConfig cc;
    if (o.af_packet.empty()) {
        cc.port.backend = softrdma::Backend::memif;
        cc.port.memif_socket = o.memif_socket;
        cc.port.memif_server = server;  // one end of a memif link is its server (it creates the socket)
    } else {
        cc.port.backend = softrdma::Backend::af_packet;
        cc.port.iface = o.af_packet;
    }
    cc.port.link_timeout = std::chrono::seconds(std::min(o.timeout_s, 30u));
    cc.eal.lcores = o.lcores;
    cc.eal.hugepages = o.no_huge ? softrdma::Hugepages::off : softrdma::Hugepages::automatic;
    cc.eal.no_huge_memory_mb = 256;
    cc.ip.address = softrdma::Ipv4::parse(!o.ip.empty() ? o.ip : server ? "198.18.0.1" : "198.18.0.2");
    cc.max_mr = 16;
    cc.max_qp = 4;
    cc.threading.mode = o.threading;  // the RX thread (if any) goes on any core; it yields when idle
    return cc;
}

inline softrdma::Ipv4 peer_address(const NetOptions& o) {
    return softrdma::Ipv4::parse(o.peer_ip.empty() ? "198.18.0.1" : o.peer_ip);
}

// ---- bounded waits -------------------------------------------------------------------------------------
// The examples' idle policy: with one thread per process (run to completion) each process has a core and
// spins. With an RX thread, that thread needs a core too and this machine may have fewer cores than busy
// threads, so after 64 turns that received nothing a turn also yields the core.
inline softrdma::IdlePolicy idle_policy(const verbs::Context& ctx) {
    return ctx.threading_mode() == softrdma::ThreadingMode::rx_thread ? softrdma::IdlePolicy{.spin_turns = 64}
                                                                        : softrdma::IdlePolicy::spin_only();
}

// One turn of the polling loop (Context::poll: RX, protocol, TX) under that policy. Returns the frames received.
inline unsigned poll_turn(verbs::Context& ctx, softrdma::Idler& idle) noexcept {
    const unsigned frames = ctx.poll();
    idle.after(frames != 0);
    return frames;
}

// Polls until done() or the deadline. A template, not a std::function, so the data path builds nothing on
// the heap. The clock is read every 64 turns. done() may throw (a wrong completion, an unexpected event): the
// exception reaches the caller.
template <class Done>
bool poll_until(verbs::Context& ctx, Done&& done, Clock::time_point deadline) {
    softrdma::Idler idle(idle_policy(ctx));
    for (unsigned turn = 0;; ++turn) {
        if (done()) return true;
        if ((turn & 63) == 0 && Clock::now() >= deadline) return done();
        poll_turn(ctx, idle);
    }
}

// After the disconnected event: keep polling until TCP has finished closing (our FIN out, the peer's FIN
// acknowledged), at most 2 s. The event comes as soon as the QP is done with the connection; a process
// that stopped polling right then could leave with its FIN unsent, and the peer would never hear of the end.
inline void finish_close(verbs::Context& ctx) {
    poll_until(ctx, [&] { return softrdma::verbs::diagnostics::tcp_connections(ctx) == 0; }, Clock::now() + 2s);
}



// ---- connections that survive what they do not expect -----------------------------------------------------
// A peer is not always the program we expect: stock rping, ucmatose and perftest send no MPA private data, a
// second client may knock while a session runs, a client may reset right after its request. Servers refuse
// what they cannot serve with an MPA reject carrying the reason as private data (the initiator can print it;
// a reset would tell it nothing), keep serving their session, and go back to waiting when a client vanished
// before its session began. Clients close in order (a FIN) when the reply is not what they expect.

// A peer's private data for a message: its text when it is printable (an MPA reject's reason), else a
// description of its bytes.
inline std::string private_data_text(const softrdma::PrivateData& pd) {
    if (pd.size == 0) return "no private data";
    std::string text;
    for (std::size_t i = 0; i < pd.size; ++i) {
        const auto c = static_cast<unsigned char>(pd.bytes[i]);
        if (c == 0 && i + 1 == pd.size) break;  // a C string's NUL
        if (c < 0x20 || c > 0x7e) return std::to_string(pd.size) + " bytes of binary private data";
        text += static_cast<char>(c);
    }
    return "\"" + text + "\"";
}

// Rejects a connect request with `why` (prefixed by the program's name) as MPA private data, and says so.
inline void refuse(verbs::CmEvent& req, const std::string& program, const std::string& why) {
    const std::string text = program + ": " + why;
    const auto n = std::min<std::size_t>(text.size(), 252);  // MPA revision 2 carries at most 252 bytes
    std::fprintf(stderr, "%s: refused a connection from %s: %s\n", program.c_str(),
                 req.request ? req.request->peer().c_str() : "?", why.c_str());
    if (req.request && !req.request->reject({reinterpret_cast<const std::byte*>(text.data()), n}))
        std::fprintf(stderr, "%s: the reject could not be sent (the request was already answered)\n", program.c_str());
}

// The next CM event about `mine` (nullptr: any event), handling the others: a connect request is refused
// ("busy": this program serves one connection at a time) and events of other connections are dropped.
// Does not poll.
inline std::optional<verbs::CmEvent> take_event(verbs::Context& ctx, const verbs::CmId* mine, const std::string& program) {
    while (auto ev = ctx.get_cm_event()) {
        if (ev->type == verbs::CmEventType::connect_request) {
            refuse(*ev, program, "busy with another connection");
            continue;
        }
        if (mine != nullptr && ev->id != mine) continue;  // a connection we already gave up on
        return ev;
    }
    return std::nullopt;
}

// Polls until an event about `mine` arrives (others handled as take_event does), or the deadline.
inline std::optional<verbs::CmEvent> wait_event(verbs::Context& ctx, const verbs::CmId* mine, const std::string& program,
                                                Clock::time_point deadline) {
    std::optional<verbs::CmEvent> got;
    poll_until(ctx, [&] { return (got = take_event(ctx, mine, program)).has_value(); }, deadline);
    return got;
}

// Server: waits until the deadline for a connect request that `check` accepts (it returns "" to accept, or
// why not, e.g. "expected 16 bytes of private data, got 0 (stock rping/ucmatose/perftest send none)"). Requests
// it refuses get an MPA reject with that reason; failures of requests already given up are ignored.
inline verbs::CmEvent next_client(verbs::Context& ctx, const std::string& program, Clock::time_point deadline,
                                  const std::function<std::string(const verbs::CmEvent&)>& check) {
    for (;;) {
        std::optional<verbs::CmEvent> ev;
        poll_until(ctx, [&] {
            while (auto e = ctx.get_cm_event())
                if (e->type == verbs::CmEventType::connect_request) {
                    ev = std::move(e);
                    return true;
                }
            return false;
        }, deadline);
        if (!ev) throw std::runtime_error("no client connected in time");
        const std::string why = check(*ev);
        if (why.empty()) return std::move(*ev);
        refuse(*ev, program, why);
    }
}

// Server, after accept(): waits for `id` to be established. False (with a line saying why) when the client
// went away first (a reset right after its request, a failed negotiation): the caller waits for another.
inline bool established(verbs::Context& ctx, const verbs::CmId& id, const std::string& program, std::chrono::seconds limit) {
    auto ev = wait_event(ctx, &id, program, Clock::now() + limit);
    if (ev && ev->type == verbs::CmEventType::established) return true;
    std::fprintf(stderr, "%s: the client at %s went away before its session began (%s%s%s); waiting for another\n",
                 program.c_str(), id.peer().c_str(), ev ? verbs::to_string(ev->type) : "no event in time",
                 ev && !ev->reason.empty() ? ": " : "", ev ? ev->reason.c_str() : "");
    return false;
}

// Client: waits for the connection; anything else throws with what the server said (a reject's reason).
inline verbs::CmEvent expect_established(verbs::Context& ctx, const verbs::CmId& id, const std::string& program,
                                         std::chrono::seconds limit) {
    auto ev = wait_event(ctx, &id, program, Clock::now() + limit);
    if (!ev) throw std::runtime_error("no answer from the server within " + std::to_string(limit.count()) + " s");
    switch (ev->type) {
    case verbs::CmEventType::established: return std::move(*ev);
    case verbs::CmEventType::rejected:
        throw std::runtime_error("the server at " + id.peer() + " rejected the connection: " +
                                 private_data_text(ev->private_data));
    default:
        throw std::runtime_error(std::string("connection failed: ") + verbs::to_string(ev->type) +
                                 (ev->reason.empty() ? "" : " (" + ev->reason + ")"));
    }
}

// Ends a connection in order: disconnect (our queued sends still go out), wait for the disconnected event,
// then for TCP's close.
inline void disconnect(verbs::Context& ctx, verbs::CmId& id, const std::string& program, std::chrono::seconds limit) {
    id.disconnect();
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
        auto ev = wait_event(ctx, &id, program, deadline);
        if (ev && ev->type == verbs::CmEventType::disconnected) return finish_close(ctx);
    }
    throw std::runtime_error("no disconnected event after disconnect()");
}

// Ends a session in order after an error of our own (a FIN, not a reset), bounded; never throws.
inline void close_quietly(verbs::Context& ctx, verbs::CmId* id, const std::string& program) noexcept {
    try {
        if (id == nullptr || !id->connected()) return;
        id->disconnect();
        const auto deadline = Clock::now() + 2s;
        while (Clock::now() < deadline) {
            auto ev = wait_event(ctx, id, program, deadline);
            if (!ev || ev->type == verbs::CmEventType::disconnected) break;
        }
        poll_until(ctx, [&] { return softrdma::verbs::diagnostics::tcp_connections(ctx) == 0; }, Clock::now() + 1s);
    } catch (...) {
    }
}

// ---- big-endian fields of the private-data / message layouts -------------------------------------------
inline std::uint64_t to_be(std::uint64_t v) { return htobe64(v); }
inline std::uint32_t to_be(std::uint32_t v) { return htobe32(v); }
inline std::uint64_t from_be(std::uint64_t v) { return be64toh(v); }
inline std::uint32_t from_be(std::uint32_t v) { return be32toh(v); }

template <class T>
std::span<const std::byte> bytes_of(const T& t) {
    return {reinterpret_cast<const std::byte*>(&t), sizeof t};
}
// A fixed-layout struct from a peer's private data; nullopt when the size is not the struct's.
template <class T>
std::optional<T> from_private_data(const softrdma::PrivateData& pd) {
    if (pd.size != sizeof(T)) return std::nullopt;
    T t{};
    std::memcpy(&t, pd.bytes.data(), sizeof t);
    return t;
}

// What a program says when a peer's private data is not its own: the sizes, and the likely cause.
inline std::string unexpected_private_data(const softrdma::PrivateData& pd, std::size_t want, const char* what) {
    return "expected " + std::to_string(want) + " bytes of private data (" + what + "), got " +
           (pd.size == 0 ? std::string("none (stock rping, ucmatose and perftest send none: another program on this port?)")
                         : private_data_text(pd));
}

// ---- latency statistics ------------------------------------------------------------------------------------
// Samples in microseconds. reserve() at setup; add() on the data path never allocates.
class Latency {
public:
    explicit Latency(std::size_t n) { us_.reserve(n); }
    void add(Clock::duration d) noexcept {
        if (us_.size() < us_.capacity()) us_.push_back(std::chrono::duration<double, std::micro>(d).count());
    }
    // Prints the title, then one line per statistic: iterations, min, p50, p90, p99, p99.9, max (µs).
    // Percentiles by nearest rank: the smallest sample with at least p % of the samples at or below it.
    void print(const std::string& title) {
        std::sort(us_.begin(), us_.end());
        std::printf("%s\n", title.c_str());
        std::printf("  %-10s %10zu\n", "iterations", us_.size());
        if (us_.empty()) return;
        auto pct = [&](double p) {
            const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(us_.size())));
            return us_[std::clamp<std::size_t>(rank, 1, us_.size()) - 1];
        };
        const std::pair<const char*, double> rows[] = {{"min", us_.front()}, {"p50", pct(50)},   {"p90", pct(90)},
                                                       {"p99", pct(99)},     {"p99.9", pct(99.9)}, {"max", us_.back()}};
        for (const auto& [name, v] : rows) std::printf("  %-10s %10.2f us\n", name, v);
        std::fflush(stdout);
    }

private:
    std::vector<double> us_;
};

// ---- --local: both ends on this machine --------------------------------------------------------------------
// Runs `server` and `client` each in its own forked process (each has its own DPDK EAL, port and lwIP stack,
// as two machines would), joined by a fresh memif socket; cores 0 and 1. Waits for both, at most
// net.timeout_s + 15 s; a process still running then is killed. If one end fails, the other gets 5 s to
// notice before it is killed. Returns 0 when both ends returned 0, else 1.
inline int run_local(NetOptions net, const std::function<int(const NetOptions&)>& server,
                     const std::function<int(const NetOptions&)>& client) {
    // Checked once here so the message appears once, not in each process.
    if (!net.no_huge && !softrdma::io::hugepages_available()) {
        std::printf("note: no free hugepages (scripts/setup reserves them); running DPDK with --no-huge\n");
        net.no_huge = true;
    }
    const std::string dir = ::access("/run", W_OK) == 0 ? "/run" : "/tmp";
    net.memif_socket = dir + "/softrdma-example-" + std::to_string(::getpid()) + ".sock";
    const bool two_cores = std::thread::hardware_concurrency() >= 2;
    auto end = [&](Role r, const char* core) {
        NetOptions mine = net;
        mine.role = r;
        mine.local_child = true;
        mine.lcores = core;
        return mine;
    };
    const NetOptions s = end(Role::server, "0"), c = end(Role::client, two_cores ? "1" : "0");
    // The memif server creates the socket first; a failing end prints its own error (echo_exceptions).
    const auto out = softrdma::procs::run({{"server", [&] { return server(s); }},
                                           {"client", [&] { return client(c); }, 200ms}},
                                          {.timeout = std::chrono::seconds(net.timeout_s + 15),
                                           .grace_after_failure = 5s,
                                           .echo_exceptions = true});
    ::unlink(net.memif_socket.c_str());
    int rc = 0;
    for (const auto& o : out) {
        if (o.exit_code == 0) continue;
        if (o.timed_out) std::fprintf(stderr, "%s: still running at the time limit or 5 s after its peer failed; killed\n", o.name.c_str());
        else if (o.exit_code > 128) std::fprintf(stderr, "%s ended by signal %d\n", o.name.c_str(), o.exit_code - 128);
        else std::fprintf(stderr, "%s exited with %d\n", o.name.c_str(), o.exit_code);
        rc = 1;
    }
    return rc;
}

// main() of every example: parse, then run the role (or both), turning exceptions into exit code 1 and bad
// flags into 2 with the usage text.
inline int run_main(int argc, char** argv, const char* usage, NetOptions& net,
                    const std::function<bool(const Args&, const std::string&, int&)>& own_flag,
                    const std::function<int(const NetOptions&)>& server,
                    const std::function<int(const NetOptions&)>& client) {
    softrdma::log::set_level(softrdma::log::Level::warn);  // the port and stack coming up are info lines
    bool help = false;
    try {
        Args args(argc, argv);
        args.parse(net, [&](const std::string& a, int& i) {
            if (a == "-h" || a == "--help") {
                help = true;
                throw std::invalid_argument("");
            }
            return own_flag(args, a, i);
        });
    } catch (const std::invalid_argument& e) {
        if (e.what()[0] != '\0') std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
        std::fprintf(help ? stdout : stderr, "usage: %s %s\n%s", argv[0], usage, net_usage(net).c_str());
        return help ? 0 : 2;
    }
    try {
        switch (net.role) {
        case Role::local: return run_local(net, server, client);
        case Role::server: return server(net);
        case Role::client: return client(net);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    }
    return 1;
}

}  // namespace examples
