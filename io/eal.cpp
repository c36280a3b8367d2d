// SPDX-License-Identifier: MIT
#include "io/eal.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <rte_eal.h>
#include <rte_errno.h>
#include "base/log.hpp"

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

// The cores this process may run on, as a list ("0,1").
std::string cpu_list(const cpu_set_t& set) {
    std::string out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out += (out.empty() ? "" : ",") + std::to_string(c);
    return out;
}

// EalConfig::pin without a list: the first core of `set` that no other process holds a claim on. A claim is an
// flock on <dir>/core-<n>.lock held through a descriptor kept open for the life of the process (the kernel
// drops it at exit, even a crash). A forked child inherits the parent's descriptor but not a new claim: its own
// open() + flock fails on the parent's core and moves on.
int claim_core(const cpu_set_t& set) {
    std::string dir = "/run/softrdma";
    if (::mkdir(dir.c_str(), 01777) != 0 && errno != EEXIST) dir.clear();
    if (dir.empty() || ::access(dir.c_str(), W_OK) != 0) {
        const char* tmp = std::getenv("TMPDIR");
        dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/softrdma-cores";
        ::mkdir(dir.c_str(), 01777);
    }
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (!CPU_ISSET(c, &set)) continue;
        const std::string path = dir + "/core-" + std::to_string(c) + ".lock";
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) continue;
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return c;  // fd stays open: the claim lasts while we live
        ::close(fd);
    }
    throw Error("EalConfig::pin: every core this process may use (" + cpu_list(set) +
                ") is claimed by another softrdma process (lock files in " + dir +
                "); give EalConfig::lcores, or leave pin off");
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
bool eal_uses_hugepages(const EalConfig& cfg) noexcept {
    return eal_started() ? !g_no_huge : cfg.hugepages != Hugepages::off && hugepages_available();
}

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
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed);
    std::vector<std::string> args{"softrdma"};
    if (!cfg.lcores.empty()) {
        args.insert(args.end(), {"-l", cfg.lcores});
    } else if (cfg.pin) {
        args.insert(args.end(), {"-l", std::to_string(claim_core(allowed))});
    } else {
        // No pinning: DPDK's main lcore 0 runs on every core the caller may use, so the affinity DPDK sets on
        // the calling thread (and gives its own threads) is the one the thread already had.
        args.insert(args.end(), {"--lcores", "0@(" + cpu_list(allowed) + ")"});
    }
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
                log::warn("no hugepages available; running DPDK with --no-huge "
                             "(run scripts/setup as root to reserve them)");
            g_no_huge = true;
        }
        break;
    case Hugepages::off: g_no_huge = true; break;
    }
    // --in-memory (no hugepage files kept) conflicts with --no-huge, which implies legacy memory; without
    // hugepages --no-shconf gives the same "no shared files".
    if (g_no_huge) args.insert(args.end(), {"--no-huge", "--no-shconf", "-m", std::to_string(cfg.no_huge_memory_mb)});
    else args.insert(args.end(), {"--in-memory", "--single-file-segments"});  // (memif zero-copy needs the latter)
    for (const auto& v : cfg.vdevs) args.insert(args.end(), {"--vdev", v});
    args.insert(args.end(), cfg.extra_args.begin(), cfg.extra_args.end());

    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = rte_eal_init(static_cast<int>(args.size()), argv.data());
    if (rc < 0) {
        pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);  // a failed start pins nothing
        std::ostringstream msg;
        msg << "DPDK EAL failed to start: " << rte_strerror(rte_errno) << " (args:";
        for (const auto& a : args) msg << ' ' << a;
        msg << "). Check: the device strings (unknown driver, bad arguments, an af_packet interface that does "
               "not exist), the core list (-l) against nproc, and hugepages (scripts/setup)";
        throw Error(msg.str());
    }
}

}  // namespace softrdma::io
