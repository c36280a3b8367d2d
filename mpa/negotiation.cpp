// SPDX-License-Identifier: MIT
#include "mpa/negotiation.hpp"

#include <algorithm>
#include <cstring>

// <softrdma/iwarp.hpp>'s private data holder (MPA is what carries it).
void softrdma::PrivateData::assign(std::span<const std::byte> s) {
    size = static_cast<std::uint16_t>(std::min(s.size(), bytes.size()));
    if (size) std::memcpy(bytes.data(), s.data(), size);
}

namespace softrdma::mpa {
namespace {

std::chrono::steady_clock::duration to_clock(std::chrono::nanoseconds d) {
    return std::chrono::duration_cast<Clock::duration>(d);
}

bool asks_crc(CrcPolicy p) { return p == CrcPolicy::preferred || p == CrcPolicy::required; }

}  // namespace


// ---- common ---------------------------------------------------------------------------------------------------

Outcome Negotiator::poll(Clock::time_point now) {
    if (timer_armed_ && outcome_ == Outcome::in_progress && now >= deadline_) {
        timer_armed_ = false;
        return fail(FailReason::timeout, kTermConnectionLost, false);
    }
    return outcome_;
}

void Negotiator::queue(const FrameParams& p) {
    out_len_ = encode_frame(out_, p);
    out_sent_ = 0;
}

Outcome Negotiator::fail(FailReason r, TermCode code, bool terminate) {
    failure_ = Failure{r, code, terminate};
    outcome_ = Outcome::failed;
    timer_armed_ = false;
    return outcome_;
}

// ---- initiator ------------------------------------------------------------------------------------------------

Outcome Initiator::start(Clock::time_point now) {
    if (cfg_.revision != 1 && cfg_.revision != 2) return fail(FailReason::protocol, kTermLocalCatastrophic, false);
    sent_crc_ = asks_crc(cfg_.crc);
    // Revision 2: always the enhanced form with IRD/ORD (RFC 6581 s3), as siw and cxgb4 send it.
    IrdOrd io{static_cast<std::uint16_t>(cfg_.ird & kIrdOrdMask), static_cast<std::uint16_t>(cfg_.ord & kIrdOrdMask)};
    if (cfg_.peer_to_peer) {
        io.peer_to_peer = true;
        io.write_rtr = cfg_.rtr.write;
        io.read_rtr = cfg_.rtr.read;
        io.send_rtr = cfg_.rtr.send;
    }
    const FrameParams p{FrameKind::request, cfg_.markers_rx, sent_crc_, false, cfg_.revision,
                        cfg_.revision == 2 ? &io : nullptr, cfg_.private_data};
    if (cfg_.peer_to_peer && cfg_.revision != 2) return fail(FailReason::protocol, kTermLocalCatastrophic, false);
    queue(p);
    if (out_len_ == 0) return fail(FailReason::protocol, kTermLocalCatastrophic, false);
    deadline_ = now + to_clock(cfg_.reply_timeout);
    timer_armed_ = true;
    outcome_ = Outcome::in_progress;
    return outcome_;
}

std::size_t Initiator::input(std::span<const std::byte> in, Clock::time_point now) {
    if (poll(now) != Outcome::in_progress || !timer_armed_) return 0;
    const auto r = dec_.feed(in);
    if (r.status == FrameDecoder::Status::error) {
        // Bad key or malformed reply: TERMINATE, LLP/MPA 0x04 (siw does the same for a bad key).
        fail(FailReason::protocol, dec_.error(), true);
    } else if (r.status == FrameDecoder::Status::done) {
        timer_armed_ = false;
        evaluate_reply();
    }
    return r.consumed;
}

void Initiator::evaluate_reply() {
    const Frame& f = dec_.frame();
    agreed_.revision = f.revision;
    agreed_.crc = sent_crc_ || f.crc;  // RFC 5044 s7.1: C in either frame -> both use CRC
    agreed_.markers_rx = cfg_.markers_rx;
    agreed_.markers_tx = f.markers;
    agreed_.peer_private_data.assign(f.private_data());
    agreed_.ird = cfg_.ird;
    agreed_.ord = cfg_.ord;

    if (f.reject) {
        outcome_ = Outcome::rejected;
        return;
    }
    if (f.revision == 0 || f.revision > cfg_.revision) {  // must not answer above what we offered
        fail(FailReason::protocol, kTermInvalidFrame, true);
        return;
    }
    if (f.markers && !cfg_.markers_tx_ok) {
        fail(FailReason::unsupported, kTermInvalidFrame, false);
        return;
    }
    if ((cfg_.crc == CrcPolicy::required && !f.crc) || (cfg_.crc == CrcPolicy::forbidden && f.crc)) {
        fail(FailReason::unsupported, kTermInvalidFrame, false);
        return;
    }
    if (cfg_.revision == 2 && f.revision == 2) {
        // RFC 6581: an enhanced request gets an enhanced reply.
        if (!f.enhanced) {
            fail(FailReason::protocol, kTermInvalidFrame, true);
            return;
        }
        agreed_.enhanced = true;
        const IrdOrd& rep = f.ird_ord;
        // The responder's ORD must fit our IRD (we may grow to max_ird); our ORD is cut to its IRD.
        if (rep.ord > cfg_.ird) {
            if (rep.ord > std::max(cfg_.max_ird, cfg_.ird)) {
                fail(FailReason::insufficient_ird, kTermInsufficientIrd, true);
                return;
            }
            agreed_.ird = rep.ord;
        }
        agreed_.ord = std::min(cfg_.ord, rep.ird);
        if (cfg_.peer_to_peer) {
            RtrType t = RtrType::none;
            if (rep.peer_to_peer) {
                if (rep.write_rtr && cfg_.rtr.write)
                    t = RtrType::write;
                else if (rep.read_rtr && cfg_.rtr.read)
                    t = RtrType::read;
                else if (rep.send_rtr && cfg_.rtr.send)
                    t = RtrType::send;
            }
            if (t == RtrType::none) {
                fail(FailReason::no_matching_rtr, kTermNoMatchingRtr, true);
                return;
            }
            agreed_.p2p = true;
            agreed_.rtr = t;
            // A READ RTR needs one outstanding READ on our side.
            if (t == RtrType::read && agreed_.ord == 0) agreed_.ord = 1;
        }
    } else if (cfg_.peer_to_peer) {
        // Revision 1 reply: no way to agree on an RTR.
        fail(FailReason::no_matching_rtr, kTermNoMatchingRtr, true);
        return;
    }
    outcome_ = Outcome::agreed;
}

// ---- responder ------------------------------------------------------------------------------------------------

void Responder::start(Clock::time_point now) {
    deadline_ = now + to_clock(cfg_.request_timeout);
    timer_armed_ = true;
    outcome_ = Outcome::in_progress;
}

std::size_t Responder::input(std::span<const std::byte> in, Clock::time_point now) {
    if (poll(now) != Outcome::in_progress || !timer_armed_) return 0;
    const auto r = dec_.feed(in);
    if (r.status == FrameDecoder::Status::error) {
        // Not an MPA request: nothing to reply to, close (siw does the same).
        fail(FailReason::protocol, dec_.error(), false);
    } else if (r.status == FrameDecoder::Status::done) {
        timer_armed_ = false;
        evaluate_request();
    }
    return r.consumed;
}

Outcome Responder::auto_reject(FailReason r, TermCode code) {
    // Reply with R set, echoing what we can, then report the failure.
    const FrameParams p{FrameKind::reply, false, agreed_.crc, true, reply_revision_, nullptr, {}};
    queue(p);
    return fail(r, code, false);
}

void Responder::evaluate_request() {
    const Frame& f = dec_.frame();
    reply_revision_ = static_cast<std::uint8_t>(std::min<unsigned>(f.revision, cfg_.revision == 1 ? 1u : 2u));
    agreed_.revision = reply_revision_;
    agreed_.crc = f.crc || asks_crc(cfg_.crc);
    agreed_.markers_rx = cfg_.markers_rx;
    agreed_.markers_tx = f.markers;
    agreed_.peer_private_data.assign(f.private_data());
    agreed_.responder_waits_for_first_fpdu = true;
    agreed_.ird = cfg_.ird;
    agreed_.ord = cfg_.ord;

    if (f.revision > 2) {  // no reply: the connection closes (siw's -EPROTO; Chelsio aborts)
        fail(FailReason::protocol, kTermInvalidFrame, false);
        return;
    }
    if (f.markers && !cfg_.markers_tx_ok) {
        auto_reject(FailReason::unsupported, kTermInvalidFrame);
        return;
    }
    if (cfg_.crc == CrcPolicy::forbidden && f.crc) {
        agreed_.crc = false;
        auto_reject(FailReason::unsupported, kTermInvalidFrame);
        return;
    }
    agreed_.enhanced = reply_revision_ == 2 && f.enhanced;
    if (agreed_.enhanced && f.ird_ord.peer_to_peer) {
        const IrdOrd& req = f.ird_ord;
        RtrType t = RtrType::none;
        if (cfg_.peer_to_peer) {
            if (req.write_rtr && cfg_.rtr.write)
                t = RtrType::write;
            else if (req.read_rtr && cfg_.rtr.read)
                t = RtrType::read;
            else if (req.send_rtr && cfg_.rtr.send)
                t = RtrType::send;
            else if (!req.write_rtr && !req.read_rtr && !req.send_rtr && cfg_.rtr.write)
                t = RtrType::write;  // P2P without a type: propose WRITE, as siw
        }
        if (t == RtrType::none) {
            auto_reject(FailReason::no_matching_rtr, kTermNoMatchingRtr);
            return;
        }
        agreed_.p2p = true;
        agreed_.rtr = t;
    }
    outcome_ = Outcome::request_received;
}

bool Responder::accept(std::span<const std::byte> private_data, std::uint16_t ird, std::uint16_t ord) {
    if (outcome_ != Outcome::request_received) return false;
    const Frame& f = dec_.frame();
    IrdOrd io{};
    if (agreed_.enhanced) {
        // Our ORD is cut to the initiator's IRD; a READ RTR needs one inbound READ slot here.
        ird = static_cast<std::uint16_t>(ird & kIrdOrdMask);
        ord = static_cast<std::uint16_t>(std::min<unsigned>(ord & kIrdOrdMask, f.ird_ord.ird));
        if (agreed_.rtr == RtrType::read && ird == 0) ird = 1;
        io.ird = ird;
        io.ord = ord;
        io.peer_to_peer = agreed_.p2p;
        io.write_rtr = agreed_.rtr == RtrType::write;
        io.read_rtr = agreed_.rtr == RtrType::read;
        io.send_rtr = agreed_.rtr == RtrType::send;
    }
    const FrameParams p{FrameKind::reply, cfg_.markers_rx, agreed_.crc, false, reply_revision_,
                        agreed_.enhanced ? &io : nullptr, private_data};
    if (frame_size(p) == 0) return false;
    queue(p);
    agreed_.ird = ird;
    agreed_.ord = ord;
    outcome_ = Outcome::agreed;
    return true;
}

bool Responder::reject(std::span<const std::byte> private_data) {
    if (outcome_ != Outcome::request_received) return false;
    IrdOrd io{static_cast<std::uint16_t>(cfg_.ird & kIrdOrdMask), static_cast<std::uint16_t>(cfg_.ord & kIrdOrdMask)};
    const FrameParams p{FrameKind::reply, cfg_.markers_rx, agreed_.crc, true, reply_revision_,
                        agreed_.enhanced ? &io : nullptr, private_data};
    if (frame_size(p) == 0) return false;
    queue(p);
    outcome_ = Outcome::rejected;
    return true;
}

}  // namespace softrdma::mpa
