// SPDX-License-Identifier: MIT
// The interface between RDMAP and the layer above it (verbs; a fake in the tests), and the one table that
// turns the upper layer's memory/receive answers into RFC 5040/5041 TERMINATE codes.
//
// The upper layer owns all memory: registered regions (STags), posted receives and their buffers. RDMAP asks
// where bytes go or come from, copies once, and reports what finished. Every call happens on the endpoint's
// thread, from inside Endpoint::pull_tx() or one of the UlpduHandler callbacks; none may call back into the
// endpoint.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ddp/header.hpp"
#include "base/term_code.hpp"
#include "rdmap/messages.hpp"

namespace softrdma::rdmap {

enum class WrOp : std::uint8_t { send, write, read, fetch_add, cmp_swap };

// An outbound READ or atomic request waiting for its response (ORQ, oldest first).
struct OrqEntry {
    WrOp op{WrOp::read};
    bool signaled{true};
    std::uint64_t wr_id{0};
    std::uint32_t sink_stag{0};
    std::uint64_t sink_to{0};
    std::uint32_t size{0};
    std::uint32_t req_id{0};
};
// An inbound READ or atomic request to answer (IRQ, oldest first). `hdr` keeps the READ request as received,
// for a TERMINATE if its source fails while the response is being sent.
struct IrqEntry {
    bool atomic{false};
    ReadRequest rr{};
    AtomicResponse ar{};
    std::array<std::byte, kReadRequestLen> hdr{};
};

// What went wrong with a memory or receive lookup (the shape of siw's siw_check_mem answers).
enum class MemError : std::uint8_t {
    none,
    invalid_stag,  // no such STag
    wrong_pd,      // STag exists but is not associated with this stream (protection domain)
    access,        // STag lacks the access right asked for
    bounds,        // range outside the region / message longer than the receive buffer
    invalidated,   // STag invalidated, or its key part does not match
    misaligned,    // atomic target not 8-byte aligned
    no_receive,    // no posted receive for an inbound untagged message
    local_gone,    // our own buffer (a posted receive, a READ sink) lost its registration while in use
};
inline constexpr std::size_t kMemErrorCount = 9;

enum class Access : std::uint8_t {
    local_write,   // READ response sink: our own region named in our READ request
    remote_write,  // inbound RDMA WRITE
    remote_read,   // inbound READ request: the source region
    remote_atomic, // inbound atomic request: the 8-byte target
};

// Where a lookup was made; selects the column of the error table.
enum class MemUse : std::uint8_t {
    tagged_sink,  // DDP tagged placement (WRITE, READ response): RFC 5041 section 7.2 tagged errors
    rdma_source,  // RDMAP checks of a READ source or atomic target: RFC 5040 remote protection errors
    receive,      // untagged placement into a posted receive (QN 0)
    invalidate,   // SEND with Invalidate
};
inline constexpr std::size_t kMemUseCount = 4;

// The one mapping from MemError to TERMINATE code (RFC 5040 section 4.8, RFC 5041 section 7.2).
// RFC 5041 has no tagged "access" code: an access violation on a tagged sink is reported as RDMAP's remote
// protection "access rights violation", which names it exactly (siw uses DDP "invalid STag" instead).
// Receive SGEs failing their own checks are a local problem: DDP local catastrophic (as siw); so is a local
// buffer whose registration ended while a message was placed into it (local_gone).
inline constexpr std::array<std::array<TermCode, kMemErrorCount>, kMemUseCount> kMemErrorTable = {{
    // none, invalid_stag, wrong_pd, access, bounds, invalidated, misaligned, no_receive, local_gone
    {{ddp::err::local_catastrophic, ddp::err::t_invalid_stag, ddp::err::t_stag_not_assoc, err::p_access,
      ddp::err::t_base_bounds, ddp::err::t_invalid_stag, ddp::err::t_base_bounds, ddp::err::local_catastrophic,
      ddp::err::local_catastrophic}},
    {{err::local_catastrophic, err::p_invalid_stag, err::p_stag_not_assoc, err::p_access, err::p_base_bounds,
      err::p_invalid_stag, err::p_base_bounds, err::local_catastrophic, err::local_catastrophic}},
    {{ddp::err::local_catastrophic, ddp::err::local_catastrophic, ddp::err::local_catastrophic,
      ddp::err::local_catastrophic, ddp::err::u_too_long, ddp::err::local_catastrophic, ddp::err::local_catastrophic,
      ddp::err::u_no_buffer, ddp::err::local_catastrophic}},
    {{err::o_cannot_invalidate, err::o_cannot_invalidate, err::p_cannot_invalidate, err::p_cannot_invalidate,
      err::o_cannot_invalidate, err::o_cannot_invalidate, err::o_cannot_invalidate, err::o_cannot_invalidate,
      err::o_cannot_invalidate}},
}};

constexpr TermCode term_code_for(MemError e, MemUse use) {
    return kMemErrorTable[static_cast<std::size_t>(use)][static_cast<std::size_t>(e)];
}

// What a TERMINATE tells the peer about a failed access to our memory when Config::opaque_access_errors is on:
// every tagged-buffer and remote-protection error reads "invalid STag", every failed invalidation "cannot
// invalidate", so the peer cannot tell an STag that does not exist from one it may not use, or a wrong offset
// from a wrong STag (RFC 5042 section 5: STag guessing). `tagged`: the offending message was tagged (a WRITE
// or READ response: DDP's code), else a READ or atomic request (RDMAP's). Other codes pass unchanged.
constexpr TermCode opaque_access_error(TermCode c, bool tagged) {
    if (c == err::p_cannot_invalidate || c == err::o_cannot_invalidate) return err::o_cannot_invalidate;
    const bool remote_protection = c.layer == TermLayer::rdmap && c.etype == err::kEtypeProtection;
    const bool tagged_buffer = c.layer == TermLayer::ddp && c.etype == ddp::err::kEtypeTagged && c != ddp::err::t_version;
    if (!remote_protection && !tagged_buffer) return c;
    return tagged ? ddp::err::t_invalid_stag : err::p_invalid_stag;
}

// Answer to a memory lookup: `len` (1..asked) contiguous bytes at `ptr`, or `err`. The bytes belong to the
// upper layer and stay valid until the endpoint call that asked returns.
struct Mem {
    std::byte* ptr{nullptr};
    std::size_t len{0};
    MemError err{MemError::none};
};

enum class WcKind : std::uint8_t { send, write, read, atomic, recv };
enum class WcStatus : std::uint8_t { success, flushed };

struct Completion {
    WcKind kind{WcKind::send};
    WcStatus status{WcStatus::success};
    std::uint64_t wr_id{0};       // send-queue work requests; 0 for recv
    std::uint32_t msn{0};         // recv: MSN of the message, the one recv_begin() bound a receive to
    std::uint32_t byte_len{0};    // recv: bytes placed; read: bytes read
    bool solicited{false};        // recv: SE variant
    bool has_imm{false};          // recv: carries RFC 7306 Immediate Data (a SEND joined by it, or imm_only)
    bool imm_only{false};         // recv: an Immediate Data message alone (after an RDMA WRITE), byte_len 0
    bool has_inv{false};          // recv: SEND with Invalidate, inv_stag invalidated
    std::uint64_t imm{0};
    std::uint32_t inv_stag{0};
    std::uint64_t atomic_original{0};  // atomic: Original Remote Data Value
};

// A TERMINATE sent (received == false) or received. `attached` is the DDP Segment Length and headers as on
// the wire (RFC 5040 section 4.8); the span is valid only during on_terminate().
struct TermReport {
    TermCode code{};
    bool received{false};
    bool m{false};
    bool d{false};
    bool r{false};
    std::span<const std::byte> attached{};
    // The 32-bit control word (layer, type, code, M/D/R) exactly as on the wire. Peers disagree on its bit
    // layout (Linux siw's x86 build swaps layer and type, see README), so a report keeps the raw word too.
    std::uint32_t raw{0};
    // A sent TERMINATE: the whole ULPDU (header + attached) as it goes on the wire, for a split tx endpoint.
    std::span<const std::byte> frame{};
    // What actually went wrong: `code` as found, before Config::opaque_access_errors hid it from the peer
    // (equal to `code` otherwise, and for a received TERMINATE). For local logs and the application.
    TermCode cause{};
};

class Upper {
public:
    virtual ~Upper() = default;

    // Tagged buffer (STag, TO): up to `len` contiguous bytes checked for `access`.
    virtual Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, Access access) = 0;
    // Binds the oldest posted receive to inbound QN 0 message `msn`; MemError::no_receive if none is posted.
    virtual MemError recv_begin(std::uint32_t msn) = 0;
    // Receive buffer bound to `msn`: up to `len` contiguous bytes at message offset `mo`; bounds if `mo` is at
    // or past the end of the buffer.
    virtual Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) = 0;
    // Invalidates `stag` (SEND with Invalidate, RFC 5040 section 5.3); none when done.
    virtual MemError invalidate(std::uint32_t stag) = 0;
    // Asked before each FPDU of a SEND or WRITE is gathered from the WR's SGEs: false when their memory is no
    // longer the WR's to read (deregistered since the post). The stream then ends with a TERMINATE (RDMAP
    // local catastrophic error: the message is cut short) and the WR is flushed.
    virtual bool source_alive(std::uint64_t /*wr_id*/) { return true; }

    virtual void on_completion(const Completion& c) = 0;
    // The stream is dead: a TERMINATE was sent or received. Posted work is flushed after this call.
    virtual void on_terminate(const TermReport& t) = 0;

    // Split endpoints only (Config::role, see endpoint.hpp): a tx endpoint framed a READ/atomic request; an
    // rx endpoint accepted an inbound one (atomics already executed).
    virtual void on_request_sent(const OrqEntry&) {}
    virtual void on_inbound_request(const IrqEntry&) {}
};

}  // namespace softrdma::rdmap
