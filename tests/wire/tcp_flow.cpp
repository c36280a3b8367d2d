// SPDX-License-Identifier: MIT
#include "tests/wire/tcp_flow.hpp"

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>

namespace softrdma::wire {
namespace {

constexpr std::size_t eth_len = 14, ip_len = 20, tcp_len = 20;
constexpr std::uint16_t ethertype_ipv4 = 0x0800, ethertype_vlan = 0x8100, ethertype_qinq = 0x88a8;
constexpr std::uint8_t ip_proto_tcp = 6;
constexpr std::uint8_t tcp_syn = 0x02, tcp_ack = 0x10;

std::uint16_t be16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }
std::uint32_t be32(const std::uint8_t* p) {
    return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}
void put16(std::uint8_t* p, std::uint16_t v) {
    p[0] = static_cast<std::uint8_t>(v >> 8);
    p[1] = static_cast<std::uint8_t>(v);
}
void put32(std::uint8_t* p, std::uint32_t v) {
    put16(p, static_cast<std::uint16_t>(v >> 16));
    put16(p + 2, static_cast<std::uint16_t>(v));
}

// RFC 1071 ones' complement sum of `bytes` (not folded, not inverted), seeded with `sum`.
std::uint32_t ones_sum(std::span<const std::uint8_t> bytes, std::uint32_t sum = 0) {
    std::size_t i = 0;
    for (; i + 1 < bytes.size(); i += 2) sum += be16(&bytes[i]);
    if (i < bytes.size()) sum += std::uint32_t{bytes[i]} << 8;
    return sum;
}

// Folds a ones' complement sum into 16 bits; a header whose checksum is right folds to 0xffff.
std::uint16_t fold_checksum(std::uint32_t sum) {
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return static_cast<std::uint16_t>(sum);
}

// Ones' complement sum of the TCP pseudo-header (RFC 793 section 3.1).
std::uint32_t pseudo_header_sum(std::span<const std::uint8_t> src_ip, std::span<const std::uint8_t> dst_ip,
                                std::size_t tcp_bytes) {
    std::uint32_t sum = ones_sum(src_ip);
    sum = ones_sum(dst_ip, sum);
    return sum + ip_proto_tcp + static_cast<std::uint32_t>(tcp_bytes);
}

// A parsed Ethernet/IPv4/TCP frame; spans point into the frame.
struct TcpSegment {
    Endpoint src, dst;
    std::uint32_t seq{0};
    std::uint8_t flags{0};
    std::span<const std::uint8_t> payload;
    bool checksums_ok{false};
};

std::optional<TcpSegment> parse_segment(std::span<const std::uint8_t> f) {
    if (f.size() < eth_len) return std::nullopt;
    TcpSegment s;
    std::copy_n(f.data(), 6, s.dst.mac.begin());
    std::copy_n(f.data() + 6, 6, s.src.mac.begin());
    std::size_t at = 12;
    std::uint16_t type = be16(&f[at]);
    while ((type == ethertype_vlan || type == ethertype_qinq) && at + 6 <= f.size()) {
        at += 4;
        type = be16(&f[at]);
    }
    at += 2;
    if (type != ethertype_ipv4 || f.size() < at + ip_len) return std::nullopt;

    const std::uint8_t* ip = &f[at];
    const std::size_t ihl = (ip[0] & 0x0f) * 4u, total = be16(ip + 2);
    if ((ip[0] >> 4) != 4 || ihl < ip_len || total < ihl || at + total > f.size()) return std::nullopt;
    if (ip[9] != ip_proto_tcp || (be16(ip + 6) & 0x3fff) != 0) return std::nullopt;  // not TCP, or fragment
    std::copy_n(ip + 12, 4, s.src.ip.begin());
    std::copy_n(ip + 16, 4, s.dst.ip.begin());

    const std::uint8_t* tcp = ip + ihl;
    const std::size_t tcp_total = total - ihl;
    if (tcp_total < tcp_len) return std::nullopt;
    const std::size_t doff = (tcp[12] >> 4) * 4u;
    if (doff < tcp_len || doff > tcp_total) return std::nullopt;
    s.src.port = be16(tcp);
    s.dst.port = be16(tcp + 2);
    s.seq = be32(tcp + 4);
    s.flags = tcp[13];
    s.payload = std::span(tcp + doff, tcp_total - doff);

    const bool ip_ok = fold_checksum(ones_sum({ip, ihl})) == 0xffff;
    const bool tcp_ok =
        fold_checksum(ones_sum({tcp, tcp_total}, pseudo_header_sum({ip + 12, 4}, {ip + 16, 4}, tcp_total))) ==
        0xffff;
    s.checksums_ok = ip_ok && tcp_ok;
    return s;
}

// Reassembly state of one direction. Offsets count payload bytes from the stream's first sequence number.
class Reassembler {
public:
    explicit Reassembler(TcpStream& out) : out_(out) {}

    void on_segment(const TcpSegment& s) {
        std::uint32_t seq = s.seq;
        if (s.flags & tcp_syn) {
            base_ = seq + 1;  // the SYN takes one sequence number
            seq = base_;
            out_.saw_syn = started_ = true;
        } else if (!started_) {
            base_ = seq;
            started_ = true;
        }
        if (s.payload.empty()) return;
        const std::int64_t start = static_cast<std::int32_t>(seq - base_);
        offer(start, {s.payload.begin(), s.payload.end()});
        drain();
    }

    // Bytes still waiting behind a gap when the capture ends.
    void finish() {
        std::int64_t covered = delivered();
        for (const auto& [start, bytes] : pending_) {
            const std::int64_t end = start + static_cast<std::int64_t>(bytes.size());
            out_.missing_bytes += static_cast<std::size_t>(std::max<std::int64_t>(0, end - std::max(start, covered)));
            covered = std::max(covered, end);
        }
        pending_.clear();
    }

private:
    TcpStream& out_;
    bool started_{false};
    std::uint32_t base_{0};
    std::multimap<std::int64_t, std::vector<std::uint8_t>> pending_;

    std::int64_t delivered() const { return static_cast<std::int64_t>(out_.bytes.size()); }

    void offer(std::int64_t start, std::vector<std::uint8_t> bytes) {
        const std::int64_t end = start + static_cast<std::int64_t>(bytes.size());
        if (end <= delivered()) {
            out_.duplicate_bytes += bytes.size();
        } else if (start <= delivered()) {
            const auto skip = static_cast<std::size_t>(delivered() - start);
            out_.duplicate_bytes += skip;
            out_.bytes.insert(out_.bytes.end(), bytes.begin() + static_cast<std::ptrdiff_t>(skip), bytes.end());
            ++out_.segments;
        } else {
            pending_.emplace(start, std::move(bytes));
        }
    }

    void drain() {
        while (!pending_.empty() && pending_.begin()->first <= delivered()) {
            auto node = pending_.extract(pending_.begin());
            offer(node.key(), std::move(node.mapped()));
        }
    }
};

}  // namespace

TcpSessionWriter::TcpSessionWriter(PcapWriter& out, Endpoint client, Endpoint server, std::uint16_t mss,
                                   std::uint32_t client_isn, std::uint32_t server_isn)
    : out_(out), client_{client, client_isn, client_isn, {}}, server_{server, server_isn, server_isn, {}},
      mss_(mss) {
    segment(client_, server_, syn, client_.isn, {});
    segment(server_, client_, syn | ack, server_.isn, {});
    segment(client_, server_, ack, client_.next_seq, {});
}

void TcpSessionWriter::send(Dir dir, std::span<const std::uint8_t> bytes) {
    Side& from = dir == Dir::client_to_server ? client_ : server_;
    const Side& to = dir == Dir::client_to_server ? server_ : client_;
    from.sent.insert(from.sent.end(), bytes.begin(), bytes.end());
    while (!bytes.empty()) {
        const auto n = std::min<std::size_t>(bytes.size(), mss_);
        segment(from, to, psh | ack, from.next_seq, bytes.first(n));
        bytes = bytes.subspan(n);
    }
}

void TcpSessionWriter::retransmit(Dir dir, std::size_t offset, std::size_t len) {
    Side& from = dir == Dir::client_to_server ? client_ : server_;
    const Side& to = dir == Dir::client_to_server ? server_ : client_;
    if (offset + len > from.sent.size()) throw std::logic_error("retransmit: beyond what was sent");
    const auto seq = static_cast<std::uint32_t>(from.isn + 1 + offset);
    segment(from, to, psh | ack, seq, std::span(from.sent).subspan(offset, len));
}

void TcpSessionWriter::close() {
    segment(client_, server_, fin | ack, client_.next_seq, {});
    segment(server_, client_, fin | ack, server_.next_seq, {});
    segment(client_, server_, ack, client_.next_seq, {});
}

// Emits one frame from `from` to `to` and advances from.next_seq past it when it is new data (or SYN/FIN).
void TcpSessionWriter::segment(Side& from, const Side& to, std::uint8_t flags, std::uint32_t seq,
                               std::span<const std::uint8_t> payload) {
    const bool with_mss = flags & syn;
    const std::size_t tcp_hdr = tcp_len + (with_mss ? 4 : 0);
    std::vector<std::uint8_t> f(eth_len + ip_len + tcp_hdr + payload.size());

    std::copy(to.ep.mac.begin(), to.ep.mac.end(), f.begin());
    std::copy(from.ep.mac.begin(), from.ep.mac.end(), f.begin() + 6);
    put16(&f[12], ethertype_ipv4);

    std::uint8_t* ip = &f[eth_len];
    ip[0] = 0x45;
    put16(ip + 2, static_cast<std::uint16_t>(ip_len + tcp_hdr + payload.size()));
    put16(ip + 4, ip_id_++);
    put16(ip + 6, 0x4000);  // don't fragment
    ip[8] = 64;             // TTL
    ip[9] = ip_proto_tcp;
    std::copy(from.ep.ip.begin(), from.ep.ip.end(), ip + 12);
    std::copy(to.ep.ip.begin(), to.ep.ip.end(), ip + 16);
    put16(ip + 10, static_cast<std::uint16_t>(~fold_checksum(ones_sum({ip, ip_len}))));

    std::uint8_t* tcp = ip + ip_len;
    put16(tcp, from.ep.port);
    put16(tcp + 2, to.ep.port);
    put32(tcp + 4, seq);
    const bool peer_synced = to.next_seq != to.isn;  // the peer's SYN has been sent, so it can be acked
    put32(tcp + 8, (flags & ack) && peer_synced ? to.next_seq : 0);
    tcp[12] = static_cast<std::uint8_t>(tcp_hdr / 4 << 4);
    tcp[13] = flags;
    put16(tcp + 14, 65535);  // window
    if (with_mss) {
        tcp[20] = 2;  // kind MSS, length 4
        tcp[21] = 4;
        put16(tcp + 22, mss_);
    }
    std::copy(payload.begin(), payload.end(), tcp + tcp_hdr);
    const std::size_t tcp_total = tcp_hdr + payload.size();
    put16(tcp + 16, static_cast<std::uint16_t>(~fold_checksum(
                        ones_sum({tcp, tcp_total}, pseudo_header_sum({ip + 12, 4}, {ip + 16, 4}, tcp_total)))));

    out_.add(f, time_us_);
    time_us_ += 10;
    const auto end = static_cast<std::uint32_t>(seq + payload.size() + ((flags & (syn | fin)) ? 1 : 0));
    if (static_cast<std::int32_t>(end - from.next_seq) > 0) from.next_seq = end;
}

std::vector<TcpConnection> reassemble(std::span<const Frame> frames) {
    using FlowKey = std::tuple<std::array<std::uint8_t, 4>, std::uint16_t, std::array<std::uint8_t, 4>, std::uint16_t>;
    auto key = [](const Endpoint& client, const Endpoint& server) {
        return FlowKey(client.ip, client.port, server.ip, server.port);
    };
    struct Tracked {
        TcpConnection* conn;
        Reassembler client, server;
    };
    std::deque<TcpConnection> conns;  // a deque: Reassemblers keep references to its elements
    std::map<FlowKey, Tracked> open;  // keyed by (client, server)
    auto close = [&](std::map<FlowKey, Tracked>::iterator it) {
        it->second.client.finish();
        it->second.server.finish();
        open.erase(it);
    };

    for (const Frame& frame : frames) {
        const auto seg = parse_segment(frame.bytes);
        if (!seg) continue;
        auto it = open.find(key(seg->src, seg->dst));
        bool from_client = it != open.end();
        if (!from_client) it = open.find(key(seg->dst, seg->src));

        const bool new_syn = (seg->flags & tcp_syn) && !(seg->flags & tcp_ack);
        if (it != open.end() && new_syn && from_client && !it->second.conn->client.bytes.empty()) {
            close(it);  // the 4-tuple is reused by a new connection
            it = open.end();
        }
        if (it == open.end()) {
            TcpConnection& c = conns.emplace_back();
            c.client.from = c.server.to = seg->src;
            c.client.to = c.server.from = seg->dst;
            it = open.emplace(key(seg->src, seg->dst), Tracked{&c, Reassembler(c.client), Reassembler(c.server)})
                     .first;
            from_client = true;
        }
        TcpStream& stream = from_client ? it->second.conn->client : it->second.conn->server;
        if (!seg->checksums_ok) ++stream.bad_checksums;
        (from_client ? it->second.client : it->second.server).on_segment(*seg);
    }
    while (!open.empty()) close(open.begin());
    return {std::make_move_iterator(conns.begin()), std::make_move_iterator(conns.end())};
}

}  // namespace softrdma::wire
