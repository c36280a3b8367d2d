// SPDX-License-Identifier: MIT
// The capture tools themselves: pcap writer -> reader round trip, reassembly of reordered, repeated and
// lost segments, pcapng parsing in both byte orders, and tshark's verdict on our checksums and sequence
// numbers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "tests/wire/pcap.hpp"
#include "tests/wire/tcp_flow.hpp"
#include "tests/wire/tshark.hpp"

using namespace softrdma::wire;

namespace {

const Endpoint client{{0x02, 0, 0, 0, 0, 0x03}, {10, 99, 0, 3}, 40000};
const Endpoint server{{0x02, 0, 0, 0, 0, 0x02}, {10, 99, 0, 2}, 7174};

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7 + i / 251);
    return v;
}

// A connection with 5000 bytes from the client and 3001 from the server, MSS 536, closed at the end.
PcapWriter sample_session(std::uint32_t client_isn = 0x1000'0000, std::uint32_t server_isn = 0x8000'0000) {
    PcapWriter pcap;
    TcpSessionWriter tcp(pcap, client, server, 536, client_isn, server_isn);
    const auto from_client = pattern(5000, 1);
    tcp.send(Dir::client_to_server, std::span(from_client).first(2000));
    tcp.send(Dir::server_to_client, pattern(3001, 2));
    tcp.send(Dir::client_to_server, std::span(from_client).subspan(2000));
    tcp.close();
    return pcap;
}

// A pcapng image: SHB, IDB (Ethernet, nanosecond if_tsresol), one EPB and one SPB carrying `frame`.
std::vector<std::uint8_t> pcapng_image(const std::vector<std::uint8_t>& frame, bool big_endian) {
    std::vector<std::uint8_t> out;
    auto u32 = [&](std::uint32_t v) {
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (big_endian ? 24 - 8 * i : 8 * i)));
    };
    auto u16 = [&](std::uint16_t v) {
        for (int i = 0; i < 2; ++i) out.push_back(static_cast<std::uint8_t>(v >> (big_endian ? 8 - 8 * i : 8 * i)));
    };
    auto padded = [&](const std::vector<std::uint8_t>& b) {
        out.insert(out.end(), b.begin(), b.end());
        out.resize(out.size() + (4 - b.size() % 4) % 4);
    };
    const auto pad_len = static_cast<std::uint32_t>((frame.size() + 3) / 4 * 4);
    u32(0x0A0D0D0A), u32(28), u32(0x1A2B3C4D), u16(1), u16(0), u32(0xffffffff), u32(0xffffffff), u32(28);
    u32(1), u32(32), u16(1), u16(0), u32(0), u16(9), u16(1), padded({9}), u16(0), u16(0), u32(32);
    const std::uint64_t ts_ns = 1'700'000'000'123'456'789;
    u32(6), u32(32 + pad_len), u32(0), u32(static_cast<std::uint32_t>(ts_ns >> 32)),
        u32(static_cast<std::uint32_t>(ts_ns)), u32(static_cast<std::uint32_t>(frame.size())),
        u32(static_cast<std::uint32_t>(frame.size())), padded(frame), u32(32 + pad_len);
    u32(3), u32(16 + pad_len), u32(static_cast<std::uint32_t>(frame.size())), padded(frame), u32(16 + pad_len);
    return out;
}

}  // namespace

TEST_CASE("pcap writer and reader round trip both directions", "[wire][pcap]") {
    const PcapWriter pcap = sample_session();
    const auto frames = parse_capture(pcap.image());
    REQUIRE(frames.size() == pcap.frame_count());
    REQUIRE(frames.size() == 3 + 4 + 6 + 6 + 3);  // handshake, 2000/536, 3001/536, 3000/536, close

    const auto conns = reassemble(frames);
    REQUIRE(conns.size() == 1);
    const TcpConnection& c = conns[0];
    CHECK(c.client.from == client);
    CHECK(c.server.from == server);
    CHECK(c.client.saw_syn);
    CHECK(c.server.saw_syn);
    CHECK(c.client.bytes == pattern(5000, 1));
    CHECK(c.server.bytes == pattern(3001, 2));
    CHECK(c.client.segments == 4 + 6);
    CHECK(c.server.segments == 6);
    for (const TcpStream* s : {&c.client, &c.server}) {
        CHECK(s->bad_checksums == 0);
        CHECK(s->duplicate_bytes == 0);
        CHECK(s->missing_bytes == 0);
    }
}

TEST_CASE("sequence numbers wrap around 2^32", "[wire][pcap]") {
    const auto conns = reassemble(parse_capture(sample_session(0xffff'fc00, 0xffff'ffff).image()));
    REQUIRE(conns.size() == 1);
    CHECK(conns[0].client.bytes == pattern(5000, 1));
    CHECK(conns[0].server.bytes == pattern(3001, 2));
}

TEST_CASE("reassembly survives reordering, duplicates and retransmits", "[wire][pcap]") {
    PcapWriter pcap;
    TcpSessionWriter tcp(pcap, client, server, 100);
    const auto data = pattern(1000, 9);
    tcp.send(Dir::client_to_server, data);      // frames 3..12
    tcp.retransmit(Dir::client_to_server, 150, 300);  // overlaps three segments
    auto frames = parse_capture(pcap.image());
    REQUIRE(frames.size() == 14);
    std::swap(frames[4], frames[7]);            // segments 2 and 5 out of order
    frames.push_back(frames[5]);                // a late duplicate

    const auto conns = reassemble(frames);
    REQUIRE(conns.size() == 1);
    CHECK(conns[0].client.bytes == data);
    CHECK(conns[0].client.duplicate_bytes == 300 + 100);
    CHECK(conns[0].client.missing_bytes == 0);
}

TEST_CASE("a lost segment stops the stream at the gap", "[wire][pcap]") {
    PcapWriter pcap;
    TcpSessionWriter tcp(pcap, client, server, 100);
    const auto data = pattern(1000, 3);
    tcp.send(Dir::client_to_server, data);
    auto frames = parse_capture(pcap.image());
    frames.erase(frames.begin() + 3 + 4);       // the fifth segment: bytes 400..499

    const auto conns = reassemble(frames);
    REQUIRE(conns.size() == 1);
    CHECK(conns[0].client.bytes == std::vector(data.begin(), data.begin() + 400));
    CHECK(conns[0].client.missing_bytes == 500);
}

TEST_CASE("a capture that starts after the handshake starts each stream at its first segment", "[wire][pcap]") {
    auto frames = parse_capture(sample_session().image());
    frames.erase(frames.begin(), frames.begin() + 3);  // no SYN, SYN-ACK, ACK

    const auto conns = reassemble(frames);
    REQUIRE(conns.size() == 1);
    CHECK_FALSE(conns[0].client.saw_syn);
    CHECK(conns[0].client.from == client);  // the first sender seen
    CHECK(conns[0].client.bytes == pattern(5000, 1));
    CHECK(conns[0].server.bytes == pattern(3001, 2));
}

TEST_CASE("connections are told apart, a reused 4-tuple after a new SYN too", "[wire][pcap]") {
    PcapWriter pcap;
    Endpoint other = client;
    other.port = 40001;
    TcpSessionWriter a(pcap, client, server, 1460);
    TcpSessionWriter b(pcap, other, server, 1460);
    a.send(Dir::client_to_server, pattern(10, 1));
    b.send(Dir::server_to_client, pattern(20, 2));
    a.close();
    TcpSessionWriter again(pcap, client, server, 1460, 0x2000'0000);
    again.send(Dir::client_to_server, pattern(30, 3));

    const auto conns = reassemble(parse_capture(pcap.image()));
    REQUIRE(conns.size() == 3);
    CHECK(conns[0].client.bytes == pattern(10, 1));
    CHECK(conns[1].client.from == other);
    CHECK(conns[1].server.bytes == pattern(20, 2));
    CHECK(conns[2].client.bytes == pattern(30, 3));
}

TEST_CASE("pcapng in either byte order", "[wire][pcap]") {
    PcapWriter pcap;
    TcpSessionWriter tcp(pcap, client, server, 1460);
    const auto frame = parse_capture(pcap.image()).at(0).bytes;
    for (bool big_endian : {false, true}) {
        const auto frames = parse_capture(pcapng_image(frame, big_endian));
        REQUIRE(frames.size() == 2);
        CHECK(frames[0].time_us == 1'700'000'000'123'456);
        CHECK(frames[0].bytes == frame);
        CHECK(frames[1].bytes == frame);
    }
}

TEST_CASE("a truncated capture is reported", "[wire][pcap]") {
    auto image = sample_session().image();
    image.erase(image.end() - 5, image.end());  // (not resize(size() - 5): g++ 12 -O1 with ASan sees a memset of ~2^64)
    CHECK_THROWS_AS(parse_capture(image), std::runtime_error);
}

TEST_CASE("tshark finds valid checksums and a clean TCP conversation", "[wire][pcap][tshark]") {
    const auto tshark = find_tshark();
    if (!tshark) {
        WARN("tshark is not installed: skipping the tshark check of the pcap writer");
        SUCCEED();
        return;
    }
    const auto file = std::filesystem::current_path() / "wire_pcap_writer.pcap";
    const PcapWriter pcap = sample_session();
    pcap.save(file);
    const auto out = run_tshark(*tshark, {"-r", file.string(), "-o", "tcp.check_checksum:TRUE", "-o",
                                          "ip.check_checksum:TRUE", "-o", "tcp.relative_sequence_numbers:FALSE",
                                          "-T", "fields", "-E", "separator=;", "-e", "ip.checksum.status",
                                          "-e", "tcp.checksum.status", "-e", "tcp.analysis.flags", "-e",
                                          "tcp.len", "-e", "_ws.malformed", "-e", "_ws.expert.severity"});
    const auto rows = lines_of(out);
    REQUIRE(rows.size() == pcap.frame_count());
    std::size_t payload = 0;
    for (const auto& row : rows) {
        INFO("tshark row: " << row);
        const auto fields = split(row, ';');
        REQUIRE(fields.size() == 6);
        CHECK(fields[0] == "1");        // IPv4 checksum good
        CHECK(fields[1] == "1");        // TCP checksum good
        CHECK(fields[2].empty());       // no TCP analysis flags: sequence and ack numbers consistent
        payload += std::stoul(fields[3]);
        CHECK(fields[4].empty());       // not malformed
        for (const auto& severity : split(fields[5], ','))
            CHECK(std::stoul(severity) < expert_warn);  // SYN/FIN draw chats and notes, nothing worse
    }
    CHECK(payload == 5000 + 3001);
}

TEST_CASE("tshark's expert summary is parsed", "[wire][tshark]") {
    const std::string text = "\nWarns (8)\n=============\n"
                             "   Frequency      Group           Protocol  Summary\n"
                             "           4    Request          IWARP_MPA  Res field is NOT set to zero as required\n"
                             "\nChats (2)\n=============\n"
                             "   Frequency      Group           Protocol  Summary\n"
                             "           2   Sequence                TCP  Connection establish request (SYN): x\n";
    const auto items = parse_expert_summary(text);
    REQUIRE(items.size() == 2);
    CHECK(items[0].severity == "Warns");
    CHECK(items[0].count == 4);
    CHECK(items[0].protocol == "IWARP_MPA");
    CHECK(items[0].summary == "Res field is NOT set to zero as required");
    CHECK(items[1].severity == "Chats");
    CHECK(items[1].group == "Sequence");
}
