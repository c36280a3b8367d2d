// SPDX-License-Identifier: MIT
// detail::Cq: what a verbs::CompletionQueue is (internal to verbs): a ring of completions allocated at creation
// and an eventfd for notification. Pushed by the QPs on the application thread; polled by the application.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <softrdma/verbs.hpp>

#include "stack/fill_book.hpp"

namespace softrdma::verbs::detail {

class Cq {
public:
    // `fills`: the Context's stack::FillBook (shared: the CQ may outlive the Stack, which empties it at its end),
    // settled when a poll returns a send-side completion; null for none.
    Cq(std::uint32_t cqe, std::shared_ptr<stack::FillBook> fills);
    ~Cq();
    Cq(const Cq&) = delete;
    Cq& operator=(const Cq&) = delete;

    // A completion, or an overrun counted when the ring is full (sizing rule in verbs.hpp). True for the first
    // completion this CQ lost: the pusher then queues the cq_err async event (once per CQ, as verbs' CQ error).
    [[nodiscard]] bool push(const WorkCompletion& wc) noexcept;
    std::size_t poll(std::span<WorkCompletion> out) noexcept;
    std::size_t size() const noexcept { return count_; }
    std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(ring_.size()); }
    std::uint64_t overruns() const noexcept { return overruns_; }
    void req_notify(bool solicited_only) noexcept { armed_ = solicited_only ? Arm::solicited : Arm::next; }
    int fd() const noexcept { return efd_; }
    bool get_event() noexcept;
    // The handle the application holds, for its async events (null once it is destroyed).
    CompletionQueue* handle() const noexcept { return handle_; }
    void set_handle(CompletionQueue* h) noexcept { handle_ = h; }

private:
    enum class Arm : std::uint8_t { none, next, solicited };
    Arm armed_{Arm::none};
    int efd_{-1};
    std::vector<WorkCompletion> ring_;
    std::size_t head_{0};
    std::size_t count_{0};
    std::uint64_t overruns_{0};
    CompletionQueue* handle_{nullptr};
    std::shared_ptr<stack::FillBook> fills_;
};

// eventfd helpers shared with the engine.
int make_eventfd(const char* what);
void signal_fd(int fd) noexcept;
bool drain_fd(int fd) noexcept;

}  // namespace softrdma::verbs::detail
