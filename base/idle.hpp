// SPDX-License-Identifier: MIT
// What a polling loop does when a turn finds nothing to do: the one idle policy every busy loop uses (the RX
// thread, Context::run_until, Stack::run_until, the examples' and rdma_perf's loops).
//
//   Idler idle(policy);
//   for (;;) { if (poll() != 0) idle.busy(); else idle.idle(); }
//
// Spinning gives the lowest latency when each busy thread has a core; yielding or sleeping lets more busy
// threads than cores share a small machine (two processes with an RX thread each on two cores).
#pragma once

#include <sched.h>

#include <softrdma/config.hpp>  // IdlePolicy

#include <chrono>
#include <thread>

namespace softrdma {

class Idler {
public:
    explicit constexpr Idler(const IdlePolicy& p) noexcept : p_(p) {}
    // The turn did work: back to spinning.
    void busy() noexcept { idle_ = 0; }
    // The turn found nothing: spin, or after spin_turns of them yield / sleep.
    void idle() noexcept {
        if (p_.then == IdlePolicy::Then::spin || ++idle_ <= p_.spin_turns) return;
        if (p_.then == IdlePolicy::Then::yield) {
            sched_yield();
        } else {
            std::this_thread::sleep_for(p_.sleep);
        }
    }
    // Either, from the turn's result.
    void after(bool did_work) noexcept { did_work ? busy() : idle(); }

private:
    IdlePolicy p_;
    unsigned idle_ = 0;
};

}  // namespace softrdma
