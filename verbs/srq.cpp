// SPDX-License-Identifier: MIT
#include "verbs/srq.hpp"

#include "verbs/engine.hpp"
#include "verbs/memory.hpp"

namespace softrdma::verbs::detail {

Srq::Srq(std::shared_ptr<Engine> engine, std::uint32_t pd, const SrqInitAttr& attr)
    : keep_engine_(std::move(engine)), mem_(keep_engine_->memory()), pd_(pd), max_sge_(attr.max_sge), max_wr_(attr.max_wr), limit_(attr.srq_limit), ring_(attr.max_wr) {}

PostResult<RecvWr> Srq::post_recv(std::span<const RecvWr> wrs) noexcept {
    for (const RecvWr& wr : wrs) {
        if (wr.sg_list.size() > max_sge_) return {PostErrc::too_many_sge, &wr};
        if (count_.load(std::memory_order_relaxed) >= max_wr_) return {PostErrc::queue_full, &wr};
        RecvSlot r{};
        std::uint64_t total = 0;
        for (const Sge& g : wr.sg_list) {
            const rdmap::Mem m = mem_.lookup_local(g.lkey, g.addr, g.length, pd_, access::local_write, r.lease[r.nsge]);
            if (m.err != rdmap::MemError::none) return {PostErrc::bad_lkey, &wr};
            r.sge[r.nsge++] = {m.ptr, g.length};
            total += g.length;
        }
        if (total > 0xffffffffu) return {PostErrc::bad_length, &wr};
        r.wr_id = wr.wr_id;
        r.total = static_cast<std::uint32_t>(total);
        if (!ring_.bounded_push(r)) return {PostErrc::queue_full, &wr};  // nodes: max_wr, allocated at creation
        count_.fetch_add(1, std::memory_order_release);
    }
    return {};
}

bool Srq::take(RecvSlot& out, bool& limit_reached) noexcept {
    limit_reached = false;
    if (!ring_.pop(out)) return false;
    const std::uint32_t left = count_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    std::uint32_t lim = limit_.load(std::memory_order_relaxed);
    // Fires once per arm: whoever swaps the armed limit to 0 reports it.
    if (lim != 0 && left < lim && limit_.compare_exchange_strong(lim, 0, std::memory_order_relaxed)) limit_reached = true;
    return true;
}

}  // namespace softrdma::verbs::detail

namespace softrdma::verbs {

SharedReceiveQueue::SharedReceiveQueue(std::shared_ptr<detail::Srq> impl) : impl_(std::move(impl)) {
    impl_->set_handle(this);
}
// QPs may still take receives from it; its limit event then names no handle.
SharedReceiveQueue::~SharedReceiveQueue() { impl_->set_handle(nullptr); }
PostResult<RecvWr> SharedReceiveQueue::post_recv(std::span<const RecvWr> wrs) noexcept { return impl_->post_recv(wrs); }
void SharedReceiveQueue::arm_limit(std::uint32_t limit) noexcept { impl_->arm_limit(limit); }
std::uint32_t SharedReceiveQueue::limit() const noexcept { return impl_->limit(); }
std::size_t SharedReceiveQueue::posted() const noexcept { return impl_->posted(); }

std::unique_ptr<SharedReceiveQueue> ProtectionDomain::create_srq(const SrqInitAttr& attr) {
    if (attr.max_wr == 0) throw Error("create_srq: zero depth");
    if (attr.max_sge > kMaxSge) throw Error("create_srq: at most kMaxSge (8) SGEs");
    engine_->check_open("create_srq");
    return std::make_unique<SharedReceiveQueue>(std::make_shared<detail::Srq>(engine_, handle_, attr));
}

}  // namespace softrdma::verbs
