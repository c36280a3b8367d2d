// SPDX-License-Identifier: MIT
// detail::Srq: what a verbs::SharedReceiveQueue is (internal to verbs). Posted by the application thread, taken
// by whichever thread runs each QP's receive half (with an RX thread: that thread, or the application thread
// before a QP's handover): a bounded lock-free MPMC queue, max_wr nodes allocated at creation.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include <boost/lockfree/queue.hpp>

#include "verbs/memory.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::verbs::detail {

class Engine;
class MemoryTable;

class Srq {
public:
    Srq(std::shared_ptr<Engine> engine, std::uint32_t pd, const SrqInitAttr& attr);
    PostResult<RecvWr> post_recv(std::span<const RecvWr> wrs) noexcept;
    // The oldest WR; `limit_reached` true when this take crossed the armed limit (the caller queues the event).
    bool take(RecvSlot& out, bool& limit_reached) noexcept;
    void arm_limit(std::uint32_t limit) noexcept { limit_.store(limit, std::memory_order_relaxed); }
    std::uint32_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
    std::size_t posted() const noexcept { return count_.load(std::memory_order_relaxed); }
    std::uint32_t pd() const noexcept { return pd_; }
    std::uint32_t max_wr() const noexcept { return max_wr_; }
    // The handle the application holds, for its async events.
    SharedReceiveQueue* handle() const noexcept { return handle_; }
    void set_handle(SharedReceiveQueue* h) noexcept { handle_ = h; }

private:
    std::shared_ptr<Engine> keep_engine_;  // its MR table
    MemoryTable& mem_;
    std::uint32_t pd_;
    std::uint32_t max_sge_;
    std::uint32_t max_wr_;
    std::atomic<std::uint32_t> limit_;
    boost::lockfree::queue<RecvSlot, boost::lockfree::fixed_sized<true>> ring_;
    std::atomic<std::uint32_t> count_{0};
    SharedReceiveQueue* handle_{nullptr};
};

}  // namespace softrdma::verbs::detail
