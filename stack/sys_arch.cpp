// SPDX-License-Identifier: MIT
// What lwIP (NO_SYS=1) needs from the platform: a millisecond clock, assertions, diagnostics, randomness, and
// its checksum routine.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <random>

#include <rte_cycles.h>
#include "base/inet_sum.hpp"
#include "base/log.hpp"

#include "lwip/arch.h"
#include "lwip/sys.h"

extern "C" {

// Milliseconds from DPDK's TSC clock (no system call on the polling path).
u32_t sys_now(void) {
    static const std::uint64_t hz_per_ms = rte_get_timer_hz() / 1000;
    return static_cast<u32_t>(rte_get_timer_cycles() / hz_per_ms);
}

void softrdma_lwip_assert(const char* msg, const char* file, int line) {
    softrdma::log::error("lwIP assertion failed: {} at {}:{}", msg, file, line);
    std::abort();
}

void softrdma_lwip_diag(const char* fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    softrdma::log::info("lwIP: {}", buf);
}

// Initial sequence numbers and ephemeral ports; seeded once per process.
// lwIP's tcp_init() starts the ephemeral ports at TCP_ENSURE_LOCAL_PORT_RANGE(rand): 0xc000 | (low 14 bits),
// up to 0xffff. From 0xffff its tcp_new_port() steps to 0 (u16 wrap, past the range check) and tcp_connect()
// refuses it with ERR_BUF: the first connect of such a process failed ("err -2", one process in 16384; seen
// once in the TSan suite). A value whose low 14 bits are all ones would start there: its lowest bit is
// cleared (one value in 16384 folded onto its neighbour; nothing else relies on that bit).
uint32_t softrdma_lwip_rand(void) {
    static std::mt19937 gen{std::random_device{}()};
    auto r = static_cast<uint32_t>(gen());
    if ((r & 0x3fffu) == 0x3fffu) r ^= 1u;
    return r;
}

uint16_t softrdma_lwip_chksum(const void* data, int len) {
    return softrdma::ones_fold(softrdma::ones_sum(data, static_cast<std::size_t>(len)));
}

}  // extern "C"
