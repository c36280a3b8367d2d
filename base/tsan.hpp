// SPDX-License-Identifier: MIT
// ThreadSanitizer annotations for the one synchronisation TSan cannot see: the wire. With an RX thread, the
// application thread sends (tx_burst) and the RX thread receives (rx_burst) through DPDK code TSan does not
// instrument and through a peer process. Two orders matter and are real:
//   - an application's memory accesses before it sends a message happen before the peer's answer, so before
//     the RX thread places that answer (e.g. a region read, then "write it again" sent, then the WRITE lands);
//   - an mbuf written by one thread and freed goes back to the pool and is handed to the other thread.
// wire_release/wire_acquire tell TSan about both (release before sending or freeing, acquire after receiving
// or allocating). They compile to nothing outside TSan builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace softrdma {

inline void wire_release([[maybe_unused]] const void* token) noexcept {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(const_cast<void*>(token));
#endif
}

inline void wire_acquire([[maybe_unused]] const void* token) noexcept {
#if defined(__SANITIZE_THREAD__)
    __tsan_acquire(const_cast<void*>(token));
#endif
}

}  // namespace softrdma
