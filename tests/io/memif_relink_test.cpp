// SPDX-License-Identifier: MIT
// A memif server that opens without waiting for its client (PortConfig::wait_for_link off), and a memif client
// that follows its server through restarts (PortConfig::memif_reconnect): what qperf's server needs, which
// forks a child per test, each opening a new memif server on the same socket that the one client process
// must reach (io::Port::watch_link). One long-lived client process; a server process per round, forked one
// after another. Each round the client sends a numbered frame and the server answers it; then the server
// closes and exits and the client, seeing the link go down, must reach the next one by itself. The first
// server opens before the client exists and must return from opening with the link still down. Without
// memif_reconnect the client stays down after the first server leaves (checked too).
//
// A server that closed while its client kept reconnecting must go quiet: DPDK 22.11 leaves the listening socket
// bound with its interrupt callback on a freed socket, and a client waiting in its backlog had the server process
// spend a whole core until it ended (io::Port::retire_listener). Each server measures its own CPU time for a
// while after its close. In the last case every server opens in one process, on the same socket: the name must
// be free again after each close.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "io/eal.hpp"
#include "io/port.hpp"
#include "tests/support/memif_frames.hpp"
#include "tests/support/processes.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr unsigned kRounds = 3;
constexpr auto kWait = 20s;  // the link, a frame (each server process starts its EAL first: seconds under TSan)
// After its close a server sleeps kQuiet and may have used at most kQuietCpu of CPU meanwhile (the spinning
// interrupt thread took all of it).
constexpr auto kQuiet = 500ms;
constexpr auto kQuietCpu = 150ms;

// Shared between the roles (an anonymous shared mapping made before they fork): the client opens its port only
// once the first server has opened its own (without a client: it must not have waited for one).
std::atomic<bool>* g_first_open = nullptr;

io::PortConfig port_config(const std::string& socket, bool server, bool reconnect, bool zero_copy) {
    io::PortConfig cfg;
    cfg.backend = Backend::memif;
    cfg.memif_socket = socket;
    cfg.memif_server = server;
    cfg.memif_zero_copy = zero_copy;
    cfg.mbufs = 0;  // sized by the rule
    cfg.link_timeout = kWait;
    cfg.wait_for_link = !server;  // the server: no waiting (a client always waits for its server)
    cfg.memif_reconnect = reconnect;
    return cfg;
}

std::chrono::microseconds cpu_time() {
    rusage r{};
    ::getrusage(RUSAGE_SELF, &r);  // every thread of the process
    return std::chrono::seconds(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           std::chrono::microseconds(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

// One server: open (not waiting), answer the client's frame of this round, close, then stay quiet while the
// client tries to reconnect. What went wrong ("" when nothing); `lonely`: "lonely" when no client came within 2 s
// (as it should not).
std::string serve_round(const std::string& socket, unsigned round, bool zero_copy, bool lonely) {
    io::EalConfig eal;
    eal.lcores = "0";
    auto port = io::open_port(port_config(socket, true, false, zero_copy), eal);
    const bool up_at_open = port->link_up();
    if (round == 0) g_first_open->store(true);  // now the client may open
    std::string err;
    // The first server opened before the client's port existed: opening must not have waited for it (with
    // wait_for_link it would still be waiting, or have thrown after link_timeout).
    if (round == 0 && up_at_open) err += " opening waited for the client;";
    if (lonely) {
        std::this_thread::sleep_for(2s);
        const bool came = port->link_up();
        const bool clean = port->close() == io::Port::CloseResult::clean;
        return !came && clean ? "lonely" : " the client came back, or close() not clean;";
    }
    if (!wait_link_up(*port, kWait)) err += " the client never came;";
    const std::uint32_t got = err.empty() ? receive_tag(*port, kWait) : 0;
    if (err.empty() && got != 100 + round) err += " got frame " + std::to_string(got) + ";";
    if (err.empty() && !send_tag(*port, 200 + round, kWait)) err += " could not answer;";
    // The client acknowledges the answer: only then may the link go (a frame still in the ring would be lost).
    if (err.empty() && receive_tag(*port, kWait) != 300 + round) err += " no acknowledgement;";
    if (port->close() != io::Port::CloseResult::clean) err += " close() not clean;";
    port.reset();
    const auto before = cpu_time();
    std::this_thread::sleep_for(kQuiet);  // the client reconnects every 20 ms meanwhile
    const auto used = std::chrono::duration_cast<std::chrono::milliseconds>(cpu_time() - before);
    if (used > kQuietCpu) err += " busy after close: " + std::to_string(used.count()) + " ms of CPU in 500 ms;";
    return err;
}

// A server in its own process. Exit codes: 0 fine, 2 a check failed (on stderr), 3 exception, 5 `lonely` and no
// client came within 2 s.
[[noreturn]] void server_process(const std::string& socket, unsigned round, bool zero_copy, bool lonely) {
    int rc = 0;
    try {
        const std::string err = serve_round(socket, round, zero_copy, lonely);
        if (err == "lonely") ::_exit(5);
        if (!err.empty()) {
            std::fprintf(stderr, "server %u:%s\n", round, err.c_str());
            rc = 2;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "server %u: exception: %s\n", round, e.what());
        rc = 3;
    }
    ::_exit(rc);
}

// `lonely_last`: the last server is one the client must not reach (it exits 5 when none came). `one_process`:
// every server in this process, one after another, on the same socket.
int servers(const std::string& socket, unsigned rounds, bool zero_copy, bool lonely_last, bool one_process) {
    unsigned failures = 0;
    for (unsigned round = 0; round < rounds; ++round) {
        const bool lonely = lonely_last && round + 1 == rounds;
        if (one_process) {
            std::string err;
            try {
                err = serve_round(socket, round, zero_copy, lonely);
            } catch (const std::exception& e) {
                err = std::string(" exception: ") + e.what();
            }
            if (err != (lonely ? "lonely" : "")) {
                report("server " + std::to_string(round) + ":" + err);
                ++failures;
                break;
            }
            continue;
        }
        std::fflush(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) server_process(socket, round, zero_copy, lonely);
        int status = 0;
        ::waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != (lonely ? 5 : 0)) {
            report("server " + std::to_string(round) + " failed (status " + std::to_string(status) + ")");
            ++failures;
            break;
        }
    }
    report("servers: failures=" + std::to_string(failures));
    return failures == 0 ? 0 : 1;
}

// The one client: reaches every server in turn. With reconnect off it must stay down after the first.
int client(const std::string& socket, bool reconnect, bool zero_copy) {
    const auto deadline = Clock::now() + kWait;
    while (!g_first_open->load() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    io::EalConfig eal;
    eal.lcores = "1";
    auto port = io::open_port(port_config(socket, false, reconnect, zero_copy), eal);
    const unsigned start_in_use = port->mbufs_in_use();
    unsigned answered = 0;
    for (unsigned round = 0; round < (reconnect ? kRounds : 1u); ++round) {
        if (!wait_link_up(*port, kWait)) {
            report("round " + std::to_string(round) + ": link never came up");
            break;
        }
        if (!send_tag(*port, 100 + round, kWait) || receive_tag(*port, kWait) != 200 + round || !send_tag(*port, 300 + round, kWait)) {
            report("round " + std::to_string(round) + ": no answer");
            break;
        }
        ++answered;
        const auto gone = Clock::now() + kWait;  // the server leaves
        while (port->link_losses() <= round && Clock::now() < gone) std::this_thread::sleep_for(1ms);
    }
    bool stayed_down = true;
    if (!reconnect) {  // the second server opens and waits 2 s: this client must not come back to it
        std::this_thread::sleep_for(1500ms);
        stayed_down = !port->link_up() && port->relinks() == 0;
    }
    const unsigned relinks = port->relinks(), losses = port->link_losses();
    const unsigned in_use = port->mbufs_in_use();
    const bool clean = port->close() == io::Port::CloseResult::clean;
    report("client: answered=" + std::to_string(answered) + " link_losses=" + std::to_string(losses) +
           " relinks=" + std::to_string(relinks) + " stayed_down=" + std::to_string(stayed_down ? 1 : 0) +
           " mbufs_back=" + std::to_string(in_use == start_in_use ? 1 : 0) + " clean=" + std::to_string(clean ? 1 : 0));
    return 0;
}

unsigned field(const std::string& report, const std::string& name) {
    const auto at = report.find(name + "=");
    return at == std::string::npos ? ~0u : static_cast<unsigned>(std::stoul(report.substr(at + name.size() + 1)));
}

void run(bool reconnect, bool zero_copy, bool one_process = false) {
    if (zero_copy && !io::hugepages_available()) {
        WARN("skipped: memif zero-copy needs hugepages (scripts/setup reserves them)");
        return;
    }
    const std::string socket = "/run/" + unique_name("softrdma-relink-");
    void* mem = ::mmap(nullptr, sizeof(std::atomic<bool>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    g_first_open = new (mem) std::atomic<bool>(false);
    // Without reconnect: two servers, the second waiting for a client that must not come.
    const auto out = run_roles({{"servers", [&] { return servers(socket, reconnect ? kRounds : 2u, zero_copy, !reconnect, one_process); }},
                                {"client", [&] { return client(socket, reconnect, zero_copy); }}},
                               60s);
    ::munmap(mem, sizeof(std::atomic<bool>));
    INFO("servers:\n" << out[0].report << "client:\n" << out[1].report);
    CHECK_FALSE(out[0].timed_out);
    CHECK_FALSE(out[1].timed_out);
    CHECK(out[0].exit_code == 0);
    CHECK(out[1].exit_code == 0);
    const std::string& c = out[1].report;
    CHECK(field(c, "answered") == (reconnect ? kRounds : 1u));
    CHECK(field(c, "mbufs_back") == 1);
    CHECK(field(c, "clean") == 1);
    if (reconnect) {
        CHECK(field(c, "link_losses") == kRounds);
        CHECK(field(c, "relinks") >= kRounds - 1);
    } else {
        CHECK(field(c, "stayed_down") == 1);
    }
}

}  // namespace

TEST_CASE("memif: a server opens without waiting for its client, and a client with memif_reconnect reaches each "
          "new server on its socket after the last one left",
          "[io][memif][relink]") {
    run(true, false);
}

TEST_CASE("memif: the same with a zero-copy client", "[io][memif][relink][zero-copy]") { run(true, true); }

TEST_CASE("memif: without memif_reconnect a client whose server left stays down", "[io][memif][relink]") {
    run(false, false);
}

TEST_CASE("memif: every server in one process on the same socket, the client reaching each; a closed server "
          "stays quiet while its client reconnects",
          "[io][memif][relink]") {
    run(true, false, true);
}
