// SPDX-License-Identifier: MIT
// Our bytes as tshark sees them. Two endpoints built from the real layers (mpa::Initiator/Responder for the
// MPA Request/Reply, rdmap::Endpoint over mpa::FpduTx for TX, mpa::Deframer into the peer Endpoint for RX)
// run one connection: every SEND variant, a multi-segment WRITE, a READ, both atomics tshark knows, and a
// WRITE to an unknown STag that makes the peer send a TERMINATE. Every FPDU goes in a TCP segment of its own
// (tshark's iwarp_mpa expects one FPDU per segment) into a pcap, which tshark must decode with no malformed
// frame, no expert error or warning except the two MPA revision-2 warnings, a good CRC on every FPDU when
// CRC is on, and the opcodes, STags, offsets, queue numbers, MSNs and lengths we encoded.
// Markers: tshark 4.0's iwarp_mpa does decode them, whatever the revision: it places one every 512 octets from
// each direction's first FPDU (as RFC 5044 section 4.3 and our FpduTx do), strips them, and checks the CRC
// over them. It assumes Markers in both directions as soon as either side sets M, so the marker runs set M
// on both sides. tshark absent: each case warns and passes (the loopback itself still runs and checks).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "mpa/negotiation.hpp"
#include "rdmap/duplex.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"
#include "tests/wire/iwarp_trace.hpp"
#include "tests/wire/memory_upper.hpp"
#include "tests/wire/pcap.hpp"
#include "tests/wire/tcp_flow.hpp"
#include "tests/wire/tshark.hpp"

using namespace softrdma;
using namespace softrdma::wire;

namespace {

const Endpoint client_addr{{0x02, 0, 0, 0, 0, 0x03}, {10, 99, 0, 3}, 40000};
const Endpoint server_addr{{0x02, 0, 0, 0, 0, 0x02}, {10, 99, 0, 2}, 7174};
constexpr std::uint16_t mss = 1460;  // our segments carry no TCP options: EMSS = MSS
constexpr std::uint16_t ird_ord = 8;

// STags. Server side: WRITE sink, READ source, atomic target, two to invalidate; client side: READ sink.
constexpr std::uint32_t write_stag = 0x1000, read_src_stag = 0x2000, atomic_stag = 0x3000;
constexpr std::uint32_t inv_stag_a = 0x4000, inv_stag_b = 0x4001, read_sink_stag = 0x5000, unknown_stag = 0x7777;
constexpr std::uint32_t read_only_stag = 0x6000;  // registered without the remote-write right
constexpr std::uint64_t write_to = 0x10008, read_src_to = 0x20000, atomic_to = 0x30000, read_sink_to = 0x50000;

// tshark field -> expected value (numbers compared by value, whatever base tshark prints them in).
using Fields = std::map<std::string, std::uint64_t>;

std::span<const std::uint8_t> u8(std::span<const std::byte> b) {
    return {reinterpret_cast<const std::uint8_t*>(b.data()), b.size()};
}

std::uint64_t op_value(rdmap::Opcode op) { return static_cast<std::uint64_t>(op); }

// The FPDUs a message becomes: `total` payload bytes cut at mulpdu - header, MO/TO advancing.
void expect_message(std::vector<Fields>& out, rdmap::Opcode op, std::size_t total, std::size_t mulpdu,
                    const Fields& extra = {}) {
    const rdmap::OpInfo& info = rdmap::op_info(op);
    const std::size_t per = mulpdu - info.hdr_len;
    std::size_t off = 0;
    do {
        const std::size_t len = std::min(per, total - off);
        Fields f = extra;
        f["iwarp_rdma.opcode"] = op_value(op);
        f["iwarp_ddp.tagged_flag"] = info.tagged;
        f["iwarp_ddp.last_flag"] = off + len == total;
        f["iwarp_mpa.ulpdulength"] = info.hdr_len + len;
        if (info.tagged) {
            f["iwarp_ddp.tagged_offset"] += off;
        } else {
            f["iwarp_ddp.qn"] = info.qn;
            f["iwarp_ddp.mo"] = off;
        }
        out.push_back(f);
        off += len;
    } while (off < total);
}

// One side of the connection: the real layers on plain bytes, plus what it sent.
struct Side {
    explicit Side(const mpa::Agreed& a)
        : tx(mpa::tx_config(a, mss)),
          framer(tx),
          ep(upper, framer, rdmap::Config{.sq_depth = 64, .ird = ird_ord, .ord = ird_ord, .rfc7306 = true}),
          deframer(mpa::rx_config(a)), markers_tx(a.markers_tx) {}
    MemoryUpper upper;
    mpa::FpduTx tx;
    rdmap::FpduFramer framer;
    rdmap::Duplex ep;
    mpa::Deframer<rdmap::Duplex> deframer;
    bool markers_tx;
    std::uint64_t tx_pos{0};
    std::size_t fpdus_sent{0};
};

struct Setup {
    const char* name;
    std::uint8_t revision;
    CrcPolicy crc;
    bool markers;  // both sides ask for Markers on what they receive
    bool access_violation = false;  // the last WRITE goes to a read-only region instead of an unknown STag
};

struct Result {
    PcapWriter pcap;
    mpa::Agreed agreed;
    std::vector<Fields> from_client, from_server;  // expected FPDU fields per direction, in order
    std::size_t fpdus{0};
    std::size_t markers{0};  // one at every multiple of 512 of each direction's FPDU stream, when negotiated
};

// MPA startup through the real negotiators; the Request and Reply go on the wire. Returns the initiator's
// and the responder's agreement.
std::pair<mpa::Agreed, mpa::Agreed> negotiate(TcpSessionWriter& tcp, const Setup& setup) {
    const auto now = mpa::Clock::now();
    mpa::NegotiationConfig cfg;
    cfg.revision = setup.revision;
    cfg.crc = setup.crc;
    cfg.markers_rx = setup.markers;
    cfg.markers_tx_ok = setup.markers;  // opt-in (refused by default, as siw)
    cfg.ird = cfg.ord = ird_ord;
    mpa::Initiator ini(cfg);
    mpa::Responder resp(cfg);
    REQUIRE(ini.start(now) == mpa::Outcome::in_progress);
    resp.start(now);

    const std::vector<std::byte> request(ini.output().begin(), ini.output().end());
    ini.output_sent(request.size());
    tcp.send(Dir::client_to_server, u8(request));
    REQUIRE(resp.input(request, now) == request.size());
    REQUIRE(resp.outcome() == mpa::Outcome::request_received);
    REQUIRE(resp.accept({}, ird_ord, ird_ord));

    const std::vector<std::byte> reply(resp.output().begin(), resp.output().end());
    resp.output_sent(reply.size());
    tcp.send(Dir::server_to_client, u8(reply));
    REQUIRE(ini.input(reply, now) == reply.size());
    REQUIRE(ini.outcome() == mpa::Outcome::agreed);
    return {ini.agreed(), resp.agreed()};
}

// Runs the connection; every byte on the wire also goes into the pcap.
Result run_session(const Setup& setup) {
    Result r;
    TcpSessionWriter tcp(r.pcap, client_addr, server_addr, mss);
    const auto [client_agreed, server_agreed] = negotiate(tcp, setup);
    r.agreed = client_agreed;

    Side client(client_agreed), server(server_agreed);
    const std::size_t mulpdu = client.tx.mulpdu();
    REQUIRE(server.tx.mulpdu() == mulpdu);

    // Server memory and receives; client READ sink.
    server.upper.add_region(write_stag, write_to - 8, 8192);
    auto& src = server.upper.add_region(read_src_stag, read_src_to, 8192);
    for (std::size_t i = 0; i < src.bytes.size(); ++i) src.bytes[i] = static_cast<std::byte>(i * 13);
    auto& target = server.upper.add_region(atomic_stag, atomic_to, 8);
    const std::uint64_t initial = 40;  // atomics work on a host-order 64-bit word (as verbs do)
    std::memcpy(target.bytes.data(), &initial, sizeof initial);
    server.upper.add_region(inv_stag_a, 0, 64);
    server.upper.add_region(inv_stag_b, 0, 64);
    for (int i = 0; i < 4; ++i) server.upper.post_receive(4096);
    client.upper.add_region(read_sink_stag, read_sink_to, 8192);
    server.upper.add_region(read_only_stag, 0, 64).remote_write = false;

    // Pumps both directions until neither has anything left; each FPDU is one TCP segment.
    std::vector<std::byte> buf(64 * 1024);
    auto pump = [&] {
        for (bool moved = true; moved;) {
            moved = false;
            for (auto [from, to, dir] : {std::tuple(&client, &server, Dir::client_to_server),
                                         std::tuple(&server, &client, Dir::server_to_client)}) {
                const std::size_t n = from->ep.pull_tx(buf);
                if (n == 0) continue;
                moved = true;
                for (auto fpdu : split_fpdus(std::span(buf).first(n), from->tx_pos, from->markers_tx)) {
                    REQUIRE(fpdu.size() <= mss);
                    tcp.send(dir, u8(fpdu));
                    rdmap::receive(to->deframer, to->ep, fpdu);
                    ++from->fpdus_sent;
                }
            }
        }
    };

    // The client's work requests and the FPDUs each one must become.
    std::vector<std::byte> payload(5000);
    for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7 + 1);
    std::uint64_t wr_id = 1;
    auto wr_with = [&](rdmap::WrOp op, std::size_t len) {
        rdmap::WorkRequest wr{.wr_id = wr_id++, .op = op};
        if (len) {
            wr.sgl[0] = std::span<const std::byte>(payload).first(len);
            wr.num_sge = 1;
        }
        return wr;
    };
    using Op = rdmap::Opcode;
    std::uint32_t send_msn = 1, request_msn = 1, atomic_resp_msn = 1, atomic_id = 1;
    auto post_send = [&](Op op, std::size_t len, bool se, std::uint32_t inv) {
        rdmap::WorkRequest wr = wr_with(rdmap::WrOp::send, len);
        wr.solicited = se;
        wr.with_inv = inv != 0;
        wr.inv_stag = inv;
        REQUIRE(client.ep.post(wr) == rdmap::PostStatus::ok);
        Fields f{{"iwarp_ddp.msn", send_msn++}};
        if (inv) f["iwarp_rdma.inval_stag"] = inv;
        expect_message(r.from_client, op, len, mulpdu, f);
    };
    post_send(Op::send, 100, false, 0);
    post_send(Op::send_se, 3000, true, 0);
    post_send(Op::send_inv, 10, false, inv_stag_a);
    post_send(Op::send_se_inv, 0, true, inv_stag_b);

    rdmap::WorkRequest write = wr_with(rdmap::WrOp::write, 5000);
    write.remote_stag = write_stag;
    write.remote_to = write_to;
    REQUIRE(client.ep.post(write) == rdmap::PostStatus::ok);
    expect_message(r.from_client, Op::write, 5000, mulpdu,
                   {{"iwarp_ddp.stag", write_stag}, {"iwarp_ddp.tagged_offset", write_to}});

    rdmap::WorkRequest read = wr_with(rdmap::WrOp::read, 0);
    read.remote_stag = read_src_stag;
    read.remote_to = read_src_to;
    read.local_stag = read_sink_stag;
    read.local_to = read_sink_to;
    read.read_len = 4000;
    REQUIRE(client.ep.post(read) == rdmap::PostStatus::ok);
    expect_message(r.from_client, Op::read_request, 0, mulpdu,
                   {{"iwarp_ddp.msn", request_msn++},
                    {"iwarp_rdma.sinkstag", read_sink_stag},
                    {"iwarp_rdma.sinkto", read_sink_to},
                    {"iwarp_rdma.rdmardsz", 4000},
                    {"iwarp_rdma.srcstag", read_src_stag},
                    {"iwarp_rdma.srcto", read_src_to}});
    expect_message(r.from_server, Op::read_response, 4000, mulpdu,
                   {{"iwarp_ddp.stag", read_sink_stag}, {"iwarp_ddp.tagged_offset", read_sink_to}});

    // RFC 7306 atomics: the requests on queue 1 after the READ, their responses on queue 3.
    auto post_atomic = [&](rdmap::WrOp op, std::uint64_t compare, std::uint64_t swap_add, std::uint64_t original,
                           Fields f) {
        rdmap::WorkRequest wr = wr_with(op, 0);
        wr.remote_stag = atomic_stag;
        wr.remote_to = atomic_to;
        wr.compare = compare;
        wr.swap_add = swap_add;
        REQUIRE(client.ep.post(wr) == rdmap::PostStatus::ok);
        f["iwarp_ddp.msn"] = request_msn++;
        f["iwarp_rdma.atomic.request_identifier"] = atomic_id;
        f["iwarp_rdma.atomic.remote_stag"] = atomic_stag;
        f["iwarp_rdma.atomic.remote_tagged_offset"] = atomic_to;
        expect_message(r.from_client, Op::atomic_request, 0, mulpdu, f);
        expect_message(r.from_server, Op::atomic_response, 0, mulpdu,
                       {{"iwarp_ddp.msn", atomic_resp_msn++},
                        {"iwarp_rdma.atomic.original_request_identifier", atomic_id++},
                        {"iwarp_rdma.atomic.original_remote_data_value", original}});
    };
    constexpr std::uint64_t all_ones = ~std::uint64_t{0};
    post_atomic(rdmap::WrOp::fetch_add, 0, 2, 40,
                {{"iwarp_rdma.atomic.opcode", 0}, {"iwarp_rdma.atomic.add_data", 2}, {"iwarp_rdma.atomic.add_mask", 0}});
    post_atomic(rdmap::WrOp::cmp_swap, 42, 7, 42,
                {{"iwarp_rdma.atomic.opcode", 2},
                 {"iwarp_rdma.atomic.swap_data", 7},
                 {"iwarp_rdma.atomic.swap_mask", all_ones},
                 {"iwarp_rdma.atomic.compare_data", 42},
                 {"iwarp_rdma.atomic.compare_mask", all_ones}});

    pump();
    REQUIRE(client.upper.completions.size() == 8);  // all signaled, all done before the stream ends

    rdmap::WorkRequest bad = wr_with(rdmap::WrOp::write, 16);
    if (!setup.access_violation) {
        // A WRITE to an STag the server never registered: DDP tagged "invalid STag", TERMINATE with M and D
        // (RFC 5040 section 4.8), the DDP header of the offending segment attached.
        bad.remote_stag = unknown_stag;
        REQUIRE(client.ep.post(bad) == rdmap::PostStatus::ok);
        expect_message(r.from_client, Op::write, 16, mulpdu, {{"iwarp_ddp.stag", unknown_stag}, {"iwarp_ddp.tagged_offset", 0}});
        expect_message(r.from_server, Op::terminate, 2 + ddp::kTaggedHeaderLen, mulpdu,
                       {{"iwarp_ddp.msn", 1},
                        {"iwarp_rdma.term_layer", 1},
                        {"iwarp_rdma.term_etype_ddp", 1},
                        {"iwarp_rdma.term_errcode_ddp_tagged", 0},
                        {"iwarp_rdma.term_hdrct_m", 1},
                        {"iwarp_rdma.hdrct_d", 1},
                        {"iwarp_rdma.hdrct_r", 0}});
    } else {
        // A WRITE into a region without the remote-write right: RDMAP remote protection "access rights
        // violation", the WRITE's header attached with M and D; R stays clear (no READ request header in it),
        // or tshark would decode the WRITE's header as a READ request's and call the frame malformed.
        bad.remote_stag = read_only_stag;
        REQUIRE(client.ep.post(bad) == rdmap::PostStatus::ok);
        expect_message(r.from_client, Op::write, 16, mulpdu, {{"iwarp_ddp.stag", read_only_stag}, {"iwarp_ddp.tagged_offset", 0}});
        expect_message(r.from_server, Op::terminate, 2 + ddp::kTaggedHeaderLen, mulpdu,
                       {{"iwarp_ddp.msn", 1},
                        {"iwarp_rdma.term_layer", 0},
                        {"iwarp_rdma.term_etype_rdma", 1},
                        {"iwarp_rdma.term_errcode_rdma", 2},
                        {"iwarp_rdma.term_hdrct_m", 1},
                        {"iwarp_rdma.hdrct_d", 1},
                        {"iwarp_rdma.hdrct_r", 0}});
    }
    pump();
    tcp.close();
    r.fpdus = client.fpdus_sent + server.fpdus_sent;
    for (const Side* side : {&client, &server})
        if (side->markers_tx) r.markers += (side->tx_pos + mpa::kMarkerInterval - 1) / mpa::kMarkerInterval;

    // Both ends saw what the other meant: the data arrived, and the TERMINATE ended the stream on both sides.
    REQUIRE(server.upper.received.size() == 4);
    CHECK(server.upper.received[1].buffer == std::vector<std::byte>(payload.begin(), payload.begin() + 3000));
    CHECK(std::equal(payload.begin(), payload.end(), server.upper.regions[write_stag].bytes.begin() + 8));
    CHECK(std::equal(src.bytes.begin(), src.bytes.begin() + 4000, client.upper.regions[read_sink_stag].bytes.begin()));
    std::uint64_t final_value = 0;
    std::memcpy(&final_value, server.upper.regions[atomic_stag].bytes.data(), sizeof final_value);
    CHECK(final_value == 7);  // 40, + 2, then 42 swapped for 7
    REQUIRE(server.upper.terminates.size() == 1);
    CHECK(server.upper.terminates[0].code == (setup.access_violation ? rdmap::err::p_access : ddp::err::t_invalid_stag));
    REQUIRE(client.upper.terminates.size() == 1);
    CHECK(client.upper.terminates[0].received);
    return r;
}

// Parses `tshark -T fields` rows (separator ';') into one map per row for `names`; empty fields are left out.
std::vector<std::map<std::string, std::string>> field_rows(const std::string& out, const std::vector<std::string>& names) {
    std::vector<std::map<std::string, std::string>> rows;
    for (const auto& line : lines_of(out)) {
        const auto values = split(line, ';');
        REQUIRE(values.size() == names.size());
        auto& row = rows.emplace_back();
        for (std::size_t i = 0; i < names.size(); ++i)
            if (!values[i].empty()) row[names[i]] = values[i];
    }
    return rows;
}

std::size_t count(const std::string& text, const std::string& needle) {
    std::size_t n = 0;
    for (std::size_t at = 0; (at = text.find(needle, at)) != std::string::npos; at += needle.size()) ++n;
    return n;
}

std::vector<std::string> tshark_args(const std::filesystem::path& file, std::vector<std::string> more) {
    std::vector<std::string> a{"-r", file.string(), "--disable-protocol", "rpcordma", "--disable-protocol",
                               "smb_direct"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
}

// Checks tshark's decode of the pcap of a session run with `setup`.
void check_with_tshark(const std::filesystem::path& tshark, const Setup& setup, const Result& r) {
    const auto file = std::filesystem::current_path() / (std::string("wire_tshark_") + setup.name + ".pcap");
    r.pcap.save(file);
    INFO("capture: " << file);

    // 1. Expert items: nothing at warning level or above but MPA's two complaints about revision 2.
    for (const auto& item : parse_expert_summary(run_tshark(tshark, tshark_args(file, {"-q", "-z", "expert"})))) {
        INFO("expert item: " << item.severity << " " << item.protocol << " " << item.summary);
        CHECK(item.severity != "Errors");
        if (item.severity == "Warns") {
            CHECK(setup.revision == 2);
            CHECK(item.protocol == "IWARP_MPA");
            CHECK((item.summary.starts_with("Rev field is NOT set to one") ||
                   item.summary.starts_with("Res field is NOT set to zero")));
        }
    }

    // 2. The verbose decode: nothing malformed, and one good CRC per FPDU when CRC is on.
    const std::string verbose = run_tshark(tshark, tshark_args(file, {"-V"}));
    CHECK(verbose.find("Malformed") == std::string::npos);
    CHECK(verbose.find("Bad CRC32") == std::string::npos);
    CHECK(count(verbose, "(Good CRC32)") == (r.agreed.crc ? r.fpdus : 0));
    CHECK(count(verbose, "FPDU back pointer:") == r.markers);

    // 3. MPA Request and Reply fields.
    const std::vector<std::string> mpa_names{"tcp.srcport", "iwarp_mpa.rev", "iwarp_mpa.marker_flag",
                                             "iwarp_mpa.crc_flag", "iwarp_mpa.rej_flag", "iwarp_mpa.pdlength",
                                             "iwarp_mpa.privatedata"};
    std::vector<std::string> args{"-Y", "iwarp_mpa.req or iwarp_mpa.rep", "-T", "fields", "-E", "separator=;"};
    for (const auto& n : mpa_names) args.insert(args.end(), {"-e", n});
    const auto frames = field_rows(run_tshark(tshark, tshark_args(file, args)), mpa_names);
    REQUIRE(frames.size() == 2);
    for (const auto& f : frames) {
        CHECK(std::stoul(f.at("iwarp_mpa.rev")) == setup.revision);
        CHECK(std::stoul(f.at("iwarp_mpa.marker_flag")) == setup.markers);
        CHECK(std::stoul(f.at("iwarp_mpa.crc_flag")) == r.agreed.crc);
        CHECK(std::stoul(f.at("iwarp_mpa.rej_flag")) == 0);
        if (setup.revision == 2) {
            CHECK(std::stoul(f.at("iwarp_mpa.pdlength")) == 4);
            CHECK(f.at("iwarp_mpa.privatedata") == "00080008");  // IRD 8, ORD 8, no P2P bits
        } else {
            CHECK(std::stoul(f.at("iwarp_mpa.pdlength")) == 0);
        }
    }

    // 4. Every FPDU's decoded fields, per direction in order.
    std::vector<std::string> names{"tcp.srcport"};
    for (const auto* list : {&r.from_client, &r.from_server})
        for (const auto& expected : *list)
            for (const auto& [name, value] : expected)
                if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    args = {"-Y", "iwarp_ddp", "-T", "fields", "-E", "separator=;", "-E", "occurrence=f"};
    for (const auto& n : names) args.insert(args.end(), {"-e", n});
    const auto rows = field_rows(run_tshark(tshark, tshark_args(file, args)), names);
    std::size_t next[2] = {0, 0};
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const bool from_client = std::stoul(rows[i].at("tcp.srcport")) == client_addr.port;
        const auto& list = from_client ? r.from_client : r.from_server;
        std::size_t& k = next[from_client ? 0 : 1];
        INFO("FPDU " << k << (from_client ? " from the client" : " from the server") << " (DDP frame " << i << ")");
        REQUIRE(k < list.size());
        for (const auto& [name, value] : list[k]) {
            INFO("field " << name);
            REQUIRE(rows[i].count(name) == 1);
            CHECK(std::stoull(rows[i].at(name), nullptr, 0) == value);
        }
        ++k;
    }
    CHECK(next[0] == r.from_client.size());
    CHECK(next[1] == r.from_server.size());
}

}  // namespace

TEST_CASE("tshark decodes our MPA startup and every RDMAP opcode it knows", "[wire][tshark]") {
    const Setup setups[] = {
        {"rev1", 1, CrcPolicy::off, false},
        {"rev1_crc", 1, CrcPolicy::preferred, false},
        {"rev2", 2, CrcPolicy::off, false},
        {"rev2_crc", 2, CrcPolicy::preferred, false},
        {"rev2_crc_access_violation", 2, CrcPolicy::preferred, false, true},
        {"rev1_markers", 1, CrcPolicy::preferred, true},
        {"rev2_markers", 2, CrcPolicy::preferred, true},
    };
    const auto tshark = find_tshark();
    for (const Setup& s : setups) {
        DYNAMIC_SECTION(s.name) {
            const Result r = run_session(s);
            CHECK(r.agreed.revision == s.revision);
            CHECK(r.agreed.crc == (s.crc != CrcPolicy::off));
            if (!tshark) {
                WARN("tshark is not installed: the " << s.name << " capture is not decoded");
                SUCCEED();
                continue;
            }
            check_with_tshark(*tshark, s, r);
        }
    }
}
