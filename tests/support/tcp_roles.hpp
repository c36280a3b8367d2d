// SPDX-License-Identifier: MIT
// Test roles for two-process TCP tests: each runs in its own child process (its own EAL, port and lwIP),
// does its part, then checks that lwIP's pools and DPDK's mempool are back to their starting counts.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "io/port.hpp"
#include "stack/stack.hpp"

namespace softrdma::test {

struct PeerConfig {
    io::PortConfig port;
    io::EalConfig eal;
    std::string netns;          // enter this network namespace before starting DPDK ("" = stay)
    stack::StackConfig stack;
    Ipv4 peer;           // the other end's address
    std::uint16_t tcp_port = 5000;
};

// Two memif peers on a fresh socket: [0] server on core 0, [1] client on core 1.
std::pair<PeerConfig, PeerConfig> memif_pair(std::uint16_t mtu = 1500);

// The end of every two-process role: waits for every connection to finish closing, drops TIME_WAIT, compares
// lwIP's pools and DPDK's mempool with `baseline` (taken right after the stack was built), reports
// "pools back to start" or what differs plus the stack/port counters. Returns rc, or 3 if rc was 0 and the
// pools differ. `run` drives the process while it waits (run(done, timeout): true once done() held); empty:
// stack.run_until. A verbs Context must pass its own run_until: with an RX thread the stack alone never sees a
// frame (the Context drains the RX thread's ring), so the peer's last ACKs and FINs were never taken.
// Set (for a test's scope, before its roles fork) when the link between the two roles loses frames: fault
// injection on either side, usually only on one. finish_checks then stays in TIME_WAIT, answering resent FINs,
// until the peer has gone (at most 3 s) on both sides, not only on the one whose port injects the faults: the
// clean side once purged its TIME_WAIT at once, and the faulty side's FIN, whose ACK it had dropped, was resent
// to nobody (client stuck in CLOSING, MTU 9000 faults case under TSan, RX thread).
inline bool g_lossy_link = false;
struct LossyLink {
    LossyLink() { g_lossy_link = true; }
    ~LossyLink() { g_lossy_link = false; }
    LossyLink(const LossyLink&) = delete;
    LossyLink& operator=(const LossyLink&) = delete;
};

using RunUntil = std::function<bool(const std::function<bool()>&, std::chrono::milliseconds)>;
int finish_checks(stack::Stack& stack, io::Port& port, const stack::PoolUsage& baseline, int rc,
                  const RunUntil& run = {});

// Moves this process into the network namespace `name` ("" = stay): before opening a port in it.
void enter_netns(const std::string& name);

// Listens on cfg.tcp_port, accepts `connections` streams of `bytes` each (after an 8-byte seed header),
// verifies every byte, closes each after the peer's FIN. Reports "rx_bytes=N seconds=S MBps=M".
// `stall`: once a quarter of all bytes arrived, stop polling for that long (a receiver that falls behind: the
// sender's rings and TX queue fill up).
int stream_server(const PeerConfig& cfg, std::uint64_t bytes, unsigned connections,
                  std::chrono::milliseconds stall = std::chrono::milliseconds(0));
// Opens `connections` connections to cfg.peer:cfg.tcp_port, sends the streams, closes. `mixed`: each write of
// up to 64 KiB begins with 1 KiB sent by reference from a TX chunk (TcpConnection::tx_buffer) and copies the
// rest, so that lwIP builds segments of a chunk's piece followed by copied pieces.
int stream_client(const PeerConfig& cfg, std::uint64_t bytes, unsigned connections, bool mixed = false);
// Receives one stream with keepalive on (1 s idle, 0.5 s interval, 3 probes); succeeds if the connection
// ends with "timed out" after the sender vanished. Reports "peer loss detected after S s".
int dead_peer_detecting_server(const PeerConfig& cfg);
// Sends part of a stream, then the process ends at once (no FIN, no RST): a peer that dies.
int dying_client(const PeerConfig& cfg, std::uint64_t bytes_before_death);
// Runs a stack with no listener until the peer leaves (link down) or `seconds` pass.
int idle_peer(const PeerConfig& cfg, unsigned seconds);
// Connects to a port nobody listens on; succeeds if the error reported is "refused".
int refused_client(const PeerConfig& cfg);
// Accepts one connection and aborts it (RST) when the first data arrives.
int aborting_server(const PeerConfig& cfg);
// Connects, sends data until the connection is reset; succeeds if the error reported is "reset".
int reset_expecting_client(const PeerConfig& cfg);

}  // namespace softrdma::test
