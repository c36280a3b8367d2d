// SPDX-License-Identifier: MIT
#include "tests/wire/tshark.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace softrdma::wire {
namespace {

// Quotes one argument for /bin/sh.
std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

}  // namespace

std::optional<std::filesystem::path> find_tshark() {
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        const auto candidate = std::filesystem::path(dir.empty() ? "." : dir) / "tshark";
        if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return std::nullopt;
}

std::string run_tshark(const std::filesystem::path& tshark, const std::vector<std::string>& args) {
    std::string cmd = shell_quote(tshark.string());
    for (const auto& a : args) cmd += ' ' + shell_quote(a);
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
    if (!pipe) throw std::runtime_error("cannot run " + cmd);
    std::string out;
    char buf[65536];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe.get())) > 0;) out.append(buf, n);
    const int status = ::pclose(pipe.release());
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error("tshark failed (status " + std::to_string(status) + "): " + cmd);
    return out;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

std::vector<ExpertItem> parse_expert_summary(const std::string& text) {
    std::vector<ExpertItem> items;
    std::string severity;
    for (const auto& line : lines_of(text)) {
        std::istringstream in(line);
        ExpertItem item;
        if (line.empty() || line.front() == '=') continue;
        if (line.front() != ' ') {  // a section title: "Warns (8)"
            severity = line.substr(0, line.find(' '));
        } else if (in >> item.count >> item.group >> item.protocol) {  // skips the column-title row
            std::getline(in >> std::ws, item.summary);
            item.severity = severity;
            items.push_back(item);
        }
    }
    return items;
}

std::vector<std::string> split(const std::string& line, char separator) {
    std::vector<std::string> fields;
    if (line.empty()) return fields;
    std::size_t from = 0;
    for (std::size_t at; (at = line.find(separator, from)) != std::string::npos; from = at + 1)
        fields.push_back(line.substr(from, at - from));
    fields.push_back(line.substr(from));
    return fields;
}

}  // namespace softrdma::wire
