// SPDX-License-Identifier: MIT
// Captures of Linux siw (see the README next to them) through our receive side: every TCP connection is
// reassembled, its MPA Request and Reply decoded with mpa::FrameDecoder and checked against what ran, and the
// rest of each direction fed through the real mpa::Deframer (CRC checked when negotiated) into a recording
// handler, whose segments must obey DDP/RDMAP rules. When tshark is installed, its per-opcode segment
// counts must equal ours.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>

#include "mpa/deframer.hpp"
#include "mpa/frames.hpp"
#include "tests/wire/iwarp_trace.hpp"
#include "tests/wire/pcap.hpp"
#include "tests/wire/tcp_flow.hpp"
#include "tests/wire/tshark.hpp"

using namespace softrdma;
using namespace softrdma::wire;

namespace {


// The MPA startup of one connection, from captures/README.md and checked against the capture bytes.
struct Startup {
    bool crc_request{false}, crc_reply{false};
    mpa::IrdOrd request{}, reply{};
    bool write_rtr{false};  // the client's first FPDU is a zero-length WRITE to STag 1 (iwarp-wire.md)
};

constexpr mpa::IrdOrd ird_ord(std::uint16_t ird, std::uint16_t ord) { return {.ird = ird, .ord = ord}; }

struct CaptureCase {
    const char* file;
    std::vector<Startup> connections;  // in order of the first SYN
};

// README says ib_send_lat negotiates "0/0 then 128/128"; its bytes say 0/0 on both connections, and it is
// ib_read_lat that asks for 128/128 on the test connection (a READ test needs read credits, a SEND test
// none). The table follows the bytes.
const std::vector<CaptureCase>& cases() {
    static const std::vector<CaptureCase> c = {
        {"rping.pcapng", {{false, false, ird_ord(1, 1), ird_ord(1, 1)}}},
        {"rping_crc.pcapng", {{true, true, ird_ord(1, 1), ird_ord(1, 1)}}},
        {"rping_crcreq.pcapng", {{true, true, ird_ord(1, 1), ird_ord(1, 1)}}},
        {"rping_p2p.pcapng",
         {{false, false,
           {.ird = 1, .ord = 1, .peer_to_peer = true, .write_rtr = true, .read_rtr = true},
           {.ird = 1, .ord = 1, .peer_to_peer = true, .write_rtr = true},
           true}}},
        {"ib_send_lat.pcapng", {{false, false, ird_ord(0, 0), ird_ord(0, 0)}, {false, false, ird_ord(0, 0), ird_ord(0, 0)}}},
        {"ib_read_lat.pcapng",
         {{false, false, ird_ord(0, 0), ird_ord(0, 0)}, {false, false, ird_ord(128, 128), ird_ord(128, 128)}}},
        {"ib_write_bw.pcapng", {{false, false, ird_ord(0, 0), ird_ord(0, 0)}, {false, false, ird_ord(0, 0), ird_ord(0, 0)}}},
    };
    return c;
}

std::span<const std::byte> as_bytes(const std::vector<std::uint8_t>& v) {
    return std::as_bytes(std::span(v));
}

// Decodes the MPA frame at the front of `stream`; returns it and drops its bytes from `stream`.
mpa::Frame take_frame(std::span<const std::byte>& stream, mpa::FrameKind kind) {
    mpa::FrameDecoder dec(kind);
    const auto res = dec.feed(stream);
    REQUIRE(res.status == mpa::FrameDecoder::Status::done);
    stream = stream.subspan(res.consumed);
    return dec.frame();
}

void check_frame(const mpa::Frame& f, bool crc, const mpa::IrdOrd& expected) {
    CHECK(f.revision == 2);
    CHECK(f.enhanced);
    CHECK(f.crc == crc);
    CHECK_FALSE(f.markers);
    CHECK_FALSE(f.reject);
    CHECK(f.reserved_flags == 0);
    CHECK(f.pd_length == mpa::kIrdOrdSize);
    CHECK(f.ird_ord == expected);
}

// Feeds one direction's FPDUs through the deframer in `chunk`-byte pieces; returns what the recorder saw.
std::vector<RecordedSegment> deframe(std::span<const std::byte> fpdus, bool crc, std::size_t chunk) {
    UlpduRecorder rec;
    mpa::Deframer<UlpduRecorder> deframer(mpa::DeframerConfig{.crc = crc});
    for (std::size_t at = 0; at < fpdus.size(); at += chunk) {
        const ProtoStatus st = deframer.feed(fpdus.subspan(at, std::min(chunk, fpdus.size() - at)), rec);
        INFO("deframer error at stream offset " << deframer.stream_position());
        REQUIRE_FALSE(st.has_value());
    }
    return std::move(rec.segments);
}

bool same_segments(const std::vector<RecordedSegment>& a, const std::vector<RecordedSegment>& b) {
    auto key = [](const RecordedSegment& s) {
        return std::tuple(s.opcode, s.last, s.tagged_hdr.stag, s.tagged_hdr.to, s.untagged_hdr.msn,
                          s.untagged_hdr.mo, s.payload_len, s.payload_got, s.complete);
    };
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [&](const auto& x, const auto& y) { return key(x) == key(y); });
}

std::string opcode_counts(const StreamReport& r) {
    std::string s;
    for (std::size_t op = 0; op < rdmap::kOpcodeCount; ++op)
        if (r.segments[op] != 0)
            s += std::string(rdmap::kOpTable[op].name) + " " + std::to_string(r.segments[op]) + " segments/" +
                 std::to_string(r.messages[op]) + " messages  ";
    return s;
}

}  // namespace

TEST_CASE("captures of Linux siw decode cleanly through our receive side", "[wire][captures]") {
    const auto dir = captures_dir();
    if (!std::filesystem::is_directory(dir)) {
        WARN("captures not found at " << dir << " (set SOFTRDMA_CAPTURES): skipping");
        SUCCEED();
        return;
    }
    const auto tshark = find_tshark();
    if (!tshark) WARN("tshark is not installed: per-opcode counts are not cross-checked");

    for (const CaptureCase& cc : cases()) {
        DYNAMIC_SECTION(cc.file) {
            const auto conns = reassemble(read_capture(dir / cc.file));
            REQUIRE(conns.size() == cc.connections.size());
            std::array<std::size_t, rdmap::kOpcodeCount> total{};

            for (std::size_t ci = 0; ci < conns.size(); ++ci) {
                INFO("connection " << ci);
                const TcpConnection& c = conns[ci];
                const Startup& want = cc.connections[ci];
                for (const TcpStream* s : {&c.client, &c.server}) {
                    CHECK(s->saw_syn);
                    CHECK(s->bad_checksums == 0);
                    CHECK(s->missing_bytes == 0);
                }

                std::span<const std::byte> from_client = as_bytes(c.client.bytes);
                std::span<const std::byte> from_server = as_bytes(c.server.bytes);
                const mpa::Frame req = take_frame(from_client, mpa::FrameKind::request);
                const mpa::Frame rep = take_frame(from_server, mpa::FrameKind::reply);
                check_frame(req, want.crc_request, want.request);
                check_frame(rep, want.crc_reply, want.reply);
                const bool crc = req.crc || rep.crc;  // RFC 5044 section 7.1: either side's C bit

                const auto client_segs = deframe(from_client, crc, 997);
                const auto server_segs = deframe(from_server, crc, 997);
                if (from_client.size() + from_server.size() < 64 * 1024) {  // small streams: every cut point too
                    CHECK(same_segments(deframe(from_client, crc, 1), client_segs));
                    CHECK(same_segments(deframe(from_server, crc, 1), server_segs));
                }

                if (want.write_rtr) {
                    REQUIRE_FALSE(client_segs.empty());
                    const RecordedSegment& rtr = client_segs.front();
                    CHECK(rtr.opcode == static_cast<std::uint8_t>(rdmap::Opcode::write));
                    CHECK(rtr.tagged_hdr.stag == 1);
                    CHECK(rtr.payload_len == 0);
                    CHECK(rtr.last);
                }

                const StreamReport client_report = check_segments(client_segs);
                const StreamReport server_report = check_segments(server_segs);
                for (const auto& p : client_report.problems) FAIL_CHECK("client -> server: " << p);
                for (const auto& p : server_report.problems) FAIL_CHECK("server -> client: " << p);
                const bool cut = client_report.incomplete_tail || server_report.incomplete_tail;
                for (const auto& p : match_reads(client_report.read_requests, server_report.read_responses, cut))
                    FAIL_CHECK("client READs: " << p);
                for (const auto& p : match_reads(server_report.read_requests, client_report.read_responses, cut))
                    FAIL_CHECK("server READs: " << p);

                std::cout << cc.file << " connection " << ci << " client->server: " << opcode_counts(client_report)
                          << (client_report.incomplete_tail ? "(+ a cut FPDU)" : "") << "\n"
                          << cc.file << " connection " << ci << " server->client: " << opcode_counts(server_report)
                          << (server_report.incomplete_tail ? "(+ a cut FPDU)" : "") << "\n";
                for (std::size_t op = 0; op < total.size(); ++op)
                    total[op] += client_report.segments[op] + server_report.segments[op];
            }

            if (tshark) {
                const auto out = run_tshark(*tshark, {"-r", (dir / cc.file).string(), "--disable-protocol", "rpcordma",
                                                      "--disable-protocol", "smb_direct", "-Y", "iwarp_rdma", "-T",
                                                      "fields", "-e", "iwarp_rdma.opcode"});
                std::array<std::size_t, rdmap::kOpcodeCount> theirs{};
                for (const auto& line : lines_of(out)) ++theirs.at(std::stoul(line, nullptr, 16));
                CHECK(theirs == total);
            }
        }
    }
}

TEST_CASE("a flipped payload bit in a CRC capture is a CRC error", "[wire][captures]") {
    const auto file = captures_dir() / "rping_crc.pcapng";
    if (!std::filesystem::exists(file)) {
        WARN(file << " not found: skipping");
        SUCCEED();
        return;
    }
    const auto conns = reassemble(read_capture(file));
    REQUIRE(conns.size() == 1);
    std::vector<std::uint8_t> stream = conns[0].client.bytes;
    std::span<const std::byte> rest = as_bytes(stream);
    take_frame(rest, mpa::FrameKind::request);
    const std::size_t first_fpdu = stream.size() - rest.size();
    stream[first_fpdu + 24] ^= 0x01;  // inside the first SEND's payload (its header ends at byte 20)

    UlpduRecorder rec;
    mpa::Deframer<UlpduRecorder> deframer(mpa::DeframerConfig{.crc = true});
    CHECK(deframer.feed(as_bytes(stream).subspan(first_fpdu), rec) == mpa::kTermCrc);
    REQUIRE(rec.segments.size() == 1);
    CHECK_FALSE(rec.segments[0].complete);
}
