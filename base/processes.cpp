// SPDX-License-Identifier: MIT
#include "base/processes.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

namespace softrdma::procs {
namespace {
int g_report_fd = -1;  // the child's end of its report pipe
}  // namespace

void report(const std::string& line) {
    if (g_report_fd < 0) return;
    const std::string l = line + "\n";
    [[maybe_unused]] auto n = ::write(g_report_fd, l.data(), l.size());
}

std::vector<Outcome> run(const std::vector<Role>& roles, const Options& opts) {
    struct Running {
        pid_t pid;
        int fd;
    };
    std::vector<Running> running;
    std::vector<Outcome> out(roles.size());
    for (std::size_t i = 0; i < roles.size(); ++i) {
        out[i].name = roles[i].name;
        std::this_thread::sleep_for(roles[i].start_delay);
        std::fflush(nullptr);  // or the child inherits unwritten stdio buffers and prints them again
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("procs::run: pipe failed");
        const pid_t pid = ::fork();
        if (pid < 0) throw std::runtime_error("procs::run: fork failed");
        if (pid == 0) {
            ::close(p[0]);
            g_report_fd = p[1];
            ::setpgid(0, 0);  // its own group: killing it takes whatever it started
            std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines of several roles interleave whole
            int rc = 1;
            try {
                rc = roles[i].body();
            } catch (const std::exception& e) {
                report(std::string("exception: ") + e.what());
                if (opts.echo_exceptions) std::fprintf(stderr, "%s: %s\n", roles[i].name.c_str(), e.what());
            } catch (...) {
                report("exception: unknown");
            }
            std::fflush(nullptr);
            ::_exit(rc);  // no atexit handlers of the parent's objects, no test framework teardown
        }
        ::close(p[1]);
        ::fcntl(p[0], F_SETFL, O_NONBLOCK);
        running.push_back({pid, p[0]});
    }
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    std::optional<std::chrono::steady_clock::time_point> failed_at;
    std::vector<bool> done(roles.size(), false);
    std::size_t left = roles.size();
    char buf[4096];
    auto drain = [&](std::size_t i) {
        ssize_t n;
        while ((n = ::read(running[i].fd, buf, sizeof buf)) > 0) out[i].report.append(buf, static_cast<std::size_t>(n));
    };
    while (left != 0) {
        for (std::size_t i = 0; i < running.size(); ++i) {
            drain(i);
            if (done[i]) continue;
            int status = 0;
            if (::waitpid(running[i].pid, &status, WNOHANG) == running[i].pid) {
                done[i] = true;
                --left;
                out[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                if (out[i].exit_code != 0 && !failed_at) failed_at = std::chrono::steady_clock::now();
            }
        }
        if (left == 0) break;
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline || (failed_at && opts.grace_after_failure && now >= *failed_at + *opts.grace_after_failure)) {
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
        drain(i);
        ::close(running[i].fd);
    }
    return out;
}

std::string unique_name(const std::string& stem) {
    static std::atomic<unsigned> n{0};
    return stem + std::to_string(::getpid()) + "x" + std::to_string(n++);
}

}  // namespace softrdma::procs
