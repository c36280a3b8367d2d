// SPDX-License-Identifier: MIT
// Looking at iWARP byte streams from the outside, for the wire tests:
// - UlpduRecorder, an mpa::UlpduHandler that decodes and records every DDP segment (with the ddp/rdmap
//   header decoders and opcode table) instead of placing it;
// - check_segments(), an independent check of what a stream of segments must obey (RFC 5040/5041 as real
//   peers apply it): legal opcodes, per-queue MSN from 1 up by one per message, continuous MO and TO;
// - match_reads(), READ responses against the READ requests of the other direction;
// - split_fpdus(), cutting a run of FPDUs from our transmitter into single FPDUs (one per TCP segment).
// Test code only: it allocates and reports problems as text.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/header.hpp"
#include "base/term_code.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/opcode.hpp"

namespace softrdma::wire {

// One DDP segment as received.
struct RecordedSegment {
    std::uint8_t opcode{0};
    bool tagged{false};
    bool last{false};
    ddp::TaggedHeader tagged_hdr{};      // when tagged
    ddp::UntaggedHeader untagged_hdr{};  // when untagged
    rdmap::ReadRequest read_request{};   // READ request
    rdmap::TerminateHeader terminate{};  // TERMINATE
    std::size_t payload_len{0};
    std::size_t payload_got{0};
    bool complete{false};  // on_ulpdu_end came: the whole FPDU is in and its CRC (when negotiated) verified
};

class UlpduRecorder {
public:
    // The opcode table's header length; 0 (invalid) for a reserved opcode, a T flag the opcode does not
    // have, or a DDP/RDMAP version other than 1.
    std::size_t ulpdu_header_length(std::uint16_t ctrl) const;
    // Records the segment. A bare control word (the deframer's report of an invalid one) is "unexpected
    // opcode"; a READ request with payload is an error too.
    ProtoStatus on_ulpdu_header(std::span<const std::byte> hdr, std::size_t payload_len);
    ProtoStatus on_ulpdu_payload(std::span<const std::byte> bytes);
    ProtoStatus on_ulpdu_end();

    std::vector<RecordedSegment> segments;
};

struct ReadResponseMessage {
    std::uint32_t stag{0};
    std::uint64_t to{0};  // of its first segment
    std::uint64_t length{0};
};

struct StreamReport {
    std::array<std::size_t, rdmap::kOpcodeCount> segments{};  // per opcode, complete segments
    std::array<std::size_t, rdmap::kOpcodeCount> messages{};  // per opcode, messages whose last segment came
    std::vector<rdmap::ReadRequest> read_requests;            // in stream order
    std::vector<ReadResponseMessage> read_responses;          // in stream order
    bool incomplete_tail{false};                              // the stream ends inside an FPDU
    std::vector<std::string> problems;                        // empty when the stream obeys every rule
};

// Checks a direction's segments: only the last may be incomplete; untagged segments name their opcode's
// queue, MSN starts at 1 per queue and goes up by one per message, MO counts the message's bytes; a tagged
// message keeps its STag and continues its TO; segments of one message share the opcode.
StreamReport check_segments(std::span<const RecordedSegment> segments);

// Problems found matching READ responses (in order) against the requests (in order) the other side sent:
// each response names the sink STag and TO and has the read size of the oldest request not yet answered.
// Requests left unanswered are fine when the stream was cut (`cut` true).
std::vector<std::string> match_reads(std::span<const rdmap::ReadRequest> requests,
                                     std::span<const ReadResponseMessage> responses, bool cut);

// Cuts a run of whole FPDUs (as FpduTx::write emits them) into single FPDUs. `stream_pos` is the run's
// position in the stream counted from the first FPDU (what FpduTx calls its stream position) and is advanced
// past the run; with `markers`, a Marker sits at every multiple of 512 and is counted in the FPDU it falls in.
std::vector<std::span<const std::byte>> split_fpdus(std::span<const std::byte> run, std::uint64_t& stream_pos,
                                                    bool markers);

}  // namespace softrdma::wire
