// SPDX-License-Identifier: MIT
// Catch2 checks shared by the multi-process test suites.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/support/processes.hpp"

namespace softrdma::test {

// Every role finished in time, returned 0, and found lwIP's pools and the mempool back at their start.
// When one role fails, every role's report is shown: the cause often sits with the peer that passed.
inline void check_outcomes(const std::vector<ChildOutcome>& out) {
    bool all_ok = true;
    for (const auto& o : out)
        all_ok = all_ok && !o.timed_out && o.exit_code == 0 && o.report.find("pools back to start") != std::string::npos;
    for (const auto& o : out) {
        std::string peers;
        if (!all_ok)
            for (const auto& p : out)
                if (&p != &o) peers += "\n(peer) " + p.name + " exit=" + std::to_string(p.exit_code) + "\n" + p.report;
        INFO(o.name << " exit=" << o.exit_code << (o.timed_out ? " TIMED OUT" : "") << "\n" << o.report << peers);
        CHECK_FALSE(o.timed_out);
        CHECK(o.exit_code == 0);
        CHECK(o.report.find("pools back to start") != std::string::npos);
    }
}

}  // namespace softrdma::test
