// SPDX-License-Identifier: MIT
// Catch2 checks shared by the multi-process test suites.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/support/processes.hpp"

namespace softrdma::test {

// Every role finished in time, returned 0, and found lwIP's pools and the mempool back at their start.
inline void check_outcomes(const std::vector<ChildOutcome>& out) {
    for (const auto& o : out) {
        INFO(o.name << " exit=" << o.exit_code << (o.timed_out ? " TIMED OUT" : "") << "\n" << o.report);
        CHECK_FALSE(o.timed_out);
        CHECK(o.exit_code == 0);
        CHECK(o.report.find("pools back to start") != std::string::npos);
    }
}

}  // namespace softrdma::test
