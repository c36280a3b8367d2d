// SPDX-License-Identifier: MIT
// softrdma verbs: the API applications link (standard C++ only: no DPDK, lwIP or Boost header comes with it).
// A verbs-like C++20 surface over iWARP (MPA/DDP/RDMAP) on a user-level TCP/IP stack over DPDK, with the names
// libibverbs/librdmacm users know. Building, linking and complete configurations: verbs/README.md.
//
//   auto ctx = verbs::Context::open(cfg);            // one per process: DPDK port + TCP/IP stack
//   auto pd  = ctx->alloc_pd();
//   auto mr  = pd->reg_mr(buffer, access::local_write | access::remote_write);
//   auto cq  = ctx->create_cq(256);
//   auto qp  = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get()});
//   qp->post_recv(...);                              // receives may be posted before the connection
//   auto id  = ctx->connect(peer, port, *qp, param); // CM events: ctx->get_cm_event()
//   qp->post_send(...);  ctx->poll();  cq->poll(wcs);
//
// Threading: the thread that opened the Context calls every function here. Context::poll() runs one turn:
// network RX and the protocol's receive side (run to completion), or the events and headers the dedicated RX
// thread handed over (ContextConfig::threading), then TCP, CM timers and TX of every QP that has work.
//
// Errors: control path (open, reg_mr, create_*, listen, connect) throws verbs::Error; data path (post_send,
// post_recv, poll) returns values and never allocates, locks or logs. CM events are logged at debug level (<softrdma/log.hpp>).
//
// Lifetimes: objects may be destroyed in any order; each handle keeps alive what it depends on.
//   - A QP keeps its CQs and SRQ (their completions still go into them, unread), its PD's identity and the
//     Context's internals. An MR, SRQ, PD, CM id or listener keeps the Context's internals.
//   - Destroying the Context with objects still alive closes it first: connections still in use are reset
//     (RST; those already ending get their FIN within ContextConfig::close_linger), every QP goes to ERR with
//     its outstanding work flushed into its CQs, listeners stop, and the port and stack are released. The
//     handles still held stay safe: posts complete with wr_flush_err, calls that need the network (reg_mr,
//     create_qp, create_srq) throw Error("... the Context is closed"), and destroying them is always fine.
//   - Deregistering an MR (destroying it) while posted WRs still name it fails those WRs instead of touching
//     the memory again: a SEND or WRITE not yet fully sent, a posted receive, a READ's sink or an atomic's
//     result buffer completes with loc_prot_err (and a message cut short ends the stream with a TERMINATE,
//     local catastrophic error); from the moment the MR is gone softrdma neither reads nor writes its bytes.
//   - Destroying a connected QP or CmId aborts the connection (RST).
//
// Every class here is a handle: its state lives in an internal object of verbs/ (detail::), which the other
// parts of the library reach through impl(); applications never need it.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <softrdma/config.hpp>
#include <softrdma/iwarp.hpp>

namespace softrdma::verbs {

class Error : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Scatter/gather entries per work request (send, receive, SRQ).
inline constexpr std::uint32_t kMaxSge = 8;

class Context;
class ProtectionDomain;
class MemoryRegion;
class CompletionQueue;
class SharedReceiveQueue;
class QueuePair;
class CmId;
class CmListener;

namespace detail {  // the internal objects behind the handles (verbs/*.hpp, not installed)
class Engine;
class Cq;
class Srq;
class Qp;
class Conn;
class Listener;
}  // namespace detail

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

const char* to_string(WrOpcode o) noexcept;

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
    bad_remote_address,  // WRITE/READ: remote address + length wraps past 2^64; atomic: target not 8-byte aligned
};
const char* to_string(PostErrc e) noexcept;

template <class Wr>
struct [[nodiscard]] PostResult {
    PostErrc err{PostErrc::none};
    const Wr* bad_wr{nullptr};
    bool ok() const noexcept { return err == PostErrc::none; }
};

// ---- completions -------------------------------------------------------------------------------------------
// A send WR that a connection's end kills completes with the cause when there is one, the rest of what is
// outstanding with wr_flush_err (in posting order, the oldest first):
//   rem_access_err   the peer's TERMINATE says it refused an access to its memory (STag, bounds, rights, PD)
//   rem_inv_req_err  the peer's TERMINATE says it could not take the message (no receive posted, too long)
//   rem_op_err       any other TERMINATE from the peer (protocol or operation error)
//   retry_exc_err    the peer stopped answering (ConnParam::liveness: keepalive or user timeout)
// loc_prot_err: a region this WR names was deregistered under it. fatal_err: not used by the engine.
enum class WcStatus : std::uint8_t {
    success, wr_flush_err, loc_prot_err, fatal_err, rem_access_err, rem_op_err, rem_inv_req_err, retry_exc_err
};
enum class WcOpcode : std::uint8_t { send, rdma_write, rdma_read, comp_swap, fetch_add, recv, recv_rdma_with_imm };
const char* to_string(WcStatus s) noexcept;
const char* to_string(WcOpcode o) noexcept;

namespace wc_flags {
inline constexpr std::uint32_t with_imm = 1u << 0;
inline constexpr std::uint32_t with_inv = 1u << 1;
inline constexpr std::uint32_t solicited = 1u << 2;
}  // namespace wc_flags

// ibv_wc. RFC 7306 on the wire, verbs at the receiver (both ends agreed: ConnParam::rfc7306):
//   SEND_WITH_IMM  -> a SEND whose segments announce the Immediate Data message that follows it (SE on that
//                     one when solicited; the announcement is a softrdma value in the SEND's reserved RsvdULP
//                     field, rdmap::kImmFollows). The receiver completes them as ONE receive, as verbs
//                     applications expect, wherever TCP cuts the stream: opcode recv, byte_len = the SEND's
//                     bytes, wc_flags with_imm, imm_data; one receive WR consumed. A SEND and an Immediate Data
//                     from another RFC 7306 implementation (no announcement) take a receive each, as the RFC
//                     has it: the second completes as recv_rdma_with_imm.
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
// ring full is lost and counted in overruns(), and the first one queues a cq_err async event naming the CQ
// (verbs' CQ overrun error, IBV_EVENT_CQ_ERR): the application's accounting of its work requests is then
// broken, and it should treat the CQ as failed (as a verbs provider does) rather than go on.
class CompletionQueue {
public:
    explicit CompletionQueue(std::shared_ptr<detail::Cq> impl);  // made by Context::create_cq
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue&) = delete;
    CompletionQueue& operator=(const CompletionQueue&) = delete;

    // Moves up to out.size() completions, oldest first; returns the count. Does not poll the network: call
    // Context::poll() (run-to-completion).
    std::size_t poll(std::span<WorkCompletion> out) noexcept;
    std::size_t size() const noexcept;
    std::uint32_t capacity() const noexcept;
    std::uint64_t overruns() const noexcept;

    // Notification (ibv_req_notify_cq / ibv_get_cq_event). req_notify() asks for one event: at the next
    // completion, or with solicited_only at the next receive completion of a solicited message (SEND_SE,
    // Immediate Data with SE) or any completion with an error status. The event makes fd() (an eventfd)
    // readable; get_event() consumes it. Arm again after each event. In run-to-completion mode completions
    // only appear inside Context::poll(), so the fd says "that turn produced what you asked for"; with the
    // RX thread it becomes the place to sleep.
    void req_notify(bool solicited_only) noexcept;
    int fd() const noexcept;
    // True if an event was pending (non-blocking read of the eventfd).
    bool get_event() noexcept;

    detail::Cq& impl() noexcept { return *impl_; }
    // The QPs that use this CQ hold it too: destroying the handle first leaves it to them.
    const std::shared_ptr<detail::Cq>& shared_impl() const noexcept { return impl_; }

private:
    std::shared_ptr<detail::Cq> impl_;
};

// ---- memory regions ----------------------------------------------------------------------------------------
// STag = tag << 8 | key (RFC 5040's STag Index and STag Key). `tag` is 24 bits: the table slot + 1 in its low
// bits (enough for max_mr) and random bits above them; `key` is random too. Every registration draws fresh
// random bits (getrandom), so an STag says nothing about any other: with the default 4096-entry table 20 of
// its 32 bits are random (RFC 5042 section 5: STags hard to guess). rekey() replaces the key, and the old STag
// is then refused. Tag 0 is never used, so STags below 256 (STag 1: the RTR's) name no region.
class MemoryRegion {
public:
    MemoryRegion(std::shared_ptr<detail::Engine> engine, std::uint32_t index, std::uint32_t stag,
                 std::span<std::byte> bytes, std::uint32_t access);  // made by ProtectionDomain::reg_mr
    // Deregisters: WRs still using the region fail (loc_prot_err) and its bytes are no longer touched.
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
    std::shared_ptr<detail::Engine> engine_;
    std::uint32_t index_;
    std::uint32_t stag_;
    std::span<std::byte> bytes_;
    std::uint32_t access_;
};

// ---- shared receive queue ----------------------------------------------------------------------------------
struct SrqInitAttr {
    std::uint32_t max_wr{256};
    std::uint32_t max_sge{kMaxSge};
    std::uint32_t srq_limit{0};  // armed limit (0 = not armed)
};

// Receives shared by several QPs of one PD (ibv_srq). An inbound message takes the oldest WR when its first
// segment arrives; from then the WR belongs to that QP (flushed with it if the QP fails; the WRs still in
// the SRQ are not). Limit event (IBV_EVENT_SRQ_LIMIT_REACHED): once armed with a limit, the first time fewer
// than `limit` WRs remain posted an srq_limit_reached async event is queued on the Context and the limit
// disarms. Sizing: max_wr slots, allocated at creation.
class SharedReceiveQueue {
public:
    explicit SharedReceiveQueue(std::shared_ptr<detail::Srq> impl);  // made by ProtectionDomain::create_srq
    ~SharedReceiveQueue();
    SharedReceiveQueue(const SharedReceiveQueue&) = delete;
    SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;
    PostResult<RecvWr> post_recv(std::span<const RecvWr> wrs) noexcept;
    void arm_limit(std::uint32_t limit) noexcept;
    std::uint32_t limit() const noexcept;
    std::size_t posted() const noexcept;

    detail::Srq& impl() noexcept { return *impl_; }
    const std::shared_ptr<detail::Srq>& shared_impl() const noexcept { return impl_; }

private:
    std::shared_ptr<detail::Srq> impl_;
};

// Asynchronous events (ibv_async_event). srq_limit_reached names `srq`; cq_err (a completion lost to a full
// CQ, once per CQ) names `cq` and the QP whose completion it was. The QP errors name the QP by `qp_num`
// (a handle could be gone before the event is read) and carry the TERMINATE that put it in ERR:
//   qp_access_err  a TERMINATE for an access to memory (sent: the peer's offence; received: ours)
//   qp_req_err     a TERMINATE for a message that could not be taken (no receive, too long, bad MSN/queue)
//   qp_fatal       any other TERMINATE
// describe() says it in words. A connection that ends without a TERMINATE (close, reset, a dead peer) is a CM
// event (disconnected, with its reason), not an async event.
enum class AsyncEventType : std::uint8_t { srq_limit_reached, qp_fatal, qp_req_err, qp_access_err, cq_err };
const char* to_string(AsyncEventType t) noexcept;
struct TerminateInfo;

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
    std::uint32_t max_send_sge{kMaxSge};
    std::uint32_t max_recv_sge{kMaxSge};
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
// The RFC's name of a TERMINATE cause ("DDP tagged: invalid STag"), or "not an RFC 5040/5041/5044 code".
const char* to_string(TermCode c) noexcept;

struct TerminateInfo {
    TermCode code{};
    bool received{false};
    std::uint32_t raw{0};
    TermCode cause{};
    std::string describe() const;
};

struct AsyncEvent {
    AsyncEventType type{AsyncEventType::srq_limit_reached};
    SharedReceiveQueue* srq{nullptr};  // srq_limit_reached
    CompletionQueue* cq{nullptr};      // cq_err (null if the application has destroyed its handle)
    std::uint32_t qp_num{0};           // the QP errors; cq_err: the QP whose completion was lost
    TerminateInfo term{};              // the QP errors
    std::string describe() const;      // control path (allocates)
};

class QueuePair {
public:
    explicit QueuePair(std::unique_ptr<detail::Qp> impl);  // made by ProtectionDomain::create_qp
    ~QueuePair();
    QueuePair(const QueuePair&) = delete;
    QueuePair& operator=(const QueuePair&) = delete;

    // Posts in order; stops at the first WR it refuses (bad_wr). No allocation; copies the WR.
    PostResult<SendWr> post_send(std::span<const SendWr> wrs) noexcept;
    PostResult<RecvWr> post_recv(std::span<const RecvWr> wrs) noexcept;

    // reset -> init; any state -> err (flushes every outstanding WR; a connected QP also ends its stream: use
    // CmId::disconnect() for an orderly end); err -> reset once its connection has ended (false while it is
    // still closing: poll and ask again), after which the QP may go to init and connect again (its CmId, if
    // still held, then names no QP). rtr/rts/sqd are entered by the connection manager.
    bool modify_state(QpState s) noexcept;
    QpState state() const noexcept;
    std::uint32_t qp_num() const noexcept;
    const std::optional<TerminateInfo>& terminate_info() const noexcept;
    const QpCap& cap() const noexcept;
    // The protection domain's handle number (ProtectionDomain::handle()).
    std::uint32_t pd_handle() const noexcept;

    detail::Qp& impl() noexcept { return *impl_; }

private:
    std::unique_ptr<detail::Qp> impl_;
};

// ---- protection domain -------------------------------------------------------------------------------------
// A PD is a number its MRs, SRQs and QPs carry (never reused within a Context): destroying the handle first
// leaves them working, in the same domain.
class ProtectionDomain {
public:
    ProtectionDomain(std::shared_ptr<detail::Engine> engine, std::uint32_t handle)  // made by Context::alloc_pd
        : engine_(std::move(engine)), handle_(handle) {}
    ~ProtectionDomain();
    ProtectionDomain(const ProtectionDomain&) = delete;
    ProtectionDomain& operator=(const ProtectionDomain&) = delete;

    // Registers caller memory (it must outlive the region). Throws Error when the MR table is full or the
    // Context is closed.
    std::unique_ptr<MemoryRegion> reg_mr(std::span<std::byte> bytes, std::uint32_t access_flags);
    // Throws Error on a bad attribute (no CQ, zero depth, more SGEs than kMaxSge, too many QPs).
    std::unique_ptr<QueuePair> create_qp(const QpInitAttr& attr);
    // Throws Error on zero depth or more SGEs than kMaxSge.
    std::unique_ptr<SharedReceiveQueue> create_srq(const SrqInitAttr& attr);
    std::uint32_t handle() const noexcept { return handle_; }

private:
    std::shared_ptr<detail::Engine> engine_;
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
// Dead-peer detection on an RDMA-mode connection (each end sets its own). A peer that dies without closing
// (kill -9, power, a cut link) or stops answering (hung, stopped) ends the connection: CmEventType::disconnected
// with the reason in words, the QP in ERR, the oldest outstanding send WR completing retry_exc_err and every
// other WR flushed. Then the TCP connection is reset (nothing lingers retransmitting).
//   Idle (nothing to send): TCP keepalive. After `keepalive_idle` with nothing received, a probe every
//   `keepalive_interval`; when `keepalive_probes` went unanswered the peer is dead: reported within
//   idle + probes x interval (defaults: 3 s + 3 x 1 s = 6 s) of its last segment. 0 probes: no keepalive.
//   Sending: `user_timeout` (Linux's TCP_USER_TIMEOUT): data sent and not acknowledged for this long (however
//   often TCP retransmitted it), or kept from going out by the peer's closed receive window for this long
//   (however often the peer answered our zero-window probes), ends the connection. 0: only lwIP's
//   retransmission limit (8 retransmissions with exponential backoff: ~15 s at LAN round trips), and a closed
//   window is waited out forever. Time the application spends without driving the engine (no poll for 100 ms
//   or more) is not held against the peer.
// A peer that keeps taking our data is never affected: any segment from it restarts the keepalive clock, and
// every acknowledgement of new data the user-timeout clock.
struct Liveness {
    std::chrono::milliseconds keepalive_idle{3000};
    std::chrono::milliseconds keepalive_interval{1000};
    unsigned keepalive_probes{3};
    std::chrono::milliseconds user_timeout{6000};
};

struct ConnParam {
    std::span<const std::byte> private_data{};  // at most 252 bytes (MPA revision 2)
    std::uint16_t responder_resources{16};  // IRD: inbound READ/atomic requests we answer at once
    std::uint16_t initiator_depth{16};      // ORD: outbound READ/atomic requests outstanding
    // RFC 6581 peer-to-peer mode. Initiator: ask for it, offering `rtr` (the responder picks one; we send that
    // RTR before anything else). Listener defaults: the RTR types accepted (a P2P request is always answered).
    bool peer_to_peer{false};
    RtrSet rtr{.write = true, .read = true, .send = false};
    CrcPolicy crc{CrcPolicy::off};
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
    // accept, without peer-to-peer mode: RFC 5044 section 7.1.2 has the responder send no FPDU before the
    // initiator's first one. A server that speaks first (perftest's ib_write_lat server: its client waits on
    // memory) would wait forever on an initiator that waits too, as Linux siw's initiator does, so the
    // responder's first FPDU goes this long after the MPA reply if the initiator has not spoken by then. Not
    // sooner: siw as initiator takes bytes in the same read as the reply for a protocol error. 0 = the RFC's
    // rule without exception (wait for the initiator however long). Peer-to-peer mode needs none of this.
    std::chrono::milliseconds responder_grace{10};
    // connect: how long to wait for the MPA reply (siw: 10 s); listen defaults: for the request (siw: 5 s).
    std::chrono::milliseconds mpa_timeout{0};  // 0 = those defaults
    // connect: a TCP connect refused (nothing listens on the port yet: a server still starting, as when two
    // processes start together) is tried again every 20 ms until this long after connect(); the QP stays in
    // RTR and sees nothing of it. 0 = report it at once (unreachable).
    std::chrono::milliseconds connect_retry{0};
    // connect: the TCP source port (0: one of lwIP's ephemeral ports, 49152 and up). One that a connection or
    // listener of this Context holds fails connect() (it throws).
    std::uint16_t local_port{0};
    // Dead-peer detection (connect; accept): see Liveness.
    Liveness liveness{};
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
    PrivateData private_data{};    // connect_request, established, rejected: the peer's
    std::uint16_t ird{0};               // connect_request: peer's IRD/ORD; established: agreed
    std::uint16_t ord{0};
    std::string reason;                 // unreachable/error/disconnected: text
};

// One connection: MPA negotiation over a TCP connection, then the byte stream handed to the QP.
class CmId {
public:
    explicit CmId(std::unique_ptr<detail::Conn> impl);  // made by Context::connect and on connect requests
    ~CmId();  // aborts (RST) a connection still in use; one that ended in order (rejected, disconnected) gets its FIN
    CmId(const CmId&) = delete;
    CmId& operator=(const CmId&) = delete;

    // Responder, after connect_request: replies and moves `qp` to RTS. False if not in request state or the
    // private data is too long.
    [[nodiscard]] bool accept(QueuePair& qp, const ConnParam& param);
    // Responder: an MPA reject reply with our private data, then close.
    [[nodiscard]] bool reject(std::span<const std::byte> private_data);
    // Orderly: the QP goes to SQD (no new sends), the send queue drains to TCP (bounded by 5 s), then FIN and
    // the QP to err (what is still outstanding, e.g. READs awaiting their response, is flushed). A
    // disconnected event follows.
    void disconnect();
    // Abortive: RST at once, QP to err.
    void abort();

    // Peer's request (connect_request) / reply (established): IRD, ORD, private data.
    const PrivateData& peer_private_data() const noexcept;
    QueuePair* qp() noexcept;
    bool connected() const noexcept;
    // Initiator: zero-length WRITEs sent behind the first FPDU (FirstFpduGuard::Mode::nudge) so far.
    unsigned nudges_sent() const noexcept;
    // The peer's address and TCP port ("10.0.0.2:51234"), known once TCP is connected; "" before.
    std::string peer() const;
    // The same as numbers (0 before), and our end's TCP port: the connection's identity as the wire shows it.
    Ipv4 peer_address() const noexcept;
    std::uint16_t peer_port() const noexcept;
    std::uint16_t local_port() const noexcept;
    // Initiator, peer-to-peer: when the reply asks for an RTR we can send but cannot agree to (no matching RTR,
    // insufficient IRD), that RTR goes first and the TERMINATE this long after it (see cm.cpp).
    static constexpr auto kRtrSettle = std::chrono::milliseconds(300);

    detail::Conn& impl() noexcept { return *impl_; }

private:
    std::unique_ptr<detail::Conn> impl_;
};

class CmListener {
public:
    explicit CmListener(std::unique_ptr<detail::Listener> impl);  // made by Context::listen
    ~CmListener();
    CmListener(const CmListener&) = delete;
    CmListener& operator=(const CmListener&) = delete;
    std::uint16_t port() const noexcept;

    detail::Listener& impl() noexcept { return *impl_; }

private:
    std::unique_ptr<detail::Listener> impl_;
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
    // (the TCP stack's eviction order), a flood of idle connections can neither starve running sessions nor shut out new
    // clients for long (README, "Security"). 0 = no limit.
    unsigned max_pending_per_peer{64};
    unsigned max_pending{256};
};

struct ContextConfig {
    PortConfig port{};
    EalConfig eal{};
    IpConfig ip{};
    std::uint32_t max_mr{4096};   // MR table entries (allocated at open)
    std::uint32_t max_qp{1024};   // QPs (TX work list allocated at open)
    // Run to completion (default: everything inside poll() on the application thread) or a dedicated RX
    // thread; the RX thread's core and idle policy.
    ThreadingConfig threading{};
    // Per-layer cost accounting (diagnostics::layer_cycles): a TSC read at each layer boundary.
    // Run-to-completion mode only; off by default (~0.1 us on a 64 B half round trip, rdma_perf --layers).
    bool layer_cycles{false};
    // TCP checksums: automatic = off on memif (shared memory between two softrdma processes: nothing can
    // corrupt a frame, and both ends use this policy; captures then show checksum 0); on everywhere else
    // (af_packet, devices: a kernel or RNIC peer checks them). IP header checksums are always on.
    enum class Checksums : std::uint8_t { automatic, on, off } tcp_checksums{Checksums::automatic};
    // Large segments (memif, either threading mode): TCP segments of up to 64 KiB cross the link as one chained
    // frame, as the kernel's veth carries GSO/GRO super-frames, with FPDUs still sized for the port's MTU (the
    // byte stream is the one a 1500-byte link would carry; only its cutting into segments differs). Offered in
    // the TCP MSS option, so a peer that cannot take them (large_segments off, another memif application) is
    // sent MTU-sized segments. No effect on af_packet or devices. On by default since 2026-11-26 (run to
    // completion; the RX-thread mode since 2026-11-27): 64 KiB WRITE at MTU 1500 4.0x kernel TCP with it,
    // 0.4x without, in the same sitting (bench/RESULTS.md, "Bandwidth, 2026-11-26, second sitting").
    bool large_segments{true};
    // The destructor keeps polling while connections finish closing (data still queued, FIN handshakes), so the
    // peer gets everything and an orderly end even if the application stops polling right after its
    // disconnected event: up to three times this long without progress (bytes acknowledged, connections
    // closed), and at most 20 times this long in all; what is left then is reset.
    std::chrono::milliseconds close_linger{500};
    SecurityConfig security{};
    // The application thread inside run_until() / wait_cm_event() / drain() when a turn receives nothing:
    // spin 64 turns, then yield the core (two processes may share the cores).
    IdlePolicy idle{.spin_turns = 64};
};

class Context {
public:
    // Opens the io port and the lwIP stack. One per process. Throws io::Error / Error.
    static std::unique_ptr<Context> open(const ContextConfig& cfg);
    explicit Context(const ContextConfig& cfg);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    std::unique_ptr<ProtectionDomain> alloc_pd();
    std::unique_ptr<CompletionQueue> create_cq(std::uint32_t cqe);

    // One turn: network RX and protocol, CM timers, TX for every QP with work. Returns frames received.
    unsigned poll() noexcept;
    // Only the TX part of a turn: what was posted goes onto the wire now, nothing is received (a caller about
    // to stop polling for a while; the drop-in's ibv_post_send).
    void flush() noexcept;
    // Polls until done() or timeout; returns done().
    bool run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

    // ---- connection manager: events on their own channel, apart from CQs ----
    std::unique_ptr<CmListener> listen(std::uint16_t port, const ConnParam& defaults = {});
    // Starts TCP connect + MPA negotiation for a QP in INIT. Either may be destroyed first (a QP destroyed while
    // connected aborts the connection; an id destroyed first leaves the QP in ERR).
    std::unique_ptr<CmId> connect(Ipv4 addr, std::uint16_t port, QueuePair& qp, const ConnParam& param);
    // The oldest CM event, if any (does not poll).
    std::optional<CmEvent> get_cm_event();
    // Whether get_cm_event() would return one (cheap: for a check after every poll()).
    bool has_cm_event() const noexcept;
    // Readable (eventfd) while CM events are queued: for epoll next to the CQs' fds.
    int cm_fd() const noexcept;

    // ---- sleeping instead of polling (RX thread mode) ----
    // Completions, CM events and TCP work all happen inside poll(); with an RX thread the application may sleep
    // between polls: call prepare_sleep(); if it returns true, epoll on wake_fd() (with the CQ and CM fds) —
    // the RX thread makes wake_fd() readable when the next frame arrives — then poll() again. If it returns
    // false, something is already waiting: poll() now. TCP's timers run inside poll(): give epoll a timeout
    // of a few ms. In run-to-completion mode nothing runs while the application sleeps, so prepare_sleep()
    // returns false (keep polling, or sleep with a short timeout).
    //   for (;;) { while (ctx->poll() != 0) {}  drain CQs;  if (ctx->prepare_sleep()) epoll_wait(...); }
    bool prepare_sleep() noexcept;
    int wake_fd() const noexcept;
    // Asynchronous events (ibv_get_async_event): SRQ limit, QP errors. Bounded ring (64); overflow counted.
    std::optional<AsyncEvent> get_async_event() noexcept;
    std::uint64_t async_dropped() const noexcept;
    // Polls until an event arrives or timeout.
    std::optional<CmEvent> wait_cm_event(std::chrono::milliseconds timeout);
    // Polls until every TCP connection has finished closing, or timeout; returns whether they all did.
    // (A disconnected event comes when the stream ends; the TCP close handshake still needs a few turns.)
    bool drain(std::chrono::milliseconds timeout);

    ThreadingMode threading_mode() const noexcept;
    // Connections refused or reset at accept by SecurityConfig's limits (a probing host, too many pending).
    std::uint64_t refused_connections() const noexcept;

    detail::Engine& impl() noexcept { return *impl_; }
    const detail::Engine& impl() const noexcept { return *impl_; }

private:
    std::shared_ptr<detail::Engine> impl_;
};

}  // namespace softrdma::verbs
