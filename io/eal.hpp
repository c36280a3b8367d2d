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
// Free 2 MiB hugepages on this machine and whether hugetlbfs is mounted.
bool hugepages_available() noexcept;

}  // namespace softrdma::io
