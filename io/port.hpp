// SPDX-License-Identifier: MIT
// One DPDK Ethernet port with one RX and one TX queue, behind a small interface. The backend (memif,
// af_packet, ring, or a real device) is chosen at run time from PortConfig.
//
// Threads: rx_burst() may be called by one thread and tx_burst() by one (possibly other) thread; nothing
// here touches lwIP. Counters are written only by the thread of their direction.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include "io/eal.hpp"
#include "io/error.hpp"

namespace softrdma::io {

class PcapWriter;

enum class Backend {
    memif,      // shared memory between two processes on one machine (the default)
    af_packet,  // a Linux interface (veth, tap, or a physical NIC) through AF_PACKET
    ring,       // inside one process (tests): see open_ring_pair()
    device,     // anything else DPDK can drive: `device` is a PCI address or a full vdev string
};

using MacAddress = std::array<std::uint8_t, 6>;

struct PortConfig {
    Backend backend = Backend::memif;
    // memif: socket path shared by both ends, one end the server. Same `memif_id` on both ends.
    std::string memif_socket = "/run/softrdma-memif.sock";
    bool memif_server = true;
    unsigned memif_id = 0;
    // af_packet: the Linux interface to attach to.
    std::string iface;
    // device: a PCI address ("0000:01:00.0") or a full vdev string ("net_xxx0,arg=...").
    std::string device;
    // MAC address; unset = the backend's own (memif derives one from role and id to keep peers distinct).
    bool has_mac = false;
    MacAddress mac{};
    std::uint16_t mtu = 1500;  // 9000 where the backend allows
    std::uint16_t rx_descriptors = 1024;
    std::uint16_t tx_descriptors = 1024;
    // mbufs in the pool; 0 = the sizing rule in port.cpp (rx + tx descriptors + frames the stack may hold).
    std::uint32_t mbufs = 0;
    // Write every frame sent and received to this pcap file (tshark/Wireshark); empty = off. Debug aid:
    // it costs a buffered file write per frame.
    std::string capture_path;
    // How long open_port() waits for the link (for memif: the peer process) before failing.
    std::chrono::milliseconds link_timeout{10000};
};

struct PortCounters {
    std::uint64_t rx_packets = 0, rx_bytes = 0;
    std::uint64_t tx_packets = 0, tx_bytes = 0;
    std::uint64_t tx_refused = 0;  // frames tx_burst() could not queue (TX ring full); the caller keeps them
};

class Port {
public:
    ~Port();
    Port(const Port&) = delete;
    Port& operator=(const Port&) = delete;

    // Receives up to out.size() frames. Ownership: each returned mbuf now belongs to the caller, who must
    // rte_pktmbuf_free() it (or hand it on, saying who frees it).
    std::uint16_t rx_burst(std::span<rte_mbuf*> out) noexcept {
        const auto n = rte_eth_rx_burst(port_id_, 0, out.data(), static_cast<std::uint16_t>(out.size()));
        if (n != 0) account_rx(out.first(n));
        return n;
    }
    // Queues frames for transmission. Ownership: the first `return value` mbufs now belong to the driver;
    // the rest stay with the caller (retry or free).
    std::uint16_t tx_burst(std::span<rte_mbuf*> frames) noexcept {
        if (capture_) [[unlikely]] capture_tx(frames);  // before the driver may free them
        const auto n = rte_eth_tx_burst(port_id_, 0, frames.data(), static_cast<std::uint16_t>(frames.size()));
        account_tx(frames, n);
        return n;
    }

    // An mbuf from this port's pool (nullptr when the pool is empty). Ownership: the caller's.
    rte_mbuf* alloc() noexcept { return rte_pktmbuf_alloc(pool_); }
    rte_mempool* pool() const noexcept { return pool_; }
    // Mbufs currently out of the pool (in rings, held by the stack, or in flight), for leak checks.
    unsigned mbufs_in_use() const noexcept;
    unsigned mbufs_total() const noexcept;

    std::uint16_t id() const noexcept { return port_id_; }
    const std::string& name() const noexcept { return name_; }
    const MacAddress& mac() const noexcept { return mac_; }
    std::uint16_t mtu() const noexcept { return mtu_; }
    // Largest frame (Ethernet header + MTU) one mbuf of this pool holds without chaining.
    std::uint32_t mbuf_data_room() const noexcept;
    bool link_up() const noexcept;
    const PortCounters& counters() const noexcept { return counters_; }
    // The driver's own statistics (imissed, ierrors, rx_nombuf...).
    rte_eth_stats device_stats() const noexcept;
    // Flushes the capture file (if any) to disk.
    void flush_capture() noexcept;

private:
    friend std::unique_ptr<Port> open_port(const PortConfig&, const EalConfig&);
    friend std::array<std::unique_ptr<Port>, 2> open_ring_pair(const PortConfig&, const PortConfig&,
                                                               const EalConfig&);
    Port(std::uint16_t port_id, std::string name, const PortConfig& cfg);
    void start(const PortConfig& cfg);
    void wait_link(std::chrono::milliseconds timeout);
    void account_rx(std::span<rte_mbuf* const> frames) noexcept;
    void account_tx(std::span<rte_mbuf* const> frames, std::uint16_t sent) noexcept;
    void capture_tx(std::span<rte_mbuf* const> frames) noexcept;

    std::uint16_t port_id_;
    std::string name_;
    rte_mempool* pool_ = nullptr;
    MacAddress mac_{};
    std::uint16_t mtu_ = 1500;
    bool started_ = false;
    bool memif_ = false;
    PortCounters counters_;
    std::unique_ptr<PcapWriter> capture_;
    // Refused frames are a suffix the caller offers again: remember them so the capture records each once.
    const rte_mbuf* refused_head_ = nullptr;
    std::size_t refused_count_ = 0;
};

// Starts the EAL if this process has not yet (the port's device is added to `eal.vdevs`), then configures,
// starts and waits for the link of one port. Throws io::Error with a message naming the fix on bad config,
// missing hugepages (when required), a device DPDK cannot create, or a peer that never appears.
std::unique_ptr<Port> open_port(const PortConfig& port, const EalConfig& eal = {});

// Two ports inside this process wired back to back through rte_rings (net_ring): what one sends, the
// other receives. For tests of io itself. Each port has its own config (MTU, capture file...).
std::array<std::unique_ptr<Port>, 2> open_ring_pair(const PortConfig& a, const PortConfig& b,
                                                    const EalConfig& eal = {});

// "02:00:00:00:00:01"-style text for logs.
std::string to_string(const MacAddress& mac);

}  // namespace softrdma::io
