// SPDX-License-Identifier: MIT
// How a Context runs its data path: one thread (run to completion) or a dedicated RX thread.
#pragma once

#include <chrono>

#include "base/idle.hpp"

namespace softrdma::threading {

enum class Mode {
    // One thread (the application's) polls DPDK, runs lwIP, MPA/DDP/RDMAP and TX inside Context::poll().
    // For machines with few cores: nothing else competes for the core.
    run_to_completion,
    // A dedicated RX thread polls DPDK and returns each mbuf within its turn: frames of connections not yet
    // in RDMA mode are copied into a slot the application side owns (lwIP takes it without a copy); the
    // payload of each QP's stream is placed by the QP's receive half straight from the mbuf (the one copy),
    // only the headers going on to lwIP. The application thread runs lwIP, the protocol's TX, completions and
    // the CM. They meet only through bounded lock-free SPSC rings (threading/rx_thread.hpp).
    rx_thread,
};

using softrdma::IdlePolicy;  // base/idle.hpp

struct ThreadingConfig {
    Mode mode = Mode::run_to_completion;
    // Core for the RX thread; -1 = any core of the process (the kernel places it).
    int rx_core = -1;
    // Core to pin the application thread (the one opening the Context) to; -1 = leave it as it is.
    int app_core = -1;
    IdlePolicy rx_idle{};  // the RX thread when it finds no frame
    // Frame buffers between the RX thread and the application thread. Sizing rule: frames in flight on the
    // ring plus what lwIP may hold (its out-of-order queue, TCP_OOSEQ_MAX_PBUFS = 256) plus frames of
    // connections still negotiating MPA; 4096 leaves room for 1024 QPs with a few frames each.
    unsigned rx_slots = 4096;
};

// Pins the calling thread to `core` (-1 = every core the machine has). Throws std::system_error.
void pin_this_thread(int core);

}  // namespace softrdma::threading
