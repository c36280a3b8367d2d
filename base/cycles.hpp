// SPDX-License-Identifier: MIT
// A cycle counter for the per-layer cost accounting (verbs::ContextConfig::layer_cycles): the TSC on x86-64,
// nanoseconds elsewhere. Only read when accounting is on.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#else
#include <chrono>
#endif

namespace softrdma {

inline std::uint64_t cycles_now() noexcept {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

}  // namespace softrdma
