// SPDX-License-Identifier: MIT
#include "tests/support/processes.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

namespace softrdma::test {
namespace {
int g_report_fd = -1;

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t word_index) {
    return mix(seed * 0x100000001b3ull + word_index);
}
}  // namespace

void report(const std::string& line) {
    if (g_report_fd < 0) return;
    const std::string l = line + "\n";
    [[maybe_unused]] auto n = ::write(g_report_fd, l.data(), l.size());
}

std::vector<ChildOutcome> run_roles(const std::vector<Role>& roles, std::chrono::seconds timeout) {
    struct Running {
        pid_t pid;
        int fd;
    };
    std::vector<Running> running;
    std::vector<ChildOutcome> out(roles.size());
    for (std::size_t i = 0; i < roles.size(); ++i) {
        out[i].name = roles[i].name;
        std::this_thread::sleep_for(roles[i].start_delay);
        std::fflush(nullptr);  // or the child inherits unwritten stdio buffers and prints them again
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::close(p[0]);
            g_report_fd = p[1];
            ::setpgid(0, 0);
            int rc = 1;
            try {
                rc = roles[i].body();
            } catch (const std::exception& e) {
                report(std::string("exception: ") + e.what());
            } catch (...) {
                report("exception: unknown");
            }
            ::_exit(rc);  // no atexit handlers, no Catch2 teardown in the child
        }
        ::close(p[1]);
        ::fcntl(p[0], F_SETFL, O_NONBLOCK);
        running.push_back({pid, p[0]});
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<bool> done(roles.size(), false);
    std::size_t left = roles.size();
    char buf[4096];
    while (left != 0) {
        for (std::size_t i = 0; i < running.size(); ++i) {
            ssize_t n;
            while ((n = ::read(running[i].fd, buf, sizeof buf)) > 0) out[i].report.append(buf, static_cast<std::size_t>(n));
            if (done[i]) continue;
            int status = 0;
            if (::waitpid(running[i].pid, &status, WNOHANG) == running[i].pid) {
                done[i] = true;
                --left;
                out[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
        }
        if (left == 0) break;
        if (std::chrono::steady_clock::now() >= deadline) {
            for (std::size_t i = 0; i < running.size(); ++i) {
                if (done[i]) continue;
                ::kill(-running[i].pid, SIGKILL);
                ::kill(running[i].pid, SIGKILL);
                ::waitpid(running[i].pid, nullptr, 0);
                out[i].timed_out = true;
                out[i].exit_code = 128 + SIGKILL;
            }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (std::size_t i = 0; i < running.size(); ++i) {
        ssize_t n;
        while ((n = ::read(running[i].fd, buf, sizeof buf)) > 0) out[i].report.append(buf, static_cast<std::size_t>(n));
        ::close(running[i].fd);
    }
    return out;
}

std::string unique_name(const std::string& stem) {
    static std::atomic<unsigned> n{0};
    return stem + std::to_string(::getpid()) + "x" + std::to_string(n++);
}

// Word-at-a-time: one mix and one 8-byte store or compare per word, bytes only at the unaligned ends, so
// the pattern costs far less than the transfer it checks.
void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) {
    std::size_t i = 0;
    for (; i < out.size() && ((offset + i) & 7) != 0; ++i)
        out[i] = static_cast<std::byte>(pattern_word(seed, (offset + i) >> 3) >> (8 * ((offset + i) & 7)));
    for (; i + 8 <= out.size(); i += 8) {
        const std::uint64_t w = pattern_word(seed, (offset + i) >> 3);
        std::memcpy(out.data() + i, &w, 8);
    }
    for (; i < out.size(); ++i)
        out[i] = static_cast<std::byte>(pattern_word(seed, (offset + i) >> 3) >> (8 * ((offset + i) & 7)));
}

long long check_pattern(std::uint64_t seed, std::uint64_t offset, std::span<const std::byte> in) {
    std::size_t i = 0;
    auto byte_at = [&](std::size_t k) {
        return static_cast<std::byte>(pattern_word(seed, (offset + k) >> 3) >> (8 * ((offset + k) & 7)));
    };
    for (; i < in.size() && ((offset + i) & 7) != 0; ++i)
        if (in[i] != byte_at(i)) return static_cast<long long>(i);
    for (; i + 8 <= in.size(); i += 8) {
        const std::uint64_t w = pattern_word(seed, (offset + i) >> 3);
        std::uint64_t got;
        std::memcpy(&got, in.data() + i, 8);
        if (got != w) break;  // the byte loop below finds the exact index
    }
    for (; i < in.size(); ++i)
        if (in[i] != byte_at(i)) return static_cast<long long>(i);
    return -1;
}

}  // namespace softrdma::test
