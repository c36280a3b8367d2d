// SPDX-License-Identifier: MIT
// Forked roles that never hang: the one process runner of the tests, the benchmarks and the examples' --local
// mode. Each role runs in a child process of its own (own DPDK EAL, own lwIP: what two machines would be),
// writes lines back with report(), and is killed at the deadline (or a grace period after another role failed).
// Not part of the installed library.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace softrdma::procs {

struct Role {
    std::string name;
    // Runs in the child; returns its exit code (0 = success). An exception ends the child with exit code 1 and
    // "exception: <what>" in its report (and on stderr, as "<name>: <what>", when Options::echo_exceptions).
    std::function<int()> body;
    // Wait before forking this role (e.g. let a memif server create its socket before its client).
    std::chrono::milliseconds start_delay{0};
};

struct Outcome {
    std::string name;
    int exit_code = -1;     // the role's return value; 128 + signal if a signal ended it
    bool timed_out = false; // killed at the deadline or after the grace period
    std::string report;     // every line the role wrote with report()
};

struct Options {
    std::chrono::seconds timeout{60};  // every role still running then is killed
    // After the first role fails, how long the others get to notice before they are killed (nullopt: the
    // whole timeout).
    std::optional<std::chrono::seconds> grace_after_failure{};
    bool echo_exceptions = false;  // also print a role's exception on stderr
};

// Forks every role (in order, after each one's start_delay) and waits for all; outcomes in role order.
std::vector<Outcome> run(const std::vector<Role>& roles, const Options& opts);

// Appends a line to the report the parent receives (call inside a role; does nothing elsewhere).
void report(const std::string& line);

// A name unique to this process and call: memif sockets, namespaces, file prefixes.
std::string unique_name(const std::string& stem);

}  // namespace softrdma::procs
