// SPDX-License-Identifier: MIT
#include "io/tx_arena.hpp"

#include <rte_errno.h>
#include <rte_malloc.h>

#include <string>

#include "io/error.hpp"

namespace softrdma::io {

TxArena::TxArena(std::uint32_t chunks, int socket) : count_(chunks), shinfo_(chunks), gen_(chunks, 0) {
    base_ = static_cast<std::byte*>(
        rte_malloc_socket("softrdma_tx_arena", static_cast<std::size_t>(chunks) * kChunkSize, kChunkSize, socket));
    if (base_ == nullptr)
        throw Error("cannot allocate " + std::to_string(chunks) + " TX chunks of 64 KiB (" +
                    std::to_string(static_cast<std::size_t>(chunks) * kChunkSize >> 20) +
                    " MiB) in DPDK memory: more hugepages, a larger EalConfig::no_huge_memory_mb, or a smaller "
                    "PortConfig::tx_chunks (0 turns zero-copy transmit off)");
    iova_ = rte_malloc_virt2iova(base_);
    free_.reserve(chunks);
    for (std::uint32_t i = chunks; i-- > 0;) {
        shinfo_[i].free_cb = &TxArena::free_cb;
        shinfo_[i].fcb_opaque = this;
        rte_mbuf_ext_refcnt_set(&shinfo_[i], 0);
        free_.push_back(static_cast<std::int32_t>(i));  // chunk 0 on top: the first taken
    }
}

TxArena::~TxArena() { rte_free(base_); }

std::int32_t TxArena::acquire() noexcept {
    if (free_.empty()) return -1;
    const std::int32_t c = free_.back();
    free_.pop_back();
    rte_mbuf_ext_refcnt_set(&shinfo_[static_cast<std::size_t>(c)], 1);
    ++acquired_;
    return c;
}

void TxArena::release(std::int32_t chunk) noexcept {
    if (rte_mbuf_ext_refcnt_update(&shinfo_[static_cast<std::size_t>(chunk)], -1) == 0) put(chunk);
}

void TxArena::attach(rte_mbuf* m, std::int32_t chunk, void* p, std::uint16_t len) noexcept {
    rte_mbuf_ext_shared_info* sh = &shinfo_[static_cast<std::size_t>(chunk)];
    rte_mbuf_ext_refcnt_update(sh, 1);
    const auto off = static_cast<std::size_t>(static_cast<std::byte*>(p) - base_);
    // buf_addr is the slice itself, so free_cb's address finds the chunk (find()).
    rte_pktmbuf_attach_extbuf(m, p, iova_ == RTE_BAD_IOVA ? RTE_BAD_IOVA : iova_ + off, len, sh);
    m->data_len = len;
    m->pkt_len = len;
}

// The last mbuf carrying a slice of a chunk whose holder already let go was freed (inside tx_burst or
// rte_pktmbuf_free on the owner thread).
void TxArena::free_cb(void* addr, void* opaque) {
    auto* self = static_cast<TxArena*>(opaque);
    self->put(self->find(addr));
}

}  // namespace softrdma::io
