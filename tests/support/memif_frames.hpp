// SPDX-License-Identifier: MIT
// Frames between two io::Port ends in the io tests (memif_relink_test, memif_hello_test): a 64-byte frame
// carrying a 32-bit tag, sent and received with a time limit, and waiting for the link.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "io/port.hpp"

namespace softrdma::test {

// Sends a frame whose first 4 bytes are `tag`. False if no mbuf, or the driver took none within `wait`.
inline bool send_tag(io::Port& port, std::uint32_t tag, std::chrono::milliseconds wait) {
    rte_mbuf* m = port.alloc();
    if (m == nullptr) return false;
    char* p = rte_pktmbuf_append(m, 64);
    if (p == nullptr) {
        rte_pktmbuf_free(m);  // never handed on: ours
        return false;
    }
    std::memset(p, 0, 64);
    std::memcpy(p, &tag, sizeof tag);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (port.tx_burst({&m, 1}) == 0) {  // sent: the driver's
        if (std::chrono::steady_clock::now() >= deadline) {
            rte_pktmbuf_free(m);  // never taken: still ours
            return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
}

// The tag of the next frame, or 0 when none came within `wait`. Frees what it receives.
inline std::uint32_t receive_tag(io::Port& port, std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    rte_mbuf* burst[8];
    while (std::chrono::steady_clock::now() < deadline) {
        const unsigned n = port.rx_burst(burst);
        std::uint32_t tag = 0;
        for (unsigned i = 0; i < n; ++i) {
            if (tag == 0 && rte_pktmbuf_pkt_len(burst[i]) >= sizeof tag)
                std::memcpy(&tag, rte_pktmbuf_mtod(burst[i], const void*), sizeof tag);
            rte_pktmbuf_free(burst[i]);  // ours since rx_burst
        }
        if (tag != 0) return tag;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return 0;
}

inline bool wait_link_up(io::Port& port, std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!port.link_up())
        if (std::chrono::steady_clock::now() >= deadline) return false;
        else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
}

}  // namespace softrdma::test
