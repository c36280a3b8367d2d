// SPDX-License-Identifier: MIT
// The test roles' runner is base/processes.hpp (shared with the benchmarks and the examples): the names the
// test suites use for it, and the deterministic content every stream check writes and verifies.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/processes.hpp"

namespace softrdma::test {

using ChildOutcome = procs::Outcome;
using Role = procs::Role;
using procs::report;
using procs::unique_name;

// Forks every role, waits up to `timeout` for all, kills leftovers. Outcomes in role order.
inline std::vector<ChildOutcome> run_roles(const std::vector<Role>& roles, std::chrono::seconds timeout) {
    return procs::run(roles, {.timeout = timeout});
}

// Deterministic content for stream checks: the byte at stream offset i of stream `seed`.
// fill_pattern writes out.size() bytes starting at `offset`; check_pattern returns the index of the first
// byte that differs, or -1.
void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out);
long long check_pattern(std::uint64_t seed, std::uint64_t offset, std::span<const std::byte> in);

}  // namespace softrdma::test
