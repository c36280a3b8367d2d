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

// One row of `tshark -q -z expert`: how many times an expert item of that severity, group, protocol and
// summary fired. Some items (MPA's revision warnings) are attached to no tree item, so they appear only in
// this summary, never in -V or -T fields output.
struct ExpertItem {
    std::string severity;  // "Errors", "Warns", "Notes", "Chats" or "Comments"
    unsigned long count{0};
    std::string group, protocol, summary;
};
std::vector<ExpertItem> parse_expert_summary(const std::string& text);

// _ws.expert.severity of a warning (epan/proto.h PI_WARN); errors are above it.
constexpr unsigned long expert_warn = 0x00600000;

}  // namespace softrdma::wire
