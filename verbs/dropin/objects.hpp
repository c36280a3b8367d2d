// SPDX-License-Identifier: MIT
// The objects behind the libibverbs structures the drop-in hands out (internal). Each embeds the public
// structure first, so the pointer the application holds converts back; each owns the softrdma handle it
// stands for. Ownership: made by ibv_alloc_pd / ibv_reg_mr / ibv_create_* (rdma_create_qp), owned by the
// application from then, freed by the matching ibv_dealloc / dereg / destroy (rdma_destroy_qp); the softrdma
// objects behind them may live on in what still uses them (see <softrdma/verbs.hpp>, Lifetimes). A comp
// channel's struct is kept after ibv_destroy_comp_channel (objects.hpp Channel::destroyed). Created and destroyed under the runtime's lock. librdmacm reaches them through the functions
// below (exported from libibverbs.so.1 under a private version node).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <array>
#include <memory>
#include <vector>

#include "verbs/dropin/runtime.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::dropin {

struct Channel;

struct Pd {
    ibv_pd pd{};
    std::unique_ptr<verbs::ProtectionDomain> h;
};
struct Mr {
    ibv_mr mr{};
    std::unique_ptr<verbs::MemoryRegion> h;
};
struct Cq {
    ibv_cq cq{};
    std::unique_ptr<verbs::CompletionQueue> h;
    Channel* ch{nullptr};
    bool armed{false};
    // ibv_poll_cq reads completions through this (under the lock), built once here rather than per call.
    std::array<verbs::WorkCompletion, 16> scratch{};
};
struct Channel {
    ibv_comp_channel ch{};
    std::vector<Cq*> cqs;
    bool readable{false};  // its fd holds a count (see ibverbs.cpp, refresh)
    // Threads inside ibv_get_cq_event on it (under the lock). Destroying the channel closes its fd and frees the
    // struct at once when none is; otherwise it is marked destroyed, they return EBADF and the last one out frees
    // it. (As with rdma-core, a thread must not enter ibv_get_cq_event after the channel was destroyed.)
    unsigned waiters{0};
    bool destroyed{false};
};
struct Srq {
    ibv_srq srq{};
    std::unique_ptr<verbs::SharedReceiveQueue> h;
};
struct Qp {
    ibv_qp qp{};
    std::unique_ptr<verbs::QueuePair> h;
    std::uint32_t max_inline{0};
    // rdma_create_qp: the id whose `qp` names this QP (cleared when the QP goes, however it is destroyed).
    rdma_cm_id* cm_id{nullptr};
};

inline Pd* of(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline Cq* of(ibv_cq* p) { return reinterpret_cast<Cq*>(p); }
inline Qp* of(ibv_qp* p) { return reinterpret_cast<Qp*>(p); }
inline Srq* of(ibv_srq* p) { return reinterpret_cast<Srq*>(p); }

// The one device context (opened on first use; nullptr with errno set when it cannot be).
ibv_context* device_context();
// A QP for `pd` (ibv_create_qp and rdma_create_qp). Under the lock. nullptr + errno on failure.
Qp* make_qp(Guard& g, ibv_pd* pd, ibv_qp_init_attr* attr);
void sync_qp_state(Qp* q) noexcept;  // qp.state from the softrdma QP

}  // namespace softrdma::dropin
