// SPDX-License-Identifier: MIT
// What a new user gets without asking: no core pinning (and distinct cores when pinning is asked without a
// list), the calling thread left as it was when opening fails, our own error for a second Context, the
// library's log on stderr through a handler the application can replace or silence, and a memif client that
// waits for its server quietly. Each case runs in forked processes (a Context owns its process's DPDK).
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "base/log.hpp"  // the library's side: log::info() as the layers call it
#include "tests/verbs/fixture.hpp"
#include <softrdma/log.hpp>

namespace softrdma::test::verbs_fixture {
namespace {

std::string affinity_text() {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    std::string out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out += (out.empty() ? "" : ",") + std::to_string(c);
    return out;
}

verbs::ContextConfig plain(const PeerConfig& cfg) {
    verbs::ContextConfig cc;
    cc.port = cfg.port;
    cc.eal = cfg.eal;
    cc.eal.lcores.clear();  // memif_pair() pins each end; these cases are about the defaults
    cc.ip = cfg.stack.ip;
    cc.max_mr = 4;
    cc.max_qp = 2;
    cc.close_linger = 0ms;
    return cc;
}

// Opens a Context (with `edit` applied) next to a memif peer that does the same, and reports the calling
// thread's cores before and after ("before=0,1 after=0,1").
// Opens, reports the thread's cores before and after, and holds the Context (and its core claim) until the
// other end has opened too: `mine` is created once open, `theirs` awaited (bounded), so a loaded machine that
// slows one end cannot make the other leave before the link came up or the claims overlapped.
int open_and_report(const PeerConfig& cfg, void (*edit)(verbs::ContextConfig&), const std::string& mine,
                    const std::string& theirs) {
    verbs::ContextConfig cc = plain(cfg);
    edit(cc);
    const std::string before = affinity_text();
    auto ctx = verbs::Context::open(cc);
    procs::report("before=" + before + " after=" + affinity_text());
    if (const int fd = ::open(mine.c_str(), O_CREAT | O_WRONLY, 0600); fd >= 0) ::close(fd);
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (::access(theirs.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(50ms);
    return 0;
}

// Both ends of one open_and_report pair: the marker files of a run.
struct Markers {
    std::string server = "/tmp/" + procs::unique_name("softrdma-open-s");
    std::string client = "/tmp/" + procs::unique_name("softrdma-open-c");
    ~Markers() {
        ::unlink(server.c_str());
        ::unlink(client.c_str());
    }
};

std::string field(const std::string& report, const std::string& key) {
    const auto at = report.find(key + "=");
    if (at == std::string::npos) return "";
    const auto from = at + key.size() + 1;
    return report.substr(from, report.find_first_of(" \n", from) - from);
}

}  // namespace

TEST_CASE("defaults: a Context pins no thread unless asked; asked without a list, two processes get distinct cores",
          "[verbs][api]") {
    if (std::thread::hardware_concurrency() < 2) {
        WARN("one core: nothing to tell apart");
        return;
    }
    auto [s, c] = memif_pair();
    SECTION("default: the calling thread keeps every core it had") {
        const Markers m;
        auto body = [&](const PeerConfig& cfg, bool server) {
            return open_and_report(cfg, [](verbs::ContextConfig&) {}, server ? m.server : m.client, server ? m.client : m.server);
        };
        const auto out = procs::run({{"server", [&] { return body(s, true); }}, {"client", [&] { return body(c, false); }, 200ms}},
                                    {.timeout = 30s});
        for (const auto& o : out) {
            INFO(o.name << ": " << o.report);
            REQUIRE(o.exit_code == 0);
            CHECK(field(o.report, "before").find(',') != std::string::npos);  // more than one core to begin with
            CHECK(field(o.report, "after") == field(o.report, "before"));
        }
    }
    SECTION("pin without a list: one core each, not the same one") {
        const Markers m;
        auto body = [&](const PeerConfig& cfg, bool server) {
            return open_and_report(cfg, [](verbs::ContextConfig& cc) { cc.eal.pin = true; }, server ? m.server : m.client,
                                   server ? m.client : m.server);
        };
        const auto out = procs::run({{"server", [&] { return body(s, true); }}, {"client", [&] { return body(c, false); }, 200ms}},
                                    {.timeout = 30s});
        for (const auto& o : out) {
            INFO(o.name << ": " << o.report);
            REQUIRE(o.exit_code == 0);
            CHECK(field(o.report, "after").find(',') == std::string::npos);
        }
        CHECK(field(out[0].report, "after") != field(out[1].report, "after"));
    }
}

TEST_CASE("defaults: a failed open leaves the thread unpinned; a second Context is refused in our words",
          "[verbs][api]") {
    auto [s, c] = memif_pair();
    const auto out = procs::run(
        {{"opener",
          [cfg = s] {
              // A port that cannot open (no such interface), with pinning asked: the open fails after DPDK
              // started and pinned the thread to core 0.
              verbs::ContextConfig bad = plain(cfg);
              bad.port.backend = Backend::af_packet;
              bad.port.iface = "no-such-if0";
              bad.eal.lcores = "0";
              const std::string before = affinity_text();
              try {
                  auto ctx = verbs::Context::open(bad);
                  procs::report("opened a port on a missing interface");
                  return 1;
              } catch (const std::exception& e) {
                  procs::report(std::string("first: ") + e.what());
              }
              procs::report("before=" + before + " after=" + affinity_text());
              // DPDK has started once in this process: any further Context is refused, with our reason.
              try {
                  auto ctx = verbs::Context::open(plain(cfg));
                  return 2;
              } catch (const verbs::Error& e) {
                  procs::report(std::string("again: ") + e.what());
              }
              return 0;
          }},
         {"holder",
          [cfg = s] {
              // A Context open (a memif server with its client), then a second one in the same process.
              auto ctx = verbs::Context::open(plain(cfg));
              try {
                  auto second = verbs::Context::open(plain(cfg));
                  return 2;
              } catch (const verbs::Error& e) {
                  procs::report(std::string("second: ") + e.what());
              }
              return 0;
          }},
         {"holder's peer",
          [cfg = c] {
              auto ctx = verbs::Context::open(plain(cfg));
              std::this_thread::sleep_for(300ms);
              return 0;
          },
          200ms}},
        {.timeout = 30s});
    for (const auto& o : out) {
        INFO(o.name << ": " << o.report);
        REQUIRE(o.exit_code == 0);
    }
    CHECK(field(out[0].report, "after") == field(out[0].report, "before"));
    CHECK(out[0].report.find("again: this process already had a Context") != std::string::npos);
    CHECK(out[1].report.find("second: a second Context in this process") != std::string::npos);
}

TEST_CASE("defaults: the library logs to stderr, through a handler the application sets, or not at all; a memif "
          "client waits for its server quietly",
          "[verbs][api]") {
    auto [s, c] = memif_pair();
    // The client starts 1.5 s before its server. Its stderr (fd 2) goes to a pipe the role reads back.
    auto client = [cfg = c] {
        int fds[2];
        if (::pipe(fds) != 0) return 9;
        std::fflush(stderr);
        const int saved = ::dup(2);
        ::dup2(fds[1], 2);
        ::close(fds[1]);
        std::mutex m;
        std::string handled;
        std::atomic<int> calls{0};
        {
            verbs::ContextConfig cc = plain(cfg);
            cc.port.link_timeout = 15s;
            auto ctx = verbs::Context::open(cc);  // default log: info lines to stderr, none from the wait
            log::set_handler([&](log::Level l, std::string_view msg) {
                std::lock_guard<std::mutex> lock(m);
                handled += std::string(log::to_string(l)) + ": " + std::string(msg) + "\n";
                ++calls;
            });
            log::info("a line for the handler");
            log::set_level(log::Level::off);
            log::error("a line nobody sees");
            log::set_level(log::Level::info);
            log::set_handler({});
        }
        std::fflush(stderr);
        ::dup2(saved, 2);
        ::close(saved);
        std::string err;
        char buf[4096];
        ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
        for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
        ::close(fds[0]);
        std::size_t lines = 0;
        for (char ch : err) lines += ch == '\n';
        procs::report("stderr_lines=" + std::to_string(lines) + " handler_calls=" + std::to_string(calls.load()));
        procs::report("stderr:\n" + err + "handled:\n" + handled);
        return 0;
    };
    auto server = [cfg = s] {
        auto ctx = verbs::Context::open(plain(cfg));
        std::this_thread::sleep_for(500ms);
        return 0;
    };
    const auto out = procs::run({{"client", client}, {"server", server, 1500ms}}, {.timeout = 40s});
    for (const auto& o : out) {
        INFO(o.name << ": " << o.report);
        REQUIRE(o.exit_code == 0);
    }
    const std::string& r = out[0].report;
    INFO(r);
    // Two lines of ours (port up, stack up) and nothing from 1.5 s of waiting for the server.
    CHECK(field(r, "stderr_lines") == "2");
    CHECK(r.find("[softrdma] [info] port net_memif") != std::string::npos);
    CHECK(r.find("[softrdma] [info] stack ") != std::string::npos);
    // The handler got exactly the line logged while it was set and the level allowed.
    CHECK(field(r, "handler_calls") == "1");
    CHECK(r.find("info: a line for the handler") != std::string::npos);
    CHECK(r.find("a line nobody sees") == std::string::npos);
}

}  // namespace softrdma::test::verbs_fixture
