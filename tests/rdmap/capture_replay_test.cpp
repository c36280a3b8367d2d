// SPDX-License-Identifier: MIT
// Real Linux siw traffic (shared/captures) replayed into our rdmap::Endpoint through the real MPA deframer:
// every FPDU siw sent must pass our strict DDP/RDMAP checks (QN, MSN, MO, READ response matching) and
// complete, with no TERMINATE. The TCP streams come from the wire tests' pcap reader and reassembler.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <utility>
#include <vector>

#include "mpa/deframer.hpp"
#include "mpa/fpdu.hpp"
#include "mpa/frames.hpp"
#include "rdmap/duplex.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"
#include "tests/wire/pcap.hpp"
#include "tests/wire/tcp_flow.hpp"

using namespace softrdma;
using namespace softrdma::rdmap;

namespace {


// Any STag, any TO: memory in 4 KiB pages created on first touch (so lookups come back in pieces, like a
// region of scattered pages). Receives are always posted.
class PermissiveUpper final : public Upper {
public:
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<std::byte>> pages;
    std::map<std::uint32_t, std::vector<std::byte>> bound;
    std::size_t recvs{0}, reads{0}, terminates{0};

    Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, Access) override {
        std::vector<std::byte>& p = pages[{stag, to / 4096}];
        if (p.empty()) p.resize(4096);
        const std::size_t off = to % 4096;
        return {p.data() + off, std::min(len, 4096 - off), MemError::none};
    }
    MemError recv_begin(std::uint32_t msn) override {
        bound[msn].assign(1 << 17, std::byte{0});
        return MemError::none;
    }
    Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override {
        std::vector<std::byte>& b = bound[msn];
        if (mo >= b.size()) return {nullptr, 0, MemError::bounds};
        return {b.data() + mo, std::min(len, b.size() - mo), MemError::none};
    }
    MemError invalidate(std::uint32_t) override { return MemError::none; }
    void on_completion(const Completion& c) override {
        if (c.kind == WcKind::recv) {
            ++recvs;
            bound.erase(c.msn);
        }
        if (c.kind == WcKind::read) ++reads;
    }
    void on_terminate(const TermReport& t) override {
        ++terminates;
        FAIL_CHECK("TERMINATE " << (t.received ? "received" : "sent") << ": layer " << int(t.code.layer) << " etype "
                                << int(t.code.etype) << " ecode " << int(t.code.ecode));
    }
};

// Collects what a direction carries: its READ requests (in order) and how many SEND-type messages end in it.
struct Scanner {
    std::vector<ReadRequest> reads;
    std::size_t sends{0};
    std::uint8_t op{0};
    bool last{false};
    std::size_t ulpdu_header_length(std::uint16_t ctrl) {
        const OpInfo& i = kOpTable[ctrl_opcode(ctrl)];
        return i.valid ? i.hdr_len : 0;
    }
    ProtoStatus on_ulpdu_header(std::span<const std::byte> hdr, std::size_t) {
        if (hdr.size() < 2) return err::o_opcode;
        const std::uint16_t ctrl = load_be16(hdr, 0);
        op = ctrl_opcode(ctrl);
        last = ddp::ctrl_last(ctrl);
        if (op == static_cast<std::uint8_t>(Opcode::read_request)) reads.push_back(ReadRequest::decode(hdr));
        return std::nullopt;
    }
    ProtoStatus on_ulpdu_payload(std::span<const std::byte>) { return std::nullopt; }
    ProtoStatus on_ulpdu_end() {
        if (last && kOpTable[op].qn == kQnSend && !kOpTable[op].tagged) ++sends;
        return std::nullopt;
    }
};

Scanner scan(std::span<const std::byte> fpdus, bool crc) {
    Scanner s;
    mpa::Deframer<Scanner> d(mpa::DeframerConfig{.crc = crc});
    d.feed(fpdus, s);
    return s;
}

std::span<const std::byte> skip_frame(std::span<const std::byte> stream, mpa::FrameKind kind, bool& crc) {
    mpa::FrameDecoder dec(kind);
    const auto res = dec.feed(stream);
    REQUIRE(res.status == mpa::FrameDecoder::Status::done);
    crc = crc || dec.frame().crc;
    return stream.subspan(res.consumed);
}

// Replays `in` (FPDUs siw sent to this side) into an Endpoint that first issued the READs found in `out`
// (the FPDUs this side sent). Returns the upper layer's counts.
void replay(std::span<const std::byte> in, std::span<const std::byte> out, bool crc, std::size_t chunk,
            const char* what) {
    INFO(what << ", chunk " << chunk);
    const Scanner theirs = scan(in, crc);
    const Scanner ours = scan(out, crc);
    PermissiveUpper upper;
    mpa::FpduTx tx(mpa::FpduTxConfig{crc, false, 1448});
    FpduFramer framer(tx);
    const auto n_reads = static_cast<std::uint32_t>(ours.reads.size());
    Duplex ep(upper, framer, Config{.sq_depth = n_reads + 1, .ird = 4096, .ord = static_cast<std::uint16_t>(n_reads + 1)});
    for (const ReadRequest& rr : ours.reads) {
        WorkRequest w;
        w.op = WrOp::read;
        w.local_stag = rr.sink_stag;
        w.local_to = rr.sink_to;
        w.read_len = rr.size;
        w.remote_stag = rr.src_stag;
        w.remote_to = rr.src_to;
        REQUIRE(ep.post(w) == PostStatus::ok);
    }
    std::vector<std::byte> sink(1 << 16);
    while (ep.pull_tx(sink) != 0) {
    }
    CHECK(ep.orq_outstanding() == n_reads);
    mpa::Deframer<Duplex> deframer(mpa::DeframerConfig{.crc = crc});
    for (std::size_t at = 0; at < in.size() && ep.state() == State::operational; at += chunk) {
        CHECK_FALSE(receive(deframer, ep, in.subspan(at, std::min(chunk, in.size() - at))));
        while (ep.pull_tx(sink) != 0) {  // READ responses we owe: served from the permissive memory
        }
    }
    CHECK(ep.state() == State::operational);
    CHECK(upper.terminates == 0);
    CHECK(upper.recvs == theirs.sends);
    // A capture cut short may end inside a READ response; otherwise every READ we issued was answered.
    CHECK(upper.reads + ep.orq_outstanding() == n_reads);
    CHECK(ep.orq_outstanding() <= 1);
    std::cout << what << ": " << theirs.sends << " receives, " << upper.reads << "/" << n_reads << " READs answered, "
              << theirs.reads.size() << " READs served\n";
}

}  // namespace

TEST_CASE("siw captures replay into our Endpoint without a TERMINATE", "[rdmap][captures]") {
    const auto dir = wire::captures_dir();
    if (!std::filesystem::is_directory(dir)) {
        WARN("captures not found at " << dir << " (set SOFTRDMA_CAPTURES): skipping");
        SUCCEED();
        return;
    }
    for (const char* file : {"rping.pcapng", "rping_crc.pcapng", "rping_crcreq.pcapng", "rping_p2p.pcapng",
                             "ib_send_lat.pcapng", "ib_read_lat.pcapng", "ib_write_bw.pcapng"}) {
        DYNAMIC_SECTION(file) {
            const auto conns = wire::reassemble(wire::read_capture(dir / file));
            REQUIRE_FALSE(conns.empty());
            for (const wire::TcpConnection& c : conns) {
                bool crc = false;
                const auto client = skip_frame(std::as_bytes(std::span(c.client.bytes)), mpa::FrameKind::request, crc);
                const auto server = skip_frame(std::as_bytes(std::span(c.server.bytes)), mpa::FrameKind::reply, crc);
                const std::string name(file);
                replay(server, client, crc, 997, (name + " client side").c_str());
                replay(client, server, crc, 997, (name + " server side").c_str());
                if (client.size() + server.size() < 64 * 1024) {
                    replay(server, client, crc, 1, (name + " client side").c_str());
                    replay(client, server, crc, 1, (name + " server side").c_str());
                }
            }
        }
    }
}
