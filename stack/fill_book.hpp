// SPDX-License-Identifier: MIT
// stack::FillBook: the payload bytes framed without their payload (deferred, Stack::defer_fill) that their TX
// chunk does not hold yet, each with where it is now (`src`, the application's registered memory) and where it
// belongs (`dst`, chunk memory). A frame carrying such bytes takes them from `src`; the chunk gets them only if
// they must outlive the source's loan (settle()), which in a stream is rarely: most are acknowledged first and
// never copied at all.
//
// The loan: a source is the application's until the work request that named it completes, so the book must be
// settled (every live record copied into its chunk) before the application can learn of any send-side
// completion — a completion queue settles it when a poll returns one (verbs::detail::Cq), before an MR is
// deregistered, and when a connection closes (inline payload is never deferred: the send queue reuses its
// buffers without a completion); the Stack settles it before lwIP's persist timer runs with a window closed
// (a zero-window probe or a split reads segment bytes). lwIP holds our segments by reference (PBUF_ROM), so
// ARP queueing keeps them as they are and sends them through link_output later. A record dies by
// itself when its chunk goes back to the free list (every byte acknowledged: io::TxArena::generation changes),
// and the records are dropped unsettled when the Stack ends (detach()).
//
// Shared (shared_ptr) between the Stack and the completion queues of its Context, which may outlive it: after
// detach() the book is empty and stays so. Threads: the Stack's thread only (the application's, in both
// threading modes: the RX thread never transmits). Memory: a fixed ring; nothing allocates.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tx_arena.hpp"
#include <softrdma/diagnostics.hpp>

namespace softrdma::stack {

class FillBook {
public:
    struct Fill {
        std::byte* dst;
        const std::byte* src;
        std::uint32_t len;  // 0: settled
        std::int32_t chunk;
        std::uint32_t gen;  // the chunk's generation when recorded
    };
    // Sizing rule: records live until their chunk is acknowledged, so the ring must hold what a connection has
    // unacknowledged — lwIP's send buffer (TCP_SND_BUF, 256 KiB) in FPDUs of at least 1 KiB payload (verbs'
    // DeferringFramer::kDeferMin) — plus the chunk the acknowledgement has not freed yet: 512 for a single piece
    // per FPDU. The ring is the Stack's, shared by its connections and retired from the head only, so a slow
    // connection's records hold the room of the others. When it is full the framer copies at once
    // (Stack::fill_room): correct, only slower. More records: more connections sending from their sources, but a
    // longer scan per frame carrying deferred bytes (Stack::link_output).
    static constexpr unsigned kCapacity = 512;
    static_assert((kCapacity & (kCapacity - 1)) == 0);

    // `arena`: the port's (borrowed; the Stack detaches the book before the port goes); `counters`: the Stack's.
    // Setup path: allocates one span per chunk of the arena.
    FillBook(io::TxArena* arena, StackCounters* counters)
        : arena_(arena), counters_(counters), spans_(arena != nullptr ? arena->size() : 0) {}

    bool pending() const noexcept { return head_ != tail_; }
    // Records add() still takes (dead ones retired first).
    unsigned room() noexcept {
        retire();
        return kCapacity - (tail_ - head_);
    }
    // Caller: room() != 0 and `dst` inside an acquired chunk of the arena.
    void add(std::byte* dst, const std::byte* src, std::uint32_t len) noexcept {
        const std::int32_t c = arena_->find(dst);
        const std::uint32_t gen = arena_->generation(c);
        Span& sp = spans_[static_cast<std::size_t>(c)];
        if (sp.gen != gen) sp = Span{tail_, tail_, gen};
        else sp.hi = tail_;
        at(tail_++) = Fill{dst, src, len, c, gen};
        counters_->tx_fill_deferred += len;
    }
    // A record still owed to its chunk (the chunk not freed since, the bytes not copied).
    bool live(const Fill& f) const noexcept { return f.len != 0 && arena_->generation(f.chunk) == f.gen; }
    // Copies `f` into its chunk now (the loan ends or the chunk's bytes are needed).
    void settle(Fill& f) noexcept {
        std::memcpy(f.dst, f.src, f.len);
        counters_->tx_fill_copied += f.len;
        f.len = 0;
    }
    // Every live record into its chunk: the application may take its sources back after this.
    void settle() noexcept {
        if (head_ == tail_) return;
        for (unsigned i = head_; i != tail_; ++i)
            if (Fill& f = at(i); live(f)) settle(f);
        head_ = tail_;
    }
    // The Stack ends: the chunks go with it, nothing will read them.
    void detach() noexcept { head_ = tail_; }

    // Iteration over [first(), end()) in the order recorded (stream order per connection).
    unsigned first() const noexcept { return head_; }
    unsigned end() const noexcept { return tail_; }
    // The part of [first(), end()) that holds every live record of chunk `c`: from its first record still in
    // the book to its last, with other chunks' records interleaved (those added meanwhile). A frame's piece of
    // one chunk scans this instead of the whole book: with 16 connections sending from their sources the book
    // holds hundreds of records, and scanning them all for every piece of every frame took ~14 % of a READ
    // responder's time (stock ib_read_bw -q 16).
    struct Range {
        unsigned from, to;
    };
    Range records_of(std::int32_t c) const noexcept {
        const Span& sp = spans_[static_cast<std::size_t>(c)];
        const unsigned n = tail_ - head_;
        if (sp.gen != arena_->generation(c) || sp.hi - head_ >= n) return {tail_, tail_};  // none left
        return {sp.lo - head_ < n ? sp.lo : head_, sp.hi + 1};
    }
    Fill& at(unsigned i) noexcept { return ring_[i & (kCapacity - 1)]; }
    const Fill& at(unsigned i) const noexcept { return ring_[i & (kCapacity - 1)]; }

private:
    void retire() noexcept {
        while (head_ != tail_ && !live(at(head_))) ++head_;
    }

    io::TxArena* arena_;
    StackCounters* counters_;
    // Per chunk: where its records of its current generation were added, first and last (free-running ring
    // positions; a generation that changed has none live: records_of()).
    struct Span {
        unsigned lo = 0, hi = 0;
        std::uint32_t gen = ~0u;
    };
    std::vector<Span> spans_;
    std::array<Fill, kCapacity> ring_{};
    unsigned head_ = 0, tail_ = 0;  // records in [head_, tail_), free-running (at() wraps)
};

}  // namespace softrdma::stack
