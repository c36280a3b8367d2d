// SPDX-License-Identifier: MIT
#include "io/port.hpp"

#include <unistd.h>

#include <cstdio>
#include <thread>

#include <rte_bus_vdev.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_lcore.h>
#include <rte_ring.h>
#include <spdlog/spdlog.h>

#include "io/pcap_writer.hpp"

namespace softrdma::io {
namespace {

constexpr std::uint32_t kEthHeader = 14 + 4;  // Ethernet header + one VLAN tag of slack
constexpr unsigned kPoolCache = 256;          // per-lcore mempool cache (DPDK's recommended size)
// Frames the TCP stack may hold at once outside the driver's rings: RX frames wrapped as pbufs sitting in
// receive queues and out-of-order queues (bounded per pcb by TCP_OOSEQ_MAX_PBUFS in lwipopts.h) plus its
// TX queue (stack::Stack::kTxQueue = 1024). Busy connections consume their data promptly; beyond this, RX drops and TCP resends.
constexpr std::uint32_t kStackHeldFrames = 4096;

std::string format_mac(const MacAddress& m) {
    char buf[18];
    std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
    return buf;
}

// The vdev (or PCI) string for a config, and the name DPDK gives the port it creates.
struct DeviceArgs {
    std::string args;
    std::string name;
    bool pci = false;
};

DeviceArgs device_args(const PortConfig& cfg) {
    switch (cfg.backend) {
    case Backend::memif: {
        const std::string name = "net_memif" + std::to_string(cfg.memif_id);
        MacAddress mac = cfg.mac;
        // Distinct locally administered MACs for the two ends unless the user set one.
        if (!cfg.has_mac)
            mac = {0x02, 0x53, 0x52, 0x00, static_cast<std::uint8_t>(cfg.memif_id),
                   static_cast<std::uint8_t>(cfg.memif_server ? 1 : 2)};
        // bsize: one memif buffer holds a whole frame (no descriptor chains) up to 9000-byte MTUs.
        const unsigned bsize = cfg.mtu + kEthHeader > 2048 ? 10240 : 2048;
        return {name + ",role=" + (cfg.memif_server ? "server" : "client") + ",id=" +
                    std::to_string(cfg.memif_id) + ",socket=" + cfg.memif_socket + ",mac=" + format_mac(mac) +
                    ",bsize=" + std::to_string(bsize) + ",rsize=11",  // 2048 slots per direction
                name};
    }
    case Backend::af_packet: {
        if (cfg.iface.empty()) throw Error("af_packet backend needs an interface name (PortConfig::iface)");
        const std::string name = "net_af_packet_" + cfg.iface;
        return {name + ",iface=" + cfg.iface + ",qpairs=1", name};
    }
    case Backend::device: {
        if (cfg.device.empty())
            throw Error("device backend needs a PCI address or vdev string (PortConfig::device)");
        const bool pci = cfg.device.find(':') != std::string::npos && cfg.device.find(',') == std::string::npos &&
                         cfg.device.rfind("net_", 0) != 0;
        return {cfg.device, cfg.device.substr(0, cfg.device.find(',')), pci};
    }
    case Backend::ring: throw Error("the ring backend pairs two ports in one process: use open_ring_pair()");
    }
    throw Error("unknown backend");
}

std::uint32_t data_room_for(std::uint16_t mtu) {
    // Whole frame in one mbuf: Ethernet header + MTU, at least DPDK's default 2 KiB, plus headroom.
    const std::uint32_t frame = std::max<std::uint32_t>(2048, mtu + kEthHeader);
    return ((frame + 1023) / 1024) * 1024 + RTE_PKTMBUF_HEADROOM;
}

}  // namespace

std::string to_string(const MacAddress& mac) { return format_mac(mac); }

Port::Port(std::uint16_t port_id, std::string name, const PortConfig& cfg)
    : port_id_(port_id), name_(std::move(name)), mtu_(cfg.mtu),
      memif_(cfg.backend == Backend::memif) {}

Port::~Port() {
    if (started_) {
        // DPDK 22.11's memif frees its shared regions a second time ("EAL: Error: Invalid memory") when it
        // is stopped after its interrupt thread already handled the peer's disconnect; and ethdev will not
        // close a started port. So a memif port whose peer is already gone is left to process exit, which
        // releases its memory and socket; every other port is stopped and closed.
        if (!memif_ || link_up()) {
            rte_eth_dev_stop(port_id_);
            rte_eth_dev_close(port_id_);
        }
    }
    if (capture_) capture_->flush();
    // The pool outlives nothing that uses it: the stack returns every mbuf before the Port goes.
    if (pool_ != nullptr) rte_mempool_free(pool_);
}

void Port::start(const PortConfig& cfg) {
    rte_eth_dev_info info{};
    if (rte_eth_dev_info_get(port_id_, &info) != 0) throw Error("cannot query device " + name_);
    // The largest MTU ethdev will configure: DPDK checks MTU + overhead against max_rx_pktlen.
    const std::uint32_t overhead = info.max_mtu < UINT16_MAX && info.max_rx_pktlen > info.max_mtu
                                       ? info.max_rx_pktlen - info.max_mtu
                                       : RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
    const std::uint32_t device_max = std::min<std::uint32_t>(info.max_mtu, info.max_rx_pktlen - overhead);
    std::uint16_t device_mtu = cfg.mtu;
    if (cfg.mtu > device_max) {
        // memif (DPDK 22.11) reports a 1518-byte frame limit but carries frames of any size through its
        // shared-memory rings (chained buffers): the link MTU is ours to choose, so configure ethdev at its
        // limit and let the stack use cfg.mtu. Every other backend must allow the MTU itself.
        if (cfg.backend != Backend::memif)
            throw Error("MTU " + std::to_string(cfg.mtu) + " not allowed by " + name_ + " (at most " +
                        std::to_string(device_max) + ")");
        device_mtu = static_cast<std::uint16_t>(std::min<std::uint32_t>(device_max, RTE_ETHER_MTU));
    }
    if (cfg.mtu < 576) throw Error("MTU " + std::to_string(cfg.mtu) + " below IPv4's minimum of 576");

    // Mempool sizing rule: RX descriptors (each holds an mbuf once filled) + TX descriptors (mbufs wait
    // there until sent) + frames the stack holds (kStackHeldFrames) + one cache per lcore; rounded to
    // 2^n - 1, the size DPDK's ring-based pool uses best.
    std::uint32_t n = cfg.mbufs;
    if (n == 0) {
        const std::uint32_t need =
            cfg.rx_descriptors + cfg.tx_descriptors + kStackHeldFrames + kPoolCache * rte_lcore_count();
        n = 1;
        while (n < need + 1) n <<= 1;
        n -= 1;
    }
    const std::string pool_name = "softrdma_p" + std::to_string(port_id_);
    pool_ = rte_pktmbuf_pool_create(pool_name.c_str(), n, kPoolCache, 0,
                                    static_cast<std::uint16_t>(data_room_for(cfg.mtu)), rte_socket_id());
    if (pool_ == nullptr)
        throw Error("cannot allocate " + std::to_string(n) + " mbufs of " + std::to_string(data_room_for(cfg.mtu)) +
                    " bytes for " + name_ + ": " + rte_strerror(rte_errno) +
                    " (more hugepages, or a larger EalConfig::no_huge_memory_mb)");

    rte_eth_conf conf{};
    conf.rxmode.mtu = device_mtu;
    if (rte_eth_dev_configure(port_id_, 1, 1, &conf) != 0) throw Error("cannot configure " + name_);
    std::uint16_t nrx = cfg.rx_descriptors, ntx = cfg.tx_descriptors;
    rte_eth_dev_adjust_nb_rx_tx_desc(port_id_, &nrx, &ntx);
    const int socket = rte_eth_dev_socket_id(port_id_);
    if (rte_eth_rx_queue_setup(port_id_, 0, nrx, socket, nullptr, pool_) != 0)
        throw Error("cannot set up RX queue of " + name_);
    if (rte_eth_tx_queue_setup(port_id_, 0, ntx, socket, nullptr) != 0)
        throw Error("cannot set up TX queue of " + name_);
    if (cfg.has_mac && cfg.backend != Backend::memif) {
        rte_ether_addr a{};
        std::copy(cfg.mac.begin(), cfg.mac.end(), a.addr_bytes);
        if (rte_eth_dev_default_mac_addr_set(port_id_, &a) != 0)
            spdlog::warn("softrdma: {} does not take MAC {}; keeping its own", name_, format_mac(cfg.mac));
    }
    if (rte_eth_dev_set_mtu(port_id_, device_mtu) != 0 && device_mtu != RTE_ETHER_MTU)
        throw Error("device " + name_ + " refused MTU " + std::to_string(device_mtu));

    // A memif client whose server is not up yet fails to start: retry until the link timeout.
    const auto deadline = std::chrono::steady_clock::now() + cfg.link_timeout;
    int rc;
    while ((rc = rte_eth_dev_start(port_id_)) != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (rc != 0)
        throw Error("cannot start " + name_ + ": " + rte_strerror(-rc) +
                    (cfg.backend == Backend::memif
                         ? std::string(" (memif client: is the server process running on socket ") +
                               cfg.memif_socket + "?)"
                         : std::string()));
    started_ = true;

    rte_ether_addr a{};
    rte_eth_macaddr_get(port_id_, &a);
    std::copy(std::begin(a.addr_bytes), std::end(a.addr_bytes), mac_.begin());
    if (!cfg.capture_path.empty()) capture_ = std::make_unique<PcapWriter>(cfg.capture_path);
    wait_link(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration{0})));
}

void Port::wait_link(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!link_up()) {
        if (std::chrono::steady_clock::now() >= deadline)
            throw Error("link of " + name_ + " still down after the link timeout: the peer never appeared "
                        "(for memif: start the other process with the same socket and the opposite role; "
                        "for af_packet: bring the interface up)");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

bool Port::link_up() const noexcept {
    rte_eth_link link{};
    return rte_eth_link_get_nowait(port_id_, &link) == 0 && link.link_status == RTE_ETH_LINK_UP;
}

unsigned Port::mbufs_in_use() const noexcept { return rte_mempool_in_use_count(pool_); }
unsigned Port::mbufs_total() const noexcept { return pool_->size; }
std::uint32_t Port::mbuf_data_room() const noexcept {
    return rte_pktmbuf_data_room_size(pool_) - RTE_PKTMBUF_HEADROOM;
}

rte_eth_stats Port::device_stats() const noexcept {
    rte_eth_stats s{};
    rte_eth_stats_get(port_id_, &s);
    return s;
}

void Port::flush_capture() noexcept {
    if (capture_) capture_->flush();
}

void Port::account_rx(std::span<rte_mbuf* const> frames) noexcept {
    counters_.rx_packets += frames.size();
    for (const rte_mbuf* m : frames) {
        counters_.rx_bytes += m->pkt_len;
        if (capture_) capture_->write(m);
    }
}

void Port::account_tx(std::span<rte_mbuf* const> frames, std::uint16_t sent) noexcept {
    counters_.tx_packets += sent;
    counters_.tx_refused += frames.size() - sent;
    for (std::uint16_t i = 0; i < sent; ++i) counters_.tx_bytes += frames[i]->pkt_len;
    refused_head_ = sent < frames.size() ? frames[sent] : nullptr;
    refused_count_ = frames.size() - sent;
}

void Port::capture_tx(std::span<rte_mbuf* const> frames) noexcept {
    const std::size_t skip =
        !frames.empty() && frames[0] == refused_head_ ? std::min(refused_count_, frames.size()) : 0;
    for (std::size_t i = skip; i < frames.size(); ++i) capture_->write(frames[i]);
}

std::unique_ptr<Port> open_port(const PortConfig& cfg, const EalConfig& eal_cfg) {
    const DeviceArgs dev = device_args(cfg);
    if (!eal_started()) {
        EalConfig eal = eal_cfg;
        if (dev.pci) eal.extra_args.insert(eal.extra_args.end(), {"-a", dev.args});
        else eal.vdevs.push_back(dev.args);
        start_eal(eal);
    } else if (!dev.pci) {
        if (rte_dev_probe(dev.args.c_str()) != 0)
            throw Error("DPDK could not create device '" + dev.args + "' (unknown driver or bad arguments)");
    }
    std::uint16_t id = 0;
    if (rte_eth_dev_get_port_by_name(dev.name.c_str(), &id) != 0) {
        std::string hint;
        switch (cfg.backend) {
        case Backend::af_packet: hint = "does the af_packet interface '" + cfg.iface + "' exist here (ip link)?"; break;
        case Backend::memif: hint = "check the memif socket path and permissions"; break;
        default: hint = "known vdev drivers: net_memif, net_af_packet, net_ring; a PCI NIC must be bound to a DPDK "
                        "driver (vfio-pci) first";
        }
        throw Error("DPDK created no port named '" + dev.name + "' from '" + dev.args + "': " + hint);
    }
    std::unique_ptr<Port> port(new Port(id, dev.name, cfg));
    port->start(cfg);
    spdlog::info("softrdma: port {} up, MAC {}, MTU {}, {} mbufs{}", port->name(), to_string(port->mac()),
                 port->mtu(), port->mbufs_total(), eal_without_hugepages() ? " (no hugepages)" : "");
    return port;
}

std::array<std::unique_ptr<Port>, 2> open_ring_pair(const PortConfig& cfg_a, const PortConfig& cfg_b,
                                                    const EalConfig& eal) {
    if (!eal_started()) start_eal(eal);
    // Two rings crossed: port A sends into ab and receives from ba; port B the other way round.
    const unsigned size = 4096;  // >= TX descriptors of one side + a burst, power of two
    static unsigned pair_no = 0;
    const std::string tag = std::to_string(pair_no++);
    rte_ring* ab = rte_ring_create(("sr_ab" + tag).c_str(), size, rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ);
    rte_ring* ba = rte_ring_create(("sr_ba" + tag).c_str(), size, rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (ab == nullptr || ba == nullptr) throw Error("cannot create rings for a net_ring pair");
    const int a = rte_eth_from_rings(("sr_ring_a" + tag).c_str(), &ba, 1, &ab, 1, rte_socket_id());
    const int b = rte_eth_from_rings(("sr_ring_b" + tag).c_str(), &ab, 1, &ba, 1, rte_socket_id());
    if (a < 0 || b < 0) throw Error("cannot create net_ring ports");
    std::array<std::unique_ptr<Port>, 2> ports{
        std::unique_ptr<Port>(new Port(static_cast<std::uint16_t>(a), "sr_ring_a" + tag, cfg_a)),
        std::unique_ptr<Port>(new Port(static_cast<std::uint16_t>(b), "sr_ring_b" + tag, cfg_b))};
    ports[0]->start(cfg_a);
    ports[1]->start(cfg_b);
    return ports;
}

}  // namespace softrdma::io
