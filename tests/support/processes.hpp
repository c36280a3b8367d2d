// SPDX-License-Identifier: MIT
// Runs test roles in forked child processes (each its own DPDK EAL and lwIP), collects what each reports,
// and never hangs: a child still running at the deadline is killed and reported as timed out.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <functional>
#include <string>
#include <vector>

namespace softrdma::test {

// What a child role writes back: free text (`report`), success = returning 0.
struct ChildOutcome {
    std::string name;
    int exit_code = -1;     // the role's return value; 128+signal if killed by one
    bool timed_out = false;
    std::string report;     // everything the role wrote with report()
};

// Appends a line to the report the parent receives (call only inside a child role).
void report(const std::string& line);

struct Role {
    std::string name;
    // Runs in the child. Return 0 on success. Exceptions become "exception: <what>" and exit 1.
    std::function<int()> body;
    // Delay before forking this role (e.g. start a memif server before its client).
    std::chrono::milliseconds start_delay{0};
};

// Forks every role, waits up to `timeout` for all, kills leftovers. Outcomes in role order.
std::vector<ChildOutcome> run_roles(const std::vector<Role>& roles, std::chrono::seconds timeout);

// A name unique to this test process and call, for memif sockets, namespaces, file prefixes.
std::string unique_name(const std::string& stem);

// Deterministic content for stream checks: the byte at stream offset i of stream `seed`.
// fill_pattern writes out.size() bytes starting at `offset`; check_pattern returns the index of the first
// byte that differs, or -1.
void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out);
long long check_pattern(std::uint64_t seed, std::uint64_t offset, std::span<const std::byte> in);

}  // namespace softrdma::test
