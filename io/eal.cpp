// SPDX-License-Identifier: MIT
#include "io/eal.hpp"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <rte_eal.h>
#include <rte_errno.h>
#include <spdlog/spdlog.h>

#include "io/error.hpp"

namespace softrdma::io {
namespace {

std::atomic<bool> g_started{false};
bool g_no_huge = false;

unsigned long meminfo_value(const char* key) {
    std::ifstream in("/proc/meminfo");
    std::string line;
    const std::size_t klen = std::strlen(key);
    while (std::getline(in, line))
        if (line.compare(0, klen, key) == 0) return std::stoul(line.substr(klen));
    return 0;
}

bool hugetlbfs_mounted() {
    std::ifstream in("/proc/mounts");
    std::string dev, dir, type;
    std::string rest;
    while (in >> dev >> dir >> type) {
        if (type == "hugetlbfs") return true;
        std::getline(in, rest);
    }
    return false;
}

}  // namespace

bool hugepages_available() noexcept {
    try {
        return meminfo_value("HugePages_Free:") > 0 && hugetlbfs_mounted();
    } catch (...) {
        return false;
    }
}

bool eal_started() noexcept { return g_started.load(); }
bool eal_without_hugepages() noexcept { return g_no_huge; }

void start_eal(const EalConfig& cfg) {
    if (g_started.exchange(true)) throw Error("DPDK EAL already started in this process (it cannot start twice)");

    // Check the core list ourselves: DPDK answers a bad one with its whole usage text.
    if (!cfg.lcores.empty()) {
        cpu_set_t set;
        CPU_ZERO(&set);
        sched_getaffinity(0, sizeof set, &set);
        std::size_t pos = 0;
        while (pos < cfg.lcores.size()) {
            const std::size_t end = cfg.lcores.find_first_of(",-", pos);
            const std::string num = cfg.lcores.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
            char* rest = nullptr;
            const unsigned long core = std::strtoul(num.c_str(), &rest, 10);
            if (num.empty() || *rest != '\0' || core >= CPU_SETSIZE || !CPU_ISSET(core, &set))
                throw Error("core list '" + cfg.lcores + "': core '" + num + "' is not available to this process (" +
                            std::to_string(CPU_COUNT(&set)) + " cores; see nproc)");
            if (end == std::string::npos) break;
            pos = end + 1;
        }
    }
    std::vector<std::string> args{"softrdma"};
    if (!cfg.lcores.empty()) args.insert(args.end(), {"-l", cfg.lcores});
    else args.insert(args.end(), {"-l", "0"});
    const std::string prefix =
        cfg.file_prefix.empty() ? "softrdma-" + std::to_string(::getpid()) : cfg.file_prefix;
    // The prefix keeps two processes' names apart; shared runtime files are avoided (below) so a crashed
    // process leaves nothing behind for the next one.
    args.insert(args.end(), {"--file-prefix", prefix, "--no-telemetry", "--log-level", std::to_string(cfg.log_level)});
    bool pci = false;
    for (const auto& extra : cfg.extra_args) pci = pci || extra == "-a" || extra.rfind("--allow", 0) == 0;
    if (!pci) args.emplace_back("--no-pci");

    const bool have_huge = hugepages_available();
    switch (cfg.hugepages) {
    case Hugepages::required:
        if (!have_huge)
            throw Error("no free 2 MiB hugepages or no hugetlbfs mount: run scripts/setup as root (or "
                        "echo 512 > /proc/sys/vm/nr_hugepages; mount -t hugetlbfs nodev /dev/hugepages), "
                        "or allow --no-huge mode (Hugepages::automatic)");
        break;
    case Hugepages::automatic:
        if (!have_huge) {
            static std::atomic<bool> said{false};
            if (!said.exchange(true))
                spdlog::warn("softrdma: no hugepages available; running DPDK with --no-huge "
                             "(run scripts/setup as root to reserve them)");
            g_no_huge = true;
        }
        break;
    case Hugepages::off: g_no_huge = true; break;
    }
    // --in-memory (no hugepage files kept) conflicts with --no-huge, which implies legacy memory; without
    // hugepages --no-shconf gives the same "no shared files".
    if (g_no_huge) args.insert(args.end(), {"--no-huge", "--no-shconf", "-m", std::to_string(cfg.no_huge_memory_mb)});
    else args.emplace_back("--in-memory");
    for (const auto& v : cfg.vdevs) args.insert(args.end(), {"--vdev", v});
    args.insert(args.end(), cfg.extra_args.begin(), cfg.extra_args.end());

    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = rte_eal_init(static_cast<int>(args.size()), argv.data());
    if (rc < 0) {
        std::ostringstream msg;
        msg << "DPDK EAL failed to start: " << rte_strerror(rte_errno) << " (args:";
        for (const auto& a : args) msg << ' ' << a;
        msg << "). Check: the device strings (unknown driver, bad arguments, an af_packet interface that does "
               "not exist), the core list (-l) against nproc, and hugepages (scripts/setup)";
        throw Error(msg.str());
    }
}

}  // namespace softrdma::io
