// SPDX-License-Identifier: MIT
// How the endpoint turns one ULPDU (header + gathered payload) into FPDU bytes: the MPA framing seam.
// rdmap::FpduFramer (rdmap/stream.hpp) wraps mpa::FpduTx; the QPs use verbs' DeferringFramer, which may send a
// payload from where it is (verbs/qp_tx.hpp); tests may use a trivial framer.
#pragma once

#include <cstddef>
#include <span>

namespace softrdma::rdmap {

class Framer {
public:
    virtual ~Framer() = default;
    // Largest ULPDU (DDP header + payload) one FPDU may carry (RFC 5044 MULPDU).
    virtual std::size_t mulpdu() const = 0;
    // Bytes an FPDU carrying `ulpdu_len` ULPDU bytes takes on the wire (length, pad, CRC, markers).
    virtual std::size_t wire_size(std::size_t ulpdu_len) const = 0;
    // Writes one whole FPDU at the front of `out`, out.size() >= wire_size(ulpdu_len). Returns the bytes written.
    // Reads `header` during the call only; `payload` (borrowed, caller-owned: registered memory, a READ source)
    // during the call, or, for a framer that sends it from where it is (verbs' DeferringFramer), for as long as
    // the work request's buffers are lent to the QP (until the completion the application polls, the MR's
    // deregistration or the connection's close: stack::FillBook), on the same thread.
    virtual std::size_t write(std::span<std::byte> out, std::span<const std::byte> header,
                              std::span<const std::span<const std::byte>> payload) = 0;
};

// The framer of an endpoint that never frames (Role::rx: its TERMINATE goes out through the tx endpoint, as
// TermReport::frame): frames nothing.
Framer& no_framer();

}  // namespace softrdma::rdmap
