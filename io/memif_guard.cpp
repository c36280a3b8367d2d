// SPDX-License-Identifier: MIT
//
// What DPDK 22.11's memif driver (drivers/net/memif/rte_eth_memif.c, memif_socket.c) does when a link ends:
//
// - Each port has a control channel: a unix SOCK_SEQPACKET socket watched by DPDK's interrupt thread
//   (eal-intr-thread), which runs memif_intr_handler() for it. When the peer goes away (its process exits or
//   closes: end of file on the socket, or a DISCONNECT message) that handler calls memif_disconnect() on the
//   interrupt thread, at any moment relative to the application's threads.
// - memif_disconnect() marks the link down, clears the CONNECTED flag, takes the control-channel spinlock
//   (pmd->cc_lock) to unregister the channel, releases it, closes the queues' eventfds, then
//   memif_free_regions() munmap()s the shared memory and rte_free()s the region descriptors, and finally
//   clears the connection parameters (pmd->run).
// - rx/tx burst check the CONNECTED flag once on entry, then read ring pointers and packet buffers in those
//   regions with no synchronisation against the interrupt thread. A burst that passed the check just before
//   the peer left reads unmapped (or freed and zeroed) memory: SIGSEGV inside rx_burst. Checking the link
//   before each burst does not close that window; only keeping memif_disconnect from unmapping does.
// - rte_eth_dev_stop() runs memif_disconnect() on the calling thread. If the interrupt thread runs it at the
//   same time (both ends closing within microseconds of each other, the usual end of a test), both free the
//   same regions: "EAL: Error: Invalid memory" and heap corruption. Only the unregistering is under cc_lock.
//
// So io::Port holds cc_lock itself for as long as its data path may run. memif_disconnect then stops at the
// lock, after marking the link down but before touching any shared memory. Port's link watcher sees the link
// go down, closes its burst gate, waits for bursts in flight to leave, and releases the lock: the driver
// unmaps only when nobody can be reading. To close, Port takes the lock, shuts the control socket down and
// releases it, so that the interrupt thread alone runs memif_disconnect, waits until that is over (settled()),
// and only then stops and closes the port, whose own memif_disconnect then finds nothing left to free.
//
// Debian ships no driver headers, so the few leading fields read here are declared below, for DPDK 22.11
// only; attach() checks several of them against what we configured before anything relies on them.
// rte_intr_fd_get() is still marked experimental in 22.11.
#define ALLOW_EXPERIMENTAL_API
#include "io/memif_guard.hpp"

#include <sys/socket.h>

#include <cstddef>
#include <cstring>

#include <rte_ethdev.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_interrupts.h>
#include <rte_spinlock.h>
#include <rte_version.h>

// Exported by librte_ethdev for drivers (ethdev_driver.h, not installed): the device of a port, by name.
extern "C" struct rte_eth_dev* rte_eth_dev_allocated(const char* name);

namespace softrdma::io::detail {
namespace {

constexpr bool kKnownDpdk = RTE_VERSION >= RTE_VERSION_NUM(22, 11, 0, 0) && RTE_VERSION < RTE_VERSION_NUM(22, 12, 0, 0);

// Leading fields of DPDK 22.11's struct rte_eth_dev (lib/ethdev/ethdev_driver.h).
struct EthDevHead {
    void* fast_path[6];  // rx_pkt_burst, tx_pkt_burst, tx_pkt_prepare, rx_queue_count, rx/tx_descriptor_status
    struct EthDevDataHead* data;
    void* process_private;  // memif: struct pmd_process_private
};
// Leading fields of struct rte_eth_dev_data (same header).
struct EthDevDataHead {
    char name[RTE_ETH_NAME_MAX_LEN];
    void** rx_queues;
    void** tx_queues;
    std::uint16_t nb_rx_queues;
    std::uint16_t nb_tx_queues;
    rte_eth_dev_sriov sriov;
    void* dev_private;
};
// Leading field of memif's struct memif_control_channel (drivers/net/memif/memif_socket.h).
struct MemifChannelHead {
    rte_intr_handle* intr_handle;
};
// Leading fields of memif's struct pmd_internals (drivers/net/memif/rte_eth_memif.h).
struct MemifRunParams {
    std::uint8_t log2_ring_size;
    std::uint8_t num_c2s_rings;
    std::uint8_t num_s2c_rings;
    std::uint16_t pkt_buffer_size;
};
struct MemifPmdHead {
    std::uint32_t id;
    int role;  // 0 server, 1 client
    std::uint32_t flags;
    char* socket_filename;
    char secret[24];
    MemifChannelHead* cc;
    rte_spinlock_t cc_lock;
    char remote_name[RTE_DEV_NAME_MAX_LEN];
    char remote_if_name[RTE_DEV_NAME_MAX_LEN];
    MemifRunParams cfg;  // configured maxima
    MemifRunParams run;  // of the current connection; zeroed at the end of memif_disconnect
};
// memif's struct memif_queue (rte_eth_memif.h), up to the ring size. A zero-copy client keeps in `buffers` the
// mbufs it lent the server: RX buffers posted to the ring, and sent frames (one slot per segment), from
// last_tail up to the ring's head, which only the client writes.
struct MemifQueue {
    rte_mempool* mempool;
    void* pmd;
    int type;  // memif_ring_type_t: 0 client-to-server, 1 server-to-client
    std::uint16_t region;
    std::uint16_t in_port;
    std::uint32_t ring_offset;
    std::uint16_t last_head;
    std::uint16_t last_tail;
    rte_mbuf** buffers;
    std::uint64_t n_pkts;
    std::uint64_t n_bytes;
    rte_intr_handle* intr_handle;
    std::uint8_t log2_ring_size;
};
static_assert(offsetof(MemifQueue, buffers) == 32 && offsetof(MemifQueue, log2_ring_size) == 64);
// memif's struct memif_region and struct pmd_process_private (rte_eth_memif.h): region 0 holds the rings.
struct MemifRegionHead {
    void* addr;
};
struct MemifProcessPrivate {
    MemifRegionHead* regions[256];
    std::uint16_t regions_num;
};
// memif_ring_t (memif.h): head in the first cache line, tail in the second.
struct MemifRingHead {
    std::uint32_t cookie;
    std::uint16_t flags;
    std::uint16_t head;
};
constexpr std::uint32_t kFlagDisabled = 1u << 3;  // refuses connection requests
constexpr std::uint32_t kFlagZeroCopy = 1u << 2;
constexpr std::uint32_t kKnownFlags = 0x1f;

MemifPmdHead* pmd(void* p) { return static_cast<MemifPmdHead*>(p); }

}  // namespace

bool MemifGuard::attach(std::uint16_t port_id, const std::string& name, const MemifExpect& expect,
                        std::string& why) {
    if constexpr (!kKnownDpdk) {
        why = "built against DPDK " + std::string(rte_version()) + ", not 22.11";
        return false;
    }
    if (std::strncmp(rte_version(), "DPDK 22.11", 10) != 0) {
        why = std::string("running with ") + rte_version() + ", not DPDK 22.11";
        return false;
    }
    const auto* dev = reinterpret_cast<const EthDevHead*>(rte_eth_dev_allocated(name.c_str()));
    const EthDevDataHead* data = dev != nullptr ? dev->data : nullptr;
    // The queue pointers ethdev publishes for the fast path must be the ones in the device data we found.
    if (data == nullptr || std::strncmp(data->name, name.c_str(), sizeof data->name) != 0 ||
        data->nb_rx_queues != 1 || data->nb_tx_queues != 1 || data->rx_queues == nullptr ||
        data->tx_queues == nullptr || data->rx_queues[0] != rte_eth_fp_ops[port_id].rxq.data[0] ||
        data->tx_queues[0] != rte_eth_fp_ops[port_id].txq.data[0]) {
        why = "ethdev's device data of " + name + " does not have the expected layout";
        return false;
    }
    auto* p = static_cast<MemifPmdHead*>(data->dev_private);
    if (p == nullptr || p->id != expect.id || p->role != (expect.server ? 0 : 1) ||
        (p->flags & ~kKnownFlags) != 0 || p->socket_filename == nullptr ||
        expect.socket != p->socket_filename || p->cfg.pkt_buffer_size != expect.buffer_size ||
        p->cfg.log2_ring_size != expect.log2_ring_size || (p->cc_lock.locked != 0 && p->cc_lock.locked != 1)) {
        why = "memif's private data of " + name + " does not have the expected layout";
        return false;
    }
    pmd_ = p;
    if (expect.zero_copy) {
        // The queues must be the ones we set up: a zero-copy client's two (the driver's queue setup writes
        // type, port and the RX pool), of this port, filled from our RX pool. Otherwise the lent mbufs stay
        // with the driver until the port closes and its pools go (reclaim_lent does nothing).
        auto* txq = static_cast<MemifQueue*>(data->tx_queues[0]);
        auto* rxq = static_cast<MemifQueue*>(data->rx_queues[0]);
        if ((p->flags & kFlagZeroCopy) != 0 && txq != nullptr && rxq != nullptr && txq->in_port == port_id &&
            rxq->in_port == port_id && txq->type == 0 && rxq->type == 1 && rxq->mempool == expect.rx_pool &&
            dev->process_private != nullptr) {
            dev_ = dev;
            txq_ = txq;
            rxq_ = rxq;
        } else {
            why = "memif's zero-copy queues of " + name + " do not have the expected layout";
        }
    }
    return true;
}

void MemifGuard::reclaim_lent() noexcept {
    if (!held_ || dev_ == nullptr) return;
    const auto* pp = static_cast<const MemifProcessPrivate*>(static_cast<const EthDevHead*>(dev_)->process_private);
    // memif_disconnect unmaps and frees the regions only after taking the lock we hold (the caller held it
    // since the link came up): the rings are still there, unless no connection was ever made.
    if (pp->regions_num == 0 || pp->regions[0] == nullptr || pp->regions[0]->addr == nullptr) return;
    for (void* qp : {txq_, rxq_}) {
        auto* q = static_cast<MemifQueue*>(qp);
        if (q->buffers == nullptr || q->log2_ring_size > 14) continue;
        const auto* ring =
            reinterpret_cast<const MemifRingHead*>(static_cast<const std::byte*>(pp->regions[0]->addr) + q->ring_offset);
        const std::uint16_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
        const std::uint16_t size = static_cast<std::uint16_t>(1u << q->log2_ring_size);
        const std::uint16_t lent = static_cast<std::uint16_t>(head - q->last_tail);
        if (lent > size) continue;  // no state the driver leaves: touch nothing
        const std::uint16_t mask = static_cast<std::uint16_t>(size - 1);
        // Ownership: the driver's (lent to the peer, who is gone or going), ours again here; one slot per
        // segment, freed one by one as the driver itself does.
        for (std::uint16_t i = 0; i < lent; ++i)
            rte_pktmbuf_free_seg(q->buffers[static_cast<std::uint16_t>(q->last_tail + i) & mask]);
        q->last_tail = head;
    }
}

void MemifGuard::release_lent_arrays() noexcept {
    if (dev_ == nullptr) return;
    for (void* qp : {txq_, rxq_}) {
        auto* q = static_cast<MemifQueue*>(qp);
        rte_free(q->buffers);  // allocated by the driver at each connection (memif_init_queues), never freed
        q->buffers = nullptr;
    }
}

bool MemifGuard::try_hold() noexcept {
    if (!held_ && rte_spinlock_trylock(&pmd(pmd_)->cc_lock) != 0) held_ = true;
    return held_;
}

void MemifGuard::release() noexcept {
    if (!held_) return;
    held_ = false;
    rte_spinlock_unlock(&pmd(pmd_)->cc_lock);
}

bool MemifGuard::shut_channel() noexcept {
    MemifPmdHead* p = pmd(pmd_);
    // The interrupt thread writes flags without atomics only while (re)connecting; an atomic OR keeps ours
    // from tearing anything it writes at the same time.
    __atomic_fetch_or(&p->flags, kFlagDisabled, __ATOMIC_SEQ_CST);
    // Under cc_lock the channel cannot be freed: memif_disconnect clears pmd->cc and frees the channel
    // (or schedules its freeing) only while holding the lock.
    MemifChannelHead* cc = __atomic_load_n(&p->cc, __ATOMIC_ACQUIRE);
    if (cc == nullptr) return false;
    const int fd = rte_intr_fd_get(cc->intr_handle);
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // end of file for both ends' interrupt threads
    return true;
}

bool MemifGuard::settled() const noexcept {
    MemifPmdHead* p = pmd(pmd_);
    // A server learns only the ring counts (from ADD_RING), a client all four (from HELLO): all must be 0.
    return __atomic_load_n(&p->cc, __ATOMIC_ACQUIRE) == nullptr &&
           __atomic_load_n(&p->run.num_c2s_rings, __ATOMIC_ACQUIRE) == 0 &&
           __atomic_load_n(&p->run.num_s2c_rings, __ATOMIC_ACQUIRE) == 0 &&
           __atomic_load_n(&p->run.pkt_buffer_size, __ATOMIC_ACQUIRE) == 0 &&
           __atomic_load_n(&p->run.log2_ring_size, __ATOMIC_ACQUIRE) == 0;
}

std::string MemifGuard::describe() const {
    const MemifPmdHead* p = pmd(pmd_);
    return std::string("control channel ") + (__atomic_load_n(&p->cc, __ATOMIC_ACQUIRE) ? "present" : "gone") +
           ", flags " + std::to_string(__atomic_load_n(&p->flags, __ATOMIC_ACQUIRE)) + ", rings " +
           std::to_string(p->run.num_c2s_rings) + "/" + std::to_string(p->run.num_s2c_rings) + ", lock " +
           (p->cc_lock.locked ? "taken" : "free") + (held_ ? " (by us)" : "");
}

}  // namespace softrdma::io::detail
