// SPDX-License-Identifier: MIT
// libFuzzer target: MPA connection setup (mpa/negotiation.hpp), both roles, on the peer's bytes.
// Input: [role/options][options][ird][ord][max_ird][split][decision][peer bytes...].
//   byte 0: bit 0 role (0 initiator, 1 responder), bits 1-2 CrcPolicy, bit 3 markers_rx, bit 4 markers_tx_ok,
//           bit 5 peer_to_peer, bit 6 revision 1 (else 2), bit 7 time out before the last piece;
//   byte 1: bits 0-2 RTR types offered/accepted (write, read, send), bits 3-7 private data length / 8;
//   split: how the peer's bytes are cut (see Splitter); decision: the responder's accept (bit 0) or reject,
//   and its private data length (bits 1-7 * 2, up to 254: some too long for a revision 2 reply).
// Invariants: input() never consumes more than it is given, and stops right after the peer's frame (what
// follows stays with the caller); our output is always one well-formed frame of the right kind that our own
// decoder reads back, with the flags we agreed; an agreement obeys the configured policy (CRC, Markers,
// revision, IRD/ORD limits, RTR choice among those offered and accepted); a failure with a TERMINATE names an
// MPA code; nothing changes after the outcome is final.
#include <array>
#include <vector>

#include "mpa/errors.hpp"
#include "mpa/frames.hpp"
#include "mpa/negotiation.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace softrdma;
using namespace softrdma::mpa;

namespace {

// Our output, read back with our own decoder.
Frame read_back(std::span<const std::byte> out, FrameKind kind) {
    FrameDecoder dec(kind);
    const auto r = dec.feed(out);
    FUZZ_CHECK(r.status == FrameDecoder::Status::done && r.consumed == out.size());
    return dec.frame();
}

bool rtr_allowed(RtrType t, const RtrSet& s) {
    return (t == RtrType::write && s.write) || (t == RtrType::read && s.read) || (t == RtrType::send && s.send);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    const std::uint8_t b0 = in.byte();
    const std::uint8_t b1 = in.byte();
    NegotiationConfig cfg;
    const bool responder = (b0 & 1) != 0;
    cfg.crc = static_cast<CrcPolicy>((b0 >> 1) & 3);
    cfg.markers_rx = (b0 & 8) != 0;
    cfg.markers_tx_ok = (b0 & 16) != 0;
    cfg.peer_to_peer = (b0 & 32) != 0;
    cfg.revision = (b0 & 64) != 0 ? 1 : 2;
    const bool time_out = (b0 & 128) != 0;
    cfg.rtr = RtrSet{(b1 & 1) != 0, (b1 & 2) != 0, (b1 & 4) != 0};
    std::array<std::byte, 248> pd{};
    for (std::size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<std::byte>(i * 13);
    cfg.private_data = std::span<const std::byte>(pd).first(static_cast<std::size_t>(b1 >> 3) * 8);
    cfg.ird = in.byte();
    cfg.ord = in.byte();
    cfg.max_ird = in.byte();
    fuzz::Splitter cut(in.byte());
    const std::uint8_t decision = in.byte();
    const std::span<const std::byte> peer = in.rest();

    const Clock::time_point t0{};
    Initiator ini(cfg);
    Responder rsp(cfg);
    Negotiator& neg = responder ? static_cast<Negotiator&>(rsp) : static_cast<Negotiator&>(ini);
    if (responder) {
        rsp.start(t0);
        FUZZ_CHECK(rsp.output().empty());
    } else {
        const Outcome o = ini.start(t0);
        if (o == Outcome::failed) return 0;  // a config we cannot send (P2P with revision 1)
        const Frame req = read_back(ini.output(), FrameKind::request);
        FUZZ_CHECK(req.revision == cfg.revision && req.markers == cfg.markers_rx);
        FUZZ_CHECK(req.crc == (cfg.crc == CrcPolicy::preferred || cfg.crc == CrcPolicy::required));
        FUZZ_CHECK(req.private_data().size() == cfg.private_data.size());
        ini.output_sent(ini.output().size());
    }

    std::size_t fed = 0, used = 0;
    while (fed < peer.size()) {
        const std::size_t k = cut.next(peer.size() - fed);
        const std::span<const std::byte> piece = peer.subspan(fed, k);
        const bool last = fed + k == peer.size();
        const Clock::time_point now = t0 + (time_out && last ? std::chrono::seconds(11) : std::chrono::seconds(0));
        const Outcome before = neg.outcome();
        const std::size_t c = responder ? rsp.input(piece, now) : ini.input(piece, now);
        FUZZ_CHECK(c <= k);
        fed += k;
        used += c;
        if (before != Outcome::in_progress) FUZZ_CHECK(c == 0 && neg.outcome() == before);
        if (c < k) FUZZ_CHECK(neg.outcome() != Outcome::in_progress);  // stopped: the frame ended or failed
    }
    FUZZ_CHECK(used <= peer.size());

    if (responder && rsp.outcome() == Outcome::request_received) {
        const Agreed pre = rsp.agreed();
        const std::size_t pdl = static_cast<std::size_t>(decision >> 1) * 2;
        const std::span<const std::byte> our_pd = std::span<const std::byte>(pd).first(std::min(pdl, pd.size()));
        const bool ok = (decision & 1) != 0 ? rsp.accept(our_pd, cfg.ird, cfg.ord) : rsp.reject(our_pd);
        const std::size_t limit = pre.revision == 2 && pre.enhanced ? kMaxAppPrivateDataV2 : kMaxPrivateDataSent;
        FUZZ_CHECK(ok == (our_pd.size() <= limit));
        if (!ok) FUZZ_CHECK(rsp.outcome() == Outcome::request_received && rsp.output().empty());
        if (ok) {
            const Frame rep = read_back(rsp.output(), FrameKind::reply);
            FUZZ_CHECK(rep.reject == ((decision & 1) == 0));
            FUZZ_CHECK(rep.crc == pre.crc && rep.markers == cfg.markers_rx && rep.revision == pre.revision);
            FUZZ_CHECK(rep.private_data().size() == our_pd.size());
        }
    }

    const Outcome o = neg.outcome();
    const Agreed& a = neg.agreed();
    if (o == Outcome::agreed) {
        FUZZ_CHECK(a.revision <= cfg.revision);
        if (!responder) FUZZ_CHECK(a.revision >= 1);  // a responder answers a revision 0 (draft) request in kind
        if (cfg.crc == CrcPolicy::required || cfg.crc == CrcPolicy::preferred) FUZZ_CHECK(a.crc);
        if (cfg.crc == CrcPolicy::forbidden) FUZZ_CHECK(!a.crc);
        FUZZ_CHECK(a.markers_rx == cfg.markers_rx);
        if (a.markers_tx) FUZZ_CHECK(cfg.markers_tx_ok);
        if (a.p2p) FUZZ_CHECK(a.enhanced && rtr_allowed(a.rtr, cfg.rtr));
        if (!responder) {
            FUZZ_CHECK(a.p2p == cfg.peer_to_peer);
            FUZZ_CHECK(a.ird <= std::max(cfg.ird, cfg.max_ird));
            FUZZ_CHECK(a.ord <= std::max<std::uint16_t>(cfg.ord, 1));
            FUZZ_CHECK(neg.output().empty());  // the initiator sends nothing more
        } else {
            FUZZ_CHECK(a.responder_waits_for_first_fpdu);
            if (a.p2p) FUZZ_CHECK(cfg.peer_to_peer);
        }
        const DeframerConfig rx = rx_config(a);
        const FpduTxConfig tx = tx_config(a, 1448);
        FUZZ_CHECK(rx.crc == a.crc && tx.crc == a.crc && rx.markers == a.markers_rx && tx.markers == a.markers_tx);
    } else if (o == Outcome::failed) {
        const Failure& f = neg.failure();
        FUZZ_CHECK(f.code.layer == TermLayer::llp && f.code.etype == kLlpErrorTypeMpa);
        FUZZ_CHECK(f.code.ecode >= 0x01 && f.code.ecode <= 0x07);
        if (f.send_terminate) FUZZ_CHECK(!responder);  // only the initiator answers a reply with a TERMINATE
        if (!responder) FUZZ_CHECK(neg.output().empty());
        if (!neg.output().empty()) FUZZ_CHECK(read_back(neg.output(), FrameKind::reply).reject);
    }
    if (responder && o == Outcome::rejected && !neg.output().empty())
        FUZZ_CHECK(read_back(neg.output(), FrameKind::reply).reject);

    // Final outcomes stay final, and take no more bytes.
    if (o != Outcome::in_progress && o != Outcome::request_received) {
        const std::byte more[32] = {};
        const std::size_t c = responder ? rsp.input(more, t0 + std::chrono::seconds(60))
                                        : ini.input(more, t0 + std::chrono::seconds(60));
        FUZZ_CHECK(c == 0 && neg.outcome() == o);
        FUZZ_CHECK(neg.poll(t0 + std::chrono::seconds(60)) == o);
    }
    return 0;
}
