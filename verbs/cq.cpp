// SPDX-License-Identifier: MIT
#include "verbs/cq.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace softrdma::verbs::detail {

int make_eventfd(const char* what) {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) throw Error(std::string(what) + ": eventfd: " + std::strerror(errno));
    return fd;
}

void signal_fd(int fd) noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(fd, &one, sizeof one);  // only fails when the counter is full
}

bool drain_fd(int fd) noexcept {
    std::uint64_t v = 0;
    return ::read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v) && v != 0;
}

Cq::Cq(std::uint32_t cqe, std::shared_ptr<stack::FillBook> fills)
    : efd_(make_eventfd("create_cq")), ring_(cqe), fills_(std::move(fills)) {}

Cq::~Cq() { ::close(efd_); }

bool Cq::get_event() noexcept { return drain_fd(efd_); }

bool Cq::push(const WorkCompletion& wc) noexcept {
    bool first_lost = false;
    if (count_ == ring_.size()) {
        first_lost = overruns_++ == 0;
    } else {
        ring_[(head_ + count_) % ring_.size()] = wc;
        ++count_;
    }
    // One syscall per armed event, not per completion (as verbs providers ring the doorbell once per arm).
    if (armed_ == Arm::next ||
        (armed_ == Arm::solicited && ((wc.wc_flags & wc_flags::solicited) != 0 || wc.status != WcStatus::success))) {
        armed_ = Arm::none;
        signal_fd(efd_);
    }
    return first_lost;
}

std::size_t Cq::poll(std::span<WorkCompletion> out) noexcept {
    const std::size_t n = std::min(out.size(), count_);
    for (std::size_t i = 0; i < n; ++i) {
        out[i] = ring_[head_];
        head_ = (head_ + 1) % ring_.size();
    }
    count_ -= n;
    // A send-side completion returns the source buffers of its WR (and of the unsignaled WRs before it) to the
    // application: payload still sent from them (stack::FillBook) goes into its TX chunks first. Receive
    // completions return nothing of ours.
    if (fills_ && fills_->pending())
        for (std::size_t i = 0; i < n; ++i)
            if (out[i].opcode != WcOpcode::recv && out[i].opcode != WcOpcode::recv_rdma_with_imm) {
                fills_->settle();
                break;
            }
    return n;
}

}  // namespace softrdma::verbs::detail

namespace softrdma::verbs {

const char* to_string(WcStatus s) noexcept {
    switch (s) {
    case WcStatus::success: return "success";
    case WcStatus::wr_flush_err: return "WR flush error";
    case WcStatus::loc_prot_err: return "local protection error";
    case WcStatus::fatal_err: return "fatal error";
    case WcStatus::rem_access_err: return "remote access error";
    case WcStatus::rem_op_err: return "remote operation error";
    case WcStatus::rem_inv_req_err: return "remote invalid request error";
    case WcStatus::retry_exc_err: return "transport retry counter exceeded (peer not responding)";
    }
    return "?";
}

const char* to_string(WcOpcode o) noexcept {
    switch (o) {
    case WcOpcode::send: return "send";
    case WcOpcode::rdma_write: return "rdma_write";
    case WcOpcode::rdma_read: return "rdma_read";
    case WcOpcode::comp_swap: return "comp_swap";
    case WcOpcode::fetch_add: return "fetch_add";
    case WcOpcode::recv: return "recv";
    case WcOpcode::recv_rdma_with_imm: return "recv_rdma_with_imm";
    }
    return "?";
}

CompletionQueue::CompletionQueue(std::shared_ptr<detail::Cq> impl) : impl_(std::move(impl)) { impl_->set_handle(this); }
CompletionQueue::~CompletionQueue() { impl_->set_handle(nullptr); }
std::size_t CompletionQueue::poll(std::span<WorkCompletion> out) noexcept { return impl_->poll(out); }
std::size_t CompletionQueue::size() const noexcept { return impl_->size(); }
std::uint32_t CompletionQueue::capacity() const noexcept { return impl_->capacity(); }
std::uint64_t CompletionQueue::overruns() const noexcept { return impl_->overruns(); }
void CompletionQueue::req_notify(bool solicited_only) noexcept { impl_->req_notify(solicited_only); }
int CompletionQueue::fd() const noexcept { return impl_->fd(); }
bool CompletionQueue::get_event() noexcept { return impl_->get_event(); }

}  // namespace softrdma::verbs
