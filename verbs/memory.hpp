// SPDX-License-Identifier: MIT
// The MR table and its one check (internal to verbs). Every access to registered memory — an inbound WRITE,
// a READ source, an atomic target, SEND with Invalidate, a local SGE at post time — asks lookup() or
// invalidate() here: STag (tag + key), validity, protection domain, rights, bounds.
//
// Threads: with an RX thread the table is read there (placement) and by the application thread, and SEND with
// Invalidate clears `valid` there: every field is an atomic (relaxed; plain loads on x86). An entry is reused
// only after the RX thread has quiesced (release()), so a check never mixes two registrations' fields in a way
// that lets a write land outside either region.
// Registrations in use: a local SGE is checked when its WR is posted, and its bytes are read or written later
// (the send queue gathers FPDU by FPDU, a receive or READ sink is placed into when the data arrives). Each such
// SGE keeps a Lease (slot + generation): release() moves the slot's generation on, and every later use asks
// alive() first, so a region deregistered while a WR still names it fails that WR (local protection error)
// instead of reading or writing memory the application may have freed.
// Memory: max_mr entries allocated at construction; registration and release are control-path calls.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "rdmap/upper.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::verbs::detail {

// A registration's identity for the life of one registration (see alive()).
struct Lease {
    std::uint32_t index{0};
    std::uint32_t gen{0};
};

// A posted receive, checked at post time (local_write, PD, bounds): its SGEs as spans, each with the lease of
// its region (checked again at every placement).
struct RecvSlot {
    std::uint64_t wr_id{0};
    std::array<std::span<std::byte>, kMaxSge> sge{};
    std::array<Lease, kMaxSge> lease{};
    std::uint8_t nsge{0};
    std::uint32_t total{0};
    bool bound{false};
    std::uint32_t msn{0};
};

class MemoryTable {
public:
    explicit MemoryTable(std::uint32_t max_mr);

    struct Registration {
        std::uint32_t index;
        std::uint32_t stag;
    };
    // Registers `bytes` (caller-owned) with `access` for protection domain `pd`: a free slot and fresh random
    // tag bits and key (STag layout in verbs.hpp). Throws verbs::Error when the table is full or getrandom fails.
    Registration add(std::span<std::byte> bytes, std::uint32_t pd, std::uint32_t access);
    // Ends a registration; `quiesce` (the RX thread's) runs between making the entry unusable and forgetting
    // its memory, so nothing is placed into the memory after this returns.
    void release(std::uint32_t index, const std::function<void()>& quiesce);
    void set_valid(std::uint32_t index, bool valid) noexcept;
    bool valid(std::uint32_t index) const noexcept;
    // Valid again under a new key; returns the new STag.
    std::uint32_t rekey(std::uint32_t index, std::uint8_t key) noexcept;

    // The check: `len` bytes at `to` under `stag`, for protection domain `pd`, with the rights `need` (0 = read
    // only, for local SGEs without local_write). Data path: no allocation, no lock.
    rdmap::Mem lookup(std::uint32_t stag, std::uint64_t to, std::size_t len, std::uint32_t pd, std::uint32_t need) const noexcept;
    // A local lookup that also returns the region's lease (for SGEs used after posting).
    rdmap::Mem lookup_local(std::uint32_t stag, std::uint64_t to, std::size_t len, std::uint32_t pd, std::uint32_t need,
                            Lease& lease) const noexcept;
    // The registration a lease names is still the one in its slot (not released since). Data path: one load.
    bool alive(const Lease& l) const noexcept { return entries_[l.index].gen.load(std::memory_order_relaxed) == l.gen; }
    template <std::size_t N>
    bool alive(const std::array<Lease, N>& l, std::size_t n) const noexcept {
        for (std::size_t i = 0; i < n; ++i)
            if (!alive(l[i])) return false;
        return true;
    }
    // SEND with Invalidate: the STag must be valid, keyed, of `pd` and registered with access::remote_invalidate.
    rdmap::MemError invalidate(std::uint32_t stag, std::uint32_t pd) noexcept;

private:
    struct Entry {
        std::atomic<std::uint32_t> tag{0};  // the STag's upper 24 bits (slot + 1 | random)
        std::atomic<std::byte*> base{nullptr};
        std::atomic<std::size_t> length{0};
        std::atomic<std::uint32_t> pd{0};
        std::atomic<std::uint32_t> access{0};
        std::atomic<std::uint8_t> key{0};
        std::atomic<bool> in_use{false};
        std::atomic<bool> valid{false};
        std::atomic<std::uint32_t> gen{0};  // moves on at every release (Lease)
    };
    Entry* entry(std::uint32_t stag) const noexcept;

    std::uint32_t max_mr_;
    std::uint32_t slot_bits_{0};  // the tag's low bits that hold slot + 1 (the rest is random)
    std::unique_ptr<Entry[]> entries_;
    std::vector<std::uint32_t> free_;  // capacity max_mr, reserved at construction
};

}  // namespace softrdma::verbs::detail
