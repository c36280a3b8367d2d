// SPDX-License-Identifier: MIT
// softrdma verbs: the API applications link. A verbs-like C++20 surface over the protocol core (mpa, ddp,
// rdmap) and the packet path (io + stack), with names libibverbs/librdmacm users know:
//
//   auto ctx = verbs::Context::open(cfg);            // one per process: DPDK port + lwIP stack
//   auto pd  = ctx->alloc_pd();
//   auto mr  = pd->reg_mr(buffer, access::local_write | access::remote_write);
//   auto cq  = ctx->create_cq(256);
//   auto qp  = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get()});
//   qp->post_recv(...);                              // receives may be posted before the connection
//   auto id  = ctx->connect(peer, port, *qp, param); // CM events: ctx->get_cm_event()
//   qp->post_send(...);  ctx->poll();  cq->poll(wcs);
//
// Threading (this slice): run-to-completion. The thread that opened the Context owns everything and calls
// every function here; Context::poll() runs one turn: RX (DPDK -> lwIP -> MPA deframer -> RDMAP), CM timers,
// TX of every QP that has work. RX-side work for a QP is one call (QueuePair::rx_bytes) so that a later
// dedicated RX thread can run it apart from TX.
//
// Errors: control path (open, reg_mr, create_*, listen, connect) throws verbs::Error; data path (post_send,
// post_recv, poll) returns values and never allocates, locks or logs. CM events are logged (spdlog debug).
//
// Lifetimes: every object a Context made (PDs, MRs, CQs, SRQs, QPs, CM ids, listeners) must be destroyed
// before the Context; a QP must outlive the CQs' and SRQ's users, i.e. destroy QPs before their CQs/SRQ and
// MRs only after no posted WR uses them. Destroying a connected QP or CmId aborts the connection (RST).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/port.hpp"
#include "mpa/negotiation.hpp"
#include "base/term_code.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"
#include "stack/stack.hpp"
#include "threading/config.hpp"
#include "threading/rx_thread.hpp"

#include <boost/lockfree/queue.hpp>
#include <boost/lockfree/spsc_queue.hpp>

namespace softrdma::stack {
class TcpConnection;
class TcpListener;
}  // namespace softrdma::stack

namespace softrdma::verbs {

class Error : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Context;
class ProtectionDomain;
class MemoryRegion;
class CompletionQueue;
class QueuePair;
class CmId;
class CmListener;

// ---- memory ------------------------------------------------------------------------------------------------
// Access rights of a memory region (IBV_ACCESS_*). Local read is always allowed.
namespace access {
inline constexpr std::uint32_t local_write = 1u << 0;
inline constexpr std::uint32_t remote_write = 1u << 1;
inline constexpr std::uint32_t remote_read = 1u << 2;
inline constexpr std::uint32_t remote_atomic = 1u << 3;
// The peer may invalidate this region's STag with SEND with Invalidate (RFC 5040 section 5.3). RNICs allow
// that for memory windows and fast-registered regions, never for regions registered like ibv_reg_mr: without
// this right a SEND with Invalidate naming the region ends the stream (TERMINATE "cannot invalidate") and the
// region stays valid. Needs a remote right too (an STag the peer was never meant to use is not its to revoke).
inline constexpr std::uint32_t remote_invalidate = 1u << 4;
}  // namespace access

// A scatter/gather element (ibv_sge): `addr` is a virtual address inside the region of `lkey`.
struct Sge {
    std::uint64_t addr{0};
    std::uint32_t length{0};
    std::uint32_t lkey{0};
};

// ---- work requests -----------------------------------------------------------------------------------------
enum class WrOpcode : std::uint8_t {
    send,
    send_with_imm,
    send_with_inv,
    rdma_write,
    rdma_write_with_imm,
    rdma_read,
    atomic_fetch_and_add,
    atomic_cmp_and_swp,
};

namespace send_flags {
inline constexpr std::uint32_t signaled = 1u << 0;   // IBV_SEND_SIGNALED
inline constexpr std::uint32_t solicited = 1u << 1;  // IBV_SEND_SOLICITED: SEND_SE (and SEND_SE_INV)
inline constexpr std::uint32_t inline_data = 1u << 2;  // IBV_SEND_INLINE: payload copied at post time
}  // namespace send_flags

// ibv_send_wr without the `next` link: post_send takes a span of these.
struct SendWr {
    std::uint64_t wr_id{0};
    WrOpcode opcode{WrOpcode::send};
    std::uint32_t send_flags{0};
    std::span<const Sge> sg_list{};  // send/write: gather list; read: sink list (local_write); atomics: one
                                     // 8-byte entry (local_write) that receives the original remote value
    std::uint64_t imm_data{0};       // *_with_imm: RFC 7306 Immediate Data is 8 bytes on the wire
    std::uint32_t invalidate_rkey{0};  // send_with_inv
    struct {
        std::uint64_t remote_addr{0};
        std::uint32_t rkey{0};
    } rdma{};
    struct {
        std::uint64_t remote_addr{0};  // 8-byte aligned
        std::uint64_t compare_add{0};  // fetch_and_add: addend; cmp_and_swp: compare value
        std::uint64_t swap{0};
        std::uint32_t rkey{0};
    } atomic{};
};

struct RecvWr {
    std::uint64_t wr_id{0};
    std::span<const Sge> sg_list{};  // every entry needs local_write
};

// Why a post was refused. The WRs before `bad_wr` were posted; `bad_wr` and the ones after were not.
enum class PostErrc : std::uint8_t {
    none,
    invalid_state,   // send: QP not in RTS; recv: QP in RESET
    queue_full,      // max_send_wr / max_recv_wr outstanding
    too_many_sge,    // more than max_send_sge / max_recv_sge
    bad_lkey,        // an SGE's lkey is unknown, stale, invalidated, of another PD, lacks local_write, or the
                     // SGE is outside the region (IBV_WC_LOC_PROT_ERR, refused at post time)
    bad_length,      // inline payload above max_inline_data; atomic sink not 8 bytes; READ above 4 GiB
    invalid_opcode,  // an opcode this QP cannot do (atomic/READ without ORD)
    not_agreed,      // immediate data or an atomic on a connection that did not agree to RFC 7306
                     // (ConnParam::rfc7306 on both ends); nothing was sent
};
const char* to_string(PostErrc e) noexcept;

template <class Wr>
struct PostResult {
    PostErrc err{PostErrc::none};
    const Wr* bad_wr{nullptr};
    bool ok() const noexcept { return err == PostErrc::none; }
};

// ---- completions -------------------------------------------------------------------------------------------
enum class WcStatus : std::uint8_t { success, wr_flush_err, loc_prot_err, fatal_err };
enum class WcOpcode : std::uint8_t { send, rdma_write, rdma_read, comp_swap, fetch_add, recv, recv_rdma_with_imm };
const char* to_string(WcStatus s) noexcept;

namespace wc_flags {
inline constexpr std::uint32_t with_imm = 1u << 0;
inline constexpr std::uint32_t with_inv = 1u << 1;
inline constexpr std::uint32_t solicited = 1u << 2;
}  // namespace wc_flags

// ibv_wc. RFC 7306 on the wire, verbs at the receiver (both ends agreed: ConnParam::rfc7306):
//   SEND_WITH_IMM  -> a SEND, then an Immediate Data message (SE on it when solicited), framed into one TCP
//                     segment. The receiver completes them as ONE receive, as verbs applications expect:
//                     opcode recv, byte_len = the SEND's bytes, wc_flags with_imm, imm_data. One receive WR
//                     is consumed. (Fallback: were the two split across deliveries by something resegmenting
//                     the stream, the Immediate Data completes a second receive as recv_rdma_with_imm.)
//   WRITE_WITH_IMM -> an RDMA WRITE, then an Immediate Data message that consumes one receive WR and completes
//                     as recv_rdma_with_imm, byte_len 0, with_imm, imm_data (the WRITE's bytes are in place
//                     before it: DDP places in order). As IBV_WC_RECV_RDMA_WITH_IMM, except that byte_len is
//                     0, not the WRITE's length (RFC 7306 does not carry it).
//   atomics        -> Atomic Request / Response (RFC 7306 section 3), on the requester's send CQ only.
// imm_data holds all 8 bytes of RFC 7306's Immediate Data (verbs' 32-bit imm_data is its low half).
struct WorkCompletion {
    std::uint64_t wr_id{0};
    WcStatus status{WcStatus::success};
    WcOpcode opcode{WcOpcode::send};
    std::uint32_t byte_len{0};
    std::uint32_t wc_flags{0};
    std::uint64_t imm_data{0};
    std::uint32_t invalidated_rkey{0};
    std::uint32_t qp_num{0};
};

// A bounded ring of completions, allocated at creation. Sizing rule: at least the sum of max_send_wr +
// max_recv_wr of the QPs that use it (each outstanding WR yields at most one entry); an entry that finds the
// ring full is dropped and counted in overruns() (the CQ overrun error of verbs).
class CompletionQueue {
public:
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue&) = delete;
    CompletionQueue& operator=(const CompletionQueue&) = delete;

    // Moves up to out.size() completions, oldest first; returns the count. Does not poll the network: call
    // Context::poll() (run-to-completion).
    std::size_t poll(std::span<WorkCompletion> out) noexcept;
    std::size_t size() const noexcept { return count_; }
    std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(ring_.size()); }
    std::uint64_t overruns() const noexcept { return overruns_; }

    // Notification (ibv_req_notify_cq / ibv_get_cq_event). req_notify() asks for one event: at the next
    // completion, or with solicited_only at the next receive completion of a solicited message (SEND_SE,
    // Immediate Data with SE) or any completion with an error status. The event makes fd() (an eventfd)
    // readable; get_event() consumes it. Arm again after each event. In run-to-completion mode completions
    // only appear inside Context::poll(), so the fd says "that turn produced what you asked for"; with the
    // RX thread (next) it becomes the place to sleep.
    void req_notify(bool solicited_only) noexcept;
    int fd() const noexcept { return efd_; }
    // True if an event was pending (non-blocking read of the eventfd).
    bool get_event() noexcept;

private:
    friend class Context;
    friend class QueuePair;
    explicit CompletionQueue(std::uint32_t cqe);
    void push(const WorkCompletion& wc) noexcept;
    enum class Arm : std::uint8_t { none, next, solicited };
    Arm armed_{Arm::none};
    int efd_{-1};
    std::vector<WorkCompletion> ring_;
    std::size_t head_{0};
    std::size_t count_{0};
    std::uint64_t overruns_{0};
};

// ---- memory regions ----------------------------------------------------------------------------------------
// STag = tag << 8 | key (RFC 5040's STag Index and STag Key). `tag` is 24 bits: the table slot + 1 in its low
// bits (enough for max_mr) and random bits above them; `key` is random too. Every registration draws fresh
// random bits (getrandom), so an STag says nothing about any other: with the default 4096-entry table 20 of
// its 32 bits are random (RFC 5042 section 5: STags hard to guess). rekey() replaces the key, and the old STag
// is then refused. Tag 0 is never used, so STags below 256 (STag 1: the RTR's) name no region.
class MemoryRegion {
public:
    ~MemoryRegion();
    MemoryRegion(const MemoryRegion&) = delete;
    MemoryRegion& operator=(const MemoryRegion&) = delete;

    std::uint32_t lkey() const noexcept { return stag_; }
    std::uint32_t rkey() const noexcept { return stag_; }
    std::uint64_t addr() const noexcept { return reinterpret_cast<std::uint64_t>(bytes_.data()); }
    std::size_t length() const noexcept { return bytes_.size(); }
    std::uint32_t access() const noexcept { return access_; }
    std::span<std::byte> bytes() const noexcept { return bytes_; }
    // An SGE for [offset, offset + len) of this region.
    Sge sge(std::size_t offset, std::uint32_t len) const noexcept { return {addr() + offset, len, stag_}; }
    // Local invalidate: the STag is refused until rekey().
    void invalidate() noexcept;
    bool valid() const noexcept;
    // Makes the region valid again under a new key (low byte); returns the new STag.
    std::uint32_t rekey(std::uint8_t key) noexcept;

private:
    friend class ProtectionDomain;
    MemoryRegion(Context& ctx, std::uint32_t index, std::uint32_t stag, std::span<std::byte> bytes, std::uint32_t acc)
        : ctx_(ctx), index_(index), stag_(stag), bytes_(bytes), access_(acc) {}
    Context& ctx_;
    std::uint32_t index_;
    std::uint32_t stag_;
    std::span<std::byte> bytes_;
    std::uint32_t access_;
};

// A posted receive, checked at post time (local_write, PD, bounds): its SGEs as spans.
struct RecvSlot {
    std::uint64_t wr_id{0};
    std::array<std::span<std::byte>, rdmap::kMaxSge> sge{};
    std::uint8_t nsge{0};
    std::uint32_t total{0};
    bool bound{false};
    std::uint32_t msn{0};
};

// ---- shared receive queue ----------------------------------------------------------------------------------
struct SrqInitAttr {
    std::uint32_t max_wr{256};
    std::uint32_t max_sge{rdmap::kMaxSge};
    std::uint32_t srq_limit{0};  // armed limit (0 = not armed)
};

// Receives shared by several QPs of one PD (ibv_srq). An inbound message takes the oldest WR when its first
// segment arrives; from then the WR belongs to that QP (flushed with it if the QP fails; the WRs still in
// the SRQ are not). Limit event (IBV_EVENT_SRQ_LIMIT_REACHED): once armed with a limit, the first time fewer
// than `limit` WRs remain posted an srq_limit_reached async event is queued on the Context and the limit
// disarms. Sizing: max_wr slots, allocated at creation.
class SharedReceiveQueue {
public:
    SharedReceiveQueue(const SharedReceiveQueue&) = delete;
    SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;
    PostResult<RecvWr> post_recv(std::span<const RecvWr> wrs) noexcept;
    void arm_limit(std::uint32_t limit) noexcept { limit_.store(limit, std::memory_order_relaxed); }
    std::uint32_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
    std::size_t posted() const noexcept { return count_.load(std::memory_order_relaxed); }

private:
    friend class ProtectionDomain;
    friend class QueuePair;
    SharedReceiveQueue(Context& ctx, ProtectionDomain& pd, const SrqInitAttr& attr);
    // The oldest WR; `limit_reached` true when this take crossed the armed limit (the caller queues the event).
    bool take(RecvSlot& out, bool& limit_reached) noexcept;

    Context& ctx_;
    ProtectionDomain& pd_;
    std::uint32_t max_sge_;
    std::uint32_t max_wr_;
    std::atomic<std::uint32_t> limit_;
    // Posted by the application thread, taken by whichever thread runs each QP's receive side (with an RX
    // thread: that thread, or the application thread before a QP's handover): a bounded lock-free MPMC
    // queue, max_wr nodes allocated at creation.
    boost::lockfree::queue<RecvSlot, boost::lockfree::fixed_sized<true>> ring_;
    std::atomic<std::uint32_t> count_{0};
};

enum class AsyncEventType : std::uint8_t { srq_limit_reached };
struct AsyncEvent {
    AsyncEventType type{AsyncEventType::srq_limit_reached};
    SharedReceiveQueue* srq{nullptr};
};

// ---- queue pairs -------------------------------------------------------------------------------------------
// Verbs states and the iWARP QP states they stand for (RFC 5040 section 6 has none of its own; siw's map):
//   reset, init -> IDLE (receives may be posted in init); rtr -> the CM is running MPA negotiation;
//   rts -> RTS (RDMA mode, the stream belongs to the QP); sqd -> CLOSING (orderly disconnect started);
//   sqe -> not used by iWARP (no send-queue-only error); err -> TERMINATE / ERROR (all WRs flushed).
enum class QpState : std::uint8_t { reset, init, rtr, rts, sqd, sqe, err };
const char* to_string(QpState s) noexcept;

struct QpCap {
    std::uint32_t max_send_wr{64};   // outstanding send WRs (queued + READ/atomic awaiting their response)
    std::uint32_t max_recv_wr{64};
    std::uint32_t max_send_sge{rdmap::kMaxSge};
    std::uint32_t max_recv_sge{rdmap::kMaxSge};
    std::uint32_t max_inline_data{64};
};

struct QpInitAttr {
    CompletionQueue* send_cq{nullptr};
    CompletionQueue* recv_cq{nullptr};
    QpCap cap{};
    bool sq_sig_all{false};
    SharedReceiveQueue* srq{nullptr};  // receives from this SRQ (same PD); post_recv on the QP is then refused
};

// What ended the stream: a TERMINATE we sent (received == false) or received. `raw` is its 32-bit control word
// as on the wire: `code` reads it by RFC 5040; a Linux siw peer (x86) lays the fields out swapped, so its
// "LLP/MPA 0x01" reads here as layer 0 type 2 (describe() shows both readings).
// `cause`: for a TERMINATE we sent, what we found, when SecurityConfig::opaque_access_errors hid it from the
// peer behind "invalid STag" (equal to `code` otherwise).
struct TerminateInfo {
    TermCode code{};
    bool received{false};
    std::uint32_t raw{0};
    TermCode cause{};
    std::string describe() const;
};

class QueuePair final : private rdmap::Upper {
public:
    ~QueuePair() override;
    QueuePair(const QueuePair&) = delete;
    QueuePair& operator=(const QueuePair&) = delete;

    // Posts in order; stops at the first WR it refuses (bad_wr). No allocation; copies the WR.
    PostResult<SendWr> post_send(std::span<const SendWr> wrs) noexcept;
    PostResult<RecvWr> post_recv(std::span<const RecvWr> wrs) noexcept;

    // reset -> init, and any state -> err (flushes every outstanding WR; a connected QP also ends its
    // stream: use CmId::disconnect() for an orderly end). rtr/rts/sqd are entered by the connection manager.
    bool modify_state(QpState s) noexcept;
    QpState state() const noexcept { return state_; }
    std::uint32_t qp_num() const noexcept { return qp_num_; }
    const std::optional<TerminateInfo>& terminate_info() const noexcept { return term_; }
    const QpCap& cap() const noexcept { return cap_; }
    ProtectionDomain& pd() noexcept { return pd_; }

private:
    friend class ProtectionDomain;
    friend class Context;
    friend class CmId;
    QueuePair(Context& ctx, ProtectionDomain& pd, const QpInitAttr& attr, std::uint32_t qp_num);
    PostResult<SendWr> post_send_inner(std::span<const SendWr> wrs) noexcept;
    PostResult<RecvWr> post_recv_inner(std::span<const RecvWr> wrs) noexcept;

    // rdmap::Upper: the one place where PD, access, bounds and key are checked for the stream.
    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access access) override;
    rdmap::MemError recv_begin(std::uint32_t msn) override;
    rdmap::Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override;
    rdmap::MemError invalidate(std::uint32_t stag) override;
    void on_completion(const rdmap::Completion& c) override;
    void on_terminate(const rdmap::TermReport& t) override;

    // ---- stream (called by the CM) ----
    // RDMA mode reached: builds the FPDU engines and the endpoint from the agreement (control path: allocates).
    // `hold_first`: the initiator sends nothing until release_first_fpdu() (FirstFpduGuard::Mode::hold).
    void enter_rts(CmId& conn, const mpa::Agreed& agreed, std::uint32_t emss, bool initiator, bool rfc7306,
                   bool hold_first);
    // The first-FPDU guard's tools (the CM decides when): a zero-length RDMA WRITE to STag 1 behind whatever
    // is queued (no completion; false if the send queue is full or the stream is not in RTS), and the end
    // of a hold.
    bool post_nudge() noexcept;
    void release_first_fpdu() noexcept;
    // Stream bytes handed to TCP so far, and whether the peer's first FPDU byte has arrived (then: the count
    // at that moment). The CM reads them to see whether the peer's receive path is live.
    std::uint64_t tx_written() const noexcept { return tx_written_; }
    bool peer_spoke() const noexcept { return rx_started_; }
    std::uint64_t tx_written_when_peer_spoke() const noexcept { return tx_at_rx_start_; }
    // RX: bytes of the TCP stream in RDMA mode, in order, borrowed for the call. RX-side work only (deframe,
    // place, complete); TX it causes is scheduled, not done here.
    void rx_bytes(std::span<const std::byte> bytes) noexcept;
    // The end of one delivery (a TCP receive upcall's bytes, given to rx_bytes piece by piece).
    void rx_end() noexcept;
    // TX: moves whole FPDUs from the endpoint to TCP while TCP takes them.
    void tx_pump() noexcept;
    // The TCP connection ended (peer FIN, reset, local close): flush everything; no TERMINATE is sent.
    void stream_lost() noexcept;
    void detach_conn() noexcept { conn_ = nullptr; }
    void schedule_tx() noexcept;
    // Nothing framed or ready to frame (the send queue reached TCP, or only ORD-blocked requests remain).
    bool tx_idle() const noexcept { return tx_len_ == 0 && (!ep_ || !ep_->tx_ready()); }
    void enter_error() noexcept;
    void flush_rq() noexcept;
    void flush_sq_unstarted() noexcept;
    std::uint32_t alloc_slot() noexcept;
    PostErrc check_sge(const Sge& s, bool need_write, std::span<std::byte>& out) const noexcept;
    void complete_send(std::uint32_t slot, WcStatus st) noexcept;
    void free_slot(std::uint32_t slot) noexcept;

    // A send WR from post to completion; the endpoint's wr_id is the slot index.
    struct SqSlot {
        std::uint64_t wr_id{0};
        WcOpcode opcode{WcOpcode::send};
        bool signaled{false};
        std::uint32_t byte_len{0};
        std::array<std::span<std::byte>, rdmap::kMaxSge> sink{};  // READ sink list / atomic result
        std::uint8_t nsink{0};
        std::uint32_t next_free{0};
    };

    Context& ctx_;
    ProtectionDomain& pd_;
    CompletionQueue* send_cq_;
    CompletionQueue* recv_cq_;
    QpCap cap_;
    bool sig_all_;
    std::uint32_t qp_num_;
    QpState state_{QpState::reset};
    std::optional<TerminateInfo> term_;
    CmId* conn_{nullptr};

    // Sizing: one SqSlot per max_send_wr (every outstanding send WR holds one until its completion), a free
    // list through next_free; inline payload max_inline_data bytes per slot.
    std::vector<SqSlot> sq_;
    std::uint32_t sq_free_{0};
    std::uint32_t sq_used_{0};
    std::vector<std::byte> inline_buf_;
    // The receive side: posted receives (own ring, or the SRQ) and the one bound to the inbound message in
    // progress (RDMAP keeps at most one untagged message in progress). Producer: post_recv (application
    // thread); consumer: whoever runs the stream's receive path (this thread, or the RX thread after the
    // handover), which alone touches `bound`. Sizing: max_recv_wr slots allocated at creation.
    struct RecvQueue {
        RecvQueue(std::uint32_t depth, SharedReceiveQueue* s) : ring(std::max<std::uint32_t>(depth, 1)), srq(s) {}
        boost::lockfree::spsc_queue<RecvSlot> ring;
        SharedReceiveQueue* srq;
        RecvSlot bound{};
        bool has{false};
        rdmap::MemError begin(std::uint32_t msn, bool& srq_limit) noexcept;
        rdmap::Mem place(std::uint32_t msn, std::uint32_t mo, std::size_t len) const noexcept;
        const RecvSlot* current(std::uint32_t msn) const noexcept;
        WorkCompletion complete(const rdmap::Completion& c, std::uint32_t qp_num) noexcept;
    };
    RecvQueue recv_;
    SharedReceiveQueue* srq_{nullptr};

    // ---- with the RX thread (threading::Mode::rx_thread) ----
    // The stream's receive half (deframer + an rx-role endpoint) that the RX thread runs after the handover;
    // it talks to this QP through SPSC rings only (qp.cpp).
    struct RxSide;
    std::unique_ptr<RxSide> rxs_;
    int flow_{-1};               // the Context's flow id of this QP's connection, while the RX thread follows it
    bool handed_over_{false};    // the RX thread places this stream: lwIP's bytes for it are stand-ins
    std::atomic<std::uint32_t> answered_{0};  // inbound requests answered (tx endpoint -> rx endpoint)
    void on_request_sent(const rdmap::OrqEntry& e) override;
    void watch_stream(stack::TcpConnection& conn) noexcept;
    void on_marker() noexcept;
    void on_gap() noexcept;
    void drain_rx_events() noexcept;
    bool rx_events_pending() const noexcept;  // cheap (one load): events queued by the receive half
    void detach_rx() noexcept;

    // Stream (RDMA mode), built by enter_rts.
    std::optional<mpa::FpduTx> fpdu_tx_;
    std::optional<rdmap::FpduFramer> framer_;
    std::optional<mpa::Deframer<rdmap::Endpoint>> deframer_;
    std::optional<rdmap::Endpoint> ep_;
    // TX staging: whole FPDUs the endpoint wrote, not yet taken by TCP. Sizing: one EMSS, so one batch of
    // FPDUs fills at most one TCP segment.
    std::vector<std::byte> tx_buf_;
    std::size_t tx_off_{0};
    std::size_t tx_len_{0};
    bool tx_gate_{false};       // responder: no FPDU before the initiator's first FPDU (RFC 5044 s7.1.2);
                                // initiator: held by the CM (FirstFpduGuard::Mode::hold)
    std::uint64_t tx_written_{0};
    bool rx_started_{false};
    std::uint64_t tx_at_rx_start_{0};
    void note_rx_start() noexcept;
    bool in_tx_list_{false};    // in the Context's list of QPs with TX work
    bool closing_{false};       // teardown in progress: an endpoint error now is not a protocol error
};

// ---- protection domain -------------------------------------------------------------------------------------
class ProtectionDomain {
public:
    ~ProtectionDomain() = default;
    ProtectionDomain(const ProtectionDomain&) = delete;
    ProtectionDomain& operator=(const ProtectionDomain&) = delete;

    // Registers caller memory (it must outlive the region). Throws Error when the MR table is full.
    std::unique_ptr<MemoryRegion> reg_mr(std::span<std::byte> bytes, std::uint32_t access_flags);
    // Throws Error on a bad attribute (no CQ, zero depth, more SGEs than rdmap::kMaxSge, too many QPs).
    std::unique_ptr<QueuePair> create_qp(const QpInitAttr& attr);
    // Throws Error on zero depth or more SGEs than rdmap::kMaxSge.
    std::unique_ptr<SharedReceiveQueue> create_srq(const SrqInitAttr& attr);
    Context& context() noexcept { return ctx_; }
    std::uint32_t handle() const noexcept { return handle_; }

private:
    friend class Context;
    ProtectionDomain(Context& ctx, std::uint32_t handle) : ctx_(ctx), handle_(handle) {}
    Context& ctx_;
    std::uint32_t handle_;
};

// ---- connection manager ------------------------------------------------------------------------------------
// The initiator's first FPDU against a responder that is not ready for it (see verbs/cm.cpp, "The accept
// window"): Linux siw sends its MPA reply and only then attaches its RDMA receive path; bytes arriving in
// between sit unread until another TCP segment arrives, and both ends wait forever.
struct FirstFpduGuard {
    enum class Mode : std::uint8_t {
        nudge,  // send the first FPDU at once; if the stream then goes quiet, follow it with zero-length RDMA
                // WRITEs (STag 1: placed nowhere, no completion, accepted by siw and by softrdma) `delay`, 10x
                // and 100x ... later, `nudges` in all. Costs a softrdma or RNIC peer nothing but a few bytes.
        hold,   // hold the first FPDU back `delay` (siw needed ~200 ms under emulation): every connection pays it
        off,    // send at once, nothing after (a responder with no accept window, e.g. softrdma or an RNIC)
    };
    Mode mode{Mode::nudge};
    std::chrono::milliseconds delay{2};
    std::uint8_t nudges{4};  // nudge: 2, 20, 200, 2000 ms after the first FPDU by default
};

// rdma_conn_param: private data and IRD/ORD, plus the MPA and iWARP choices.
struct ConnParam {
    std::span<const std::byte> private_data{};  // at most 252 bytes (MPA revision 2)
    std::uint16_t responder_resources{16};  // IRD: inbound READ/atomic requests we answer at once
    std::uint16_t initiator_depth{16};      // ORD: outbound READ/atomic requests outstanding
    // RFC 6581 peer-to-peer mode. Initiator: ask for it, offering `rtr` (the responder picks one; we send that
    // RTR before anything else). Listener defaults: the RTR types accepted (a P2P request is always answered).
    bool peer_to_peer{false};
    mpa::RtrSet rtr{.write = true, .read = true, .send = false};
    mpa::CrcPolicy crc{mpa::CrcPolicy::off};
    // MPA markers (RFC 5044 section 5). `markers_rx`: ask for them on what we receive; `markers_tx`: agree to
    // put them on what we send when the peer asks. Off by default, as Linux siw: a request or reply asking
    // for markers is then refused (MPA reject / failure), not silently obeyed.
    bool markers_rx{false};
    bool markers_tx{false};
    // MPA revision the initiator offers: 2 (RFC 6581, IRD/ORD and peer-to-peer; what siw and Chelsio send)
    // or 1 (RFC 5044, for old peers). A responder answers revisions 0-2 with the request's revision.
    std::uint8_t mpa_revision{2};
    // RFC 7306 (immediate data, atomics) on this connection. RFC 7306 leaves the agreement to the application
    // (nothing in MPA carries it): set it on both ends (connect and accept). Off, posting SEND/WRITE with
    // immediate data or an atomic fails with PostErrc::not_agreed and nothing is sent, and a peer's RFC 7306
    // message ends the stream with TERMINATE "unexpected opcode", as Linux siw and Chelsio answer them.
    bool rfc7306{false};
    // connect: the first FPDU against a responder's accept window (see FirstFpduGuard).
    FirstFpduGuard first_fpdu{};
    // connect: how long to wait for the MPA reply (siw: 10 s); listen defaults: for the request (siw: 5 s).
    std::chrono::milliseconds mpa_timeout{0};  // 0 = those defaults
};

enum class CmEventType : std::uint8_t {
    connect_request,  // on a listener: `request` holds the new id; accept() or reject() it
    established,      // RDMA mode: the QP is in RTS
    rejected,         // the peer rejected; private_data is the peer's
    unreachable,      // TCP connect refused or timed out, or no MPA reply in time
    disconnected,     // the stream ended (peer or local close, TERMINATE sent or received); QP in err
    error,            // MPA negotiation failed (protocol, policy, IRD, RTR); `reason` says which
};
const char* to_string(CmEventType t) noexcept;

// One event, owned by the application once taken. Control path (allocates).
struct CmEvent {
    CmEventType type{CmEventType::error};
    CmId* id{nullptr};                  // the connection the event is about (connect_request: request.get())
    CmListener* listener{nullptr};      // connect_request: the listener
    std::unique_ptr<CmId> request;      // connect_request only
    mpa::PrivateData private_data{};    // connect_request, established, rejected: the peer's
    std::uint16_t ird{0};               // connect_request: peer's IRD/ORD; established: agreed
    std::uint16_t ord{0};
    std::string reason;                 // unreachable/error/disconnected: text
};

// One connection: MPA negotiation over a TCP connection, then the stream handed to the QP.
class CmId {
public:
    ~CmId();  // aborts (RST) a connection still in use; one that ended in order (rejected, disconnected) gets its FIN
    CmId(const CmId&) = delete;
    CmId& operator=(const CmId&) = delete;

    // Responder, after connect_request: replies and moves `qp` to RTS. False if not in request state or the
    // private data is too long.
    bool accept(QueuePair& qp, const ConnParam& param);
    // Responder: an MPA reject reply with our private data, then close.
    bool reject(std::span<const std::byte> private_data);
    // Orderly: the QP goes to SQD (no new sends), the send queue drains to TCP (bounded by 5 s), then FIN and
    // the QP to err (what is still outstanding, e.g. READs awaiting their response, is flushed). A
    // disconnected event follows.
    void disconnect();
    // Abortive: RST at once, QP to err.
    void abort();

    // Peer's request (connect_request) / reply (established): IRD, ORD, private data.
    const mpa::PrivateData& peer_private_data() const noexcept { return peer_pd_; }
    QueuePair* qp() noexcept { return qp_; }
    bool connected() const noexcept { return phase_ == Phase::rdma; }
    // Initiator: zero-length WRITEs sent behind the first FPDU (FirstFpduGuard::Mode::nudge) so far.
    unsigned nudges_sent() const noexcept { return nudges_sent_; }
    // The peer's address and TCP port ("10.0.0.2:51234"), known once TCP is connected; "" before.
    std::string peer() const;
    // Initiator, peer-to-peer: when the reply asks for an RTR we can send but cannot agree to (no matching RTR,
    // insufficient IRD), that RTR goes first and the TERMINATE this long after it (see cm.cpp).
    static constexpr auto kRtrSettle = std::chrono::milliseconds(300);

private:
    friend class Context;
    friend class CmListener;
    friend class QueuePair;
    struct TcpHandler;
    enum class Phase : std::uint8_t { connecting, negotiating, request, rdma, closed };
    explicit CmId(Context& ctx);

    void on_tcp_connected();
    void on_tcp_receive(std::span<const std::byte> bytes);
    void on_tcp_receive_end();
    void on_tcp_sent();
    void on_tcp_remote_close();
    void on_tcp_error(const char* what, bool unreachable);
    void negotiate_input(std::span<const std::byte> bytes);
    void write_negotiation_output();
    void check_outcome();
    // Poll stage: negotiation time limits, a pending TCP close.
    void service(mpa::Clock::time_point now);
    void go_rdma(const mpa::Agreed& agreed);
    // QP reached err (TERMINATE sent/received): close once the TERMINATE is out.
    void qp_failed();
    // The initiator's first-FPDU guard (FirstFpduGuard), from the poll stage.
    void guard_first_fpdu(mpa::Clock::time_point now);
    // Initiator: a reply we cannot use from a responder waiting for an RTR (see cm.cpp).
    bool rtr_before_terminate(TermCode code, CmEventType type);
    // Ends the connection: QP to err (flush), TCP closed in the poll stage, event (unless quiet).
    void finish(CmEventType type, const std::string& reason, bool quiet = false);
    void emit(CmEventType type, const std::string& reason = {});

    Context& ctx_;
    std::unique_ptr<TcpHandler> handler_;
    std::unique_ptr<stack::TcpConnection> conn_;
    std::optional<mpa::Initiator> ini_;
    std::optional<mpa::Responder> resp_;
    std::vector<std::byte> pd_copy_;  // our request private data, kept for the negotiator
    Phase phase_{Phase::connecting};
    bool initiator_{false};
    QueuePair* qp_{nullptr};
    CmListener* listener_{nullptr};
    mpa::PrivateData peer_pd_{};
    std::string peer_;           // "a.b.c.d:port", set when TCP connects
    std::uint32_t peer_ip_be_{0};
    bool pending_{false};        // counted in the Context's pending connections (responder, before RDMA mode)
    void leave_pending() noexcept;
    bool draining_{false};       // disconnect(): waiting for the QP's send queue to reach TCP
    mpa::Clock::time_point drain_deadline_{};
    bool quiet_close_{false};    // the event was already given (initiator failure with TERMINATE)
    std::uint16_t ird_{0};
    std::uint16_t ord_{0};
    bool close_pending_{false};  // close TCP once the QP's TX (the TERMINATE) is out
    bool rfc7306_{false};        // ConnParam::rfc7306 of our side (connect, or accept)
    // First-FPDU guard (initiator in RDMA mode; see cm.cpp "The accept window").
    FirstFpduGuard guard_{};
    bool guarding_{false};
    std::optional<mpa::Clock::time_point> first_tx_at_;  // when our first FPDU reached TCP
    mpa::Clock::time_point last_tx_seen_{};              // last poll stage that saw our TX advance
    std::uint64_t tx_seen_{0};
    unsigned nudges_sent_{0};
    unsigned nudge_step_{0};
    mpa::Clock::time_point hold_until_{};
    std::optional<TermCode> deferred_term_;          // rtr_before_terminate(): the TERMINATE, due at deferred_until_
    mpa::Clock::time_point deferred_until_{};
    std::optional<std::pair<CmEventType, std::string>> fail_event_;  // its event, given when it is out
};

class CmListener {
public:
    ~CmListener();
    CmListener(const CmListener&) = delete;
    CmListener& operator=(const CmListener&) = delete;
    std::uint16_t port() const noexcept { return port_; }

private:
    friend class Context;
    struct Acceptor;
    CmListener(Context& ctx, std::uint16_t port, const ConnParam& defaults);
    Context& ctx_;
    std::uint16_t port_;
    ConnParam defaults_;
    std::unique_ptr<Acceptor> acceptor_;
    std::unique_ptr<stack::TcpListener> listener_;
};

// ---- device context ----------------------------------------------------------------------------------------
// What a peer may learn and hold (the security model: README, "Security"). Every limit is per Context.
struct SecurityConfig {
    // Report every failed access to our memory (no such STag, other PD, missing right, outside the region,
    // stale key) as "invalid STag", and every refused invalidation as "cannot invalidate", instead of the
    // precise RFC 5040/5041 code: a prober then cannot tell a guessed STag from a wrong one, nor find a
    // region's bounds. Our own TerminateInfo keeps the precise cause. Off: precise codes (debugging with
    // trusted peers).
    bool opaque_access_errors{true};
    // A host whose streams draw this many such TERMINATEs (failed accesses to our memory, refused
    // invalidations) within `access_error_window` has its new connections refused (reset at accept) until
    // the window has passed: guessing STags then costs it a connection and a slot in this budget per guess.
    // 0 = no limit.
    unsigned max_access_errors_per_peer{8};
    std::chrono::seconds access_error_window{60};
    // Connections accepted by TCP whose MPA request has not arrived yet hold a TCP PCB and CM state for up to
    // the request time limit (5 s) and cost the sender nothing. Per host at most `max_pending_per_peer` (more
    // are reset at accept); in all at most `max_pending`, beyond which the oldest is reset to admit the new one.
    // A client that sends its request at once (every real one) is pending for one round trip. Together with
    // lwIP evicting connections not yet in RDMA mode before those that are when its PCBs run out
    // (stack::TcpPriority), a flood of idle connections can neither starve running sessions nor shut out new
    // clients for long (README, "Security"). 0 = no limit.
    unsigned max_pending_per_peer{64};
    unsigned max_pending{256};
};

struct ContextConfig {
    io::PortConfig port{};
    io::EalConfig eal{};
    stack::StackConfig stack{};
    std::uint32_t max_mr{4096};   // MR table entries (allocated at open)
    std::uint32_t max_qp{1024};   // QPs (TX work list allocated at open)
    // Run to completion (default: everything inside poll() on the application thread) or a dedicated RX
    // thread; core pinning and the RX thread's idle policy. See threading/config.hpp.
    threading::ThreadingConfig threading{};
    // Per-layer cost accounting (layer_cycles()): a TSC read at each layer boundary. Run-to-completion mode
    // only; off by default (it costs a few ns per message).
    bool layer_cycles{false};
    // TCP checksums: automatic = off on memif (shared memory between two softrdma processes: nothing can
    // corrupt a frame, and both ends use this policy; captures then show checksum 0); on everywhere else
    // (af_packet, devices: a kernel or RNIC peer checks them). IP header checksums are always on.
    enum class Checksums : std::uint8_t { automatic, on, off } tcp_checksums{Checksums::automatic};
    // The destructor keeps polling up to this long while connections finish closing (FIN handshakes), so the
    // peer sees an orderly end even if the application stops polling right after its disconnected event.
    std::chrono::milliseconds close_linger{500};
    SecurityConfig security{};
    // The application thread inside run_until() / wait_cm_event() / drain() when a turn receives nothing:
    // spin 64 turns, then yield the core (two processes may share the cores).
    IdlePolicy idle{.spin_turns = 64};
};

// Where the cycles of the data path went, by layer (ContextConfig::layer_cycles), since the Context opened.
//   io:        DPDK rx/tx burst calls (the driver, memif copies)
//   lwip:      lwIP input/output, timers, our netif glue (TX copy into mbufs)
//   mpa:       deframing, markers, framing and the gather copy on TX; the CRC on TX
//   ddp_rdmap: DDP/RDMAP receive (header checks, placement copy; with CRC on, the CRC fused into it) and TX
//   verbs:     post_send / post_recv, completions, CM and the rest of Context::poll()
struct LayerCycles {
    std::uint64_t io = 0, lwip = 0, mpa = 0, ddp_rdmap = 0, verbs = 0;
    double cycles_per_ns = 1.0;
    std::uint64_t total() const noexcept { return io + lwip + mpa + ddp_rdmap + verbs; }
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

class Context {
public:
    // Opens the io port and the lwIP stack. One per process. Throws io::Error / Error.
    static std::unique_ptr<Context> open(const ContextConfig& cfg);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    std::unique_ptr<ProtectionDomain> alloc_pd();
    std::unique_ptr<CompletionQueue> create_cq(std::uint32_t cqe);

    // One turn: network RX and protocol, CM timers, TX for every QP with work. Returns frames received.
    unsigned poll() noexcept;
    // Polls until done() or timeout; returns done().
    bool run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

    // ---- connection manager: events on their own channel, apart from CQs ----
    std::unique_ptr<CmListener> listen(std::uint16_t port, const ConnParam& defaults = {});
    // Starts TCP connect + MPA negotiation; the QP (in init) must outlive the id or be destroyed first.
    std::unique_ptr<CmId> connect(stack::Ipv4 addr, std::uint16_t port, QueuePair& qp, const ConnParam& param);
    // The oldest CM event, if any (does not poll).
    std::optional<CmEvent> get_cm_event();
    // Readable (eventfd) while CM events are queued: for epoll next to the CQs' fds.
    int cm_fd() const noexcept { return cm_efd_; }

    // ---- sleeping instead of polling (RX thread mode) ----
    // Completions, CM events and TCP work all happen inside poll(); with an RX thread the application may sleep
    // between polls: call prepare_sleep(); if it returns true, epoll on wake_fd() (with the CQ and CM fds) —
    // the RX thread makes wake_fd() readable when the next frame arrives — then poll() again. If it returns
    // false, something is already waiting: poll() now. TCP's timers run inside poll(): give epoll a timeout
    // of a few ms. In run-to-completion mode nothing runs while the application sleeps, so prepare_sleep()
    // returns false (keep polling, or sleep with a short timeout).
    //   for (;;) { while (ctx->poll() != 0) {}  drain CQs;  if (ctx->prepare_sleep()) epoll_wait(...); }
    bool prepare_sleep() noexcept;
    int wake_fd() const noexcept { return wake_efd_; }
    // Asynchronous events (ibv_get_async_event): SRQ limit. Bounded ring; overflow counted.
    std::optional<AsyncEvent> get_async_event() noexcept;
    std::uint64_t async_dropped() const noexcept { return async_dropped_; }
    // Polls until an event arrives or timeout.
    std::optional<CmEvent> wait_cm_event(std::chrono::milliseconds timeout);
    // Polls until every TCP connection has finished closing, or timeout; returns whether they all did.
    // (A disconnected event comes when the stream ends; the TCP close handshake still needs a few turns.)
    bool drain(std::chrono::milliseconds timeout) {
        return run_until([this] { return stack_->active_pcbs() == 0; }, timeout);
    }

    stack::Stack& stack() noexcept { return *stack_; }
    io::Port& port() noexcept { return *port_; }
    threading::Mode threading_mode() const noexcept { return cfg_.threading.mode; }
    RxCopyStats rx_copy_stats() const noexcept;
    // The RX thread's counters (frames, copies, placed payload, drops); nullopt in run-to-completion mode.
    std::optional<threading::RxCounters> rx_thread_counters() const noexcept;
    // Connections refused or reset at accept by SecurityConfig's limits (a probing host, too many pending).
    std::uint64_t refused_connections() const noexcept { return refused_connections_; }
    LayerCycles layer_cycles() const noexcept;

private:
    friend class ProtectionDomain;
    friend class MemoryRegion;
    friend class QueuePair;
    friend class CmId;
    friend class CmListener;
    friend class SharedReceiveQueue;
    explicit Context(const ContextConfig& cfg);
    unsigned poll_turn() noexcept;

    // One MR table entry. With an RX thread the table is read there (placement checks) and by the application
    // thread, and SEND with Invalidate clears `valid` there: every field is an atomic (relaxed; x86 plain
    // loads). An entry is only reused after the RX thread has quiesced (MemoryRegion's destructor), so a
    // check never mixes two registrations' fields in a way that lets a write land outside either region.
    struct MrEntry {
        std::atomic<std::uint32_t> tag{0};  // the STag's upper 24 bits (slot + 1 | random)
        std::atomic<std::byte*> base{nullptr};
        std::atomic<std::size_t> length{0};
        std::atomic<std::uint32_t> pd{0};
        std::atomic<std::uint32_t> access{0};
        std::atomic<std::uint8_t> key{0};
        std::atomic<bool> in_use{false};
        std::atomic<bool> valid{false};
    };
    // The MR check: PD, access, bounds, key, validity. `len` bytes at `to`. For local SGEs pass the local
    // right needed (0 = read only).
    rdmap::Mem mr_lookup(std::uint32_t stag, std::uint64_t to, std::size_t len, std::uint32_t pd,
                         std::uint32_t need) noexcept;
    MrEntry* mr_entry(std::uint32_t stag) noexcept;
    void schedule_tx(QueuePair* qp) noexcept;
    void new_request(CmListener& listener, std::unique_ptr<stack::TcpConnection> conn);
    // SecurityConfig bookkeeping (control path): per host, connections pending and access errors caused.
    struct PeerRecord {
        unsigned pending = 0;
        unsigned errors = 0;
        std::chrono::steady_clock::time_point window_start{};
    };
    std::unordered_map<std::uint32_t, PeerRecord> peers_;
    unsigned pending_total_{0};
    std::uint64_t refused_connections_{0};
    PeerRecord& peer_record(std::uint32_t ip_be);
    void note_access_error(std::uint32_t ip_be);
    void push_event(CmEvent ev);
    void drop_events(const CmId* id) noexcept;

    ContextConfig cfg_;
    std::unique_ptr<io::Port> port_;
    // Declared between the port and the stack: the RX thread stops before the stack goes (the destructor
    // stops it first), and its slots outlive the stack, whose pbufs may still reference them.
    std::unique_ptr<threading::RxThread> rx_;
    std::unique_ptr<stack::Stack> stack_;
    // Layer accounting (ContextConfig::layer_cycles; application thread).
    struct Prof {
        std::uint64_t ep_rx = 0, framer = 0, proto_rx = 0, proto_tx = 0, lwip_tx = 0, poll = 0, api = 0;
    } prof_;
    std::atomic<std::uint64_t> placed_bytes_{0};  // RxCopyStats::payload_bytes (either thread, relaxed)
    // RX thread mode: flow ids (one per QP whose connection the RX thread follows) and the doorbell ring on
    // which the RX thread names flows with new receive events. Sizing: max_qp each, allocated at open; a flow
    // is on the doorbell at most once (RxSide's `rung` flag), so it never overflows.
    std::vector<QueuePair*> flows_;
    std::vector<std::uint16_t> flow_free_;
    std::unique_ptr<boost::lockfree::spsc_queue<std::uint16_t>> doorbell_;
    int alloc_flow(QueuePair* qp) noexcept;
    void free_flow(int id) noexcept;
    rdmap::MemError mr_invalidate(std::uint32_t stag, std::uint32_t pd) noexcept;
    std::unique_ptr<MrEntry[]> mrs_;     // max_mr entries, allocated at open
    std::vector<std::uint32_t> mr_free_;
    std::uint32_t mr_slot_bits_{0};      // the STag tag's low bits that hold slot + 1 (the rest is random)
    std::uint32_t next_pd_{1};
    std::uint32_t next_qpn_{1};
    std::uint32_t qp_count_{0};
    std::vector<QueuePair*> tx_list_;    // QPs with TX work; capacity max_qp, reserved at open
    std::vector<CmId*> ids_;             // live CM ids (timers); control path
    std::deque<CmEvent> events_;         // control path
    int cm_efd_{-1};
    int wake_efd_{-1};                   // RX thread -> sleeping application thread (prepare_sleep)
    std::atomic<bool> want_wake_{false};
    bool slept_{false};                  // prepare_sleep() said yes: drain wake_efd_ at the next poll
    // Async events come from the data path: a ring allocated at open. Sizing: one per armed SRQ limit in
    // flight; 64 covers an application that does not read them for a while, beyond that they are counted.
    std::array<AsyncEvent, 64> async_{};
    std::size_t async_head_{0};
    std::size_t async_count_{0};
    std::uint64_t async_dropped_{0};
    void push_async(const AsyncEvent& e) noexcept;
    std::vector<std::unique_ptr<CmId>> orphans_;  // accepted TCP connections before their connect_request
    bool cm_work_{false};                // a CM id has work for the poll stage
    std::uint64_t next_timer_tsc_{0};
};

}  // namespace softrdma::verbs
