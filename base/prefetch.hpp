// SPDX-License-Identifier: MIT
// Taking a cache line for writing ahead of the write (PREFETCHW): the line comes into this core's cache owned,
// so a later store to it does not wait for it to be taken from the core that read it last. A hint: nothing is
// read or written, and it never faults. Used where a copy into memory another process reads next has idle time
// before it (io::detail::MemifServerPath::pre_own).
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace softrdma::base {

// Whether this CPU has PREFETCHW (CPUID 0x80000001 ECX bit 8: AMD since K8, Intel since Broadwell). Without
// it the instruction is not defined, so callers check first (at setup).
inline bool cpu_has_prefetchw() noexcept {
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(0x80000001u, &a, &b, &c, &d) != 0 && (c & bit_PRFCHW) != 0;
#else
    return false;
#endif
}

// Caller: cpu_has_prefetchw().
inline void prefetch_for_write(const void* p) noexcept {
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
    (void)p;
#endif
}

}  // namespace softrdma::base
