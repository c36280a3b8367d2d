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
// The driver's private state read here is declared in io/memif_layout.hpp (DPDK 22.11 only; attach() checks
// it against what we configured). rte_intr_fd_get() is still marked experimental in 22.11.
#define ALLOW_EXPERIMENTAL_API
#include "io/memif_guard.hpp"
#include "io/memif_layout.hpp"

#include "base/copy.hpp"
#include "base/log.hpp"
#include "base/prefetch.hpp"
#include "base/tsan.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_interrupts.h>
#include <rte_spinlock.h>
#include <rte_version.h>

namespace softrdma::io::detail {
namespace {

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
    // The TX queue as memif_tx_queue_setup left it (this port's, server-to-client for a server), for
    // free_tx_interrupt.
    if (auto* q = static_cast<MemifQueue*>(data->tx_queues[0]);
        q->in_port == port_id && q->type == (expect.server ? 1 : 0) && q->intr_handle != nullptr)
        tx_queue_ = q;
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

bool MemifGuard::refusing() const noexcept {
    return (__atomic_load_n(&pmd(pmd_)->flags, __ATOMIC_ACQUIRE) & kFlagDisabled) != 0;
}

void MemifGuard::free_tx_interrupt() noexcept {
    auto* q = static_cast<MemifQueue*>(tx_queue_);
    if (q == nullptr || q->intr_handle == nullptr) return;
    // Ownership: the driver's instance (memif_tx_queue_setup), which nothing frees; ours to free once the port
    // stopped (memif_disconnect, the last reader of it, closed its eventfd) and before the queue goes.
    rte_intr_instance_free(q->intr_handle);
    q->intr_handle = nullptr;
    tx_queue_ = nullptr;
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
    MemifChannel* cc = __atomic_load_n(&p->cc, __ATOMIC_ACQUIRE);
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

// ---- A server socket's listener --------------------------------------------------------------------------
//
// DPDK 22.11's memif driver never closes a server socket's listening descriptor nor unregisters its interrupt
// callback: when the last device on the socket goes, memif_socket_remove_device frees the socket and its
// interrupt instance and leaves both behind. The listener stays bound (to an abstract name, the driver's
// default), so clients still connect to it (one with memif_reconnect every kRelinkPeriod); one waiting in its
// backlog wakes the interrupt thread again and again, each time calling the callback with the freed socket,
// whose accept fails: a whole core until the process ends (2.94 s of CPU in 3 s after a server's close), and
// no new server on that socket in this process (its bind finds the name taken). Connections the listener had
// accepted but no device took (a client's handshake still under way) keep a pointer to the socket too, which
// they would follow when the client's INIT message comes: they are ended first (end_untaken_channels, below).
//
// So before the last device on a server socket stops (port.cpp, Port::close), every listener of this process
// bound to the name gets a never-readable eventfd dup3()'d under its number: the listener is closed at once (the
// name free, its backlog reset) while the number stays taken, since the interrupt thread's list keeps the
// listener's source by number and re-adds it to every epoll set it builds (an empty number there would make a
// rebuild panic, a reused one would run the stale callback on someone else's file). Then a job on the interrupt
// thread itself (end_untaken_channels, below; no callback of the listener can be running there) removes the
// listener's source, which this process registered behind a trampoline, and closes the number: nothing of the
// listener is left. If that job cannot run (the interrupt thread stuck for a second), the number stays taken
// by the eventfd for the process's life, as the driver leaked its listener.
namespace softrdma::io::detail {
namespace {

enum class UnixRole { other, listener, accepted };

// What `fd` is to the memif socket `name`: its listener, a connection the listener accepted (bound to the
// listener's address), or neither. The driver binds abstract names (the default) of at most 106 bytes.
UnixRole unix_role(int fd, const std::string& name) noexcept {
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return UnixRole::other;
    sockaddr_un a{};
    socklen_t alen = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &alen) != 0 || a.sun_family != AF_UNIX ||
        alen <= offsetof(sockaddr_un, sun_path))
        return UnixRole::other;
    std::string_view path(a.sun_path, alen - offsetof(sockaddr_un, sun_path));
    const bool abstract = path.front() == '\0';
    if (abstract) path.remove_prefix(1);
    path = path.substr(0, path.find('\0'));  // a file name is NUL-terminated; an abstract one cut as the driver did
    const std::string_view want = abstract ? std::string_view(name).substr(0, sizeof a.sun_path - 2) : std::string_view(name);
    if (path.empty() || path != want) return UnixRole::other;
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) return UnixRole::other;
    return listening != 0 ? UnixRole::listener : UnixRole::accepted;
}

// Descriptors this code makes for itself (the duplicates it looks through, the eventfd) are placed at or above
// this number: clear of the low numbers accept() hands the driver's control channels, where stale sources can
// sit (see above); a file of ours opened and closed on such a number would make the next rebuild panic.
constexpr int kOwnFdFloor = 512;

// A duplicate of `fd` at kOwnFdFloor or above; anywhere when the process may not have that many descriptors.
int dup_high(int fd) noexcept {
    const int d = ::fcntl(fd, F_DUPFD_CLOEXEC, kOwnFdFloor);
    return d >= 0 || (errno != EINVAL && errno != EMFILE) ? d : ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

int high_fd(int fd) noexcept {  // `fd` itself moved up (kept where it is if that fails)
    const int moved = dup_high(fd);
    if (moved < 0) return fd;
    ::close(fd);
    return moved;
}

// A descriptor of this process that is `role` to a name: its number, and a duplicate of our own naming the
// same file. Other threads open and close their own descriptors while we look (DPDK's interrupt thread makes a
// new epoll descriptor at every rebuild and closes the connections it frees): the role is read from, and any
// action taken on, the duplicate, so a number closed and reused meanwhile is never mistaken for the socket.
struct Found {
    int fd;
    int dup;  // ours: close it
};

std::vector<Found> unix_fds(const std::string& name, UnixRole role) {
    std::vector<Found> found;
    DIR* d = ::opendir("/proc/self/fd");
    if (d == nullptr) return found;
    const int own = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == own) continue;
        const int dup = dup_high(static_cast<int>(fd));
        if (dup < 0) continue;
        if (unix_role(dup, name) == role)
            found.push_back({static_cast<int>(fd), dup});
        else
            ::close(dup);
    }
    ::closedir(d);
    return found;
}

}  // namespace

bool same_file(int a, int b) noexcept {
    struct stat sa{}, sb{};
    return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool retire_memif_listener(const std::string& socket, const std::string& port) noexcept {
    try {
        static int never_readable = -1;  // never written; callers hold port.cpp's socket lock
        if (never_readable < 0) {
            never_readable = ::eventfd(0, EFD_CLOEXEC);
            if (never_readable >= 0) never_readable = high_fd(never_readable);
        }
        if (never_readable < 0) {
            log::error("{}: no eventfd ({}): memif socket {}'s listener left to the driver", port, std::strerror(errno), socket);
            return false;
        }
        // The listener's number is the driver's (nothing of the driver's closes it), so it is the one replaced;
        // our duplicate goes after, which releases the file. The listener first (it accepts nothing more: the
        // driver's accept finds the eventfd), then, on the interrupt thread, the connections it had accepted that
        // no device took (found through our duplicate of it) and the listener's source and number.
        for (const Found& f : unix_fds(socket, UnixRole::listener)) {
            if (same_file(f.fd, f.dup)) ::dup3(never_readable, f.fd, O_CLOEXEC);
            end_untaken_channels(f.dup, never_readable);
            ::close(f.dup);
        }
        return true;
    } catch (const std::exception& e) {
        log::error("{}: memif socket {}'s listener: {}", port, socket, e.what());
        return false;
    }
}

}  // namespace softrdma::io::detail

// ---- a memif server's own receive and transmit ------------------------------------------------------------

namespace softrdma::io::detail {
namespace {

constexpr int kRingClientToServer = 0;  // memif_ring_type_t
constexpr int kRingServerToClient = 1;

constexpr unsigned kMaxLog2Ring = 14;  // ETH_MEMIF_MAX_LOG2_RING_SIZE

// The queue's ring, null before a connection maps the regions (the driver returns 0 then too). The client
// chose its region, offset and size (memif's ADD_RING message, taken as sent): a ring that does not fit in
// that region is null too, with `misplaced` set.
MemifRingHead* ring_of(const MemifProcessPrivate* pp, const MemifQueue* q, bool& misplaced) noexcept {
    misplaced = false;
    if (q->region >= pp->regions_num || q->region >= std::size(pp->regions) || pp->regions[q->region] == nullptr)
        return nullptr;
    const MemifRegionHead* r = pp->regions[q->region];
    if (r->addr == nullptr) return nullptr;
    if (q->log2_ring_size > kMaxLog2Ring ||
        std::uint64_t{q->ring_offset} + 2 * RTE_CACHE_LINE_SIZE + (sizeof(MemifDesc) << q->log2_ring_size) > r->region_size) {
        misplaced = true;
        return nullptr;
    }
    return reinterpret_cast<MemifRingHead*>(static_cast<std::byte*>(r->addr) + q->ring_offset);
}

// The `len` bytes a descriptor names, if they lie inside one of the client's regions; else null.
std::byte* buffer_of(const MemifProcessPrivate* pp, const MemifDesc& d, std::uint32_t len) noexcept {
    if (d.region >= pp->regions_num || d.region >= std::size(pp->regions)) return nullptr;
    const MemifRegionHead* r = pp->regions[d.region];
    if (r == nullptr || r->addr == nullptr || std::uint64_t{d.offset} + len > r->region_size) return nullptr;
    return static_cast<std::byte*>(r->addr) + d.offset;
}

// A descriptor as read once from shared memory: the client may rewrite it at any time, so everything checked
// and used is this copy.
MemifDesc read_desc(const MemifDesc* ring_descs, std::uint16_t slot, std::uint16_t mask) noexcept {
    MemifDesc d;
    std::memcpy(&d, &ring_descs[slot & mask], sizeof d);
    return d;
}

}  // namespace

// One connection's regions as this process maps them itself, and its client-to-server ring's slots while
// frames borrowed from them are out (see MemifServerPath, "Borrowed receive").
struct MemifServerPath::Lease {
    struct Map {
        std::byte* addr = nullptr;
        std::uint64_t size = 0;
    };
    // A ring slot's external-buffer info: its free callback gives the slot back (borrow_free).
    struct Slot {
        rte_mbuf_ext_shared_info shinfo;
        Lease* lease;
        std::uint16_t index;
    };
    std::vector<Map> maps;             // by region index; sized at enable_borrowing, never reallocated
    MemifRingHead* ring = nullptr;     // the client-to-server ring, in our mapping
    std::uint16_t mask = 0;
    std::uint16_t released = 0;        // next slot to give back: the ring's tail as we last stored it
    std::uint16_t taken = 0;           // next slot rx() will look at (the queue's last_head)
    std::vector<std::uint8_t> done;    // per slot: its frame was freed (or never borrowed)
    std::vector<Slot> slots;
    std::atomic<std::uint32_t> out{0};  // borrowed frames not yet freed: rx() adds, borrow_free subtracts
    bool mapped = false;               // control side only

    void unmap() noexcept {
        for (Map& m : maps) {
            if (m.addr != nullptr) ::munmap(m.addr, m.size);
            m = Map{};
        }
        ring = nullptr;
        mapped = false;
    }
    // Slots whose frames are done, from the tail on, go back to the client (ring order: the tail says "all
    // before me"). The tail is stored through our mapping: after a disconnect the memory is still ours.
    void give_back() noexcept {
        const std::uint16_t start = released;
        while (released != taken && done[released & mask] != 0) {
            done[released & mask] = 0;
            ++released;
        }
        if (released != start) __atomic_store_n(ring_tail(ring), released, __ATOMIC_RELEASE);
    }
};

namespace {

// The free callback of a borrowed frame's external buffer, run by rte_pktmbuf_free on the thread that frees
// it (the thread that calls rx(): see the header).
void borrow_free(void*, void* opaque) {
    auto* slot = static_cast<MemifServerPath::Lease::Slot*>(opaque);
    MemifServerPath::Lease& l = *slot->lease;
    l.done[slot->index] = 1;
    l.give_back();
    // Last: once `out` is 0, reap() may unmap the lease (pairs with its acquire load).
    l.out.fetch_sub(1, std::memory_order_release);
}

}  // namespace

MemifServerPath::MemifServerPath() = default;
MemifServerPath::~MemifServerPath() {
    for (auto& l : leases_) {
        if (!l) continue;
        if (l->out.load(std::memory_order_acquire) == 0) {
            if (l->mapped) l->unmap();
        } else {
            // Frames still out (a stack that outlives its port): their callbacks will still come, so the lease
            // and its mapping stay, left to process exit.
            static_cast<void>(l.release());
        }
    }
}

bool MemifServerPath::borrowed(const rte_mbuf* m) noexcept {
    return RTE_MBUF_HAS_EXTBUF(m) && m->shinfo != nullptr && m->shinfo->free_cb == borrow_free;
}

std::uint32_t MemifServerPath::borrowed_out() const noexcept {
    std::uint32_t n = 0;
    for (const auto& l : leases_)
        if (l) n += l->out.load(std::memory_order_relaxed);
    return n;
}

void MemifServerPath::enable_borrowing(rte_mempool* header_pool, unsigned log2_ring) {
    const std::size_t size = std::size_t{1} << log2_ring;
    for (auto& l : leases_) {
        l = std::make_unique<Lease>();
        l->maps.resize(std::size(MemifProcessPrivate{}.regions));
        l->done.assign(size, 0);
        l->slots.resize(size);
        for (std::size_t i = 0; i < size; ++i) {
            Lease::Slot& s = l->slots[i];
            s.shinfo.free_cb = borrow_free;
            s.shinfo.fcb_opaque = &s;
            rte_mbuf_ext_refcnt_set(&s.shinfo, 0);
            s.lease = l.get();
            s.index = static_cast<std::uint16_t>(i);
        }
    }
    header_pool_ = header_pool;
}

// At link-up, gate shut, lock held (so the driver's regions and their descriptors stay as they are): map the
// client's regions ourselves. No free lease (both still have frames out), or a region we cannot map: this
// connection copies.
void MemifServerPath::link_up() noexcept {
    current_ = nullptr;
    if (header_pool_ == nullptr) return;
    reap();
    Lease* l = nullptr;
    for (auto& c : leases_)
        if (!c->mapped) l = c.get();
    const auto* pp = static_cast<const MemifProcessPrivate*>(process_private_);
    const auto* q = static_cast<const MemifQueue*>(rxq_);
    if (l == nullptr || pp->regions_num > l->maps.size() || (std::size_t{1} << q->log2_ring_size) > l->slots.size())
        return;
    l->mapped = true;
    for (unsigned r = 0; r < pp->regions_num; ++r) {
        const MemifRegionHead* reg = pp->regions[r];
        if (reg == nullptr || reg->addr == nullptr || reg->fd < 0 || reg->region_size == 0) continue;
        void* a = ::mmap(nullptr, reg->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, reg->fd, 0);
        if (a == MAP_FAILED) {
            l->unmap();
            return;
        }
        l->maps[r] = Lease::Map{static_cast<std::byte*>(a), reg->region_size};
    }
    // The ring, in our mapping, where ring_of() finds it in the driver's (the same checks).
    const Lease::Map& rm = q->region < pp->regions_num ? l->maps[q->region] : Lease::Map{};
    if (rm.addr == nullptr || q->log2_ring_size > kMaxLog2Ring ||
        std::uint64_t{q->ring_offset} + 2 * RTE_CACHE_LINE_SIZE + (sizeof(MemifDesc) << q->log2_ring_size) > rm.size) {
        l->unmap();
        return;
    }
    l->ring = reinterpret_cast<MemifRingHead*>(rm.addr + q->ring_offset);
    l->mask = static_cast<std::uint16_t>((1u << q->log2_ring_size) - 1);
    l->released = l->taken = q->last_head;
    std::fill(l->done.begin(), l->done.end(), 0);
    current_ = l;
}

// At link-down, gate shut: no further frames are borrowed from this connection; those still out keep its
// mapping until reap() sees them all back.
void MemifServerPath::link_down() noexcept { current_ = nullptr; }

void MemifServerPath::reap() noexcept {
    for (auto& l : leases_)
        if (l && l->mapped && l.get() != current_ && l->out.load(std::memory_order_acquire) == 0) l->unmap();
}

bool MemifServerPath::attach(std::uint16_t port_id, const std::string& name, const void* wire_token, std::string& why) {
    const auto* dev = reinterpret_cast<const EthDevHead*>(rte_eth_dev_allocated(name.c_str()));
    const EthDevDataHead* data = dev != nullptr ? dev->data : nullptr;
    auto* p = data != nullptr ? static_cast<MemifPmdHead*>(data->dev_private) : nullptr;
    if (p == nullptr || p->role != 0 || data->nb_rx_queues != 1 || data->nb_tx_queues != 1 ||
        dev->process_private == nullptr) {
        why = name + " is not a memif server with one queue each way";
        return false;
    }
    auto* rxq = static_cast<MemifQueue*>(data->rx_queues[0]);
    auto* txq = static_cast<MemifQueue*>(data->tx_queues[0]);
    if (rxq == nullptr || txq == nullptr || rxq->in_port != port_id || txq->in_port != port_id ||
        rxq->type != kRingClientToServer || txq->type != kRingServerToClient || rxq->mempool == nullptr) {
        why = "memif's server queues of " + name + " do not have the expected layout";
        return false;
    }
    port_id_ = port_id;
    wire_token_ = wire_token;
    pmd_ = p;
    process_private_ = dev->process_private;
    rxq_ = rxq;
    txq_ = txq;
    return true;
}

MemifRingHead* MemifServerPath::connected_ring(void* qp, std::uint64_t& faults, bool& bad_ring) noexcept {
    if ((__atomic_load_n(&static_cast<MemifPmdHead*>(pmd_)->flags, __ATOMIC_ACQUIRE) & kFlagConnected) == 0)
        return nullptr;
    bool misplaced = false;
    MemifRingHead* ring =
        ring_of(static_cast<const MemifProcessPrivate*>(process_private_), static_cast<MemifQueue*>(qp), misplaced);
    if (misplaced && !bad_ring) fault(faults);  // nothing moves on this link while it lasts
    bad_ring = misplaced;
    return ring;
}

void MemifServerPath::mark_done(Lease& l, std::uint16_t from, std::uint16_t to) noexcept {
    for (std::uint16_t i = from; i != to; ++i) l.done[i & l.mask] = 1;
}

// A borrowed frame (k descriptors from ring slot `slot`, all checked by the caller against the driver's mapping,
// `src`/`len`): its first kHeaderCopy bytes copied into an mbuf of ours (every header lwIP reads), then each
// descriptor's remaining bytes either an external buffer over our own mapping of them (kBorrowPiece bytes or
// more: that slot stays out until the mbuf is freed) or copied behind the header. Slots of which nothing is
// borrowed are done at once. Null (nothing changed; the caller copies) when a descriptor lies outside our
// mapping, nothing would be borrowed, or mbufs run out.
rte_mbuf* MemifServerPath::borrow(Lease& l, const MemifDesc* d, const std::byte* const* src, const std::uint32_t* len,
                                  unsigned k, std::uint16_t slot, std::uint32_t total) noexcept {
    std::array<std::byte*, kMaxDescs> own;
    std::uint32_t skip = std::min(total, kHeaderCopy);  // bytes the header copy takes, from the first descriptors
    unsigned lent = 0;
    for (unsigned i = 0, left = skip; i < k; ++i) {
        const std::uint32_t used = std::min(left, len[i]);
        left -= used;
        own[i] = nullptr;
        if (len[i] - used < kBorrowPiece) continue;
        if (d[i].region >= l.maps.size()) return nullptr;
        const Lease::Map& m = l.maps[d[i].region];
        if (m.addr == nullptr || std::uint64_t{d[i].offset} + len[i] > m.size) return nullptr;
        own[i] = m.addr + d[i].offset;
        ++lent;
    }
    if (lent == 0) return nullptr;
    const auto room = static_cast<std::uint32_t>(rte_pktmbuf_data_room_size(header_pool_) - RTE_PKTMBUF_HEADROOM);
    rte_mbuf* h = rte_pktmbuf_alloc(header_pool_);
    if (h == nullptr) return nullptr;
    wire_acquire(wire_token_);  // the thread that freed it released before (tx(), or the stack)
    rte_mbuf* last = h;      // the chain's last segment
    rte_mbuf* copied = h;    // the segment copied bytes go into (null after a borrowed one until a new one)
    // Copies `n` bytes from `s` behind the chain (into `copied`, or a new mbuf). False when mbufs run out.
    auto copy = [&](const std::byte* s, std::uint32_t n) {
        while (n != 0) {
            if (copied == nullptr || copied->data_len == room) {
                rte_mbuf* c = rte_pktmbuf_alloc(header_pool_);
                if (c == nullptr) return false;
                wire_acquire(wire_token_);
                last->next = c;
                last = copied = c;
                ++h->nb_segs;
            }
            const std::uint32_t c = std::min(n, room - copied->data_len);
            std::memcpy(rte_pktmbuf_mtod_offset(copied, std::byte*, copied->data_len), s, c);
            copied->data_len = static_cast<std::uint16_t>(copied->data_len + c);
            s += c;
            n -= c;
        }
        return true;
    };
    std::uint32_t left = skip;
    for (unsigned i = 0; i < k; ++i) {
        const std::uint32_t used = std::min(left, len[i]);
        left -= used;
        bool ok = copy(src[i], used);
        const std::uint16_t s_i = static_cast<std::uint16_t>(slot + i);
        if (ok && own[i] != nullptr) {
            rte_mbuf* b = rte_pktmbuf_alloc(header_pool_);
            if (b != nullptr) {
                wire_acquire(wire_token_);
                Lease::Slot& sl = l.slots[s_i & l.mask];
                rte_mbuf_ext_refcnt_set(&sl.shinfo, 1);
                // Ownership: the bytes stay the client's ring buffer, lent to us until this mbuf is freed
                // (borrow_free gives the slot back).
                rte_pktmbuf_attach_extbuf(b, own[i] + used, RTE_BAD_IOVA, static_cast<std::uint16_t>(len[i] - used),
                                          &sl.shinfo);
                b->data_len = static_cast<std::uint16_t>(len[i] - used);
                l.out.fetch_add(1, std::memory_order_relaxed);
                last->next = b;
                last = b;
                copied = nullptr;
                ++h->nb_segs;
            } else {
                ok = false;
            }
        } else if (ok) {
            ok = copy(src[i] + used, len[i] - used);
            l.done[s_i & l.mask] = 1;
        }
        if (!ok) {
            // Out of mbufs: what is built goes back (its borrowed slots marked done by their callbacks, still
            // behind `taken`), and the caller copies or waits.
            rte_pktmbuf_free(h);
            for (unsigned j = 0; j < k; ++j) l.done[static_cast<std::uint16_t>(slot + j) & l.mask] = 0;
            return nullptr;
        }
    }
    h->pkt_len = total;
    h->port = port_id_;
    __atomic_store_n(&borrowed_, borrowed_ + 1, __ATOMIC_RELAXED);
    return h;
}

// What eth_memif_rx does for a server (client-to-server ring: the client advances head, we advance tail), with
// every descriptor checked first and a frame taken only when all of it is there and copied.
std::uint16_t MemifServerPath::rx(rte_mbuf** out, std::uint16_t want) noexcept {
    auto* q = static_cast<MemifQueue*>(rxq_);
    MemifRingHead* ring = connected_ring(q, rx_faults_, rx_bad_ring_);
    if (ring == nullptr) return 0;
    const auto* pp = static_cast<const MemifProcessPrivate*>(process_private_);
    Lease* const lease = current_;
    // A receiver asking for interrupts (io never does): the driver's burst, which also consumes the eventfd's
    // signal. Not while borrowing: it would give back the slots of frames still out (and we poll anyway).
    if (lease == nullptr && (__atomic_load_n(&ring->flags, __ATOMIC_RELAXED) & kRingMaskInterrupts) == 0)
        return rte_eth_rx_burst(port_id_, 0, out, want);
    const auto size = static_cast<std::uint16_t>(1u << q->log2_ring_size);
    const auto mask = static_cast<std::uint16_t>(size - 1);
    const MemifDesc* descs = ring_desc(ring);
    std::uint16_t cur = q->last_head;
    // The next frame's descriptor is asked for before the head is read: its address does not depend on the
    // head, so when the head shows a new frame (the client wrote both lines) the two misses overlap instead of
    // the descriptor's waiting for the head's. A hint only: the descriptor is read below, after the head's
    // acquire. Slow spell (cores ~620 ns apart), SEND half round trip medians in 7 interleaved pairs: 64 B
    // 1.62 -> 1.49 us (every pair lower), 4 KiB 2.24 -> 2.17; fast spell, 64 B message rate, 64 KiB WRITE
    // unchanged (2026-11-30).
    __builtin_prefetch(&descs[cur & mask]);
    const std::uint16_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);  // pairs with the client's release
    // Borrowing, the client may use only the slots we gave back: a head further than a ring past them would
    // put new frames into slots still out.
    if (static_cast<std::uint16_t>(head - cur) > size ||
        (lease != nullptr && static_cast<std::uint16_t>(head - lease->released) > size)) {
        if (head != rx_bad_head_) fault(rx_faults_);  // more published than the ring holds: nothing is taken
        rx_bad_head_ = head;
        return 0;
    }
    rx_bad_head_ = ~0u;
    // What this process did before sending (our transmit's copies included: tx() releases after them) happens
    // before the peer's answer, which sits behind the head just read (base/tsan.hpp; nothing outside TSan).
    if (head != cur) wire_acquire(wire_token_);
    const auto room = static_cast<std::uint32_t>(rte_pktmbuf_data_room_size(q->mempool) - RTE_PKTMBUF_HEADROOM);
    std::uint16_t n = 0;
    std::uint64_t bytes = 0;
    while (cur != head && n < want) {
        // The frame: descriptors up to the first without kDescNext, all published (else wait for the rest).
        std::array<const std::byte*, kMaxDescs> src;
        std::array<std::uint32_t, kMaxDescs> len;
        std::array<MemifDesc, kMaxDescs> descs_of_frame;
        unsigned k = 0;
        std::uint16_t end = cur;
        std::uint64_t total = 0;
        bool whole = false, bad = false;
        while (end != head) {
            const MemifDesc d = read_desc(descs, end++, mask);
            const std::byte* b = buffer_of(pp, d, d.length);
            if (b == nullptr || k == kMaxDescs) {
                bad = true;
            } else {
                descs_of_frame[k] = d;
                src[k] = b;
                len[k++] = d.length;
            }
            total += d.length;
            if ((d.flags & kDescNext) == 0) {
                whole = true;
                break;
            }
        }
        if (!whole) break;
        if (bad || total > kMaxFrame) {
            fault(rx_faults_);  // dropped: its slots go back to the client with the others
            if (lease != nullptr) mark_done(*lease, cur, end);
            cur = end;
            continue;
        }
        if (lease != nullptr && total >= kBorrowMin) {
            if (rte_mbuf* f = borrow(*lease, descs_of_frame.data(), src.data(), len.data(), k, cur,
                                     static_cast<std::uint32_t>(total))) {
                out[n++] = f;
                bytes += total;
                cur = end;
                continue;
            }
        }
        // Ownership: fresh mbufs of the RX pool, the caller's once returned; on a shortage the frame stays in
        // the ring for the next call (the driver would lose it).
        rte_mbuf* first = rte_pktmbuf_alloc(q->mempool);
        if (first == nullptr) break;
        wire_acquire(wire_token_);  // the thread that freed it released before (tx() below, or the stack)
        rte_mbuf* m = first;
        bool short_of_mbufs = false;
        for (unsigned i = 0; i < k && !short_of_mbufs; ++i) {
            const std::byte* s = src[i];
            std::uint32_t left = len[i];
            while (left != 0) {
                if (m->data_len == room) {
                    rte_mbuf* next = rte_pktmbuf_alloc(q->mempool);
                    if (next == nullptr) {
                        short_of_mbufs = true;
                        break;
                    }
                    wire_acquire(wire_token_);
                    m->next = next;
                    ++first->nb_segs;
                    m = next;
                }
                const std::uint32_t c = std::min(left, room - m->data_len);
                std::memcpy(rte_pktmbuf_mtod_offset(m, std::byte*, m->data_len), s, c);
                m->data_len = static_cast<std::uint16_t>(m->data_len + c);
                s += c;
                left -= c;
            }
        }
        if (short_of_mbufs) {
            rte_pktmbuf_free(first);
            break;
        }
        first->pkt_len = static_cast<std::uint32_t>(total);
        first->port = port_id_;
        out[n++] = first;
        bytes += total;
        if (lease != nullptr) mark_done(*lease, cur, end);
        cur = end;
    }
    if (cur != q->last_head) {
        q->last_head = cur;
        if (lease != nullptr) {
            lease->taken = cur;
            lease->give_back();  // the slots of what was copied or dropped, up to the first frame still out
        } else {
            __atomic_store_n(ring_tail(ring), cur, __ATOMIC_RELEASE);  // the slots are the client's again
        }
    }
    q->n_pkts += n;  // the driver's statistics (rte_eth_stats_get), as its burst keeps them
    q->n_bytes += bytes;
    return n;
}

MemifServerPath::PostedState MemifServerPath::posted(Posted& w) noexcept {
    auto* q = static_cast<MemifQueue*>(txq_);
    if (q == nullptr) return PostedState::none;
    w.ring = connected_ring(q, tx_faults_, tx_bad_ring_);
    if (w.ring == nullptr) return PostedState::none;
    if ((__atomic_load_n(&w.ring->flags, __ATOMIC_RELAXED) & kRingMaskInterrupts) == 0) return PostedState::driver;
    w.size = static_cast<std::uint16_t>(1u << q->log2_ring_size);
    w.mask = static_cast<std::uint16_t>(w.size - 1);
    w.descs = ring_desc(w.ring);
    w.tail = __atomic_load_n(ring_tail(w.ring), __ATOMIC_RELAXED);  // only tx() writes it
    w.head = __atomic_load_n(&w.ring->head, __ATOMIC_ACQUIRE);      // pairs with the client's refill
    return w.count() > w.size ? PostedState::bad : PostedState::ok;
}

void MemifServerPath::pre_own(unsigned max_lines) noexcept {
    Posted w;
    if (posted(w) != PostedState::ok) return;  // (a bad head is tx()'s to count)
    const auto* pp = static_cast<const MemifProcessPrivate*>(process_private_);
    const std::uint16_t tail = w.tail, head = w.head;
    // A walk outside [tail, head) (a connection since, or the client took buffers back): start again at tail.
    if (static_cast<std::uint16_t>(own_slot_ - tail) > w.count()) {
        own_slot_ = tail;
        own_off_ = 0;
        own_ahead_ = 0;
    }
    std::uint64_t taken = 0;
    while (max_lines != 0 && own_ahead_ < kPreOwnMax && own_slot_ != head) {
        const MemifDesc d = read_desc(w.descs, own_slot_, w.mask);
        const std::byte* b = d.length != 0 ? buffer_of(pp, d, d.length) : nullptr;
        if (b == nullptr || own_off_ >= d.length) {  // done with it, or not the client's memory: the next
            ++own_slot_;
            own_off_ = 0;
            continue;
        }
        base::prefetch_for_write(b + own_off_);  // a hint: the client's bytes stay as they are
        own_off_ += 64;
        own_ahead_ += 64;
        taken += 64;
        --max_lines;
    }
    if (taken != 0) __atomic_store_n(&pre_owned_, pre_owned_ + taken, __ATOMIC_RELAXED);
}

// What eth_memif_tx does for a server (server-to-client ring: the client posts empty buffers by advancing
// head, we fill them and advance tail), with every buffer checked before a byte is written. A frame larger
// than one buffer goes on in the next (kDescNext), as the driver chains it. A posted buffer outside the
// client's memory is given back empty (length 0: a frame of nothing, which its receiver drops) and counted.
std::uint16_t MemifServerPath::tx(rte_mbuf** frames, std::uint16_t count) noexcept {
    Posted w;
    switch (posted(w)) {
    case PostedState::none: return 0;
    case PostedState::driver: return rte_eth_tx_burst(port_id_, 0, frames, count);  // it signals the client's eventfd
    case PostedState::bad:
        if (w.head != tx_bad_head_) fault(tx_faults_);  // more posted than the ring holds: nothing is sent
        tx_bad_head_ = w.head;
        return 0;
    case PostedState::ok: break;
    }
    auto* q = static_cast<MemifQueue*>(txq_);
    const auto* pp = static_cast<const MemifProcessPrivate*>(process_private_);
    const std::uint16_t mask = w.mask;
    MemifDesc* descs = w.descs;
    std::uint16_t* tailp = ring_tail(w.ring);
    std::uint16_t slot = w.tail;
    std::uint16_t n_free = w.count();
    tx_bad_head_ = ~0u;
    const std::uint16_t start = slot;
    std::uint16_t n = 0;
    std::uint64_t bytes = 0;
    while (n < count && n_free != 0) {
        rte_mbuf* f = frames[n];
        // The buffers this frame takes, each checked (capacity as the client posted it).
        std::array<std::byte*, kMaxDescs> dst;
        std::array<std::uint32_t, kMaxDescs> cap;
        unsigned k = 0;
        std::uint64_t room = 0;
        bool bad = false;
        while (room < f->pkt_len || k == 0) {
            if (k == n_free || k == kMaxDescs) break;
            const MemifDesc d = read_desc(descs, static_cast<std::uint16_t>(slot + k), mask);
            dst[k] = d.length != 0 ? buffer_of(pp, d, d.length) : nullptr;
            if (dst[k] == nullptr) {
                bad = true;
                ++k;
                break;
            }
            cap[k++] = d.length;
            room += d.length;
        }
        if (bad) {
            // Every buffer up to the bad one goes back empty; the frame tries the ones after it.
            for (unsigned i = 0; i < k; ++i) {
                MemifDesc& d = descs[static_cast<std::uint16_t>(slot + i) & mask];
                d.length = 0;
                d.flags = 0;
            }
            fault(tx_faults_);
            slot = static_cast<std::uint16_t>(slot + k);
            n_free = static_cast<std::uint16_t>(n_free - k);
            continue;
        }
        if (room < f->pkt_len) break;  // not enough posted yet (or a frame no ring could hold: kept, as the driver does)
        unsigned i = 0;
        std::uint32_t off = 0;
        for (const rte_mbuf* seg = f; seg != nullptr; seg = seg->next) {
            const auto* s = rte_pktmbuf_mtod(seg, const std::byte*);
            std::uint32_t left = seg->data_len;
            while (left != 0) {
                if (off == cap[i]) {
                    off = 0;
                    ++i;
                }
                const std::uint32_t c = std::min(left, cap[i] - off);
                base::copy_out(dst[i] + off, s, c);  // into the client's buffer, which it reads next: base/copy.hpp
                off += c;
                s += c;
                left -= c;
            }
        }
        // Each buffer used says how much it holds and whether the frame goes on; written after the data, read
        // by the client after the tail's release below.
        for (unsigned j = 0; j <= i; ++j) {
            MemifDesc& d = descs[static_cast<std::uint16_t>(slot + j) & mask];
            d.length = j < i ? cap[j] : off;
            d.flags = j < i ? kDescNext : 0;
        }
        slot = static_cast<std::uint16_t>(slot + i + 1);
        n_free = static_cast<std::uint16_t>(n_free - (i + 1));
        bytes += f->pkt_len;
        // Our copies of the frame (reads of application memory it points into, writes into the client's
        // buffers) happen before the peer's answer and before the frame's mbufs are allocated again; rx()
        // acquires (base/tsan.hpp: the wire is synchronisation TSan cannot see).
        wire_release(wire_token_);
        rte_pktmbuf_free(f);  // ownership: taken (copied into the client's buffers)
        ++n;
    }
    if (slot != start) {
        __atomic_store_n(tailp, slot, __ATOMIC_RELEASE);  // the filled buffers are the client's
        own_slot_ = slot;  // pre_own() goes on from the next buffer to fill, with its full reach again
        own_off_ = 0;
        own_ahead_ = 0;
    }
    q->n_pkts += n;
    q->n_bytes += bytes;
    return n;
}

}  // namespace softrdma::io::detail

// ---- Connections the listener gave up on ------------------------------------------------------------------
//
// DPDK 22.11's memif_listener_handler (on the interrupt thread) accepts a connection, registers the interrupt
// callback of its control channel, then sends HELLO; when that send fails (the client connected and left before
// the accept: a client process killed, a reconnecting client giving up on a busy server, anyone who can reach
// the socket's name) its error path closes the socket and frees the channel but leaves the callback registered.
// The interrupt thread rebuilds its epoll set as soon as the handler returns (the registration asked it to),
// finds a source whose number is closed and panics: "Error adding fd N epoll_ctl, Bad file descriptor". One
// connect() and close() on the name killed a server process (tests/io/memif_hello_test.cpp).
//
// The driver's functions are static, so the callback cannot be named from here; what this process registers
// can be seen. This library defines rte_intr_callback_register: the dynamic linker binds the memif driver's
// calls to it (the driver is loaded after us and looks its symbols up in the global scope, where this
// definition comes first), and it forwards each call to DPDK's own. A registration by the memif driver on a
// listening socket gets a trampoline in place of the driver's listener callback: the trampoline calls it, and
// afterwards unregisters any control-channel callback registered during that call whose socket is no longer
// open under its number, before the interrupt thread can rebuild; the others (greeted) it keeps in a record,
// from which the socket's last close ends those no device took (end_untaken_channels). Ownership: a
// trampoline's state is never freed (the driver never unregisters a listener either: one per server socket for
// the process's life). DPDK 22.11 only; with any other DPDK every call is forwarded untouched.
namespace softrdma::io::detail {
namespace {

using RegisterFn = int (*)(const rte_intr_handle*, rte_intr_callback_fn, void*);

// DPDK's rte_intr_callback_register: the next definition after ours in the lookup order, else the one in the
// library that defines rte_eal_init (a non-PIE program's &rte_eal_init is its own PLT slot, which dladdr puts in
// the program); never ours (that would recurse). Null, logged once, when neither is found.
extern "C" int rte_intr_callback_register(const rte_intr_handle*, rte_intr_callback_fn, void*);
RegisterFn eal_register() noexcept {
    static const RegisterFn fn = []() -> RegisterFn {
        const auto ours = reinterpret_cast<void*>(&rte_intr_callback_register);
        void* f = ::dlvsym(RTLD_NEXT, "rte_intr_callback_register", "DPDK_23");
        if (f == nullptr) f = ::dlsym(RTLD_NEXT, "rte_intr_callback_register");
        Dl_info info{};
        if ((f == nullptr || f == ours) && ::dladdr(reinterpret_cast<void*>(&rte_eal_init), &info) != 0 &&
            info.dli_fname != nullptr) {
            if (void* eal = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD); eal != nullptr) {
                f = ::dlvsym(eal, "rte_intr_callback_register", "DPDK_23");
                if (f == nullptr) f = ::dlsym(eal, "rte_intr_callback_register");
            }
        }
        if (f == ours) f = nullptr;
        if (f == nullptr)
            log::error("DPDK's rte_intr_callback_register not found behind softrdma's: DPDK cannot register "
                       "interrupt callbacks in this process");
        return reinterpret_cast<RegisterFn>(f);
    }();
    return fn;
}

// A control-channel callback registered during a listener callback, and the socket it watches.
struct Registration {
    int fd;
    rte_intr_callback_fn fn;
    void* arg;
    dev_t dev;
    ino_t ino;
    bool open() const noexcept {  // the socket is still under its number
        struct stat st{};
        return ::fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
    }
};

struct Trampoline {
    rte_intr_callback_fn fn;  // the driver's listener callback
    void* arg;                // and its argument (the driver's socket)
    int fd;                   // the listening socket's number (the driver's: only the retirement closes it)
    dev_t dev;                // the listening socket
    ino_t ino;
    // The connections this listener accepted and greeted, while they last (pruned at each accept; a device's
    // control channel among them until its link ends): added on the interrupt thread, taken by
    // end_untaken_channels. Sizing: the handshakes under way plus the links up on the socket.
    std::mutex lock;
    std::vector<Registration> live;
    bool retired = false;  // its socket's last device closed: what it still greets is ended at once
};
std::mutex g_trampolines_lock;
// Every listener wrapped. Never freed, as the trampolines (nor the list: still reachable after the static
// destructors, for a Port closed from one and for a leak checker).
std::vector<Trampoline*>& g_trampolines = *new std::vector<Trampoline*>;
// Sizing: memif_listener_handler accepts one connection and registers one callback a call; the rest are ignored.
constexpr unsigned kRegistrationsPerCall = 4;
struct DuringListener {
    std::array<Registration, kRegistrationsPerCall> seen;
    unsigned n = 0;
};
thread_local DuringListener* t_listener_call = nullptr;  // set on the interrupt thread inside a trampoline

std::atomic<unsigned> g_listeners_wrapped{0};
std::atomic<std::uint64_t> g_channels_dropped{0};
std::atomic<std::uint64_t> g_channels_ended{0};
std::atomic<std::uint64_t> g_channels_freed{0};
std::atomic<std::uint64_t> g_listeners_closed{0};

bool from_memif_driver(rte_intr_callback_fn fn) noexcept {
    Dl_info info{};
    return ::dladdr(reinterpret_cast<void*>(fn), &info) != 0 && info.dli_fname != nullptr &&
           std::strstr(info.dli_fname, "net_memif") != nullptr;
}

bool listening_socket(int fd) noexcept {
    int listening = 0;
    socklen_t len = sizeof listening;
    return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
}

// Removes the callback `r` names: the source is found by number and the callback by function and argument, so
// nothing else registered on that number is touched. DPDK's answer: callbacks removed (> 0), 0 or -ENOENT when
// it was gone already, -EAGAIN while the interrupt thread runs a callback of that source.
int unregister(const Registration& r) noexcept {
    rte_intr_handle* h = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
    if (h == nullptr) return -ENOMEM;
    int rc = -EINVAL;
    if (rte_intr_fd_set(h, r.fd) == 0 && rte_intr_type_set(h, RTE_INTR_HANDLE_EXT) == 0)
        rc = rte_intr_callback_unregister(h, r.fn, r.arg);
    rte_intr_instance_free(h);
    return rc;
}

// The driver's state of a connection no device took (its struct memif_control_channel, the callback's
// argument), freed as its own error paths free it: the interrupt instance, then the channel. Only when it still
// reads as such a channel (no device, no message queued, this socket's number in its instance); else left.
// Ownership: the driver's until its callback was removed (the caller), then nobody's but ours here.
void free_untaken_channel(const Registration& r) noexcept {
    if (!kKnownDpdk || r.arg == nullptr) return;
    auto* cc = static_cast<MemifChannel*>(r.arg);
    if (cc->dev != nullptr || cc->msg_queue_first != nullptr || cc->intr_handle == nullptr ||
        rte_intr_fd_get(cc->intr_handle) != r.fd)
        return;
    rte_intr_instance_free(cc->intr_handle);
    rte_free(cc);
    g_channels_freed.fetch_add(1, std::memory_order_relaxed);
}

// On the interrupt thread only, where the driver does all it does with connections no device took (so nothing
// of the driver's runs between the check and the close, and no callback of a connection is running): ends a
// connection the listener greeted, if it is still open. Its callback removed, then its socket shut down and
// closed (its client sees the end, no message of its reaches the driver again), and the driver's state of it
// freed.
bool end_channel(const Registration& r) noexcept {
    if (!r.open() || unregister(r) <= 0) return false;  // ended by the driver already
    free_untaken_channel(r);
    ::shutdown(r.fd, SHUT_RDWR);
    ::close(r.fd);  // its number no longer has a source: a file reusing it is nobody's business here
    g_channels_ended.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void listener_trampoline(void* p) {
    auto* t = static_cast<Trampoline*>(p);
    // An event the interrupt thread took for the listener before its retirement replaced it (same epoll batch):
    // the driver's accept would fail on the replacement (logged as an error), or, once the last device closed,
    // use the socket the driver freed. Only the listener itself is passed on.
    if (struct stat st{}; ::fstat(t->fd, &st) != 0 || st.st_dev != t->dev || st.st_ino != t->ino) return;
    DuringListener during;
    t_listener_call = &during;
    t->fn(t->arg);
    t_listener_call = nullptr;
    for (unsigned i = 0; i < during.n; ++i) {
        const Registration& r = during.seen[i];
        if (r.open()) {  // greeted: a handshake under way
            bool retired = false;
            try {
                const std::lock_guard<std::mutex> g(t->lock);
                retired = t->retired;
                if (!retired) {
                    std::erase_if(t->live, [](const Registration& l) { return !l.open(); });
                    t->live.push_back(r);
                }
            } catch (const std::exception&) {
                // (no memory: this connection stays the driver's alone, as without the trampoline)
            }
            if (retired) end_channel(r);  // accepted while its socket's last device closed
            continue;
        }
        // Given up on: its number is closed (or already another file's).
        if (unregister(r) > 0) g_channels_dropped.fetch_add(1, std::memory_order_relaxed);
    }
}

// A job for DPDK's interrupt thread: a callback on an eventfd of ours, registered once and kept for the process's
// life (its number never closes, so no rebuild meets it closed). One job at a time (the caller's lock).
struct InterruptJob {
    void (*fn)(void*) = nullptr;
    void* arg = nullptr;
    std::atomic<bool> done{false};
};
std::mutex g_job_lock;
std::atomic<int> g_job_fd{-1};  // set once, under g_job_lock
InterruptJob* g_job = nullptr;  // under g_job_lock to post; read by the interrupt thread after the eventfd's signal

void run_job(void*) {
    std::uint64_t v = 0;
    [[maybe_unused]] const auto r = ::read(g_job_fd.load(std::memory_order_acquire), &v, sizeof v);
    InterruptJob* j = __atomic_load_n(&g_job, __ATOMIC_ACQUIRE);
    if (j == nullptr || j->done.load(std::memory_order_acquire)) return;
    j->fn(j->arg);
    j->done.store(true, std::memory_order_release);
}

// Runs fn(arg) on the interrupt thread and waits up to `limit` for it. False when it could not be posted, or did
// not run in time: then `job` (the caller's) must stay valid, as it may still run (the callers' are static).
bool on_interrupt_thread(InterruptJob& job, std::chrono::milliseconds limit) noexcept {
    const std::lock_guard<std::mutex> g(g_job_lock);
    if (g_job_fd.load(std::memory_order_relaxed) < 0) {
        const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0) return false;
        const int high = high_fd(fd);
        rte_intr_handle* h = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
        const RegisterFn eal = eal_register();
        // (the handle is copied by the registration; ours goes)
        const bool ok = h != nullptr && eal != nullptr && rte_intr_fd_set(h, high) == 0 &&
                        rte_intr_type_set(h, RTE_INTR_HANDLE_EXT) == 0 && eal(h, run_job, nullptr) == 0;
        if (h != nullptr) rte_intr_instance_free(h);
        if (!ok) {
            ::close(high);
            return false;
        }
        g_job_fd.store(high, std::memory_order_release);
    }
    job.done.store(false, std::memory_order_relaxed);
    __atomic_store_n(&g_job, &job, __ATOMIC_RELEASE);
    const std::uint64_t one = 1;
    if (::write(g_job_fd.load(std::memory_order_relaxed), &one, sizeof one) != static_cast<ssize_t>(sizeof one)) return false;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!job.done.load(std::memory_order_acquire)) {
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

struct EndUntaken {
    dev_t dev;          // the listening socket
    ino_t ino;
    int replacement;    // what its number holds once replaced (retire_memif_listener), or -1
};

// On the interrupt thread: the listener's trampolines retired, the connections they greeted that are still open
// ended (end_channel), then the listener's own source removed and its number closed, if the number still holds
// the listener or its replacement (the driver never closes it; nothing else may be closed here).
void end_untaken_job(void* p) {
    const auto* e = static_cast<const EndUntaken*>(p);
    std::vector<Registration> live;
    std::vector<Registration> listeners;
    try {
        const std::lock_guard<std::mutex> g(g_trampolines_lock);
        for (Trampoline* t : g_trampolines) {
            if (t->dev != e->dev || t->ino != e->ino) continue;
            const std::lock_guard<std::mutex> tg(t->lock);
            if (!t->retired) listeners.push_back(Registration{t->fd, listener_trampoline, t, t->dev, t->ino});
            t->retired = true;
            live.insert(live.end(), t->live.begin(), t->live.end());
            t->live.clear();
        }
    } catch (const std::exception&) {
        return;  // (no memory: those connections stay the driver's, the listener's number the eventfd's)
    }
    for (const Registration& r : live) end_channel(r);
    for (const Registration& r : listeners) {
        if (!r.open() && (e->replacement < 0 || !same_file(r.fd, e->replacement))) continue;
        if (unregister(r) <= 0) continue;  // no source of ours on it: the number stays as it is
        ::close(r.fd);                     // no source left under it: the next rebuild does not look for it
        g_listeners_closed.fetch_add(1, std::memory_order_relaxed);
    }
}

}  // namespace

// The connections the listening socket `listener` (any descriptor of it) accepted that no device took, ended on
// the interrupt thread (end_channel), and those its trampoline greets from now on as they come. Only when no
// device on the socket can take a connection any more: retire_memif_listener, for the socket's last device,
// after its disconnect (it is disabled: the driver refuses INITs for it) and after the listener was replaced.
unsigned end_untaken_channels(int listener, int replacement) noexcept {
    struct stat st{};
    if (::fstat(listener, &st) != 0) return 0;
    static EndUntaken what{};  // static: a job that did not run in time may still run (on_interrupt_thread)
    static InterruptJob job;
    const std::uint64_t before = g_channels_ended.load(std::memory_order_relaxed);
    what = EndUntaken{st.st_dev, st.st_ino, replacement};
    job.fn = end_untaken_job;
    job.arg = &what;
    if (!on_interrupt_thread(job, std::chrono::seconds(1))) {
        log::warn("memif: DPDK's interrupt thread did not take the job of ending the connections no device took "
                  "within 1 s; they stay open");
        return 0;
    }
    return static_cast<unsigned>(g_channels_ended.load(std::memory_order_relaxed) - before);
}

unsigned memif_listeners_wrapped() noexcept { return g_listeners_wrapped.load(std::memory_order_relaxed); }
std::uint64_t memif_channels_ended() noexcept { return g_channels_ended.load(std::memory_order_relaxed); }
std::uint64_t memif_channels_dropped() noexcept { return g_channels_dropped.load(std::memory_order_relaxed); }
std::uint64_t memif_channels_freed() noexcept { return g_channels_freed.load(std::memory_order_relaxed); }
std::uint64_t memif_listeners_closed() noexcept { return g_listeners_closed.load(std::memory_order_relaxed); }

}  // namespace softrdma::io::detail

extern "C" __attribute__((visibility("default"))) int rte_intr_callback_register(const rte_intr_handle* h,
                                                                                 rte_intr_callback_fn fn, void* arg) {
    using namespace softrdma::io::detail;
    const RegisterFn eal = eal_register();
    if (eal == nullptr) return -ENOSYS;  // (not reached: DPDK's own is always found where DPDK runs)
    if (!kKnownDpdk || h == nullptr || fn == nullptr) return eal(h, fn, arg);
    const int fd = rte_intr_fd_get(h);
    if (DuringListener* d = t_listener_call; d != nullptr && fd >= 0) {
        const int rc = eal(h, fn, arg);
        struct stat st{};
        if (rc == 0 && d->n < d->seen.size() && ::fstat(fd, &st) == 0)
            d->seen[d->n++] = Registration{fd, fn, arg, st.st_dev, st.st_ino};
        return rc;
    }
    if (fd >= 0 && from_memif_driver(fn) && listening_socket(fd)) {
        struct stat st{};
        auto* t = ::fstat(fd, &st) == 0 ? new (std::nothrow) Trampoline{fn, arg, fd, st.st_dev, st.st_ino, {}, {}} : nullptr;
        if (t != nullptr) {  // never freed: see above
            try {
                const std::lock_guard<std::mutex> g(g_trampolines_lock);
                g_trampolines.push_back(t);
            } catch (const std::exception&) {
                delete t;
                return eal(h, fn, arg);
            }
            const int rc = eal(h, listener_trampoline, t);
            if (rc == 0) g_listeners_wrapped.fetch_add(1, std::memory_order_relaxed);  // (else it stays unused)
            return rc;
        }
    }
    return eal(h, fn, arg);
}
