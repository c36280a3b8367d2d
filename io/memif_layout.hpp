// SPDX-License-Identifier: MIT
// Internal to io/ and its tests: the leading fields of DPDK 22.11's memif driver state that io/memif_guard.cpp
// reads and writes (the driver's teardown guard, a zero-copy client's lent mbufs, the memif server's own data
// path), and memif's shared-memory ring format. Debian ships no driver headers, so they are declared here, for
// DPDK 22.11 only (drivers/net/memif/rte_eth_memif.h, memif.h; lib/ethdev/ethdev_driver.h); MemifGuard::attach
// checks several of them against what the port configured before anything relies on them.
#pragma once

#include <cstddef>
#include <cstdint>

#include <rte_common.h>
#include <rte_ethdev.h>
#include <rte_spinlock.h>
#include <rte_version.h>

// Exported by librte_ethdev for drivers (ethdev_driver.h, not installed): the device of a port, by name.
extern "C" struct rte_eth_dev* rte_eth_dev_allocated(const char* name);

namespace softrdma::io::detail {

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
// memif's struct memif_control_channel (drivers/net/memif/memif_socket.h).
struct MemifChannel {
    rte_intr_handle* intr_handle;
    void* msg_queue_first;    // TAILQ_HEAD(, memif_msg_queue_elt) msg_queue: its first element (null: empty)
    void** msg_queue_last;
    void* socket;             // struct memif_socket
    void* dev;                // struct rte_eth_dev: the device that took the connection (null until an INIT)
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
    MemifChannel* cc;
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
// Both are the driver's, made at each connection and freed at its end (memif_disconnect).
struct MemifRegionHead {
    void* addr;
    std::uint64_t region_size;  // bytes mapped at addr
    int fd;                     // the region's memory (a server keeps it open while connected)
};
struct MemifProcessPrivate {
    MemifRegionHead* regions[256];
    std::uint16_t regions_num;
};
// memif_ring_t (memif.h): head in the first cache line, tail in the second, the descriptors from the third.
struct MemifRingHead {
    std::uint32_t cookie;
    std::uint16_t flags;
    std::uint16_t head;
};
constexpr std::uint16_t kRingMaskInterrupts = 1;  // ring flag: its receiver polls (no eventfd to signal or read)
// memif_desc_t (memif.h): one buffer of a frame, in the shared memory of whoever made the region.
struct MemifDesc {
    std::uint16_t flags;  // kDescNext: the frame goes on in the next descriptor
    std::uint16_t region;
    std::uint32_t length;
    std::uint32_t offset;  // from the region's start
    std::uint32_t metadata;
};
static_assert(sizeof(MemifDesc) == 16);
constexpr std::uint16_t kDescNext = 1;
inline std::uint16_t* ring_tail(MemifRingHead* r) noexcept {
    return reinterpret_cast<std::uint16_t*>(reinterpret_cast<std::byte*>(r) + RTE_CACHE_LINE_SIZE);
}
inline MemifDesc* ring_desc(MemifRingHead* r) noexcept {
    return reinterpret_cast<MemifDesc*>(reinterpret_cast<std::byte*>(r) + 2 * RTE_CACHE_LINE_SIZE);
}
constexpr std::uint32_t kFlagDisabled = 1u << 3;  // refuses connection requests
constexpr std::uint32_t kFlagZeroCopy = 1u << 2;
constexpr std::uint32_t kFlagConnected = 1u << 1;  // ETH_MEMIF_FLAG_CONNECTED: rings and regions mapped
constexpr std::uint32_t kKnownFlags = 0x1f;

}  // namespace softrdma::io::detail
