// SPDX-License-Identifier: MIT
// The receive half of a QP's stream (internal to verbs), the same in both threading modes: the MPA deframer, an
// rx-role rdmap::Endpoint and the one rdmap::Upper implementation for what the peer sends — tagged placement
// (WRITE, READ response), posted receives (own ring or SRQ), SEND with Invalidate, atomics' targets — plus this
// side's copy of each outstanding READ/atomic request's sink list. It reports everything the QP must act on
// through an RxEventSink, and never decides how events travel:
//   on the application thread (run to completion, and with an RX thread until the handover): the sink is the
//                      QP itself, which applies each event at once (CQ push, credits, answers);
//   on the RX thread:  the sink is an SPSC ring (RxEventRing) the application thread drains.
// The sink is switched at the handover and back when the RX thread lets go (set_sink), never per frame.
// The tx half sends it the requests it framed (READ/atomic, with their sinks) through an SPSC ring (requests())
// in both modes. Entry point: deliver() with the stream's bytes in order, cut anywhere (a TCP segment's payload,
// one receive upcall's pbufs; as a threading::FlowSink the RX thread calls it per frame).
// Memory: rings sized at construction; deframer and endpoint built by start() (control path); the data path
// allocates nothing.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <boost/lockfree/spsc_queue.hpp>

#include "mpa/deframer.hpp"
#include "mpa/negotiation.hpp"
#include "rdmap/endpoint.hpp"
#include "threading/rx_thread.hpp"
#include "verbs/memory.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::verbs::detail {

static_assert(kMaxSge == rdmap::kMaxSge, "the API's SGE limit is the endpoint's");

class MemoryTable;
class Srq;

// READ sink STags name a QP-local sink list (the READ WR's send slot), not a region: they are only ever looked
// up with Access::local_write, which RDMAP uses for READ responses to our own requests (it checks the response
// carries the STag of the oldest request), and MR STags only with remote rights: the two spaces may hold the
// same value without meeting.
inline constexpr std::uint32_t kReadSinkTag = 0xff000000u;
inline constexpr std::uint32_t kNoSlot = ~0u;

// Posted receives. Producer: post_recv (application thread); consumer: the receive half (this thread, or the
// RX thread after the handover), which alone touches `bound`. Sizing: max_recv_wr slots allocated at creation
// (none with an SRQ, whose WRs are taken at a message's first segment).
struct RecvQueue {
    RecvQueue(std::uint32_t depth, Srq* s) : ring(std::max<std::uint32_t>(depth, 1)), srq(s) {}
    boost::lockfree::spsc_queue<RecvSlot> ring;
    Srq* srq;
    RecvSlot bound{};
    bool has{false};
    bool gone{false};  // the bound receive's memory was deregistered under it: it completes with loc_prot_err
    rdmap::MemError begin(std::uint32_t msn, bool& srq_limit) noexcept;
    // Where the bound receive's bytes at `mo` go, after checking its regions are still registered (`gone`).
    rdmap::Mem place(const MemoryTable& mem, std::uint32_t msn, std::uint32_t mo, std::size_t len) noexcept;
    const RecvSlot* current(std::uint32_t msn) const noexcept;
    WorkCompletion complete(const rdmap::Completion& c, std::uint32_t qp_num) noexcept;
};

// A READ's sink list (or an atomic's 8-byte result SGE). The memory is the application's, registered and
// checked at post time; the receive half places into it until it reports the request done, each time after
// asking whether the regions' leases are still alive (a region deregistered before the response arrives
// fails the WR with loc_prot_err instead of being written).
struct SinkList {
    std::array<std::span<std::byte>, kMaxSge> sge{};
    std::array<Lease, kMaxSge> lease{};
    std::uint8_t n{0};
    std::span<const std::span<std::byte>> spans() const { return std::span(sge).first(n); }
};

// A READ/atomic request the tx endpoint framed, with its sink list (tx half -> receive half).
struct OrqMsg {
    rdmap::OrqEntry e{};
    SinkList sink{};
};

// What the receive half tells the QP.
struct RxEvent {
    enum class Kind : std::uint8_t { recv, request_done, inbound, terminate, first_bytes, srq_limit };
    Kind kind{Kind::recv};
    WorkCompletion wc{};          // recv
    std::uint64_t slot{0};        // request_done: the endpoint wr_id (send slot, or the RTR's)
    WcStatus status{WcStatus::success};  // request_done: completed, flushed, or its sink deregistered (loc_prot_err)
    // request_done: its response came (an ORD credit back); false when the stream's end flushed or killed it.
    bool answered{true};
    rdmap::IrqEntry irq{};        // inbound: answer it (tx half)
    TermCode code{};              // terminate
    std::uint32_t raw{0};         // terminate: the control word as on the wire
    TermCode cause{};             // terminate: what we found (sent ones; see TerminateInfo)
    bool received{false};         // terminate: received from the peer (else: to send, bytes below)
    // terminate, received: what the oldest send WR it kills completes with (wr_flush_err: a request flushed by
    // the receive half already took the cause, or there is none).
    WcStatus first_status{WcStatus::wr_flush_err};
    std::uint8_t term_len{0};
    std::array<std::byte, rdmap::kTerminateLen + 2 + rdmap::kMaxHeaderLen> term{};
};

// What a TERMINATE says, for the application: the async event it raises (qp_access_err for an access to
// memory: also what SecurityConfig counts against a probing peer), and (received) the status of the oldest
// send WR it kills (see WcStatus). `raw` lets a Linux siw x86 peer's swapped layout be read as meant.
struct TermEffect {
    AsyncEventType async;
    WcStatus status;
};
TermEffect term_effect(TermCode c, std::uint32_t raw) noexcept;

class RxEventSink {
public:
    virtual void emit(const RxEvent& e) noexcept = 0;

protected:
    ~RxEventSink() = default;
};

class RxHalf final : public rdmap::Upper, public threading::FlowSink {
public:
    // `send_slots`: the QP's max_send_wr (READ sink STags name one of them).
    RxHalf(MemoryTable& mem, std::uint32_t pd, std::uint32_t qp_num, RecvQueue& rq, std::uint32_t send_slots);

    // A new stream (RDMA mode, control path): deframer and rx endpoint from the agreement; events go to `sink`.
    // `placed` counts payload bytes placed (copy accounting); `cycles` (may be null) the endpoint's RX work.
    void start(const mpa::Agreed& agreed, const rdmap::Config& cfg, RxEventSink& sink,
               std::atomic<std::uint64_t>& placed, std::uint64_t* cycles);
    bool started() const noexcept { return ep_.has_value(); }
    // Where events go from now: the sink of the thread that runs this half next (control path; the RX thread
    // does not run it at the time: before go(), or after remove()).
    void set_sink(RxEventSink& sink) noexcept { sink_ = &sink; }
    // Requests the tx half framed, in order (tx half -> here, SPSC: one per send slot + the RTR).
    boost::lockfree::spsc_queue<OrqMsg>& requests() noexcept { return orq_; }

    // The stream's bytes, in order, borrowed for the call: the one copy (placement) happens here.
    void deliver(std::span<const std::byte> bytes) noexcept;
    // threading::FlowSink: one frame's payload.
    void rx_payload(std::span<const std::byte> bytes) noexcept override { deliver(bytes); }
    // The stream ended without a protocol error (a FIN, a reset, the QP to ERR): outstanding requests come back
    // as flushed events, no TERMINATE is built.
    void stop() noexcept;

private:
    // rdmap::Upper (rx role): the one place where inbound accesses are checked and placed.
    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access access) override;
    rdmap::MemError recv_begin(std::uint32_t msn) override;
    rdmap::Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override;
    rdmap::MemError invalidate(std::uint32_t stag) override;
    void on_completion(const rdmap::Completion& c) override;
    void on_terminate(const rdmap::TermReport& t) override;
    void on_inbound_request(const rdmap::IrqEntry& r) override;

    MemoryTable& mem_;
    std::uint32_t pd_;
    std::uint32_t qp_num_;
    RecvQueue& rq_;
    RxEventSink* sink_{nullptr};
    std::atomic<std::uint64_t>* placed_{nullptr};
    boost::lockfree::spsc_queue<OrqMsg> orq_;  // <- tx half; max_send_wr + 1 (the RTR)
    std::vector<SinkList> sinks_;              // by send slot: this side's copy of each outstanding request's sinks
    std::optional<mpa::Deframer<rdmap::Endpoint>> deframer_;
    std::optional<rdmap::Endpoint> ep_;
    std::uint64_t gone_slot_{~std::uint64_t{0}};  // the request whose sink lost its registration (loc_prot_err)
    bool first_{true};  // the stream's first bytes are still to come (first_bytes event)
    RxEvent term_{};    // on_terminate's event, emitted when the endpoint call returns
    bool term_pending_{false};
    // A received TERMINATE's status for the first request it flushes (on_terminate, before the flush).
    std::optional<WcStatus> first_status_;
};

// The sink with an RX thread: an SPSC ring the application thread drains (RX thread -> application thread), and
// a doorbell rung once per batch so the application thread knows which QP has events.
class RxEventRing final : public RxEventSink {
public:
    // Sizing rule: every event is bounded by a resource — one per posted receive (`recv_depth`, the SRQ's
    // depth when shared), one per outbound request (at most max_send_wr + the RTR), one per inbound request (IRD,
    // at most 255 by MPA), and a few singles (terminate, first bytes, limit); doubled for the flushes at detach.
    // A push that still fails is counted in lost().
    RxEventRing(std::uint32_t recv_depth, std::uint32_t send_depth)
        : events_(2 * (std::size_t{recv_depth} + send_depth + 1 + 256) + 8) {}
    // On the RX thread: events ring `doorbell` with `flow` once until drain() (SPSC: the RX thread only).
    void ring_on(boost::lockfree::spsc_queue<std::uint16_t>* doorbell, int flow) noexcept {
        doorbell_ = doorbell;
        flow_ = flow;
    }
    void emit(const RxEvent& e) noexcept override;
    // Application thread: every queued event to `apply`, in order.
    template <class F>
    void drain(F&& apply) noexcept {
        rung_.store(false, std::memory_order_seq_cst);  // before draining: an event pushed now rings again
        RxEvent e;
        while (events_.pop(e)) apply(e);
    }
    bool pending() const noexcept { return events_.read_available() != 0; }
    std::uint64_t lost() const noexcept { return lost_.load(std::memory_order_relaxed); }

private:
    boost::lockfree::spsc_queue<RxEvent> events_;
    boost::lockfree::spsc_queue<std::uint16_t>* doorbell_{nullptr};
    int flow_{-1};
    std::atomic<bool> rung_{false};
    std::atomic<std::uint64_t> lost_{0};
};

}  // namespace softrdma::verbs::detail
