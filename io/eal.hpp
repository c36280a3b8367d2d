// SPDX-License-Identifier: MIT
// DPDK's Environment Abstraction Layer, started once per process from a config.
#pragma once

#include <softrdma/config.hpp>

namespace softrdma::io {

using softrdma::EalConfig;  // <softrdma/config.hpp>
using softrdma::Hugepages;

// Starts the EAL (once per process; DPDK cannot restart it). Throws io::Error with a message naming the fix
// when the EAL cannot start (no hugepages where required, bad vdev syntax, core list out of range...).
void start_eal(const EalConfig& cfg);
bool eal_started() noexcept;
// True when the EAL runs without hugepages (--no-huge).
bool eal_without_hugepages() noexcept;
// Whether the EAL runs on hugepages: once started, as it does; before, as start_eal(cfg) would (the rule of
// EalConfig::hugepages; `required` without them fails to start).
bool eal_uses_hugepages(const EalConfig& cfg) noexcept;
// Free 2 MiB hugepages on this machine and whether hugetlbfs is mounted.
bool hugepages_available() noexcept;

}  // namespace softrdma::io
