// SPDX-License-Identifier: MIT
// Running tshark from the wire tests.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace softrdma::wire {

// The tshark executable found on PATH, or nullopt when it is not installed.
std::optional<std::filesystem::path> find_tshark();

// Runs `tshark args...` and returns its standard output; its standard error passes through to ours.
// Throws std::runtime_error when tshark cannot be started or exits with a non-zero status.
std::string run_tshark(const std::filesystem::path& tshark, const std::vector<std::string>& args);

// Splits text into lines (without the line ends), and a line into fields (an empty line has none).
std::vector<std::string> lines_of(const std::string& text);
std::vector<std::string> split(const std::string& line, char separator);

// _ws.expert.severity values (epan/proto.h PI_WARN, PI_ERROR): anything at or above warn is a finding.
constexpr unsigned long expert_warn = 0x00600000, expert_error = 0x00800000;

}  // namespace softrdma::wire
