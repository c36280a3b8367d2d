// SPDX-License-Identifier: MIT
#include "tests/wire/iwarp_trace.hpp"

#include <optional>
#include <sstream>
#include <stdexcept>

#include "mpa/fpdu.hpp"

namespace softrdma::wire {
namespace {

template <class... Args>
std::string text(const Args&... args) {
    std::ostringstream s;
    (s << ... << args);
    return s.str();
}

}  // namespace

std::size_t UlpduRecorder::ulpdu_header_length(std::uint16_t ctrl) const {
    const rdmap::OpInfo& op = rdmap::kOpTable[rdmap::ctrl_opcode(ctrl)];
    if (!op.valid || op.tagged != ddp::ctrl_tagged(ctrl) || ddp::ctrl_ddp_version(ctrl) != ddp::kDdpVersion ||
        rdmap::ctrl_rdmap_version(ctrl) != rdmap::kRdmapVersion)
        return 0;
    return op.hdr_len;
}

ProtoStatus UlpduRecorder::on_ulpdu_header(std::span<const std::byte> hdr, std::size_t payload_len) {
    if (hdr.size() <= 2) return rdmap::err::o_opcode;
    RecordedSegment s;
    const std::uint16_t ctrl = load_be16(hdr, 0);
    s.opcode = rdmap::ctrl_opcode(ctrl);
    s.tagged = ddp::ctrl_tagged(ctrl);
    s.last = ddp::ctrl_last(ctrl);
    s.payload_len = payload_len;
    if (s.tagged) {
        s.tagged_hdr = *ddp::TaggedHeader::decode(hdr);
    } else {
        s.untagged_hdr = *ddp::UntaggedHeader::decode(hdr);
    }
    if (s.opcode == static_cast<std::uint8_t>(rdmap::Opcode::read_request)) {
        if (payload_len != 0) return rdmap::err::o_unspecified;
        s.read_request = rdmap::ReadRequest::decode(hdr);
    }
    if (s.opcode == static_cast<std::uint8_t>(rdmap::Opcode::terminate)) s.terminate = rdmap::TerminateHeader::decode(hdr);
    segments.push_back(s);
    return std::nullopt;
}

ProtoStatus UlpduRecorder::on_ulpdu_payload(std::span<const std::byte> bytes) {
    segments.back().payload_got += bytes.size();
    return std::nullopt;
}

ProtoStatus UlpduRecorder::on_ulpdu_end() {
    RecordedSegment& s = segments.back();
    if (s.payload_got != s.payload_len) return rdmap::err::local_catastrophic;  // the deframer broke its contract
    s.complete = true;
    return std::nullopt;
}

StreamReport check_segments(std::span<const RecordedSegment> segments) {
    StreamReport r;
    struct Queue {
        std::uint32_t msn{1};
        std::uint32_t mo{0};
        std::optional<std::uint8_t> opcode;  // of the message in progress
    };
    std::array<Queue, rdmap::kQueueCount> queues{};
    struct Tagged {
        std::uint32_t stag{0};
        std::uint64_t first_to{0}, next_to{0};
        std::uint8_t opcode{0};
    };
    std::optional<Tagged> tagged;  // the tagged message in progress

    for (std::size_t i = 0; i < segments.size(); ++i) {
        const RecordedSegment& s = segments[i];
        const rdmap::OpInfo& op = rdmap::kOpTable[s.opcode];
        auto problem = [&](const auto&... what) { r.problems.push_back(text("segment ", i, " (", op.name, "): ", what...)); };
        if (!s.complete) {
            if (i + 1 == segments.size()) {
                r.incomplete_tail = true;
            } else {
                problem("incomplete but followed by more segments");
            }
            break;
        }
        ++r.segments[s.opcode];
        if (s.tagged) {
            const ddp::TaggedHeader& h = s.tagged_hdr;
            if (!tagged) {
                tagged = Tagged{h.stag, h.to, h.to, s.opcode};
            } else if (h.stag != tagged->stag || h.to != tagged->next_to || s.opcode != tagged->opcode) {
                problem("STag/TO ", h.stag, "/", h.to, " does not continue ", tagged->stag, "/", tagged->next_to);
            }
            tagged->next_to = h.to + s.payload_len;
            if (s.last) {
                if (s.opcode == static_cast<std::uint8_t>(rdmap::Opcode::read_response))
                    r.read_responses.push_back({tagged->stag, tagged->first_to, tagged->next_to - tagged->first_to});
                ++r.messages[s.opcode];
                tagged.reset();
            }
            continue;
        }
        const ddp::UntaggedHeader& h = s.untagged_hdr;
        if (h.qn != op.qn || h.qn >= queues.size()) {
            problem("queue ", h.qn, ", the opcode's queue is ", unsigned{op.qn});
            continue;
        }
        Queue& q = queues[h.qn];
        if (h.msn != q.msn) problem("queue ", h.qn, " MSN ", h.msn, ", expected ", q.msn);
        if (h.mo != q.mo) problem("queue ", h.qn, " MO ", h.mo, ", expected ", q.mo);
        if (q.opcode && *q.opcode != s.opcode) problem("opcode changes inside a message");
        if (s.opcode == static_cast<std::uint8_t>(rdmap::Opcode::read_request)) r.read_requests.push_back(s.read_request);
        if (s.last) {
            ++r.messages[s.opcode];
            q = Queue{h.msn + 1, 0, std::nullopt};
        } else {
            q = Queue{h.msn, static_cast<std::uint32_t>(h.mo + s.payload_len), s.opcode};
        }
    }
    return r;
}

std::vector<std::string> match_reads(std::span<const rdmap::ReadRequest> requests,
                                     std::span<const ReadResponseMessage> responses, bool cut) {
    std::vector<std::string> problems;
    for (std::size_t i = 0; i < responses.size(); ++i) {
        if (i >= requests.size()) {
            problems.push_back(text("READ response ", i, " answers no request"));
            continue;
        }
        const rdmap::ReadRequest& rq = requests[i];
        const ReadResponseMessage& rs = responses[i];
        if (rs.stag != rq.sink_stag || rs.to != rq.sink_to || rs.length != rq.size)
            problems.push_back(text("READ response ", i, " STag/TO/length ", rs.stag, "/", rs.to, "/", rs.length,
                                    " does not match request ", rq.sink_stag, "/", rq.sink_to, "/", rq.size));
    }
    if (!cut && requests.size() > responses.size())
        problems.push_back(text(requests.size() - responses.size(), " READ requests unanswered"));
    return problems;
}

std::vector<std::span<const std::byte>> split_fpdus(std::span<const std::byte> run, std::uint64_t& stream_pos,
                                                    bool markers) {
    std::vector<std::span<const std::byte>> fpdus;
    std::size_t at = 0;
    while (at < run.size()) {
        const std::uint64_t start = stream_pos;
        const std::size_t len_at = at + (markers && start % mpa::kMarkerInterval == 0 ? mpa::kMarkerSize : 0);
        if (len_at + 2 > run.size()) throw std::runtime_error("split_fpdus: run ends inside an FPDU header");
        std::size_t total = mpa::fpdu_size_unmarked(load_be16(run, len_at));
        if (markers) {
            const std::uint64_t interval = mpa::kMarkerInterval;
            for (std::uint64_t m = (start + interval - 1) / interval * interval; m < start + total; m += interval)
                total += mpa::kMarkerSize;
        }
        if (at + total > run.size()) throw std::runtime_error("split_fpdus: run ends inside an FPDU");
        fpdus.push_back(run.subspan(at, total));
        at += total;
        stream_pos += total;
    }
    return fpdus;
}

}  // namespace softrdma::wire
