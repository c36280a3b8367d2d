// SPDX-License-Identifier: MIT
#include "stack/stack.hpp"

#include "stack/tcp.hpp"
#include "stack/frame.hpp"

#include <arpa/inet.h>
#include <sched.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <rte_cycles.h>
#include "base/log.hpp"

#include "base/tsan.hpp"
#include "base/cycles.hpp"
#include "stack/lwip_includes.hpp"

namespace softrdma {

// <softrdma/config.hpp>'s address type (the stack is where addresses are parsed).
Ipv4 Ipv4::parse(std::string_view text) {
    in_addr a{};
    const std::string s(text);
    if (inet_pton(AF_INET, s.c_str(), &a) != 1) throw std::invalid_argument("not an IPv4 address: '" + s + "'");
    return Ipv4{a.s_addr};
}

std::string Ipv4::str() const {
    char buf[INET_ADDRSTRLEN];
    in_addr a{be};
    inet_ntop(AF_INET, &a, buf, sizeof buf);
    return buf;
}

}  // namespace softrdma

namespace softrdma::stack {
namespace {

// An RX frame segment handed to lwIP without a copy: a custom pbuf whose free hook returns the mbuf
// segment to DPDK's pool. Ownership: from input() on, lwIP owns the pbuf and so the mbuf segment; whoever
// frees the last reference to the pbuf (lwIP itself, or the TCP receive handler) returns the mbuf.
// A frame from input_external() uses the same wrapper with `seg` null and its release hook instead.
struct RxPbuf {
    pbuf_custom pc;  // first member: lwIP hands back the pbuf*, which is this object
    rte_mbuf* seg;
    Stack::ReleaseFn release;
    void* ctx;
    std::uint32_t cookie;
};
// Sizing rule: one wrapper per mbuf segment lwIP may hold; >= the largest mbuf pool a port creates by
// default (8191), so the mbuf pool, not this one, is what runs dry under pressure.
constexpr int kRxPbufs = 16384;
LWIP_MEMPOOL_DECLARE(SR_RX_PBUF, kRxPbufs, sizeof(RxPbuf), "RX mbuf pbufs")

void rx_pbuf_free(pbuf* p) {
    auto* r = reinterpret_cast<RxPbuf*>(p);
    if (r->seg != nullptr) rte_pktmbuf_free_seg(r->seg);
    else r->release(r->ctx, r->cookie);
    LWIP_MEMPOOL_FREE(SR_RX_PBUF, r);
}

Stack* g_stack = nullptr;

// TCP payload bytes of an outgoing frame (StackCounters::tx_copied_out): lwIP writes the Ethernet, IPv4 and
// TCP headers into the first pbuf. 0 for anything else (ARP).
std::uint32_t tcp_payload_len(const pbuf* p) noexcept {
    const auto* b = static_cast<const std::uint8_t*>(p->payload);
    constexpr std::uint32_t kEth = 14;
    if (p->len < kEth + 20 || b[12] != 0x08 || b[13] != 0x00 || b[kEth + 9] != IP_PROTO_TCP) return 0;
    const std::uint32_t ihl = (b[kEth] & 0x0fu) * 4u;
    if (p->len < kEth + ihl + 13) return 0;
    const std::uint32_t headers = kEth + ihl + (b[kEth + ihl + 12] >> 4) * 4u;
    return p->tot_len > headers ? p->tot_len - headers : 0;
}

}  // namespace

std::string PoolUsage::diff(const PoolUsage& later) const {
    std::string out;
    auto add = [&](const std::string& what, std::uint64_t a, std::uint64_t b) {
        if (a == b) return;
        if (!out.empty()) out += "; ";
        out += what + " " + std::to_string(a) + " -> " + std::to_string(b);
    };
    for (std::size_t i = 0; i < pools.size() && i < later.pools.size(); ++i)
        add(pools[i].first, pools[i].second, later.pools[i].second);
    add("heap bytes", heap_used, later.heap_used);
    // Fewer mbufs out than at the start is no leak (a driver may have held one then); nor up to driver_slack
    // more (a memif zero-copy driver's rings, io::Port::driver_held()).
    if (later.mbufs_in_use > mbufs_in_use + driver_slack) add("mbufs", mbufs_in_use, later.mbufs_in_use);
    return out;
}

// lwIP's TCP sanity checks are off (lwipopts.h: one assumes TCP_MSS below 16 KiB); the ones that matter:
static_assert(TCP_SND_BUF >= 2 * TCP_MSS);
static_assert(TCP_SND_QUEUELEN >= 2 * (TCP_SND_BUF / TCP_MSS));
static_assert(TCP_WND >= TCP_MSS);
static_assert(TCP_MSS == kLargeSegmentMss && kLargeSegmentMss <= io::TxArena::kUsable);
// A large segment's frame, Ethernet header included, fits a pbuf chain's 16-bit length, one memif buffer of a
// large-frame port (io/port.cpp, memif_buffer_size: 65472) and one of its RX mbufs.
static_assert(kLargeSegmentMtu + 14 <= 65472 && kLargeSegmentMtu + 14 <= io::Port::kLargeRxFrame);

Stack::Stack(io::Port& port, const StackConfig& cfg)
    : port_(port), large_segments_(cfg.large_segments && port.large_frames()), cfg_(cfg),
      netif_(std::make_unique<netif>()), owner_(std::this_thread::get_id()),
      fills_(std::make_shared<FillBook>(port.tx_arena(), &counters_)) {  // before netif_add: link_output reads it
    if (g_stack != nullptr) throw std::logic_error("one softrdma::stack::Stack per process (lwIP is global)");
    // copy_chain fills each mbuf: the largest frame must fit the port's most mbufs a frame (link_output).
    const std::uint32_t largest = (large_segments_ ? kLargeSegmentMtu : port.mtu()) + 14u;
    if ((largest + port.mbuf_data_room() - 1) / port.mbuf_data_room() > port.tx_max_segments())
        throw std::invalid_argument(port.name() + ": a " + std::to_string(largest) + "-byte frame needs more than " +
                                    std::to_string(port.tx_max_segments()) + " mbufs of " +
                                    std::to_string(port.mbuf_data_room()) + " bytes, the most the port sends");
    static bool lwip_ready = false;
    if (!lwip_ready) {
        lwip_init();
        LWIP_MEMPOOL_INIT(SR_RX_PBUF);
        lwip_ready = true;
    }
    g_stack = this;
    ip4_addr_t ip, mask, gw;
    ip.addr = cfg.ip.address.be;
    mask.addr = cfg.ip.netmask.be;
    gw.addr = cfg.ip.gateway.be;
    netif_add(netif_.get(), &ip, &mask, &gw, this, &Stack::netif_init, netif_input);
    netif_set_default(netif_.get());
    // The RX thread checks TCP checksums itself (some frames reach lwIP with their payload left out).
    u16_t csum = NETIF_CHECKSUM_ENABLE_ALL;
    if (cfg.rx_external) csum &= ~NETIF_CHECKSUM_CHECK_TCP;
    if (!cfg.tcp_checksums) csum &= ~(NETIF_CHECKSUM_CHECK_TCP | NETIF_CHECKSUM_GEN_TCP);
    NETIF_SET_CHECKSUM_CTRL(netif_.get(), csum);
    netif_set_up(netif_.get());
    netif_set_link_up(netif_.get());
    tsc_per_ms_ = std::max<std::uint64_t>(1, rte_get_timer_hz() / 1000);
    ack_delay_tsc_ = std::max<std::uint64_t>(1, rte_get_timer_hz() / 1000000 * kAckDelayUs);
    next_timer_tsc_ = rte_get_timer_cycles() + tsc_per_ms_;
    // Deferred payload (defer_fill): the driver must copy the frame inside tx_burst and keep nothing (memif
    // does; fault injection holds frames back), and lwIP must not read the payload (no checksums to generate).
    // Not with a capture: a deferred frame memif refuses is built again from the chunk, and the capture, which
    // records a refused burst once by its head mbuf, would record it twice. Not as memif's zero-copy client
    // either: it keeps what it sends (the peer reads it from our memory) and can only describe DPDK's memory.
    defer_fill_ok_ = port.tx_arena() != nullptr && port.is_memif() && !port.memif_zero_copy() && !port.faults_on() &&
                     !port.capturing() && !cfg.tcp_checksums;
    foreign_shinfo_.free_cb = [](void*, void*) {};  // nothing to free: the bytes are the application's
    rte_mbuf_ext_refcnt_set(&foreign_shinfo_, 1);     // ours, so the count never reaches 0
    log::info("stack {} on {} (MTU {}{})", cfg.ip.address.str(), port.name(), port.mtu(),
              large_segments_ ? ", TCP segments up to " + std::to_string(kLargeSegmentMss) + " bytes" : std::string());
}

Stack::~Stack() {
    fills_->detach();  // the chunks go with the port; completion queues holding the book find it empty
    // Closed connections whose last bytes the peer never acknowledged: lwIP must not reference their TX chunks
    // past the Stack (the port, and so the arena, may go next).
    while (!orphans_.empty()) {
        TxOrphan* o = orphans_.back().get();
        tcp_pcb* pcb = o->pcb;
        drop_orphan(o, true);
        tcp_abort(pcb);
    }
    flush_tx();
    drop_tx_queue();  // what the driver would not take
    purge_time_wait();
    netif_remove(netif_.get());
    g_stack = nullptr;
}


void Stack::assert_owner() const noexcept {
    assert(std::this_thread::get_id() == owner_ && "lwIP used from a thread that does not own the stack");
}

signed char Stack::netif_init(netif* nif) {
    auto* self = static_cast<Stack*>(nif->state);
    nif->name[0] = 's';
    nif->name[1] = 'r';
    nif->mtu = static_cast<u16_t>(self->large_segments_ ? kLargeSegmentMtu : self->port_.mtu());
    nif->hwaddr_len = ETH_HWADDR_LEN;
    std::copy(self->port_.mac().begin(), self->port_.mac().end(), nif->hwaddr);
    nif->flags = NETIF_FLAG_BROADCAST | NETIF_FLAG_ETHARP | NETIF_FLAG_ETHERNET | NETIF_FLAG_LINK_UP;
    nif->output = etharp_output;
    nif->linkoutput = &Stack::link_output;
    return ERR_OK;
}

// lwIP -> wire. Ownership: lwIP keeps `p` (it may retransmit from it); the frame goes out in fresh mbufs,
// which the Stack owns in tx_queue_ until tx_burst hands them to the driver. Two ways:
//  - zero-copy (the port has a TX arena and the payload is in its chunks: TcpConnection's tx_buffer): an mbuf
//    with the Ethernet/IP/TCP headers, chained to an mbuf per payload pbuf that carries the chunk's bytes as an
//    external buffer (io::TxArena::attach: the mbuf holds a reference on the chunk until the driver frees it).
//    Payload pieces below kCopyBreak are copied into the header mbuf instead (an mbuf and a reference cost
//    more than copying a small SEND).
//  - copy: the whole frame into one mbuf (control frames, data lwIP copied, or a port without an arena).
// Back-pressure, not loss: with no mbuf, or the TX queue still full after a flush (the peer drains its ring
// slower than we fill it: a 1024-connection burst), return ERR_MEM. lwIP's tcp_output then keeps the segment
// at the head of pcb->unsent (TF_NAGLEMEMERR; tcp_fasttmr or our next flush sends it again), and an ACK stays
// owed (TF_ACK_NOW: resend_refused_acks sends it again), so nothing is lost. Dropping it instead (ERR_OK)
// would leave a hole only a retransmission timeout fills, with the timeout doubling on every repeat until the
// connection's user timeout kills it.
signed char Stack::link_output(netif* nif, pbuf* p) {
    auto* self = static_cast<Stack*>(nif->state);
    io::TxArena* arena = self->port_.tx_arena();
    const bool chained = arena != nullptr && p->next != nullptr && arena->find(p->next->payload) >= 0;
    const bool linear = !chained && p->tot_len <= self->port_.mbuf_data_room();
    if (!chained && !linear && !self->large_segments_) {
        ++self->counters_.tx_dropped;
        return ERR_IF;
    }
    if (self->tx_tail_ == kTxQueue) self->flush_tx_inner();
    if (self->tx_tail_ == kTxQueue) {  // the ring stayed full for a whole queue: lwIP keeps the frame
        ++self->counters_.tx_deferred;
        return ERR_MEM;
    }
    rte_mbuf* m = self->port_.alloc();
    wire_acquire(self->port_.pool());  // the mbuf may have been the RX thread's (see base/tsan.hpp)
    if (m == nullptr) {
        ++self->counters_.tx_deferred;
        return ERR_MEM;
    }
    if (self->fills_->pending() && self->overlaps_fill(p)) {
        if (chained) {
            if (self->send_deferred(p, *arena, m)) return ERR_OK;
            m = self->port_.alloc();  // (send_deferred freed the first)
        }
        // The ring is busy (or the frame is not shaped for it): settle first and send from the chunk as usual.
        self->fill_overlapping(p);
        if (m == nullptr) {
            ++self->counters_.tx_deferred;
            return ERR_MEM;
        }
    }
    std::uint32_t attached = 0;  // payload bytes sent by reference (the rest of the TCP payload is copied)
    if (chained || !linear) {
        // (a first pbuf too big for one mbuf: lwIP appended our bytes to a segment it copied; copy it all)
        bool ok = chained && p->len <= self->port_.mbuf_data_room() ? self->chain_payload(m, p, *arena, attached)
                                                                     : self->copy_chain(m, p);
        if (ok && m->nb_segs > self->port_.tx_max_segments()) [[unlikely]] {
            // More mbufs than the port takes in one frame (the memif zero-copy ring, 32 with large frames: a
            // chunk's piece followed by copied pieces, each split over mbufs of its own): copied whole, which
            // fills every mbuf (the constructor checks the largest frame fits).
            rte_pktmbuf_free(m);  // the chain and its chunk references
            attached = 0;
            if ((m = self->port_.alloc()) == nullptr) {
                ++self->counters_.tx_deferred;
                return ERR_MEM;
            }
            ok = self->copy_chain(m, p);
        }
        if (!ok) {
            rte_pktmbuf_free(m);
            ++self->counters_.tx_deferred;
            return ERR_MEM;
        }
    } else {
        pbuf_copy_partial(p, rte_pktmbuf_mtod(m, void*), p->tot_len, 0);
        m->data_len = p->tot_len;
        m->pkt_len = p->tot_len;
    }
    self->tx_queue_[self->tx_tail_++] = m;
    ++self->counters_.tx_frames;
    const std::uint32_t payload = tcp_payload_len(p);
    self->counters_.tx_copied_out += payload - std::min(attached, payload);
    return ERR_OK;
}

// A large segment lwIP copied (its bytes in lwIP's memory): into as many mbufs as it takes. False when out of
// mbufs (the caller frees `head` and what was chained to it).
bool Stack::copy_chain(rte_mbuf* head, pbuf* p) noexcept {
    const std::uint32_t room = port_.mbuf_data_room();
    std::uint32_t off = 0;
    rte_mbuf* tail = head;
    head->pkt_len = p->tot_len;
    for (;;) {
        const auto n = static_cast<std::uint16_t>(std::min<std::uint32_t>(room, p->tot_len - off));
        pbuf_copy_partial(p, rte_pktmbuf_mtod(tail, void*), n, static_cast<u16_t>(off));
        tail->data_len = n;
        off += n;
        if (off == p->tot_len) return true;
        rte_mbuf* next = port_.alloc();
        if (next == nullptr) return false;
        tail->next = next;
        tail = next;
        ++head->nb_segs;
    }
}

// Builds the zero-copy frame in `head` (a fresh mbuf): p's first pbuf (the headers lwIP wrote; it fits) copied, each
// further pbuf attached from the arena, or copied when small or not arena memory. False when out of mbufs
// (the caller frees `head`, which frees what was chained to it).
bool Stack::chain_payload(rte_mbuf* head, pbuf* p, io::TxArena& arena, std::uint32_t& attached) noexcept {
    const std::uint32_t room = port_.mbuf_data_room();
    std::memcpy(rte_pktmbuf_mtod(head, void*), p->payload, p->len);
    head->data_len = p->len;
    head->pkt_len = p->tot_len;
    rte_mbuf* tail = head;
    bool tail_copies = true;  // tail is a direct mbuf we copy into
    for (pbuf* q = p->next; q != nullptr; q = q->next) {
        const std::int32_t c = q->len >= kCopyBreak ? arena.find(q->payload) : -1;
        if (c < 0 && tail_copies && tail->data_len + q->len <= room) {
            std::memcpy(rte_pktmbuf_mtod_offset(tail, std::byte*, tail->data_len), q->payload, q->len);
            tail->data_len = static_cast<std::uint16_t>(tail->data_len + q->len);
            continue;
        }
        rte_mbuf* n = port_.alloc();
        if (n == nullptr) return false;
        if (c >= 0) {
            arena.attach(n, c, q->payload, q->len);
            attached += q->len;
            tail_copies = false;
        } else {
            // A copied piece too big for the tail (data lwIP copied into its own memory, appended to a segment
            // that began in a chunk: the connection's chunks ran out). Up to TCP_COPY_WRITE_MAX (8960) bytes,
            // more than an mbuf holds at MTU 1500: into as many mbufs as it takes.
            const auto* src = static_cast<const std::byte*>(q->payload);
            for (std::uint32_t off = 0;;) {
                const auto k = static_cast<std::uint16_t>(std::min<std::uint32_t>(room, q->len - off));
                std::memcpy(rte_pktmbuf_mtod(n, void*), src + off, k);
                n->data_len = k;
                off += k;
                if (off == q->len) break;
                tail->next = n;
                tail = n;
                ++head->nb_segs;
                n = port_.alloc();
                if (n == nullptr) return false;
            }
            tail_copies = true;
        }
        tail->next = n;
        tail = n;
        ++head->nb_segs;
    }
    return true;
}

// ---- deferred payload (defer_fill) ----

namespace {
bool overlaps(const std::byte* dst, std::uint32_t dlen, const std::byte* a, std::size_t len) noexcept {
    return dlen != 0 && dst < a + len && a < dst + dlen;
}

// Calls `f` on every live record that a pbuf of `p` (after its header pbuf) overlaps, until `f` says true;
// whether it did. Records are of chunk memory only (a pbuf outside the arena, lwIP's own, overlaps none), and a
// piece of one chunk looks only at that chunk's records (FillBook::records_of).
template <class Book, class F>
bool each_overlapping(Book& book, const io::TxArena& arena, const pbuf* p, F&& f) {
    for (const pbuf* q = p->next; q != nullptr; q = q->next) {
        const auto* a = static_cast<const std::byte*>(q->payload);
        const std::int32_t c = arena.find(a);
        if (c < 0) continue;
        const FillBook::Range r = book.records_of(c);
        for (unsigned i = r.from; i != r.to; ++i) {
            auto& rec = book.at(i);
            if (overlaps(rec.dst, rec.len, a, q->len) && book.live(rec) && f(rec)) return true;
        }
    }
    return false;
}
}  // namespace

// (Called with records pending, so the port has an arena.)
bool Stack::overlaps_fill(const pbuf* p) const noexcept {
    return each_overlapping(*fills_, *port_.tx_arena(), p, [](const FillBook::Fill&) { return true; });
}

// Settles every record a pbuf of `p` overlaps, whole (the bytes past the frame are owed anyway).
void Stack::fill_overlapping(const pbuf* p) noexcept {
    FillBook& book = *fills_;
    each_overlapping(book, *port_.tx_arena(), p, [&book](FillBook::Fill& f) {
        book.settle(f);
        return false;
    });
}

// lwIP's persist timer reads segment bytes (a zero-window probe copies one, a split copies the rest of the
// segment): before the timers run with a window closed somewhere, the book is settled (see fill_book.hpp).
bool Stack::any_persisting() const noexcept {
    for (const tcp_pcb* pcb = tcp_active_pcbs; pcb != nullptr; pcb = pcb->next)
        if (pcb->persist_backoff > 0) return true;
    return false;
}


// A frame carrying deferred bytes: built with them attached from where they are and handed to the driver at
// once (which copies it into its ring inside tx_burst and frees the mbufs: nothing points at `src` afterwards;
// the record stays until the chunk is acknowledged or the record settled). False, with nothing queued, when
// frames wait for the ring, the ring has no room for it now or mbufs ran out: the caller settles the records
// and sends from the chunk as usual.
// Ownership: `head` (a fresh mbuf) is the function's either way: sent (the driver's) or freed here.
bool Stack::send_deferred(pbuf* p, io::TxArena& arena, rte_mbuf* head) noexcept {
    flush_tx_inner();
    std::uint32_t attached = 0, deferred = 0;
    // (frames ahead of it still waiting for the ring: it waits with them, from the chunk)
    if (tx_head_ != tx_tail_ || !chain_deferred(head, p, arena, attached, deferred)) {
        rte_pktmbuf_free(head);
        return false;
    }
    const std::uint64_t t0 = cfg_.count_cycles ? cycles_now() : 0;
    rte_mbuf* one[1] = {head};
    wire_release(&port_);
    const unsigned sent = port_.tx_burst(std::span(one, 1));
    if (cfg_.count_cycles) count_io(cycles_now() - t0);
    if (sent == 0) {
        rte_pktmbuf_free(head);
        return false;
    }
    ++counters_.tx_frames;
    const std::uint32_t payload = tcp_payload_len(p);
    counters_.tx_copied_out += payload - std::min(attached, payload);
    counters_.tx_from_source += deferred;
    return true;
}

// As chain_payload, with the deferred bytes inside the chunk's pbufs attached from their source.
bool Stack::chain_deferred(rte_mbuf* head, pbuf* p, io::TxArena& arena, std::uint32_t& attached,
                           std::uint32_t& deferred) noexcept {
    const std::uint32_t room = port_.mbuf_data_room();
    if (p->len > room) return false;
    std::memcpy(rte_pktmbuf_mtod(head, void*), p->payload, p->len);
    head->data_len = p->len;
    head->pkt_len = p->tot_len;
    rte_mbuf* tail = head;
    bool tail_copies = true;
    auto link = [&](rte_mbuf* n) {
        tail->next = n;
        tail = n;
        ++head->nb_segs;
    };
    auto copy = [&](const std::byte* src, std::uint32_t n) {
        if (!tail_copies || tail->data_len + n > room) {
            rte_mbuf* m = port_.alloc();
            if (m == nullptr) return false;
            link(m);
            tail_copies = true;
        }
        std::memcpy(rte_pktmbuf_mtod_offset(tail, std::byte*, tail->data_len), src, n);
        tail->data_len = static_cast<std::uint16_t>(tail->data_len + n);
        return true;
    };
    auto from_chunk = [&](std::int32_t c, std::byte* a, std::uint32_t n) {
        if (n == 0) return true;
        if (n < kCopyBreak) return copy(a, n);
        rte_mbuf* m = port_.alloc();
        if (m == nullptr) return false;
        arena.attach(m, c, a, static_cast<std::uint16_t>(n));
        attached += n;
        link(m);
        tail_copies = false;
        return true;
    };
    for (pbuf* q = p->next; q != nullptr; q = q->next) {
        auto* a = static_cast<std::byte*>(q->payload);
        const std::int32_t c = arena.find(a);
        if (c < 0) {  // lwIP's own memory (small pieces it copied): as chain_payload
            if (q->len > room || !copy(a, q->len)) return false;
            continue;
        }
        std::byte* const end = a + q->len;
        // The records are in stream order per connection; the live ones inside this pbuf (one connection's
        // chunk, one generation of it), in address order.
        const FillBook& book = *fills_;
        const FillBook::Range r = book.records_of(c);
        for (unsigned i = r.from; i != r.to && a < end; ++i) {
            const FillBook::Fill& f = book.at(i);
            if (!overlaps(f.dst, f.len, a, static_cast<std::size_t>(end - a)) || !book.live(f)) continue;
            std::byte* const d0 = std::max(f.dst, a);
            std::byte* const d1 = std::min(f.dst + f.len, end);
            if (!from_chunk(c, a, static_cast<std::uint32_t>(d0 - a))) return false;
            rte_mbuf* m = port_.alloc();
            if (m == nullptr) return false;
            const auto n = static_cast<std::uint16_t>(d1 - d0);
            // Ownership: the bytes stay the application's; the mbuf only points at them until tx_burst (or the
            // caller on a failure) frees it, inside this call (the record outlives it); foreign_shinfo_'s free
            // callback does nothing.
            rte_mbuf_ext_refcnt_update(&foreign_shinfo_, 1);
            rte_pktmbuf_attach_extbuf(m, const_cast<std::byte*>(f.src + (d0 - f.dst)), RTE_BAD_IOVA, n,
                                      &foreign_shinfo_);
            m->data_len = n;
            m->pkt_len = n;
            attached += n;
            deferred += n;
            link(m);
            tail_copies = false;
            a = d1;
        }
        if (!from_chunk(c, a, static_cast<std::uint32_t>(end - a))) return false;
    }
    return true;
}

void Stack::adopt_tx_chunks(tcp_pcb* pcb, std::span<const std::int32_t> chunks, std::uint32_t end_seq) {
    assert_owner();
    orphans_.push_back(std::make_unique<TxOrphan>(TxOrphan{this, pcb, end_seq, {chunks.begin(), chunks.end()}}));
    TxOrphan* o = orphans_.back().get();
    tcp_arg(pcb, o);
    tcp_sent(pcb, &Stack::orphan_sent);
    tcp_err(pcb, &Stack::orphan_err);
}

err_t Stack::orphan_sent(void* arg, tcp_pcb* pcb, u16_t) {
    auto* o = static_cast<TxOrphan*>(arg);
    if (o != nullptr && static_cast<std::int32_t>(pcb->lastack - o->end_seq) >= 0) o->stack->drop_orphan(o, true);
    return ERR_OK;
}

void Stack::orphan_err(void* arg, err_t) {
    auto* o = static_cast<TxOrphan*>(arg);
    if (o != nullptr) o->stack->drop_orphan(o, false);  // the pcb is gone, and lwIP's references with it
}

void Stack::drop_orphan(TxOrphan* o, bool pcb_alive) noexcept {
    if (pcb_alive) {
        tcp_arg(o->pcb, nullptr);
        tcp_sent(o->pcb, nullptr);
        tcp_err(o->pcb, nullptr);
    }
    for (const std::int32_t c : o->chunks) port_.tx_arena()->release(c);
    for (auto it = orphans_.begin(); it != orphans_.end(); ++it) {
        if (it->get() == o) {
            orphans_.erase(it);
            break;
        }
    }
}

// Hands queued frames to the driver until it refuses; the rest wait for the next turn (RX keeps being
// polled meanwhile, so two peers with full rings still drain each other).
void Stack::flush_tx() noexcept {
    if (!cfg_.count_cycles) return flush_tx_inner();
    const std::uint64_t t0 = cycles_now();
    timed_ = true;
    flush_tx_inner();
    timed_ = false;
    cycles_.total += cycles_now() - t0;
}

void Stack::flush_tx_inner() noexcept {
    if (tx_head_ == tx_tail_) {
        port_.tx_release_held();  // fault injection's delayed frames (nothing when it is off)
        return;
    }
    wire_release(&port_);  // what we did before sending (see base/tsan.hpp)
    while (tx_head_ != tx_tail_) {
        const std::uint64_t t0 = cfg_.count_cycles ? cycles_now() : 0;
        const unsigned sent = port_.tx_burst(std::span(tx_queue_ + tx_head_, std::min(tx_tail_ - tx_head_, 64u)));
        if (cfg_.count_cycles) count_io(cycles_now() - t0);
        if (sent == 0) {
            // A full ring waits for the next turn; a link that is down (the peer is gone) never takes them:
            // drop what is queued rather than hold mbufs for it (TCP resends if the link comes back).
            if (!port_.link_up()) drop_tx_queue();
            break;
        }
        tx_head_ += sent;
    }
    if (tx_head_ == tx_tail_) {
        tx_head_ = tx_tail_ = 0;
    } else if (tx_tail_ == kTxQueue && tx_head_ != 0) {  // compact so link_output has room again
        std::copy(tx_queue_ + tx_head_, tx_queue_ + tx_tail_, tx_queue_);
        tx_tail_ -= tx_head_;
        tx_head_ = 0;
    }
}

// Refused ACKs. When link_output refuses a pure ACK (ERR_MEM: the TX queue full behind a full ring, or no
// mbuf), lwIP's tcp_send_empty_ack marks it owed (TF_ACK_NOW | TF_ACK_DELAY) for its fast timer. That timer
// looks at active pcbs only, and after its one attempt clears both flags whether the ACK went out or not: a
// second refusal loses it. A lost ACK is repaired only by the peer resending, and when it acknowledged the
// peer's FIN, the peer sits in CLOSING or LAST_ACK resending that FIN on a backed-off timer, to a TIME_WAIT
// that may be purged by then or a process that is gone (1024 QPs closing at once under TSan: 3 to 12 client
// connections never closed, a CI failure). So before lwIP's timers run (once a millisecond), while frames are
// refused or waiting for the ring, every owed ACK (TF_ACK_NOW) and every delayed one (TF_ACK_DELAY: the fast
// timer's own attempt could be refused) of active and TIME_WAIT pcbs is sent here; one still refused keeps
// TF_ACK_NOW without TF_ACK_DELAY, out of the fast timer's reach, for the next pass. (Left to lwIP: an ACK
// refused inside the timers while this pass found nothing owed: more delayed ACKs at one tick than the TX
// queue's 1024 frames, with the ring full.) Cost: nothing while the ring takes every frame; a walk of the pcb
// lists once a millisecond while it does not.
void Stack::resend_refused_acks() noexcept {
    bool owed = false;
    for (tcp_pcb* list : {tcp_active_pcbs, tcp_tw_pcbs})
        for (tcp_pcb* p = list; p != nullptr; p = p->next) {
            if ((p->flags & (TF_ACK_NOW | TF_ACK_DELAY)) == 0) continue;
            tcp_ack_now(p);
            tcp_output(p);
            if ((p->flags & TF_ACK_NOW) != 0) {
                tcp_clear_flags(p, TF_ACK_DELAY);
                owed = true;
            }
        }
    if (!owed) refusals_seen_ = counters_.tx_deferred;
}

// lwIP 2.1.3 can strand a segment when a retransmission timeout follows a fast retransmit that the peer's
// window held back. tcp_rexmit (fast retransmit) moves the oldest unacknowledged segment to pcb->unsent, in
// order; a zero window keeps it there; then tcp_rexmit_rto_prepare (the timeout, in tcp_slowtmr) puts all of
// pcb->unacked in FRONT of pcb->unsent, so that oldest segment now sits behind newer ones. tcp_output sends in
// queue order within the window: the newer segments fill the congestion window, the peer keeps acknowledging
// the hole, duplicate ACKs fast-retransmit the wrong segment, and the connection stalls until its user timeout
// (found with tests/verbs/rawtcp.py's window-shrink case: a peer that shrinks its window and drops what was
// past the new edge). After each timer run (the only place the timeout fires) we put a misordered unsent queue
// back in sequence order and send. Cost: one pointer test per active connection per millisecond, a walk of
// the queue only for connections with two or more unsent segments. The sort is an insertion sort of that short
// queue, stable for equal sequence numbers; lwIP's unsent_oversize (room in the last segment's pbuf for
// tcp_write to append to) is dropped when the last segment changes, as lwIP's own tcp_rexmit does.
void Stack::reorder_unsent() noexcept {
    auto seq = [](const tcp_seg* s) { return lwip_ntohl(s->tcphdr->seqno); };
    for (tcp_pcb* p = tcp_active_pcbs; p != nullptr; p = p->next) {
        if (p->unsent == nullptr || p->unsent->next == nullptr) continue;
        const tcp_seg* s = p->unsent;
        while (s->next != nullptr && !TCP_SEQ_GT(seq(s), seq(s->next))) s = s->next;
        if (s->next == nullptr) continue;  // in order
        const tcp_seg* last = s;
        while (last->next != nullptr) last = last->next;
        tcp_seg* sorted = nullptr;
        for (tcp_seg* cur = p->unsent; cur != nullptr;) {
            tcp_seg* next = cur->next;
            tcp_seg** at = &sorted;
            while (*at != nullptr && !TCP_SEQ_GT(seq(*at), seq(cur))) at = &(*at)->next;
            cur->next = *at;
            *at = cur;
            cur = next;
        }
        p->unsent = sorted;
        const tcp_seg* new_last = sorted;
        while (new_last->next != nullptr) new_last = new_last->next;
        if (new_last != last) p->unsent_oversize = 0;
        ++counters_.unsent_reordered;
        tcp_output(p);
    }
}

void Stack::drop_tx_queue() noexcept {
    for (unsigned i = tx_head_; i < tx_tail_; ++i) rte_pktmbuf_free(tx_queue_[i]);  // still ours: never sent
    counters_.tx_dropped += tx_tail_ - tx_head_;
    tx_head_ = tx_tail_ = 0;
}

// A borrowed frame (io::Port::borrowed: its payload still in the memif client's ring) holds a ring slot, and
// every later slot waits behind it, until it is freed: lwIP may have it only if it is done with it within this
// call. It keeps the segments that are not next in their connection's sequence (its out-of-order queue); our
// TCP handlers keep nothing past their call, IP reassembly is off and nothing is refused (on_recv_cb). So a
// segment of an established connection at or before rcv_nxt is taken at once; anything else is copied first.
// The headers read here are the frame's private copy (MemifServerPath::kHeaderCopy). lwIP moves the connection
// it finds to the front of its list: the walk is short while a connection streams.
bool Stack::taken_at_once(const rte_mbuf* m) noexcept {
    const TcpFrame v = parse_tcp_frame(rte_pktmbuf_mtod(m, const std::byte*), m->pkt_len);
    if (!v.valid || m->data_len < v.hdr_len) return false;
    // Only a connection of ours can be ESTABLISHED (close() leaves it, an accepted or connected pcb gets its
    // connection at once): the table finds it.
    const tcp_pcb* pcb = established(v.src_ip_be, v.src_port, v.dst_port);
    return pcb != nullptr && pcb->state == ESTABLISHED && pcb->refused_data == nullptr &&
           !seq_after(v.seq, pcb->rcv_nxt);
}

std::size_t Stack::conn_bucket(std::uint32_t remote_ip_be, std::uint16_t remote_port,
                               std::uint16_t local_port) noexcept {
    const std::uint64_t k = (std::uint64_t{remote_ip_be} << 32) ^ (std::uint64_t{remote_port} << 16) ^ local_port;
    return static_cast<std::size_t>((k * 0x9e3779b97f4a7c15ull) >> 53) & (kConnBuckets - 1);
}

void Stack::list_connection(TcpConnection* c) noexcept {
    if (c->tabled_ || c->pcb_ == nullptr) return;
    const tcp_pcb* pcb = c->pcb_;
    c->table_bucket_ = static_cast<std::uint32_t>(
        conn_bucket(ip4_addr_get_u32(ip_2_ip4(&pcb->remote_ip)), pcb->remote_port, pcb->local_port));
    TcpConnection*& head = conn_table_[c->table_bucket_];
    c->table_next_ = head;
    head = c;
    c->tabled_ = true;
}

void Stack::unlist_connection(TcpConnection* c) noexcept {
    if (!c->tabled_) return;
    for (TcpConnection** at = &conn_table_[c->table_bucket_]; *at != nullptr; at = &(*at)->table_next_)
        if (*at == c) {
            *at = c->table_next_;
            break;
        }
    c->table_next_ = nullptr;
    c->tabled_ = false;
}

const tcp_pcb* Stack::established(std::uint32_t remote_ip_be, std::uint16_t remote_port,
                                  std::uint16_t local_port) const noexcept {
    for (const TcpConnection* c = conn_table_[conn_bucket(remote_ip_be, remote_port, local_port)]; c != nullptr;
         c = c->table_next_) {
        const tcp_pcb* pcb = c->pcb_;
        if (pcb != nullptr && pcb->remote_port == remote_port && pcb->local_port == local_port &&
            ip4_addr_get_u32(ip_2_ip4(&pcb->remote_ip)) == remote_ip_be)
            return pcb;
    }
    return nullptr;
}

// wire -> lwIP. Ownership: the mbuf comes from the port (ours); each segment is wrapped in an RxPbuf and
// passed to lwIP, which owns it from here (see RxPbuf). On failure we free what we still own.
void Stack::input(rte_mbuf* m) noexcept {
    const bool lent = port_.borrowing() && io::Port::borrowed(m);  // a chain by design (not rx_chained)
    if (lent && !taken_at_once(m)) [[unlikely]] {
        m = port_.unborrow(m);  // ownership: m taken, the copy ours
        ++counters_.rx_unborrowed;
        if (m == nullptr) {
            ++counters_.rx_dropped;
            return;
        }
    }
    pbuf* head = nullptr;
    for (rte_mbuf* seg = m; seg != nullptr;) {
        rte_mbuf* next = seg->next;
        auto* r = static_cast<RxPbuf*>(LWIP_MEMPOOL_ALLOC(SR_RX_PBUF));
        if (r == nullptr) {
            ++counters_.rx_dropped;
            if (head != nullptr) pbuf_free(head);  // returns the segments already wrapped
            for (rte_mbuf* rest = seg; rest != nullptr;) {
                rte_mbuf* n = rest->next;
                rte_pktmbuf_free_seg(rest);
                rest = n;
            }
            return;
        }
        r->seg = seg;
        r->release = nullptr;
        r->pc.custom_free_function = rx_pbuf_free;
        pbuf* p = pbuf_alloced_custom(PBUF_RAW, seg->data_len, PBUF_REF, &r->pc, rte_pktmbuf_mtod(seg, void*),
                                      seg->data_len);
        if (head == nullptr) head = p;
        else pbuf_cat(head, p);
        seg = next;
    }
    ++counters_.rx_frames;
    counters_.rx_chained += m->nb_segs > 1 && !lent ? 1 : 0;
    if (netif_->input(head, netif_.get()) != ERR_OK) {
        ++counters_.rx_dropped;
        pbuf_free(head);
    }
}

namespace {
// Stands in for TCP payload placed elsewhere (input_headers): never written, never read by us; lwIP only
// counts it. Sized for the largest segment's payload (large segments, kLargeSegmentMss).
alignas(64) const std::byte kZeroPayload[65536]{};
static_assert(kLargeSegmentMss <= sizeof kZeroPayload);

// Wraps external bytes (input_external / input_headers) in an RxPbuf; nullptr when the wrapper pool is empty.
// Ownership: the returned pbuf owns the bytes' release (rx_pbuf_free calls it).
pbuf* wrap_external(std::byte* data, std::uint32_t len, Stack::ReleaseFn release, void* ctx, std::uint32_t cookie) {
    auto* r = static_cast<RxPbuf*>(LWIP_MEMPOOL_ALLOC(SR_RX_PBUF));
    if (r == nullptr) return nullptr;
    r->seg = nullptr;
    r->release = release;
    r->ctx = ctx;
    r->cookie = cookie;
    r->pc.custom_free_function = rx_pbuf_free;
    return pbuf_alloced_custom(PBUF_RAW, static_cast<u16_t>(len), PBUF_REF, &r->pc, data, static_cast<u16_t>(len));
}
}  // namespace

void Stack::deliver(pbuf* p) noexcept {
    ++counters_.rx_frames;
    if (netif_->input(p, netif_.get()) != ERR_OK) {  // lwIP owns p from here unless it refuses it
        ++counters_.rx_dropped;
        pbuf_free(p);
    }
}

void Stack::input_headers(std::byte* data, std::uint32_t len, std::uint32_t payload_len, ReleaseFn release,
                          void* ctx, std::uint32_t cookie) noexcept {
    if (payload_len == 0) return input_external(data, len, release, ctx, cookie);
    pbuf* tail = payload_len <= sizeof kZeroPayload ? pbuf_alloc(PBUF_RAW, static_cast<u16_t>(payload_len), PBUF_ROM)
                                                    : nullptr;
    pbuf* p = tail != nullptr ? wrap_external(data, len, release, ctx, cookie) : nullptr;
    if (p == nullptr) {
        ++counters_.rx_dropped;
        if (tail != nullptr) pbuf_free(tail);
        release(ctx, cookie);
        return;
    }
    tail->payload = const_cast<std::byte*>(kZeroPayload);  // PBUF_ROM: lwIP never writes through it
    pbuf_cat(p, tail);  // the chain owns tail now
    deliver(p);
}

void Stack::input_external(std::byte* data, std::uint32_t len, ReleaseFn release, void* ctx,
                           std::uint32_t cookie) noexcept {
    pbuf* p = wrap_external(data, len, release, ctx, cookie);
    if (p == nullptr) {
        ++counters_.rx_dropped;
        release(ctx, cookie);
        return;
    }
    deliver(p);
}

unsigned Stack::poll() noexcept {
    assert_owner();
    const std::uint64_t t_start = cfg_.count_cycles ? cycles_now() : 0;
    timed_ = cfg_.count_cycles;
    // Drain up to 4 bursts per turn: the peer's ring empties faster than one burst per turn of ours.
    constexpr unsigned kBurst = 32;
    rte_mbuf* burst[kBurst];
    unsigned n = 0;
    for (unsigned b = 0; b < 4 && !cfg_.rx_external; ++b) {
        const std::uint64_t t0 = cfg_.count_cycles ? cycles_now() : 0;
        const unsigned got = port_.rx_burst(std::span(burst, kBurst));
        if (cfg_.count_cycles) cycles_.io += cycles_now() - t0;
        for (unsigned i = 0; i < got; ++i) input(burst[i]);
        n += got;
        if (got < kBurst) break;
    }
    const std::uint64_t tsc = rte_get_timer_cycles();
    unsigned kept = 0;  // owed ACKs not due yet stay listed (see TcpConnection::send_deferred_ack)
    for (unsigned i = 0; i < ack_count_; ++i)
        if (!ack_pending_[i]->send_deferred_ack(tsc, ack_delay_tsc_)) ack_pending_[kept++] = ack_pending_[i];
    ack_count_ = kept;
    if (tsc >= next_timer_tsc_) {
        next_timer_tsc_ = tsc + tsc_per_ms_;
        if (fills_->pending() && any_persisting()) fills_->settle();
        if (counters_.tx_deferred != refusals_seen_ || tx_head_ != tx_tail_) resend_refused_acks();
        sys_check_timeouts();
        reorder_unsent();
    }
    flush_tx_inner();
    wake_chunk_waiters(tsc);
    // No borrowed frame outlives the turn that received it (taken_at_once; the handlers keep nothing past their
    // call): one kept would hold its ring slot, and every later slot behind it, until something freed it.
    assert(port_.borrowed_out() == 0 && "a borrowed frame was kept past the stack turn that received it");
    timed_ = false;
    if (cfg_.count_cycles) cycles_.total += cycles_now() - t_start;
    return n;
}

bool Stack::run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    Idler idle(cfg_.idle);
    for (std::uint64_t turn = 0;; ++turn) {
        if (done()) return true;
        const std::uint64_t sent_before = counters_.tx_frames;
        // Idle = nothing received and nothing sent this turn (the caller's done() may be the one working).
        const bool received = poll() != 0;
        idle.after(received || counters_.tx_frames != sent_before);
        if ((turn & 255) == 0 && std::chrono::steady_clock::now() >= deadline) return done();
    }
}

void Stack::defer_ack(TcpConnection* conn) noexcept {
    if (ack_count_ == kAckPending) {
        conn->send_deferred_ack(0, 0);  // due at once
        return;
    }
    ack_pending_[ack_count_++] = conn;
}

void Stack::send_owed_acks() noexcept {
    assert_owner();
    for (unsigned i = 0; i < ack_count_; ++i) ack_pending_[i]->send_deferred_ack(0, 0);
    ack_count_ = 0;
}

bool Stack::may_take_chunk(const TcpConnection& c) const noexcept {
    const io::TxArena* arena = port_.tx_arena();
    if (arena == nullptr || arena->exhausted()) return false;
    if (c.chunk_grant_ == grant_turn_) return true;  // set aside for it this turn
    return chunk_head_ == nullptr && arena->free_count() > grants_;
}

void Stack::queue_for_chunk(TcpConnection* c) noexcept {
    if (c->chunk_queued_) return;
    c->chunk_queued_ = true;
    c->chunk_next_ = nullptr;
    c->chunk_prev_ = chunk_tail_;
    (chunk_tail_ != nullptr ? chunk_tail_->chunk_next_ : chunk_head_) = c;
    chunk_tail_ = c;
}

void Stack::leave_chunk_queue(TcpConnection* c) noexcept {
    if (!c->chunk_queued_) return;
    (c->chunk_prev_ != nullptr ? c->chunk_prev_->chunk_next_ : chunk_head_) = c->chunk_next_;
    (c->chunk_next_ != nullptr ? c->chunk_next_->chunk_prev_ : chunk_tail_) = c->chunk_prev_;
    c->chunk_prev_ = c->chunk_next_ = nullptr;
    c->chunk_queued_ = false;
}

void Stack::took_chunk(TcpConnection* c) noexcept {
    if (c->chunk_grant_ == grant_turn_) {
        c->chunk_grant_ = 0;
        --grants_;
    }
    leave_chunk_queue(c);
}

// End of each turn, after the turn's frames went to the driver (which may have freed chunks): grants from the
// last turn lapse (a woken connection had its pump in between); chunks now free are set aside for the waiters
// at the head of the queue, one each, and those are woken. Nothing to do when nobody waits.
void Stack::wake_chunk_waiters(std::uint64_t tsc) noexcept {
    io::TxArena* arena = port_.tx_arena();
    if (arena == nullptr) return;
    ++grant_turn_;
    grants_ = 0;
    if (chunk_head_ == nullptr) {
        chunk_progress_tsc_ = tsc;
        chunks_stuck_ = false;
        return;
    }
    if (arena->exhausted()) port_.reclaim_tx();  // chunks of frames the peer has read, if the driver holds any
    if (arena->freed() != freed_seen_) {
        freed_seen_ = arena->freed();
        chunk_progress_tsc_ = tsc;
    }
    chunks_stuck_ = arena->exhausted() && tsc - chunk_progress_tsc_ >= kChunkStuckMs * tsc_per_ms_;
    // Waiters are popped before their handler runs (which may close or destroy the connection).
    std::uint32_t n = chunks_stuck_ ? ~0u : arena->free_count();
    while (n != 0 && chunk_head_ != nullptr) {
        TcpConnection* c = chunk_head_;
        leave_chunk_queue(c);
        if (c->pcb_ == nullptr || c->handler_ == nullptr) continue;  // closed: wants nothing any more
        if (!chunks_stuck_) {  // stuck: wake every waiter, to copy if it has nothing in flight
            c->chunk_grant_ = grant_turn_;
            ++grants_;
            --n;
        }
        c->handler_->on_tx_room(*c);
    }
}

void Stack::cancel_ack(TcpConnection* conn) noexcept {
    for (unsigned i = 0; i < ack_count_; ++i)
        if (ack_pending_[i] == conn) {
            ack_pending_[i] = ack_pending_[--ack_count_];
            return;
        }
}

void Stack::purge_time_wait() noexcept {
    assert_owner();
    while (tcp_tw_pcbs != nullptr) tcp_abort(tcp_tw_pcbs);
}

unsigned Stack::active_pcbs() const noexcept {
    unsigned n = 0;
    for (tcp_pcb* p = tcp_active_pcbs; p != nullptr; p = p->next) ++n;
    return n;
}

unsigned Stack::time_wait_pcbs() const noexcept {
    unsigned n = 0;
    for (tcp_pcb* p = tcp_tw_pcbs; p != nullptr; p = p->next) ++n;
    return n;
}

unsigned Stack::owed_output() const noexcept {
    unsigned n = (tx_tail_ - tx_head_) + ack_count_;
    for (const tcp_pcb* p = tcp_tw_pcbs; p != nullptr; p = p->next)
        if ((p->flags & TF_ACK_NOW) != 0) ++n;
    return n;
}

std::uint64_t Stack::queued_bytes() const noexcept {
    std::uint64_t n = 0;
    for (tcp_pcb* p = tcp_active_pcbs; p != nullptr; p = p->next) n += static_cast<std::uint32_t>(p->snd_lbb - p->lastack);
    return n;
}

std::string Stack::protocol_counters() const {
    const auto& t = lwip_stats.tcp;
    return "tcp xmit=" + std::to_string(t.xmit) + " recv=" + std::to_string(t.recv) + " drop=" +
           std::to_string(t.drop) + " memerr=" + std::to_string(t.memerr) + " chkerr=" + std::to_string(t.chkerr) +
           " proterr=" + std::to_string(t.proterr) + " ip drop=" + std::to_string(lwip_stats.ip.drop) +
           " link drop=" + std::to_string(lwip_stats.link.drop);
}

std::string Stack::describe_active_pcbs() const {
    std::string out;
    for (const tcp_pcb* p = tcp_active_pcbs; p != nullptr; p = p->next) {
        unsigned unsent = 0, unacked = 0;
        for (const tcp_seg* s = p->unsent; s != nullptr; s = s->next) ++unsent;
        for (const tcp_seg* s = p->unacked; s != nullptr; s = s->next) ++unacked;
        out += std::string(out.empty() ? "" : "; ") + tcp_debug_state_str(p->state) + " " +
               std::to_string(p->local_port) + "->" + std::to_string(p->remote_port) + " unsent " +
               std::to_string(unsent) + " unacked " + std::to_string(unacked) + " in flight " +
               std::to_string(p->snd_nxt - p->lastack) + " queued " + std::to_string(p->snd_lbb - p->lastack) +
               " nrtx " + std::to_string(p->nrtx) + " rto " + std::to_string(p->rto) + " snd_wnd " +
               std::to_string(p->snd_wnd) + " cwnd " + std::to_string(p->cwnd) + " persist " +
               std::to_string(p->persist_backoff) + " flags " + std::to_string(p->flags) +
               (p->callback_arg != nullptr ? " (callbacks set)" : "");
    }
    return out;
}

PoolUsage Stack::pool_usage() const {
    PoolUsage u;
    for (int i = 0; i < MEMP_MAX; ++i)
        u.pools.emplace_back(lwip_stats.memp[i]->name, lwip_stats.memp[i]->used);
    u.pools.emplace_back(memp_SR_RX_PBUF.stats->name, memp_SR_RX_PBUF.stats->used);
    u.heap_used = static_cast<std::uint32_t>(lwip_stats.mem.used);
    u.mbufs_in_use = port_.mbufs_in_use();
    u.driver_slack = port_.driver_held();
    if (const io::TxArena* a = port_.tx_arena()) u.pools.emplace_back("TX_CHUNK", a->in_use());
    return u;
}

}  // namespace softrdma::stack
