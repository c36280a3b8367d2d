// SPDX-License-Identifier: MIT
// DPDK's Environment Abstraction Layer, started once per process from a config.
#pragma once

#include <string>
#include <vector>

namespace softrdma::io {

enum class Hugepages { automatic, required, off };

struct EalConfig {
    // Cores for this process ("-l" list, e.g. "0" or "1"); empty = let DPDK use core 0. Two busy-polling
    // processes on one machine should each get their own core.
    std::string lcores;
    // automatic: use hugepages when the machine has free 2 MiB pages and a hugetlbfs mount (scripts/setup
    // makes both), else run with --no-huge and say so once. required: fail with a clear error if absent.
    Hugepages hugepages = Hugepages::automatic;
    // Memory for --no-huge mode, MiB: the mbuf pool (see io::PortConfig) plus ~64 MiB of DPDK's own.
    unsigned no_huge_memory_mb = 512;
    // Distinct per process so two DPDK processes coexist; empty = "softrdma-<pid>".
    std::string file_prefix;
    // DPDK's own log level (1..8); errors only by default.
    int log_level = 4;
    // Devices to create: "--vdev" arguments (e.g. "net_memif0,role=server,socket=/run/x.sock").
    std::vector<std::string> vdevs;
    // Appended verbatim (experts: e.g. "--iova-mode=va").
    std::vector<std::string> extra_args;
};

// Starts the EAL (once per process; DPDK cannot restart it). Throws io::Error with a message naming the fix
// when the EAL cannot start (no hugepages where required, bad vdev syntax, core list out of range...).
void start_eal(const EalConfig& cfg);
bool eal_started() noexcept;
// True when the EAL runs without hugepages (--no-huge).
bool eal_without_hugepages() noexcept;
// Free 2 MiB hugepages on this machine and whether hugetlbfs is mounted.
bool hugepages_available() noexcept;

}  // namespace softrdma::io
