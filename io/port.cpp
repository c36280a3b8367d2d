// SPDX-License-Identifier: MIT
#include "io/port.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include <rte_bus_vdev.h>
#include <rte_log.h>
#include <rte_memory.h>
#include <rte_mempool.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_lcore.h>
#include <rte_ring.h>
#include "base/log.hpp"
#include "base/prefetch.hpp"

#include "io/faults.hpp"
#include "io/pcap_writer.hpp"

namespace softrdma::io {
namespace {

constexpr std::uint32_t kEthHeader = 14 + 4;  // Ethernet header + one VLAN tag of slack
constexpr unsigned kPoolCache = 256;          // per-lcore mempool cache (DPDK's recommended size)
constexpr std::uint32_t kMinSpareMbufs = 64;  // a hand-sized pool: beyond a full RX ring, two bursts' worth
// Frames the TCP stack may hold at once outside the driver's rings: RX frames wrapped as pbufs sitting in
// receive queues and out-of-order queues (bounded per pcb by TCP_OOSEQ_MAX_PBUFS in lwipopts.h) plus its
// TX queue (stack::Stack::kTxQueue = 1024). Busy connections consume their data promptly; beyond this, RX drops and TCP resends.
constexpr std::uint32_t kStackHeldFrames = 4096;

// Large frames: received frames land whole in one mbuf of their own pool (Port::rx_pool_, data room 65535, the
// most an mbuf holds). In the port's 2 KiB mbufs a 64 KiB frame was a chain of 32 that memif filled, lwIP
// chained (pbuf_cat walks the chain each time) and the deframer and pbuf frees walked one by one: 64 KiB WRITEs
// 14.4 -> 20.6 GB/s and 8 MiB WRITEs 7.2 -> 14.8 GB/s (two interleaved pairs, 2026-11-26). Sizing rule: what
// the stack may hold at once, one RX burst being handled (32) + out-of-order frames (TCP_OOSEQ_MAX_BYTES,
// 512 KiB = 8 large frames a connection, 32 connections: 256) + the per-lcore caches, + what fault injection
// holds back (kHeld) when it is on; 511
// mbufs (33 MiB) or 1023. Beyond that (out-of-order small frames on many connections, each in a large mbuf)
// memif keeps frames in its ring until mbufs come back (lwIP drops an out-of-order queue after
// TCP_OOSEQ_TIMEOUT RTOs): slower, nothing lost.
// The per-lcore cache of a memif zero-copy client's large RX pool holds a whole ring's refill above its size:
// the driver posts fresh mbufs only when all 2^5 slots are empty, 32 at once, and DPDK's cache (rte_mempool.h)
// hands out what it holds, last freed first, then fetches the rest from the pool's ring, oldest first, and
// flushes itself whole into that ring when a put would take it past 1.5x its size. With a cache of 32 (flush at
// 48) the 32 frames freed between two refills flushed it every time, so each refill came mostly from the ring:
// the server wrote each frame into a buffer it had not touched for ~480 frames, all 511 mbufs (33 MiB, the
// L3's size) in turn. With 64 (flush at 96) a refill and the 32 frees that follow it keep it between 64 and 96:
// the same ~36 buffers (2.3 MiB) come round, as memif_log2_ring's sizing assumes. Distinct buffers the memif
// server wrote per 20000 frames of a 256 KiB SEND ping-pong: 511 -> 37 (a cache of 48: still 511). 256 KiB SEND
// half round trip 25.5 / 25.3 / 26.4 -> 23.6 / 24.1 / 23.6 us, 128 KiB 15.0 / 15.2 / 15.3 -> 14.4 / 14.1 / 14.3
// us, 32 KiB unchanged (slow spell, three interleaved rounds, 2026-11-30; bench/RESULTS.md, "The zero-copy
// client's RX buffers came round through the whole pool"). The rule above counts each
// cache at its size (two cached threads: 480, so 511 mbufs; three: 1023); one briefly holds up to half again
// as much, which the ring's waiting covers as above. So the cache is twice the ring (large_rx_cache: a refill
// takes at most a ring). Other large RX pools take one mbuf at a time (the memif server's own receive, the
// driver's copying receive): 32 serves them.
constexpr unsigned kLargeRxBurst = 32, kLargeRxHeld = 256, kLargeRxCache = 32;

// Threads with a mempool cache of their own: the EAL's lcores and an RX thread (threading::RxThread registers
// as an lcore), whether or not one runs.
unsigned cached_threads() { return rte_lcore_count() + 1; }

// memif ring geometry we ask for: 2^11 slots per direction; one buffer holds a whole frame (no descriptor
// chains) up to 9000-byte MTUs. Large frames (PortConfig::memif_large_frames): 64 KiB - 64 buffers (near memif's
// largest), 2^5 of them (2 MiB a direction, twice lwIP's 1 MiB receive window). The ring's buffers are used in
// turn, so all of it stays in the cache's working set beside the application's source and target: with whole-
// frame RX mbufs (above), 8 MiB WRITEs ran 12.6-13.3 GB/s with 2^7, 14.6-17.0 with 2^6 and 17.4-18.2 with 2^5
// (medians 12.8 / 16.4 / 18.1), 64 KiB WRITEs 21.5-22.8 / 19.6-21.9 / 20.9-23.1 (three interleaved rounds,
// 2026-11-26); 2^4 (one window) was slower at both sizes. Never chains: see PortConfig::memif_large_frames.
unsigned memif_log2_ring(const PortConfig& cfg) { return cfg.memif_large_frames ? 5 : 11; }
// The large RX pool's per-lcore cache: a memif zero-copy client's holds two refills of its ring (see above).
unsigned large_rx_cache(const PortConfig& cfg, bool memif_zero_copy) {
    return memif_zero_copy ? 2u << memif_log2_ring(cfg) : kLargeRxCache;
}
unsigned memif_buffer_size(const PortConfig& cfg) {
    if (cfg.memif_large_frames) return 65472;  // 64-byte aligned, >= the largest frame (stack::kLargeSegmentMtu + 14)
    return cfg.mtu + kEthHeader > 2048 ? 10240 : 2048;
}

// close(): how long bursts in flight may take to leave the gate, and DPDK's interrupt thread to finish a
// memif disconnect.
constexpr std::chrono::milliseconds kGateTimeout{1000};
constexpr std::chrono::milliseconds kDisconnectTimeout{5000};  // generous: a loaded core delays it
// How often the memif link watcher looks at the link. While the peer's disconnect waits for us (the
// driver's interrupt thread spins on the lock we hold), this is how long it waits.
constexpr std::chrono::microseconds kWatchPeriod{1000};
// How often a memif client whose server left tries to connect again (Port::watch_link).
constexpr std::chrono::milliseconds kRelinkPeriod{20};

// The memif driver's log, muted while it would only repeat what we already handle (a client's failed connect
// attempts while it waits for its server). mute() and restore() in pairs on one object; mute() twice is one.
class MemifLogMute {
public:
    void mute() noexcept {
        if (level_ >= 0) return;
        type_ = rte_log_register("pmd.net.memif");
        if (type_ < 0) return;
        level_ = rte_log_get_level(static_cast<std::uint32_t>(type_));
        if (level_ >= 0) rte_log_set_level(static_cast<std::uint32_t>(type_), RTE_LOG_EMERG);
    }
    void restore() noexcept {
        if (level_ < 0) return;
        rte_log_set_level(static_cast<std::uint32_t>(type_), static_cast<std::uint32_t>(level_));
        level_ = -1;
    }

private:
    int type_ = -1;
    int level_ = -1;  // the level before mute(); -1 when not muted
};

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

DeviceArgs device_args(const PortConfig& cfg, bool zero_copy) {
    switch (cfg.backend) {
    case Backend::memif: {
        const std::string name = "net_memif" + std::to_string(cfg.memif_id);
        MacAddress mac = cfg.mac;
        // Distinct locally administered MACs for the two ends unless the user set one.
        if (!cfg.has_mac)
            mac = {0x02, 0x53, 0x52, 0x00, static_cast<std::uint8_t>(cfg.memif_id),
                   static_cast<std::uint8_t>(cfg.memif_server ? 1 : 2)};
        return {name + ",role=" + (cfg.memif_server ? "server" : "client") + ",id=" +
                    std::to_string(cfg.memif_id) + ",socket=" + cfg.memif_socket + ",mac=" + format_mac(mac) +
                    ",bsize=" + std::to_string(memif_buffer_size(cfg)) +
                    ",rsize=" + std::to_string(memif_log2_ring(cfg)) + (zero_copy ? ",zero-copy=yes" : ""),
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
        // A memif device needs what only the memif backend does around DPDK 22.11's driver (the teardown guard,
        // the listener's retirement, its socket's devices counted: memif_guard.cpp): not a raw vdev string.
        if (cfg.device.rfind("net_memif", 0) == 0)
            throw Error("'" + cfg.device + "': memif is opened with the memif backend (PortConfig::memif_socket, "
                        "memif_server, memif_id; rdma_perf and the drop-in: --memif-socket / SOFTRDMA_MEMIF_SOCKET), "
                        "not as a device string");
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

Port::Port(std::uint16_t port_id, std::string name, const PortConfig& cfg, bool memif_zero_copy)
    : port_id_(port_id), name_(std::move(name)), mtu_(cfg.mtu), memif_(cfg.backend == Backend::memif),
      memif_client_(memif_ && !cfg.memif_server), memif_reconnect_(memif_client_ && cfg.memif_reconnect),
      memif_socket_(memif_ ? cfg.memif_socket : std::string()),
      large_frames_(memif_ && cfg.memif_large_frames),
      memif_zero_copy_(memif_client_ && memif_zero_copy),
      driver_held_(memif_zero_copy_ ? 2u << memif_log2_ring(cfg) : 0),
      tx_max_segments_(memif_zero_copy_ ? 1u << memif_log2_ring(cfg) : RTE_MBUF_MAX_NB_SEGS),
      vdev_(cfg.backend != Backend::device || cfg.device.find(',') != std::string::npos ||
            cfg.device.rfind("net_", 0) == 0) {}

Port::~Port() {
    // The pool outlives nothing that uses it: the stack returns every mbuf before the Port goes. A port left
    // to process exit may still reference it, so its pool stays too.
    if (close() == CloseResult::clean && borrowed_out() == 0) {
        if (pool_ != nullptr) rte_mempool_free(pool_);
        if (rx_pool_ != nullptr) rte_mempool_free(rx_pool_);
    } else {
        // Frames in the port's rings may still reference it, or borrowed frames still out (a stack that
        // outlives its port): left to process exit (kept reachable).
        static std::vector<TxArena*> left;
        left.push_back(tx_arena_.release());
    }
}

// ---- memif zero-copy and the EAL's hugepage files ------------------------------------------------------------
//
// DPDK 22.11's zero-copy client hands its peer each memory segment list as a region whose descriptor is the
// EAL's own (rte_memseg_get_fd: single-file segments, one memfd per list), not a duplicate, and then closes
// it: memif_connect right after a successful handshake ("close memseg file"), memif_free_regions after one
// that failed. The EAL still holds the number: it grows and shrinks the list's file through it (fallocate) and
// closes it when the list empties, so afterwards hugepage allocations in that list fail, or, once another
// open() reuses the number, act on (and finally close) someone else's file. So the port keeps a duplicate of
// each list's file from before its first handshake, and after every handshake (link up, or a failed attempt
// before a retry, or closing) puts it back under the EAL's number when that number is closed. If the number
// was taken by another file meanwhile, nothing can be put back: said once, and later ports refuse to open.
namespace {

struct KeptFile {
    const rte_memseg_list* msl;
    int eal_fd;   // the number the EAL uses for the list
    int copy;     // our duplicate of the same file, kept open for the process's life
};
std::vector<KeptFile> g_kept;      // control path only (opening, watching, closing ports)
std::mutex g_kept_lock;
std::atomic<bool> g_eal_files_lost{false};  // read by open_port, set by any port's restore

int eal_fd_of(const rte_memseg_list* msl) {
    struct Found {
        const rte_memseg_list* msl;
        int fd = -1;
    } f{msl};
    rte_memseg_walk(
        [](const rte_memseg_list* l, const rte_memseg* ms, void* arg) {
            auto& fo = *static_cast<Found*>(arg);
            if (l != fo.msl) return 0;
            fo.fd = rte_memseg_get_fd_thread_unsafe(ms);  // the walk holds the memory lock
            return 1;
        },
        &f);
    return f.fd;
}

// Before a zero-copy client's first handshake: a duplicate of every list file the EAL has open now.
void keep_eal_files() {
    std::vector<std::pair<const rte_memseg_list*, int>> lists;
    rte_memseg_walk(
        [](const rte_memseg_list* l, const rte_memseg* ms, void* arg) {
            auto& v = *static_cast<std::vector<std::pair<const rte_memseg_list*, int>>*>(arg);
            if (v.empty() || v.back().first != l) v.emplace_back(l, rte_memseg_get_fd_thread_unsafe(ms));
            return 0;
        },
        &lists);
    const std::lock_guard<std::mutex> lock(g_kept_lock);
    for (const auto& [msl, fd] : lists) {
        if (fd < 0) continue;
        auto it = std::find_if(g_kept.begin(), g_kept.end(), [msl = msl](const KeptFile& k) { return k.msl == msl; });
        if (it != g_kept.end() && it->eal_fd == fd && detail::same_file(fd, it->copy)) continue;  // kept already
        const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) continue;
        if (it != g_kept.end()) {
            ::close(it->copy);  // the EAL reopened the list since (it closes a list's file when it empties)
            *it = {msl, fd, copy};
        } else {
            g_kept.push_back({msl, fd, copy});
        }
    }
}

// After a zero-copy handshake (or a failed attempt): the EAL's numbers the driver closed, back.
void restore_eal_files(const std::string& port) noexcept {
    const std::lock_guard<std::mutex> lock(g_kept_lock);
    for (KeptFile& k : g_kept) {
        if (eal_fd_of(k.msl) != k.eal_fd) continue;  // the EAL uses another file now (or none)
        if (::fcntl(k.eal_fd, F_GETFD) == -1 && errno == EBADF) {
            ::dup3(k.copy, k.eal_fd, O_CLOEXEC);
        } else if (!detail::same_file(k.eal_fd, k.copy) && !g_eal_files_lost.exchange(true)) {
            log::error("{}: memif zero-copy: DPDK's hugepage file descriptor {} was closed by the driver and reused "
                       "by another file before it could be restored; this process cannot allocate DPDK memory "
                       "safely any more", port, k.eal_fd);
        }
    }
}

}  // namespace

// ---- memif devices per socket name ----------------------------------------------------------------------
//
// DPDK's memif driver ties a device to its socket (one per name, shared by the devices on it) from probe to
// close. The last device on a server socket takes the listener from the driver before it stops
// (detail::retire_memif_listener, memif_guard.cpp: DPDK 22.11 leaves it behind). What counts here is every
// memif device, any role, from a successful probe (open_port) until rte_eth_dev_close; probes and closes of
// memif devices hold the lock throughout, so no device joins a socket between its listener's retirement and
// the close that frees it.
namespace {

std::mutex g_memif_sockets_lock;
std::map<std::string, unsigned> g_memif_devices;  // per socket name (control path only, under the lock)

}  // namespace

// Under g_memif_sockets_lock, before the device stops: false when the device must not be closed.
bool Port::leave_memif_socket() noexcept {
    const auto it = g_memif_devices.find(memif_socket_);
    if (it == g_memif_devices.end() || it->second == 0) return true;  // never counted (not probed by open_port)
    if (it->second > 1) {
        --it->second;
        return true;
    }
    // The last device on the socket (whichever role probed first made it a listening one): without the guard
    // (not DPDK 22.11) the driver is left as it is.
    if (guard_.attached() && !detail::retire_memif_listener(memif_socket_, name_)) return false;
    g_memif_devices.erase(it);
    return true;
}

// ---- the burst gate and the memif link watcher ------------------------------------------------------------

void Port::open_gate(std::chrono::steady_clock::time_point deadline) {
    if (!guard_.attached()) {
        open_.store(true);
        return;
    }
    // A memif server opened without waiting (PortConfig::wait_for_link off) may have no client yet: the gate
    // stays shut and the lock free (the client's handshake takes it), and the watcher opens both once the link
    // is up, as it does for every client after the first.
    const bool up = link_up();
    if (memif_zero_copy_) restore_eal_files(name_);  // the handshake is over (or failed: closed them too)
    if (up) {
        // The driver holds the lock only inside memif_disconnect (a peer that left at once): retry briefly.
        while (!guard_.try_hold()) {
            if (std::chrono::steady_clock::now() >= deadline)
                throw Error("memif " + name_ + ": the driver's control channel stayed busy (peer left at once?)");
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (own_server_path_) server_path_.link_up();  // lock held, gate shut: the regions are there
    }
    stop_watcher_.store(false);
    const std::string thread_name = "sr-link-" + std::to_string(port_id_);
    if (rte_ctrl_thread_create(&watcher_, thread_name.c_str(), nullptr, &Port::watch_link_main, this) != 0)
        throw Error("cannot start the link watcher thread of " + name_);
    watcher_running_ = true;
    if (up) open_.store(true);
}

// Shuts the gate and waits until no burst is between its gate and its return. Pairs with the bursts: each
// stores its busy flag, then loads open_ (all seq_cst); here open_ is stored, then the busy flags loaded. So
// either the burst sees the gate shut, or we see it busy and wait.
bool Port::shut_gate(std::chrono::milliseconds limit) noexcept {
    open_.store(false);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (rx_busy_.load() || tx_busy_.load()) {
        if (std::chrono::steady_clock::now() >= deadline) return false;
        sched_yield();  // a burst lasts microseconds; its thread may just be preempted
    }
    return true;
}

void* Port::watch_link_main(void* self) noexcept {
    static_cast<Port*>(self)->watch_link();
    return nullptr;
}

// memif only, on a DPDK control thread. While the link is up we hold the driver's lock and the gate is open.
// When the peer leaves, the driver marks the link down and its interrupt thread waits for the lock: shut the
// gate, wait for bursts in flight, release the lock (the driver unmaps now). If a new peer connects (memif
// server), take the lock again and reopen. A client with PortConfig::memif_reconnect connects again itself
// (DPDK 22.11's memif client never does): every kRelinkPeriod while the link is down, once the driver has
// finished the disconnect (settled), the port is stopped and started, which connects to the server if one is
// there again (a server process restarted, as qperf's server forks one per test). The gate stays shut
// throughout: no burst is in the driver while it restarts.
void Port::watch_link() noexcept {
    auto next_relink = std::chrono::steady_clock::now();
    bool running = true;  // the client's last start succeeded (its handshake may still have failed)
    MemifLogMute quiet;   // while reconnecting: one error line per failed attempt otherwise
    const bool reconnect = memif_reconnect_;
    while (!stop_watcher_.load(std::memory_order_acquire)) {
        std::this_thread::sleep_for(kWatchPeriod);
        const bool up = link_up();
        // Each handshake, failed or not, closes the EAL's hugepage file descriptors; while a reconnecting
        // zero-copy client is down they are put back on every pass (not only before the next attempt), so a
        // file the program opens meanwhile cannot take their numbers for long.
        if (reconnect && memif_zero_copy_ && !up && !guard_.held() && guard_.settled()) restore_eal_files(name_);
        if (reconnect && !up && !guard_.held() && std::chrono::steady_clock::now() >= next_relink &&
            (!running || guard_.settled())) {
            next_relink = std::chrono::steady_clock::now() + kRelinkPeriod;
            quiet.mute();
            if (running) {
                rte_eth_dev_stop(port_id_);
                // The driver allocates new arrays per connection. What they still name was taken back when the
                // link went down with the lock held since it came up (reclaim_lent above); a connection that
                // came and went between two passes (under kWatchPeriod, no burst let in) is not covered.
                if (memif_zero_copy_) guard_.release_lent_arrays();
            }
            if (memif_zero_copy_) restore_eal_files(name_);  // a failed attempt closes them too
            running = rte_eth_dev_start(port_id_) == 0;
            relinks_.fetch_add(1, std::memory_order_relaxed);
            continue;
        }
        if (up) quiet.restore();
        if (guard_.held() && !up) {
            if (!shut_gate(kGateTimeout)) continue;  // a burst still inside: keep the lock, try again
            if (memif_zero_copy_) guard_.reclaim_lent();  // the rings are still mapped: we held the lock throughout
            if (own_server_path_) server_path_.link_down();  // frames still borrowed keep our own mapping
            guard_.release();
            link_losses_.fetch_add(1, std::memory_order_relaxed);
        } else if (!guard_.held() && up && guard_.try_hold()) {
            // Link seen up, then the lock taken: a disconnect starting now waits for us; one that already
            // passed the lock cleared the driver's CONNECTED flag first, so bursts return at once.
            if (memif_zero_copy_) restore_eal_files(name_);
            if (own_server_path_) server_path_.link_up();
            open_.store(true);
        }
        if (own_server_path_) server_path_.reap();  // leases of ended connections whose frames all came back
    }
    quiet.restore();
}

void Port::stop_watcher() noexcept {
    if (!watcher_running_) return;
    stop_watcher_.store(true, std::memory_order_release);
    pthread_join(watcher_, nullptr);
    watcher_running_ = false;
}

// For error messages: what DPDK's interrupt thread is doing (state and kernel wait channel, from /proc).
static std::string interrupt_thread_state() {
    std::string out = "interrupt thread not found";
    DIR* dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return out;
    while (const dirent* e = ::readdir(dir)) {
        const std::string base = std::string("/proc/self/task/") + e->d_name;
        std::ifstream comm(base + "/comm");
        std::string name;
        if (!std::getline(comm, name) || name != "eal-intr-thread") continue;
        std::ifstream stat(base + "/stat"), wchan(base + "/wchan");
        std::string line, channel;
        std::getline(stat, line);
        std::getline(wchan, channel);
        const auto paren = line.rfind(')');
        out = "interrupt thread " + std::string(e->d_name) + " state " +
              (paren != std::string::npos && paren + 2 < line.size() ? line.substr(paren + 2, 1) : "?") +
              " wchan " + (channel.empty() ? "-" : channel);
        break;
    }
    ::closedir(dir);
    return out;
}

std::string Port::driver_state() const {
    return std::string("link ") + (link_up() ? "up" : "down") +
           (guard_.attached() ? ", memif " + guard_.describe() : std::string()) + ", " + interrupt_thread_state();
}

// memif with the guard, gate shut, watcher stopped: take the lock (if the watcher had released it), refuse
// new connections and shut the control channel, release, and wait for the interrupt thread's disconnect.
Port::CloseResult Port::finish_memif_link() noexcept {
    const bool held_throughout = guard_.held();  // the link still up: no disconnect has passed the lock
    // The lock (if the watcher had released it), by `deadline`; false logged.
    const auto hold = [this](std::chrono::steady_clock::time_point deadline) {
        while (!guard_.try_hold()) {
            if (std::chrono::steady_clock::now() >= deadline) {
                log::error("{}: memif's control channel stayed locked ({}); left to process exit", name_,
                           guard_.describe());
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return true;
    };
    if (!hold(std::chrono::steady_clock::now() + kGateTimeout)) return CloseResult::left_to_exit;
    // Zero-copy client: the mbufs lent to the peer back to the pools. Only with the lock held since the link
    // came up: once the watcher let a disconnect through (and took them back itself), the driver may be
    // unmapping the rings right now.
    if (memif_zero_copy_ && held_throughout) guard_.reclaim_lent();
    guard_.shut_channel();
    guard_.release();
    const auto deadline = std::chrono::steady_clock::now() + kDisconnectTimeout;
    // Settled, and still refusing connections: the driver's disconnect clears its link flags with plain
    // read-modify-writes of the word shut_channel() set the refusing bit in, on the interrupt thread, so that bit
    // can be lost, and then a client's INIT be taken by this closing device. Once settled nothing of the driver's
    // writes the word again unless a connection comes, which the bit refuses: set it again (and shut whatever
    // connected meanwhile) until both hold.
    for (;;) {
        while (!guard_.settled()) {
            if (std::chrono::steady_clock::now() >= deadline) {
                log::error("{}: memif's disconnect did not finish in {} ms ({}, link {}, {}); left to "
                              "process exit", name_, kDisconnectTimeout.count(), guard_.describe(),
                              link_up() ? "up" : "down", interrupt_thread_state());
                return CloseResult::left_to_exit;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (guard_.refusing()) break;
        refusals_restored_.fetch_add(1, std::memory_order_relaxed);
        if (!hold(deadline)) return CloseResult::left_to_exit;
        guard_.shut_channel();
        guard_.release();
    }
    if (memif_zero_copy_) {
        guard_.release_lent_arrays();  // the driver is done with the connection
        restore_eal_files(name_);      // closed by a handshake that never finished
    }
    return CloseResult::clean;
}

Port::CloseResult Port::close() noexcept {
    if (closed_) return close_result_;
    closed_ = true;
    stop_watcher();
    close_result_ = CloseResult::left_to_exit;
    if (!shut_gate(kGateTimeout)) {
        log::error("{}: a burst was still inside the driver after {} ms; port left to process exit",
                      name_, kGateTimeout.count());
        return close_result_;  // never stop a port under a running burst
    }
    rx_faults_.reset();  // no burst runs any more: the frames they hold go back to the pool
    tx_faults_.reset();
    if (own_server_path_) {
        server_path_.link_down();
        server_path_.reap();  // what is still borrowed keeps its mapping (see ~MemifServerPath)
    }
    if (started_) {
        if (guard_.attached()) {
            if (finish_memif_link() != CloseResult::clean) return close_result_;
        } else if (memif_ && !link_up()) {
            // No guard (not DPDK 22.11, see attach_guard): stopping could free the regions a second time if
            // the interrupt thread handled the peer's disconnect, so the port is left to process exit.
            return close_result_;
        }
        std::unique_lock<std::mutex> sockets(g_memif_sockets_lock, std::defer_lock);
        if (memif_) {
            sockets.lock();  // until the device is gone from its socket (above)
            if (!leave_memif_socket()) {
                log::error("{}: memif socket {} not released; port left to process exit", name_, memif_socket_);
                return close_result_;
            }
        }
        if (rte_eth_dev_stop(port_id_) != 0) {
            log::error("{}: DPDK refused to stop the port", name_);
            return close_result_;
        }
        if (guard_.attached()) guard_.free_tx_interrupt();  // (DPDK 22.11's memif leaves it)
        if (rte_eth_dev_close(port_id_) != 0) {
            log::error("{}: DPDK refused to close the port", name_);
            return close_result_;
        }
        if (vdev_ && !device_name_.empty()) rte_eal_hotplug_remove("vdev", device_name_.c_str());
    }
    if (capture_) capture_->flush();
    close_result_ = CloseResult::clean;
    return close_result_;
}

bool Port::borrowed(const rte_mbuf* m) noexcept {
    for (; m != nullptr; m = m->next)
        if (detail::MemifServerPath::borrowed(m)) return true;
    return false;
}

rte_mbuf* Port::unborrow(rte_mbuf* m) noexcept {
    rte_mempool* pool = rx_pool_ != nullptr ? rx_pool_ : pool_;
    const std::uint32_t room = rte_pktmbuf_data_room_size(pool) - std::uint32_t{RTE_PKTMBUF_HEADROOM};
    rte_mbuf* c = m->pkt_len <= room ? rte_pktmbuf_alloc(pool) : nullptr;
    if (c != nullptr) {
        std::uint32_t off = 0;
        for (const rte_mbuf* seg = m; seg != nullptr; seg = seg->next) {
            std::memcpy(rte_pktmbuf_mtod_offset(c, std::byte*, off), rte_pktmbuf_mtod(seg, const std::byte*), seg->data_len);
            off += seg->data_len;
        }
        c->data_len = static_cast<std::uint16_t>(off);
        c->pkt_len = off;
        c->port = m->port;
    }
    rte_pktmbuf_free(m);  // ownership: ours (taken); a borrowed segment's slot goes back to the client
    return c;
}

void Port::attach_guard(const PortConfig& cfg) {
    detail::MemifExpect expect;
    expect.socket = cfg.memif_socket;
    expect.server = cfg.memif_server;
    expect.id = cfg.memif_id;
    expect.buffer_size = static_cast<std::uint16_t>(memif_buffer_size(cfg));
    expect.log2_ring_size = static_cast<std::uint8_t>(memif_log2_ring(cfg));
    expect.zero_copy = memif_zero_copy_;
    expect.rx_pool = rx_pool_ != nullptr ? rx_pool_ : pool_;
    std::string why;
    if (!guard_.attach(port_id_, name_, expect, why)) {
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
            log::warn("no memif teardown guard ({}): a peer leaving while this process polls may "
                         "crash it (DPDK 22.11 memif), and ports whose peer left are not closed",
                         why);
    } else if (!why.empty()) {
        log::warn("{}: the mbufs memif's zero-copy driver lends its peer stay with it until the port closes", why);
    }
    // The listener this server's socket registered (at probe, before this) must have reached memif_guard.cpp's
    // rte_intr_callback_register; not when a program defines its own, or loads DPDK before softrdma.
    if (cfg.memif_server && guard_.attached() && detail::memif_listeners_wrapped() == 0)
        log::warn("{}: DPDK's interrupt registrations do not reach softrdma's (io/memif_guard.cpp): a client that "
                  "connects and leaves before this memif server greets it makes DPDK's interrupt thread panic",
                  name_);
    if (guard_.attached() && cfg.memif_server && cfg.memif_own_server_path) {
        own_server_path_ = server_path_.attach(port_id_, name_, this, why);
        if (!own_server_path_) log::warn("{}: the memif server moves frames through DPDK's driver", why);
        // Borrowing needs frames whole in one buffer (large frames) and nothing that keeps frames back (fault
        // injection delays and reorders received ones).
        if (own_server_path_ && cfg.memif_borrow_rx && large_frames_ && rx_faults_ == nullptr)
            server_path_.enable_borrowing(pool_, memif_log2_ring(cfg));
        pre_own_ = own_server_path_ && cfg.memif_pre_own && base::cpu_has_prefetchw();
    }
}

// memif zero-copy (DPDK 22.11): the client shares each of its memory segment lists with the peer as a region
// (list i = region i + 1, from the list's base over its allocated segments), but describes every buffer, RX or
// TX, as an offset into region 1: the first list. A buffer anywhere else would point the peer at the wrong
// bytes, or past its mapping. So every mbuf pool and TX chunk this port hands the driver must lie in that span;
// they are all made before the link comes up (the regions are taken then) and DPDK's heap fills the first list
// first, so this holds unless the memory is fragmented, and then opening fails here rather than the peer later.
void Port::check_zero_copy_memory() const {
    // Region 1 as memif computes it: the first list's base, over the lengths of its allocated segments.
    struct Span {
        const rte_memseg_list* first = nullptr;
        std::uintptr_t lo = 0, hi = 0;
        bool all_inside = true;  // of what was checked
        void check(const void* p, std::size_t len) {
            const auto a = reinterpret_cast<std::uintptr_t>(p);
            all_inside = all_inside && first != nullptr && a >= lo && a + len <= hi;
        }
    } span;
    rte_memseg_walk(
        [](const rte_memseg_list* msl, const rte_memseg* ms, void* arg) {
            auto& s = *static_cast<Span*>(arg);
            if (s.first == nullptr) {
                s.first = msl;
                s.lo = s.hi = reinterpret_cast<std::uintptr_t>(msl->base_va);
            }
            if (msl == s.first) s.hi += ms->len;
            return 0;
        },
        &span);
    auto check_pool = [&span, this](rte_mempool* mp) {
        if (mp == nullptr) return;
        rte_mempool_mem_iter(
            mp,
            [](rte_mempool*, void* arg, rte_mempool_memhdr* hdr, unsigned) {
                static_cast<Span*>(arg)->check(hdr->addr, hdr->len);
            },
            &span);
        if (!span.all_inside)
            throw Error(name_ + ": memif zero-copy: mbuf pool " + mp->name +
                        " lies outside DPDK's first memory segment list, the only memory memif's zero-copy "
                        "client describes correctly; open the port without PortConfig::memif_zero_copy");
    };
    check_pool(pool_);
    check_pool(rx_pool_);
    if (tx_arena_ != nullptr) span.check(tx_arena_->base(), tx_arena_->bytes());
    if (!span.all_inside)
        throw Error(name_ + ": memif zero-copy: the TX chunks lie outside DPDK's first memory segment list; open "
                    "the port without PortConfig::memif_zero_copy");
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
    // there until sent) + frames the stack holds (kStackHeldFrames) + one cache per lcore and one for an RX thread; rounded to
    // 2^n - 1, the size DPDK's ring-based pool uses best.
    // Fault injection: PortConfig::faults, or SOFTRDMA_FAULTS (which wins).
    FaultConfig faults = cfg.faults;
    if (const char* env = std::getenv("SOFTRDMA_FAULTS"); env != nullptr && *env != '\0') {
        try {
            faults = parse_faults(env);
        } catch (const std::invalid_argument& e) {
            throw Error(std::string("SOFTRDMA_FAULTS: ") + e.what());
        }
    }
    std::uint32_t n = cfg.mbufs;
    // A pool set by hand may be small (frames then wait for mbufs, or are dropped and resent by TCP), but not
    // below a full RX ring plus a few bursts: with less, a port whose RX ring is full could send nothing.
    if (n != 0 && n < cfg.rx_descriptors + kMinSpareMbufs)
        throw Error("PortConfig::mbufs " + std::to_string(n) + " is below the minimum " +
                    std::to_string(cfg.rx_descriptors + kMinSpareMbufs) + " (rx_descriptors + " +
                    std::to_string(kMinSpareMbufs) + "; 0 = sized by the rule)");
    if (n == 0) {
        // (+ what fault injection may hold back, both directions, when it is on)
        // (+ what a memif zero-copy driver keeps: driver_held())
        // (+ a memif server borrowing frames: two mbufs per frame out, at most one per ring slot)
        const std::uint32_t need = cfg.rx_descriptors + cfg.tx_descriptors + kStackHeldFrames +
                                   kPoolCache * cached_threads() + driver_held_ +
                                   (cfg.memif_borrow_rx && memif_ && cfg.memif_server ? 2u << memif_log2_ring(cfg) : 0) +
                                   (faults.any() ? 2 * static_cast<std::uint32_t>(FaultInjector::kHeld) : 0);
        n = 1;
        while (n < need + 1) n <<= 1;
        n -= 1;
    }
    // Unique per process: a closed port's id is reused by the next port while the old Port may still exist.
    static std::atomic<unsigned> pools{0};
    const std::string pool_name = "softrdma_p" + std::to_string(port_id_) + "_" + std::to_string(pools++);
    // DPDK wants the per-lcore cache well below the pool (at most n / 1.5); a small pool gets a small cache.
    const unsigned cache = std::min<unsigned>(kPoolCache, n / 8);
    pool_ = rte_pktmbuf_pool_create(pool_name.c_str(), n, cache, 0,
                                    static_cast<std::uint16_t>(data_room_for(cfg.mtu)), rte_socket_id());
    if (pool_ == nullptr)
        throw Error("cannot allocate " + std::to_string(n) + " mbufs of " + std::to_string(data_room_for(cfg.mtu)) +
                    " bytes for " + name_ + ": " + rte_strerror(rte_errno) +
                    " (more hugepages, or a larger EalConfig::no_huge_memory_mb)");

    rte_eth_conf conf{};
    conf.rxmode.mtu = device_mtu;
    // Zero-copy transmit sends each TCP segment as a chain: an mbuf with the headers, then the payload as an
    // external buffer in a TX chunk. Sizing rule: 32 connections with full send buffers (lwIP's TCP_SND_BUF,
    // 256 KiB = 4 chunks) + the chunk each is filling + one a finished segment may still pin = 6 each: 192
    // (12 MiB). More connections than that sending at full speed take turns (the share, io::TxArena::share, and
    // the stack's chunk queue, TcpConnection::tx_buffer); they copy only when no chunk comes back. With
    // memif's large segments a connection's send buffer is 1 MiB (TcpConnection::kLargeSendBuffer, up to 19
    // chunks): 192 chunks then keep 10 connections' full send buffers in chunks.
    if (cfg.tx_zero_copy && (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0) {
        conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
        tx_arena_ = std::make_unique<TxArena>(cfg.tx_chunks != 0 ? cfg.tx_chunks : 32u * 6u, rte_socket_id());
    }
    if (rte_eth_dev_configure(port_id_, 1, 1, &conf) != 0) throw Error("cannot configure " + name_);
    std::uint16_t nrx = cfg.rx_descriptors, ntx = cfg.tx_descriptors;
    rte_eth_dev_adjust_nb_rx_tx_desc(port_id_, &nrx, &ntx);
    const int socket = rte_eth_dev_socket_id(port_id_);
    if (large_frames_) {
        const unsigned rx_cache = large_rx_cache(cfg, memif_zero_copy_);
        const std::uint32_t need = kLargeRxBurst + kLargeRxHeld + rx_cache * cached_threads() + driver_held_ +
                                   (faults.any() ? static_cast<std::uint32_t>(FaultInjector::kHeld) : 0);
        std::uint32_t rx_n = 1;
        while (rx_n < need + 1) rx_n <<= 1;
        rx_n -= 1;
        rx_pool_ = rte_pktmbuf_pool_create((pool_name + "rx").c_str(), rx_n, rx_cache, 0, UINT16_MAX,
                                           rte_socket_id());
        if (rx_pool_ == nullptr)
            throw Error("cannot allocate " + std::to_string(rx_n) + " RX mbufs of 64 KiB for " + name_ + ": " +
                        rte_strerror(rte_errno) + " (more hugepages, or a larger EalConfig::no_huge_memory_mb)");
    }
    // The capture file before the device starts: a memif zero-copy client's handshake (on DPDK's interrupt
    // thread) closes the EAL's hugepage file descriptors until the link is up (keep_eal_files), and a file
    // opened meanwhile could take one of their numbers (seen: the capture file, then closed under it).
    if (!cfg.capture_path.empty()) capture_ = std::make_unique<PcapWriter>(cfg.capture_path);
    if (memif_zero_copy_) {
        check_zero_copy_memory();
        keep_eal_files();  // before any handshake of ours
    }
    if (rte_eth_rx_queue_setup(port_id_, 0, nrx, socket, nullptr, rx_pool_ != nullptr ? rx_pool_ : pool_) != 0)
        throw Error("cannot set up RX queue of " + name_);
    if (rte_eth_tx_queue_setup(port_id_, 0, ntx, socket, nullptr) != 0)
        throw Error("cannot set up TX queue of " + name_);
    if (faults.any()) {
        rx_faults_ = std::make_unique<FaultInjector>(faults.rx, faults.delay, faults.seed, pool_, rx_fault_counters_);
        tx_faults_ = std::make_unique<FaultInjector>(faults.tx, faults.delay, faults.seed * 7919 + 1, pool_,
                                                     tx_fault_counters_);
        log::warn("{}: fault injection on (rx drop {} dup {} reorder {} delay {} corrupt {}; tx drop {} dup {} "
                  "reorder {} delay {} corrupt {}; delay {} us, seed {})",
                  name_, faults.rx.drop, faults.rx.duplicate, faults.rx.reorder, faults.rx.delay, faults.rx.corrupt,
                  faults.tx.drop, faults.tx.duplicate, faults.tx.reorder, faults.tx.delay, faults.tx.corrupt,
                  faults.delay.count(), faults.seed);
    }
    if (cfg.has_mac && cfg.backend != Backend::memif) {
        rte_ether_addr a{};
        std::copy(cfg.mac.begin(), cfg.mac.end(), a.addr_bytes);
        if (rte_eth_dev_default_mac_addr_set(port_id_, &a) != 0)
            log::warn("{} does not take MAC {}; keeping its own", name_, format_mac(cfg.mac));
    }
    if (rte_eth_dev_set_mtu(port_id_, device_mtu) != 0 && device_mtu != RTE_ETHER_MTU)
        throw Error("device " + name_ + " refused MTU " + std::to_string(device_mtu));

    // A memif client whose server is not up yet fails to start: retry until the link timeout, quietly. The
    // driver logs every failed connect (one line per attempt, ~50 a second), which says nothing a user needs
    // while waiting for a peer that is still starting (the socket is an abstract one: nothing to watch in the
    // file system), so the driver's log is muted during the attempts. A peer that never comes gets our own
    // error below.
    const auto deadline = std::chrono::steady_clock::now() + cfg.link_timeout;
    MemifLogMute quiet;
    if (memif_client_) quiet.mute();
    int rc;
    while ((rc = rte_eth_dev_start(port_id_)) != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    quiet.restore();
    if (rc != 0)
        throw Error("cannot start " + name_ + ": " + rte_strerror(-rc) +
                    (cfg.backend == Backend::memif
                         ? std::string(" (memif client: is the server process running on socket ") +
                               cfg.memif_socket + "?)"
                         : std::string()));
    started_ = true;
    if (rte_eth_dev_info_get(port_id_, &info) == 0 && info.device != nullptr) device_name_ = rte_dev_name(info.device);
    if (memif_) attach_guard(cfg);

    rte_ether_addr a{};
    rte_eth_macaddr_get(port_id_, &a);
    std::copy(std::begin(a.addr_bytes), std::end(a.addr_bytes), mac_.begin());
    // A memif client always waits: its handshake may need the restarts wait_link does.
    if (cfg.wait_for_link || memif_client_)
        wait_link(std::chrono::duration_cast<std::chrono::milliseconds>(
            std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration{0})));
    open_gate(deadline + std::chrono::seconds(1));
}

void Port::wait_link(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool running = true;
    while (!link_up()) {
        if (std::chrono::steady_clock::now() >= deadline)
            throw Error("link of " + name_ + " still down after the link timeout: the peer never appeared "
                        "(for memif: start the other process with the same socket and the opposite role; "
                        "for af_packet: bring the interface up)" +
                        (guard_.attached() ? " [memif: " + guard_.describe() + "]" : std::string()));
        // A memif server's socket accepts connections from its creation, but refuses them ("ID not found")
        // until the port is started; a client that came in between has its handshake ended and the driver does
        // not try again. Once that disconnect is over (settled: nothing left for the interrupt thread), stopping
        // is safe: connect again.
        if (memif_client_ && guard_.attached() && (!running || guard_.settled())) {
            if (memif_zero_copy_) restore_eal_files(name_);  // a failed attempt closed them too
            if (running) rte_eth_dev_stop(port_id_);
            running = rte_eth_dev_start(port_id_) == 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

bool Port::link_up() const noexcept {
    rte_eth_link link{};
    return rte_eth_link_get_nowait(port_id_, &link) == 0 && link.link_status == RTE_ETH_LINK_UP;
}

unsigned Port::mbufs_in_use() const noexcept {
    return rte_mempool_in_use_count(pool_) + (rx_pool_ != nullptr ? rte_mempool_in_use_count(rx_pool_) : 0);
}
unsigned Port::mbufs_total() const noexcept { return pool_->size + (rx_pool_ != nullptr ? rx_pool_->size : 0); }
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

// ---- fault injection (PortConfig::faults) ----

std::size_t Port::faults_held() const noexcept {
    return (rx_faults_ ? rx_faults_->held() : 0) + (tx_faults_ ? tx_faults_->held() : 0);
}

// Half the burst from the driver: room for duplicates and held frames coming due.
std::uint16_t Port::rx_faulty(std::span<rte_mbuf*> out) noexcept {
    const auto want = static_cast<std::uint16_t>(std::max<std::size_t>(1, out.size() / 2));
    const std::uint16_t n = driver_rx(out.data(), want);
    return rx_faults_->apply(out, n);
}

// Every frame is taken: what the injector passes on goes to the driver, what the driver refuses is freed
// (a lossy link; TCP sends it again).
void Port::tx_faulty(std::span<rte_mbuf*> frames) noexcept {
    std::array<rte_mbuf*, 512> buf;
    std::size_t done = 0;
    do {
        const std::size_t k = std::min<std::size_t>(frames.size() - done, buf.size() / 2);
        for (std::size_t i = 0; i < k; ++i) buf[i] = frames[done + i];
        done += k;
        const std::uint16_t n = tx_faults_->apply(buf, static_cast<std::uint16_t>(k));
        const std::uint16_t sent = driver_tx(buf.data(), n);
        // A full ring: what it refused waits for the next burst (a memif zero-copy ring of 32 slots takes a
        // 64 KiB frame of 2 KiB mbufs only when empty; dropping each refusal turned a slow peer into heavy loss).
        // Ownership: the refused frames are the injector's from here (it sends or frees them).
        tx_faults_->requeue(std::span<rte_mbuf* const>(buf.data() + sent, n - sent));
    } while (done < frames.size());
}

void Port::account_rx(std::span<rte_mbuf* const> frames) noexcept {
    // Only this thread writes them; relaxed stores (plain moves on x86) so that counters() may read them from
    // another thread.
    std::uint64_t bytes = 0;
    for (const rte_mbuf* m : frames) {
        bytes += m->pkt_len;
        if (capture_) capture_->write(m);
    }
    __atomic_store_n(&counters_.rx_packets, counters_.rx_packets + frames.size(), __ATOMIC_RELAXED);
    __atomic_store_n(&counters_.rx_bytes, counters_.rx_bytes + bytes, __ATOMIC_RELAXED);
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
    // memif zero-copy (the client's mode) shares the client's DPDK memory with the peer by file descriptor:
    // hugepages only (the EAL then runs with single-file segments); without them, off, and said.
    bool zero_copy = cfg.backend == Backend::memif && !cfg.memif_server && cfg.memif_zero_copy;
    if (zero_copy && !eal_uses_hugepages(eal_cfg)) {
        static std::atomic<bool> said{false};  // (on by default: once a process, not for every port)
        if (!said.exchange(true))
            log::info("memif zero-copy needs hugepages: this process's memif client ports copy (scripts/setup, as "
                      "root, reserves them)");
        zero_copy = false;
    }
    if (g_eal_files_lost)
        throw Error("memif zero-copy lost this process's hugepage files earlier (logged then): no more ports");
    const DeviceArgs dev = device_args(cfg, zero_copy);
    {
        // A memif device joins its socket at the probe (see "memif devices per socket name").
        std::unique_lock<std::mutex> sockets(g_memif_sockets_lock, std::defer_lock);
        if (cfg.backend == Backend::memif) sockets.lock();
        if (!eal_started()) {
            EalConfig eal = eal_cfg;
            if (dev.pci) eal.extra_args.insert(eal.extra_args.end(), {"-a", dev.args});
            else eal.vdevs.push_back(dev.args);
            start_eal(eal);
        } else if (!dev.pci) {
            if (rte_dev_probe(dev.args.c_str()) != 0)
                throw Error("DPDK could not create device '" + dev.args + "' (unknown driver or bad arguments)");
        }
        if (cfg.backend == Backend::memif) ++g_memif_devices[cfg.memif_socket];
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
    std::unique_ptr<Port> port(new Port(id, dev.name, cfg, zero_copy));
    port->start(cfg);
    log::info("port {} up, MAC {}, MTU {}, {} mbufs{}{}, {}{}", port->name(), to_string(port->mac()), port->mtu(),
              port->mbufs_total(), port->large_frames() ? " (RX: whole frames up to 64 KiB)" : "",
              eal_without_hugepages() ? " (no hugepages)" : "",
              port->tx_arena() != nullptr ? "zero-copy TX (" + std::to_string(port->tx_arena()->size()) + " chunks)"
                                          : std::string("TX copies (no zero-copy)"),
              port->memif_zero_copy() ? ", memif zero-copy" : "");
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
