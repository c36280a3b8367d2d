// SPDX-License-Identifier: MIT
// TCP over IPv4 over Ethernet for the wire tests, in both directions:
// - TcpSessionWriter wraps two byte streams into frames of one TCP connection (handshake first, valid IPv4
//   and TCP checksums, correct sequence and acknowledgement numbers, segments of at most the MSS);
// - reassemble() turns captured frames back into the two byte streams of every TCP connection.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "tests/wire/pcap.hpp"

namespace softrdma::wire {

struct Endpoint {
    std::array<std::uint8_t, 6> mac{};
    std::array<std::uint8_t, 4> ip{};
    std::uint16_t port{0};

    friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

enum class Dir { client_to_server, server_to_client };

// Writes one TCP connection into a PcapWriter. The constructor emits SYN, SYN-ACK, ACK (SYNs carry the
// MSS option); every send() emits data segments with ACK|PSH acknowledging everything the peer has sent.
class TcpSessionWriter {
public:
    TcpSessionWriter(PcapWriter& out, Endpoint client, Endpoint server, std::uint16_t mss,
                     std::uint32_t client_isn = 0x1000'0000, std::uint32_t server_isn = 0x8000'0000);

    // Sends `bytes` in order, cut into segments of at most mss bytes; one call of at most mss bytes is one
    // segment, which is how a test puts each FPDU in a segment of its own.
    void send(Dir dir, std::span<const std::uint8_t> bytes);
    // Sends a copy of an earlier segment: `offset` bytes into the stream of `dir`, `len` bytes long.
    void retransmit(Dir dir, std::size_t offset, std::size_t len);
    // FIN from the client, FIN from the server, final ACK.
    void close();

private:
    struct Side {
        Endpoint ep;
        std::uint32_t isn;
        std::uint32_t next_seq;
        std::vector<std::uint8_t> sent;  // stream bytes sent so far, for retransmit()
    };
    enum : std::uint8_t { fin = 0x01, syn = 0x02, psh = 0x08, ack = 0x10 };

    PcapWriter& out_;
    Side client_, server_;
    std::uint16_t mss_;
    std::uint16_t ip_id_{1};
    std::uint64_t time_us_{1'700'000'000'000'000};

    void segment(Side& from, const Side& to, std::uint8_t flags, std::uint32_t seq,
                 std::span<const std::uint8_t> payload);
};

// One direction of a reassembled TCP connection.
struct TcpStream {
    Endpoint from, to;
    std::vector<std::uint8_t> bytes;  // in-order payload from the first sequence number on
    bool saw_syn{false};              // the stream starts at the SYN (else at the first data segment seen)
    std::size_t segments{0};          // data segments delivered (each at its first arrival)
    std::size_t duplicate_bytes{0};   // payload bytes that arrived again (retransmits, overlaps)
    std::size_t missing_bytes{0};     // payload held back behind a gap the capture never filled
    std::size_t bad_checksums{0};     // frames whose IPv4 or TCP checksum is wrong
};

// Both directions of one connection. `client` is the SYN sender (or, without a SYN in the capture, the
// sender of the first segment).
struct TcpConnection {
    TcpStream client, server;  // client: bytes the client sent; server: bytes the server sent
};

// Groups captured Ethernet/IPv4/TCP frames (others are skipped; 802.1Q tags are stripped) by connection in
// order of first appearance, and reassembles each direction by sequence number: out-of-order segments wait
// for the gap to fill, retransmits and overlaps are dropped. A reused 4-tuple after a new SYN starts a new
// connection.
std::vector<TcpConnection> reassemble(std::span<const Frame> frames);

}  // namespace softrdma::wire
