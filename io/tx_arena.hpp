// SPDX-License-Identifier: MIT
// Zero-copy transmit memory: fixed 64 KiB chunks of DPDK memory that the stack frames FPDUs into, that lwIP
// references (tcp_write without copy) until the peer acknowledges them, and that outgoing frames carry as
// external buffers (rte_pktmbuf_attach_extbuf) instead of copies. A payload byte is then written once on the
// TX side (application -> chunk, with the MPA CRC) before the driver takes it; before, it was copied three
// times (into a staging buffer, into lwIP's send buffer, into an mbuf).
//
// Ownership, per chunk, counted in its rte_mbuf_ext_shared_info reference count:
//   - acquire() gives the caller (a TCP connection's send queue) one reference: it may write the chunk's
//     bytes and hand them to lwIP; it drops the reference with release() once every byte it handed over is
//     acknowledged (or the connection is gone, so lwIP holds none).
//   - attach() gives an mbuf one reference for the slice it carries; the driver's rte_pktmbuf_free() drops it.
//     A driver that sends asynchronously (a PCI NIC's DMA) may still hold a retransmitted slice after the ACK:
//     the chunk is reused only when the last reference is gone.
// The chunk returns to the free list when its count reaches zero, on whichever of the two releases comes last.
//
// Threads: one thread, the one that owns the stack and calls tx_burst (the driver frees TX mbufs inside
// tx_burst, on that thread). Not thread-safe otherwise; the count itself is atomic (DPDK's), the free list not.
// Memory: allocated once at construction (setup path); acquire/release/attach allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <rte_mbuf.h>

namespace softrdma::io {

class TxArena {
public:
    static constexpr std::size_t kChunkSize = 64 * 1024;
    // Bytes a holder may write: the last 64 of each chunk stay unused, so the bytes of two chunks are never
    // adjacent in memory (lwIP extends a referenced pbuf over adjacent bytes, which would cross chunks).
    static constexpr std::size_t kUsable = kChunkSize - 64;

    // `chunks` chunks on NUMA socket `socket`. Throws io::Error when DPDK has not that much memory.
    TxArena(std::uint32_t chunks, int socket);
    ~TxArena();
    TxArena(const TxArena&) = delete;
    TxArena& operator=(const TxArena&) = delete;

    // A free chunk with one reference for the caller; -1 when none is free (the caller copies instead).
    std::int32_t acquire() noexcept;
    // Drops the holder's reference (see Ownership).
    void release(std::int32_t chunk) noexcept;
    std::span<std::byte> bytes(std::int32_t chunk) noexcept {
        return {base_ + static_cast<std::size_t>(chunk) * kChunkSize, kUsable};
    }
    // The chunk that holds `p`, or -1 when `p` is not arena memory.
    std::int32_t find(const void* p) const noexcept {
        const auto* b = static_cast<const std::byte*>(p);
        if (b < base_ || b >= base_ + static_cast<std::size_t>(count_) * kChunkSize) return -1;
        return static_cast<std::int32_t>(static_cast<std::size_t>(b - base_) / kChunkSize);
    }
    // Makes `m` (a fresh direct mbuf) carry [p, p+len) of `chunk` without a copy; `m` holds a reference until
    // it is freed. The slice must lie inside the chunk's usable bytes.
    void attach(rte_mbuf* m, std::int32_t chunk, void* p, std::uint16_t len) noexcept;

    // Counts the chunk's returns to the free list: a record of its bytes taken under one generation is stale
    // once it differs (the chunk was freed, and may hold someone else's bytes now).
    std::uint32_t generation(std::int32_t chunk) const noexcept { return gen_[static_cast<std::size_t>(chunk)]; }

    // Fair share (stack::TcpConnection::tx_buffer). Connections holding at least one chunk, each counted once
    // (the holder says when it takes its first chunk and lets go of its last). A holder with bytes in flight
    // takes no more than share() chunks, and none while the free list is empty: it waits for its own ACKs to
    // free some instead of copying (a copied 64 KiB segment costs two more copies, and on a memif zero-copy
    // client a ring of 2 KiB slots for one frame). The share leaves one share for a connection that holds none
    // yet, and is at least one chunk (with two, 96 streaming connections took all 192; ib_write_bw -q 256 copied
    // 28 % of its bytes, with one 22 %). Measured: stock ib_write_bw -q 16 (64 KiB) 4.5 GB/s when the
    // connections past the tenth copied, 15-28 GB/s with shares.
    static constexpr std::uint32_t kMinShare = 1;
    void add_holder() noexcept { ++holders_; }
    void remove_holder() noexcept { --holders_; }
    std::uint32_t holders() const noexcept { return holders_; }
    std::uint32_t share() const noexcept {
        const std::uint32_t s = count_ / (holders_ + 1);
        return s > kMinShare ? s : kMinShare;
    }
    bool exhausted() const noexcept { return free_.empty(); }
    std::uint32_t free_count() const noexcept { return static_cast<std::uint32_t>(free_.size()); }
    // Chunks returned to the free list since construction: the stack's chunk waiters see from it whether any
    // came back lately (stack::Stack, chunk queue).
    std::uint64_t freed() const noexcept { return freed_; }

    std::uint32_t size() const noexcept { return count_; }
    // The chunks' memory: [base(), base() + bytes()).
    const std::byte* base() const noexcept { return base_; }
    std::size_t bytes() const noexcept { return static_cast<std::size_t>(count_) * kChunkSize; }
    // Chunks handed out since construction (tests: the zero-copy path was taken).
    std::uint64_t acquired() const noexcept { return acquired_; }
    std::uint32_t in_use() const noexcept { return count_ - static_cast<std::uint32_t>(free_.size()); }

private:
    static void free_cb(void* addr, void* opaque);
    void put(std::int32_t chunk) noexcept {
        ++gen_[static_cast<std::size_t>(chunk)];
        ++freed_;
        free_.push_back(chunk);
    }

    std::byte* base_ = nullptr;
    rte_iova_t iova_ = RTE_BAD_IOVA;
    std::uint32_t count_ = 0;
    std::uint64_t acquired_ = 0;
    std::uint64_t freed_ = 0;
    std::uint32_t holders_ = 0;
    std::vector<rte_mbuf_ext_shared_info> shinfo_;  // one per chunk
    std::vector<std::int32_t> free_;                // capacity count_: push_back never allocates
    std::vector<std::uint32_t> gen_;                // one per chunk (generation())
};

}  // namespace softrdma::io
