// SPDX-License-Identifier: MIT
// What a running Context can tell about itself, apart from the API: frame and byte counters of the port, the
// TCP/IP stack and the RX thread, the copies on the receive path, the cycles each layer costs. For benchmarks,
// tests and troubleshooting; nothing here is needed to move data. Reading them is cheap (no locks); call from
// the thread that polls the Context.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace softrdma {

// The DPDK port.
struct PortCounters {
    std::uint64_t rx_packets = 0, rx_bytes = 0;
    std::uint64_t tx_packets = 0, tx_bytes = 0;
    std::uint64_t tx_refused = 0;  // frames the TX ring could not take (the sender kept and retried them)
    // memif server: frames the client described outside its shared memory (or over 64 KiB), dropped, and
    // impossible ring indexes it published (io/memif_guard.hpp, MemifServerPath). Always 0 from a sound peer.
    std::uint64_t peer_faults = 0;
    // memif server borrowing frames (PortConfig::memif_borrow_rx): frames received without a copy out of the
    // client's ring, and the ring slots their parts still hold (one per borrowed descriptor; 0 once all are
    // freed).
    std::uint64_t rx_borrowed = 0;
    std::uint64_t rx_borrowed_out = 0;
    // memif server pre-owning the client's posted buffers (PortConfig::memif_pre_own): bytes taken for writing
    // ahead of a frame.
    std::uint64_t tx_pre_owned = 0;
};

// Fault injection in io (PortConfig::faults), per direction: what was done to frames.
struct FaultCounters {
    std::uint64_t dropped = 0, duplicated = 0, reordered = 0, delayed = 0, corrupted = 0;
};

// The TCP/IP stack (lwIP) between the port and the protocol.
struct StackCounters {
    std::uint64_t rx_frames = 0;
    std::uint64_t rx_chained = 0;   // of which arrived as a chain of mbufs (a frame larger than one RX mbuf; with
                                    // large frames each arrives whole in one, io::Port::kLargeRxFrame; borrowed
                                    // frames, chains by design, are not counted: PortCounters::rx_borrowed)
    std::uint64_t rx_dropped = 0;   // no RX buffer free, or the stack refused the frame
    std::uint64_t rx_unborrowed = 0;  // borrowed frames (PortCounters::rx_borrowed) copied before lwIP took them:
                                      // segments it would have kept (out of order), or not an established
                                      // connection's
    std::uint64_t tx_frames = 0;
    std::uint64_t tx_dropped = 0;   // lost: frame too large, or the link went down with frames queued
    std::uint64_t tx_deferred = 0;  // handed back to lwIP (no mbuf, or the TX queue stayed full): TCP keeps the
                                    // segment or ACK and sends it again on its next output (lost only if not TCP)
    std::uint64_t unsent_reordered = 0;  // a connection's send queue put back in sequence order after lwIP's
                                         // retransmission timeout misordered it (Stack::reorder_unsent)
    // Copies on the transmit path (TxCopyStats), counted over TCP payload:
    std::uint64_t tx_copied_in = 0;   // bytes lwIP copied out of the sender's buffer (TcpConnection::write)
    std::uint64_t tx_copied_out = 0;  // TCP payload copied into mbufs (frames not sent by reference to TX chunks)
    std::uint64_t tx_from_source = 0;  // TCP payload sent straight from the application's memory (deferred payload:
                                       // Stack::defer_fill), resends included
    std::uint64_t tx_fill_deferred = 0;  // payload bytes framed without their payload (left in the source)
    std::uint64_t tx_fill_copied = 0;    // of those, copied into their TX chunk later (stack::FillBook::settle: the
                                         // source's loan ended before the peer acknowledged them); the rest never were
};

// The dedicated RX thread (ThreadingMode::rx_thread).
struct RxThreadCounters {
    std::uint64_t frames = 0;              // frames handed to the application side (whole or headers only)
    std::uint64_t bytes_copied = 0;        // bytes the RX thread copied into slots
    std::uint64_t tcp_payload_copied = 0;  // of which TCP payload (whole frames copied)
    std::uint64_t tcp_payload_placed = 0;  // TCP payload placed by QPs' receive halves (no slot copy)
    std::uint64_t dropped = 0;             // oversize frames, bad checksums, held frames beyond the bound
    std::uint64_t out_of_order = 0;        // handed-over or watched segments after a gap (payload dropped)
    std::uint64_t stalled_turns = 0;       // turns without polling: no free slot
    std::uint64_t held = 0;                // mbufs held right now (frames of a flow being handed over, or
                                           // after a hole), not counters: back to 0 once flows are removed
    // The DPDK lcore the RX thread registered as (rte_thread_register: its own mempool caches), -1 if DPDK
    // gave it none (all RTE_MAX_LCORE ids taken, or multi-process in use): it then frees and allocates mbufs
    // through the pools' shared rings.
    std::int32_t lcore = -1;
    // Cycles of the loop turns that received frames (ContextConfig::layer_cycles; 0 when off): in the driver
    // (rx_burst: memif's copy out of its ring), in the QPs' receive halves (MPA deframing, DDP/RDMAP, the
    // placement copy), and the rest (classifying frames, checksums, copies into slots, freeing mbufs).
    std::uint64_t cycles_io = 0, cycles_place = 0, cycles_forward = 0;
};

namespace verbs {

class Context;

// Where the cycles of the data path went, by layer (ContextConfig::layer_cycles), since the Context opened.
//   io:        DPDK rx/tx burst calls (the driver, memif copies)
//   lwip:      lwIP input/output, timers, our netif glue (TX copy into mbufs)
//   mpa:       deframing, markers, framing and the gather copy on TX; the CRC on TX
//   ddp_rdmap: DDP/RDMAP receive (header checks, placement copy; with CRC on, the CRC fused into it) and TX
//   verbs:     post_send / post_recv, completions, CM and the rest of Context::poll()
// Those are the application thread's. In RX-thread mode the RX thread's turns that received frames are counted
// apart (`rx_*`, not in total(): the two threads run at once): rx_io its driver calls (memif's copy out of the
// ring), rx_place the QPs' receive halves it runs (MPA deframing, DDP/RDMAP, the placement copy), rx_forward
// the rest (classifying, checksums, copies into slots, mbuf frees). The application thread's io then has only
// the TX side, and its lwip the frames the RX thread handed over.
struct LayerCycles {
    std::uint64_t io = 0, lwip = 0, mpa = 0, ddp_rdmap = 0, verbs = 0;
    std::uint64_t rx_io = 0, rx_place = 0, rx_forward = 0;
    double cycles_per_ns = 1.0;
    std::uint64_t total() const noexcept { return io + lwip + mpa + ddp_rdmap + verbs; }
    std::uint64_t rx_total() const noexcept { return rx_io + rx_place + rx_forward; }
    // The difference (this - earlier): what one measured interval cost.
    LayerCycles since(const LayerCycles& earlier) const noexcept;
    // One line per layer: cycles and ns per message, share of the total.
    std::string table(std::uint64_t messages) const;
};

// Copies on the receive path, for the "one copy per payload byte" check. `payload_bytes`: DDP payload bytes
// placed into registered memory or posted receives. `copied_bytes`: bytes of received TCP payload moved by
// any copy on the way (the RX thread's frame copy, counted over TCP payload, and the placement copy).
struct RxCopyStats {
    std::uint64_t payload_bytes = 0;
    std::uint64_t copied_bytes = 0;
    double copies_per_payload_byte() const noexcept {
        return payload_bytes == 0 ? 0.0 : static_cast<double>(copied_bytes) / static_cast<double>(payload_bytes);
    }
};

// Copies on the transmit path, the counterpart of RxCopyStats. `payload_bytes`: DDP payload bytes framed for
// sending (SEND, WRITE, READ responses; retransmissions are TCP's and not framed again). `copied_bytes`: bytes
// moved by our copies between the source buffer and the driver: the gather copy that frames each FPDU (its
// payload), lwIP's copy of what it was handed by value and the copy into mbufs (both over TCP payload, so
// headers, CRCs and TCP retransmissions count too). Zero-copy transmit (a TX arena, segments of 8 KiB or more)
// leaves the gather copy alone: about 1. The driver's own copies (memif in copy mode, af_packet) are not ours
// and not counted, as on the receive side.
struct TxCopyStats {
    std::uint64_t payload_bytes = 0;
    std::uint64_t copied_bytes = 0;
    double copies_per_payload_byte() const noexcept {
        return payload_bytes == 0 ? 0.0 : static_cast<double>(copied_bytes) / static_cast<double>(payload_bytes);
    }
};

namespace diagnostics {
PortCounters port(const Context& ctx) noexcept;
StackCounters stack(const Context& ctx) noexcept;
// nullopt when running to completion.
std::optional<RxThreadCounters> rx_thread(const Context& ctx) noexcept;
RxCopyStats rx_copies(const Context& ctx) noexcept;
TxCopyStats tx_copies(const Context& ctx) noexcept;
// All zero unless ContextConfig::layer_cycles.
LayerCycles layer_cycles(const Context& ctx) noexcept;
// TCP connections not yet fully closed (a closing handshake still under way counts).
unsigned tcp_connections(const Context& ctx) noexcept;
// Whether the port runs memif's zero-copy client mode (PortConfig::memif_zero_copy and what allowed it).
bool memif_zero_copy(const Context& ctx) noexcept;
}  // namespace diagnostics

}  // namespace verbs
}  // namespace softrdma
