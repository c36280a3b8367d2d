// SPDX-License-Identifier: MIT
// Seed corpora for the fuzz targets, written fresh into a directory (nothing binary is kept in git):
//   fuzz_seeds OUT_DIR [CAPTURES_DIR]
// writes OUT_DIR/<target>/<name> for every target, from
//  - our own encoders: MPA Request/Reply frames, FPDU streams with and without Markers and CRC, a peer
//    (tests/rdmap/harness.hpp) running SEND, WRITE with Immediate Data, READ and atomics against the rdmap rig,
//    TERMINATEs with their attached headers, TCP frames from the wire tests' session writer;
//  - the real Linux siw captures (CAPTURES_DIR, usually ../shared/captures; skipped when absent): MPA
//    Requests and Replies, each direction's FPDUs, and the Ethernet frames themselves;
//  - the shapes behind known siw receive-path bugs: an FPDU whose length is shorter than its DDP header, a
//    tagged WRITE whose length covers no payload, and errors before the receive context is set (a bad first
//    length, control word or CRC).
// Every seed starts with the option bytes its target reads (see each target's header comment).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/header.hpp"
#include "mpa/fpdu.hpp"
#include "mpa/frames.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/opcode.hpp"
#include "tests/fuzz/rdmap_rig.hpp"
#include "tests/rdmap/harness.hpp"
#include "tests/wire/pcap.hpp"
#include "tests/wire/tcp_flow.hpp"

using namespace softrdma;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<std::byte>;

fs::path g_out;
std::size_t g_count = 0;

void write_seed(const std::string& target, const std::string& name, std::initializer_list<std::uint8_t> head,
                std::span<const std::byte> body) {
    const fs::path dir = g_out / target;
    fs::create_directories(dir);
    std::ofstream f(dir / name, std::ios::binary);
    for (std::uint8_t b : head) f.put(static_cast<char>(b));
    f.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
    ++g_count;
}

Bytes fpdu(mpa::FpduTx& tx, std::span<const std::byte> hdr, std::span<const std::byte> payload = {}) {
    Bytes out(tx.wire_size(hdr.size() + payload.size()) + 8);
    out.resize(tx.write(out, hdr, payload));
    return out;
}
Bytes cat(std::initializer_list<Bytes> parts) {
    Bytes all;
    for (const Bytes& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
}
Bytes tagged_hdr(rdmap::Opcode op, bool last, std::uint32_t stag, std::uint64_t to) {
    Bytes h(ddp::kTaggedHeaderLen);
    ddp::TaggedHeader{ddp::ctrl_with_last(rdmap::kOpTable[static_cast<std::size_t>(op)].ctrl, last), stag, to}.encode(h);
    return h;
}
Bytes untagged_hdr(rdmap::Opcode op, bool last, std::uint32_t qn, std::uint32_t msn, std::uint32_t mo) {
    const rdmap::OpInfo& i = rdmap::kOpTable[static_cast<std::size_t>(op)];
    Bytes h(i.hdr_len);
    ddp::UntaggedHeader{ddp::ctrl_with_last(i.ctrl, last), 0, qn, msn, mo}.encode(h);
    return h;
}
Bytes pattern(std::size_t n, std::uint8_t seed) {
    Bytes v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 7);
    return v;
}

// ---- the siw-bug shapes, as FPDU streams (crc: framed with the CRC) -----------------------------------------
struct Shape {
    std::string name;
    Bytes stream;
};
std::vector<Shape> siw_shapes(bool crc) {
    mpa::FpduTx tx(mpa::FpduTxConfig{crc, false, 1448});
    std::vector<Shape> s;
    // An FPDU length shorter than its header: a tagged WRITE cut to 10 of its 14 header octets, and an
    // untagged SEND cut to 12 of 18, then a good SEND behind it.
    const Bytes w = tagged_hdr(rdmap::Opcode::write, true, fuzz::kStagWrite, 0);
    s.push_back({"short_len_tagged", fpdu(tx, std::span(w).first(10))});
    const Bytes sh = untagged_hdr(rdmap::Opcode::send, true, rdmap::kQnSend, 1, 0);
    mpa::FpduTx tx2(mpa::FpduTxConfig{crc, false, 1448});
    s.push_back({"short_len_untagged", cat({fpdu(tx2, std::span(sh).first(12)), fpdu(tx2, sh, pattern(20, 1))})});
    // A tagged WRITE whose length covers no payload: inside, at the end of, and past a region; unknown STag.
    for (std::uint64_t to : {std::uint64_t{0}, std::uint64_t{399}, std::uint64_t{400}, std::uint64_t{0xfffffffffffffff0}}) {
        mpa::FpduTx t(mpa::FpduTxConfig{crc, false, 1448});
        s.push_back({"write_no_payload_to" + std::to_string(to), fpdu(t, tagged_hdr(rdmap::Opcode::write, true, fuzz::kStagWrite, to))});
    }
    {
        mpa::FpduTx t(mpa::FpduTxConfig{crc, false, 1448});
        s.push_back({"write_no_payload_not_last",
                     cat({fpdu(t, tagged_hdr(rdmap::Opcode::write, false, fuzz::kStagWrite, 8)),
                          fpdu(t, tagged_hdr(rdmap::Opcode::write, true, fuzz::kStagWrite, 8), pattern(5, 2))})});
        mpa::FpduTx u(mpa::FpduTxConfig{crc, false, 1448});
        s.push_back({"write_no_payload_bad_stag", fpdu(u, tagged_hdr(rdmap::Opcode::write, true, 0xdead, 0))});
    }
    // Errors before the receive context is set: a first length of 0 or 1, a bad first control word, a first
    // FPDU with a bad CRC, a first SEND in the middle of its message.
    s.push_back({"first_len_0", Bytes{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}}});
    s.push_back({"first_len_1", Bytes{std::byte{0}, std::byte{1}, std::byte{0x41}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}}});
    {
        mpa::FpduTx t(mpa::FpduTxConfig{crc, false, 1448});
        Bytes bad = untagged_hdr(rdmap::Opcode::send, true, rdmap::kQnSend, 1, 0);
        bad[0] = std::byte{0x42};  // DDP version 2
        s.push_back({"first_bad_version", fpdu(t, bad, pattern(8, 3))});
        mpa::FpduTx t2(mpa::FpduTxConfig{crc, false, 1448});
        Bytes c = fpdu(t2, sh, pattern(30, 4));
        c[c.size() - 1] ^= std::byte{1};  // the CRC (or, without CRC, its zero field)
        c[20] ^= std::byte{0x10};         // and a payload byte
        s.push_back({"first_bad_crc", c});
        mpa::FpduTx t3(mpa::FpduTxConfig{crc, false, 1448});
        s.push_back({"first_send_mid_message", fpdu(t3, untagged_hdr(rdmap::Opcode::send, true, rdmap::kQnSend, 1, 100), pattern(10, 5))});
        mpa::FpduTx t4(mpa::FpduTxConfig{crc, false, 1448});
        s.push_back({"first_read_response_unasked", fpdu(t4, tagged_hdr(rdmap::Opcode::read_response, true, 0x777, 0), pattern(16, 6))});
    }
    return s;
}

// ---- rdmap: a peer running every operation against the rig -----------------------------------------------
Bytes peer_stream(const fuzz::RigConfig& rc, std::uint32_t emss) {
    fuzz::Rig rig(rc);
    test::SideConfig sc;
    sc.ep.rfc7306 = rc.rfc7306;
    sc.crc = rc.crc;
    sc.emss = emss;
    test::Side a(sc);
    a.upper.add_region(fuzz::kPeerSource, 256);
    a.upper.add_region(fuzz::kPeerAtomic, 16);
    a.upper.add_region(0x200, 64);
    a.feed(rig.requests);  // the rig's READ and atomic: a answers them

    const Bytes p300 = pattern(300, 1), p200 = pattern(200, 2), p1 = pattern(1, 3), p500 = pattern(500, 4), p64 = pattern(64, 5);
    auto send = [&](std::uint64_t id, const Bytes& b) {
        rdmap::WorkRequest w;
        w.wr_id = id;
        w.op = rdmap::WrOp::send;
        w.sgl[0] = b;
        w.num_sge = 1;
        return w;
    };
    rdmap::WorkRequest w1 = send(1, p300);
    w1.sgl[0] = std::span(p300).first(100);
    w1.sgl[1] = std::span(p300).subspan(100);
    w1.num_sge = 2;
    a.ep.post(w1);
    rdmap::WorkRequest w2 = send(2, p200);
    w2.op = rdmap::WrOp::write;
    w2.remote_stag = fuzz::kStagWrite;
    w2.remote_to = 10;
    w2.with_imm = rc.rfc7306;
    w2.imm = 0x1122334455667788;
    a.ep.post(w2);
    if (!rc.rfc7306) a.ep.post(send(9, p1));  // takes the receive the Immediate Data would take
    rdmap::WorkRequest w3 = send(3, p1);
    w3.solicited = true;
    a.ep.post(w3);
    rdmap::WorkRequest w4;  // zero-length WRITE to STag 1 (siw's RTR)
    w4.wr_id = 4;
    w4.op = rdmap::WrOp::write;
    w4.remote_stag = fuzz::kStagRtr;
    a.ep.post(w4);
    rdmap::WorkRequest r;
    r.wr_id = 5;
    r.op = rdmap::WrOp::read;
    r.local_stag = 0x200;
    r.remote_stag = fuzz::kStagSource;
    r.remote_to = 100;
    r.read_len = 64;
    a.ep.post(r);
    if (rc.rfc7306) {
        rdmap::WorkRequest f;
        f.wr_id = 6;
        f.op = rdmap::WrOp::cmp_swap;
        f.remote_stag = fuzz::kStagAtomic;
        f.remote_to = 8;
        f.compare = 0;
        f.swap_add = 9;
        a.ep.post(f);
    }
    rdmap::WorkRequest w7 = send(7, p500);
    w7.with_inv = true;
    w7.inv_stag = fuzz::kStagWrite;
    a.ep.post(w7);
    a.ep.post(send(8, p64));
    const Bytes wire = a.drain();

    // It must run clean through the rig (else the seed would only test the first error).
    fuzz::Rig check(rc);
    check.feed(wire);
    if (!check.upper.terminates.empty())
        std::fprintf(stderr, "fuzz_seeds: warning: peer stream (flags %u) ends in a TERMINATE (%u/%u/%u)\n", rc.flags(),
                     static_cast<unsigned>(check.upper.terminates[0].cause.layer), check.upper.terminates[0].cause.etype,
                     check.upper.terminates[0].cause.ecode);
    return wire;
}

// ---- captures --------------------------------------------------------------------------------------------
struct CapturedConnection {
    std::string name;
    Bytes request, reply;  // MPA frames
    Bytes client_fpdus, server_fpdus;
    bool crc{false};
};

Bytes take_frame(std::span<const std::byte>& s, mpa::FrameKind kind, bool& ok, bool& crc) {
    mpa::FrameDecoder dec(kind);
    const auto r = dec.feed(s);
    ok = r.status == mpa::FrameDecoder::Status::done;
    if (ok) crc = crc || dec.frame().crc;
    Bytes f(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(r.consumed));
    s = s.subspan(r.consumed);
    return f;
}

std::vector<CapturedConnection> read_captures(const fs::path& dir, std::vector<wire::Frame>& frames_out) {
    std::vector<CapturedConnection> out;
    if (dir.empty() || !fs::is_directory(dir)) {
        std::fprintf(stderr, "fuzz_seeds: no captures at %s: seeds from our encoders only\n", dir.c_str());
        return out;
    }
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string ext = e.path().extension().string();
        if (ext != ".pcap" && ext != ".pcapng") continue;
        std::vector<wire::Frame> frames;
        try {
            frames = wire::read_capture(e.path());
        } catch (const std::exception& ex) {
            std::fprintf(stderr, "fuzz_seeds: skipping %s: %s\n", e.path().c_str(), ex.what());
            continue;
        }
        for (std::size_t i = 0; i < frames.size() && i < 60; ++i) frames_out.push_back(frames[i]);
        std::size_t n = 0;
        for (const wire::TcpConnection& c : wire::reassemble(frames)) {
            auto cb = std::as_bytes(std::span(c.client.bytes));
            auto sb = std::as_bytes(std::span(c.server.bytes));
            CapturedConnection cc;
            cc.name = e.path().stem().string() + "_" + std::to_string(n++);
            bool ok1 = false, ok2 = false;
            cc.request = take_frame(cb, mpa::FrameKind::request, ok1, cc.crc);
            cc.reply = take_frame(sb, mpa::FrameKind::reply, ok2, cc.crc);
            if (!ok1 || !ok2) continue;  // not an MPA connection (e.g. the CM's side channel)
            cc.client_fpdus.assign(cb.begin(), cb.end());
            cc.server_fpdus.assign(sb.begin(), sb.end());
            out.push_back(std::move(cc));
        }
    }
    return out;
}

constexpr std::size_t kMaxSeed = 8192;
std::span<const std::byte> cap(std::span<const std::byte> s) { return s.first(std::min(s.size(), kMaxSeed)); }

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR [CAPTURES_DIR]\n");
        return 2;
    }
    g_out = argv[1];
    fs::remove_all(g_out);
    std::vector<wire::Frame> cap_frames;
    const std::vector<CapturedConnection> caps = read_captures(argc > 2 ? fs::path(argv[2]) : fs::path(), cap_frames);

    // ---- fuzz_mpa_negotiation: [b0][b1][ird][ord][max_ird][split][decision][peer bytes] ----
    {
        const Bytes pd = pattern(40, 9);
        const mpa::IrdOrd io{.ird = 4, .ord = 4};
        const mpa::IrdOrd p2p{.ird = 1, .ord = 1, .peer_to_peer = true, .write_rtr = true, .read_rtr = true};
        const mpa::IrdOrd p2p_send{.ird = 1, .ord = 1, .peer_to_peer = true, .send_rtr = true};
        int i = 0;
        for (mpa::FrameKind kind : {mpa::FrameKind::request, mpa::FrameKind::reply})
            for (const mpa::IrdOrd* o : {&io, &p2p, &p2p_send, static_cast<const mpa::IrdOrd*>(nullptr)})
                for (int flags = 0; flags < 8; ++flags) {
                    mpa::FrameParams p{kind, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0 && kind == mpa::FrameKind::reply,
                                       static_cast<std::uint8_t>(o != nullptr ? 2 : 1), o, std::span(pd).first(flags * 5)};
                    Bytes f(mpa::kMaxFrameSize);
                    f.resize(mpa::encode_frame(f, p));
                    const std::uint8_t role = kind == mpa::FrameKind::request ? 1 : 0;
                    const std::uint8_t b0 = static_cast<std::uint8_t>(role | ((flags & 3) << 1) | 16 | (o == &p2p || o == &p2p_send ? 32 : 0));
                    write_seed("fuzz_mpa_negotiation", "enc_" + std::to_string(i++), {b0, 0x07, 4, 4, 128, 0, 1}, f);
                    write_seed("fuzz_mpa_negotiation", "enc_" + std::to_string(i++), {b0, 0x0b, 1, 1, 2, 3, 0x20}, f);
                }
        for (const CapturedConnection& c : caps) {
            const std::uint8_t crcbits = c.crc ? 2 : 0;
            write_seed("fuzz_mpa_negotiation", "cap_" + c.name + "_req", {static_cast<std::uint8_t>(1 | crcbits | 32), 0x03, 1, 1, 128, 0, 1},
                       cat({c.request, Bytes(c.client_fpdus.begin(), c.client_fpdus.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(64, c.client_fpdus.size())))}));
            write_seed("fuzz_mpa_negotiation", "cap_" + c.name + "_rep", {static_cast<std::uint8_t>(crcbits | 32), 0x03, 1, 1, 128, 5, 0}, c.reply);
            write_seed("fuzz_mpa_negotiation", "cap_" + c.name + "_rep_plain", {crcbits, 0x00, 128, 128, 128, 0, 0}, c.reply);
        }
    }

    // ---- fuzz_deframer: [flags][split][offset/4][stream] ----
    for (std::uint8_t flags = 0; flags < 4; ++flags) {
        const bool crc = flags & 1, markers = flags & 2;
        for (std::uint8_t off : {0, 100, 127}) {
            mpa::FpduTx tx(mpa::FpduTxConfig{crc, markers, 600}, std::uint64_t{off} * 4);
            Bytes s;
            for (std::size_t k = 0; k < 6; ++k) {
                const std::size_t plen = std::min<std::size_t>(k * 170, tx.mulpdu() - 18);
                s = cat({s, fpdu(tx, untagged_hdr(rdmap::Opcode::send, k == 5, rdmap::kQnSend, 1, 0), pattern(plen, static_cast<std::uint8_t>(k)))});
                s = cat({s, fpdu(tx, tagged_hdr(rdmap::Opcode::write, true, 0x100, k), pattern(plen / 2, 7))});
            }
            s = cat({s, fpdu(tx, untagged_hdr(rdmap::Opcode::read_request, true, rdmap::kQnReadRequest, 1, 0))});
            write_seed("fuzz_deframer", "enc_f" + std::to_string(flags) + "_o" + std::to_string(off), {flags, 0, off}, s);
            write_seed("fuzz_deframer", "enc_f" + std::to_string(flags) + "_o" + std::to_string(off) + "_cut", {flags, 13, off}, s);
        }
    }
    for (bool crc : {false, true})
        for (const Shape& sh : siw_shapes(crc))
            write_seed("fuzz_deframer", "siw_" + sh.name + (crc ? "_crc" : ""), {static_cast<std::uint8_t>(crc), 5, 0}, sh.stream);
    for (const CapturedConnection& c : caps) {
        write_seed("fuzz_deframer", "cap_" + c.name + "_c", {static_cast<std::uint8_t>(c.crc), 0, 0}, cap(c.client_fpdus));
        write_seed("fuzz_deframer", "cap_" + c.name + "_s", {static_cast<std::uint8_t>(c.crc), 31, 0}, cap(c.server_fpdus));
    }

    // ---- fuzz_rdmap_rx: [flags][split][stream] ----
    for (std::uint8_t flags = 0; flags < 8; ++flags) {
        const fuzz::RigConfig rc = fuzz::RigConfig::from_flags(flags);
        for (std::uint32_t emss : {128u, 1448u}) {
            const Bytes s = peer_stream(rc, emss);
            write_seed("fuzz_rdmap_rx", "peer_f" + std::to_string(flags) + "_m" + std::to_string(emss), {flags, 0}, cap(s));
            if (emss == 128) write_seed("fuzz_rdmap_rx", "peer_f" + std::to_string(flags) + "_cut", {flags, 40}, cap(s));
        }
        for (const Shape& sh : siw_shapes(rc.crc))
            write_seed("fuzz_rdmap_rx", "siw_" + sh.name + "_f" + std::to_string(flags), {flags, 0}, sh.stream);
    }
    for (const CapturedConnection& c : caps) {
        write_seed("fuzz_rdmap_rx", "cap_" + c.name + "_c", {static_cast<std::uint8_t>(c.crc | 2), 0}, cap(c.client_fpdus));
        write_seed("fuzz_rdmap_rx", "cap_" + c.name + "_s", {static_cast<std::uint8_t>(c.crc | 2), 0}, cap(c.server_fpdus));
    }

    // ---- fuzz_terminate: [flags][word][ctrl 2][qn 4][msn 4][mo 4][attached] ----
    {
        const TermCode codes[] = {ddp::err::t_invalid_stag, ddp::err::t_base_bounds, ddp::err::u_no_buffer,
                                  ddp::err::u_too_long, rdmap::err::p_access, rdmap::err::o_opcode,
                                  rdmap::err::local_catastrophic, mpa::kTermCrc, mpa::kTermMarker};
        int i = 0;
        for (const TermCode& c : codes) {
            for (int mdr = 0; mdr < 3; ++mdr) {
                const rdmap::TerminateHeader th{c, mdr >= 1, mdr >= 1, mdr >= 2};
                Bytes att;
                if (mdr >= 1) {  // DDP Segment Length, the offending DDP header, (RDMAP header)
                    const Bytes h = mdr == 2 ? untagged_hdr(rdmap::Opcode::read_request, true, 1, 1, 0)
                                             : tagged_hdr(rdmap::Opcode::write, false, 0x100, 0x40);
                    att = cat({Bytes{std::byte{0}, std::byte{static_cast<std::uint8_t>(h.size() + 16)}}, h});
                }
                const std::uint32_t w = th.word();
                const std::uint8_t flags = static_cast<std::uint8_t>((i % 2) | ((i % 3) == 0 ? 2 : 0) | ((i % 4) == 0 ? 8 : 0));
                write_seed("fuzz_terminate", "term_" + std::to_string(i++),
                           {flags, static_cast<std::uint8_t>(w >> 24), static_cast<std::uint8_t>(w >> 16),
                            static_cast<std::uint8_t>(w >> 8), static_cast<std::uint8_t>(w), 0x41, 0x47, 0, 0, 0, 2,
                            0, 0, 0, 1, 0, 0, 0, 0},
                           att);
            }
        }
        // The raw-header variants: wrong QN, MSN, MO, not last.
        const std::uint8_t raw[][14] = {{0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
                                        {0x01, 0x47, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0},
                                        {0x41, 0x47, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 0},
                                        {0x41, 0x47, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 8},
                                        {0x42, 0x47, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0}};
        for (const auto& r : raw)
            write_seed("fuzz_terminate", "raw_" + std::to_string(i++),
                       {4, 0x12, 0x02, 0xe0, 0x00, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13]},
                       pattern(20, 1));
    }

    // ---- fuzz_frame: Ethernet frames ----
    {
        wire::PcapWriter pcap;
        const wire::Endpoint client{{0x02, 0, 0, 0, 0, 0x03}, {10, 99, 0, 3}, 40000};
        const wire::Endpoint server{{0x02, 0, 0, 0, 0, 0x04}, {10, 99, 0, 4}, 4791};
        wire::TcpSessionWriter tcp(pcap, client, server, 536);
        std::vector<std::uint8_t> data(1200);
        for (std::size_t k = 0; k < data.size(); ++k) data[k] = static_cast<std::uint8_t>(k * 3);
        tcp.send(wire::Dir::client_to_server, std::span(data).first(1));
        tcp.send(wire::Dir::client_to_server, data);
        tcp.send(wire::Dir::server_to_client, std::span(data).first(77));
        tcp.close();
        int i = 0;
        for (const wire::Frame& f : wire::parse_capture(pcap.image()))
            write_seed("fuzz_frame", "enc_" + std::to_string(i++), {}, std::as_bytes(std::span(f.bytes)));
        i = 0;
        for (const wire::Frame& f : cap_frames)
            write_seed("fuzz_frame", "cap_" + std::to_string(i++), {}, std::as_bytes(std::span(f.bytes)));
    }

    std::printf("fuzz_seeds: %zu seeds in %s (%zu captured connections)\n", g_count, g_out.c_str(), caps.size());
    return 0;
}
