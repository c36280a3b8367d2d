// SPDX-License-Identifier: MIT
// What a Context is opened with, part by part (verbs::ContextConfig gathers them): the port (which DPDK
// device), the process's DPDK environment and cores, the IP address, the threading mode, the idle policy of
// polling loops. Plain structs, standard C++ only; the layers below verbs read these same types.
//
// A complete memif configuration for two processes on one machine, and an af_packet one for a Linux interface,
// are in verbs/README.md ("Your own program").
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace softrdma {

// What a polling loop does when a turn finds nothing to do (the RX thread, Context::run_until and
// wait_cm_event, the examples' loops). Spinning gives the lowest latency when each busy thread has a core;
// yielding or sleeping lets more busy threads than cores share a small machine.
struct IdlePolicy {
    enum class Then { spin, yield, sleep };
    // Idle turns spent spinning before `then` applies on each further idle turn (0 = at once).
    unsigned spin_turns = 256;
    Then then = Then::yield;
    // Sleep length for Then::sleep (what waking from idle costs in latency).
    std::chrono::microseconds sleep{20};

    static constexpr IdlePolicy spin_only() { return {.spin_turns = 0, .then = Then::spin}; }
};

// ---- the port: which Ethernet device DPDK drives -----------------------------------------------------------
enum class Backend {
    memif,      // shared memory between two processes on one machine (the default)
    af_packet,  // a Linux interface (veth, tap, or a physical NIC) through AF_PACKET
    ring,       // inside one process (tests)
    device,     // anything else DPDK can drive: `device` is a PCI address or a full vdev string
};

using MacAddress = std::array<std::uint8_t, 6>;

// Fault injection on one direction of a port: the probability, per frame, of each fault (0 = never).
struct FaultRates {
    double drop = 0;       // freed, never delivered / sent
    double duplicate = 0;  // delivered / sent twice (a copy follows it)
    double reorder = 0;    // held back until the next burst: frames after it overtake it
    double delay = 0;      // held back for FaultConfig::delay (released at the first burst after that)
    double corrupt = 0;    // one bit flipped past the Ethernet header (IP or TCP checksum, or MPA CRC, must catch it)
};
// Fault injection in io (io/faults.hpp), for tests and soak runs: off by default and then free. Also set by the
// environment: SOFTRDMA_FAULTS="rx_drop=0.01,tx_corrupt=0.01,delay_us=300,seed=7" ("all=0.01": every rate).
// With faults on, the port takes every frame sent: those a full TX ring refuses wait in the injector's queue,
// first out at the next burst (past its 256 they are dropped, and TCP resends them); a Context with TCP
// checksums on `automatic` turns them on (a corrupted frame must be caught).
struct FaultConfig {
    FaultRates rx{};
    FaultRates tx{};
    std::chrono::microseconds delay{300};
    std::uint64_t seed = 1;
    bool any() const noexcept {
        for (const FaultRates* r : {&rx, &tx})
            if (r->drop > 0 || r->duplicate > 0 || r->reorder > 0 || r->delay > 0 || r->corrupt > 0) return true;
        return false;
    }
};

struct PortConfig {
    Backend backend = Backend::memif;
    // memif: socket path shared by both ends, one end the server. Same `memif_id` on both ends.
    std::string memif_socket = "/run/softrdma-memif.sock";
    bool memif_server = true;
    unsigned memif_id = 0;
    // af_packet: the Linux interface to attach to.
    std::string iface;
    // device: a PCI address ("0000:01:00.0") or a full vdev string ("net_xxx0,arg=...").
    std::string device;
    // MAC address; unset = the backend's own (memif derives one from role and id to keep peers distinct).
    bool has_mac = false;
    MacAddress mac{};
    std::uint16_t mtu = 1500;  // 9000 where the backend allows
    std::uint16_t rx_descriptors = 1024;
    std::uint16_t tx_descriptors = 1024;
    // mbufs in the pool; 0 = the sizing rule in io/port.cpp (rx + tx descriptors + frames the stack may hold).
    // Set by hand it may be smaller (frames then wait for mbufs or are resent: slower, nothing lost), but not
    // below rx_descriptors + 64 (opening says so).
    std::uint32_t mbufs = 0;
    // Zero-copy transmit: FPDUs are framed into 64 KiB chunks of DPDK memory that TCP segments and outgoing
    // frames reference until acknowledged, instead of being copied into lwIP and again into an mbuf
    // (io/tx_arena.hpp). Chunks in the arena; 0 = the sizing rule in io/port.cpp (32 connections with full
    // send buffers: 192 chunks, 12 MiB; 10 with large segments' 1 MiB ones); a connection that finds none
    // free copies, as without zero-copy.
    // Only where the driver takes chained mbufs (memif, af_packet, most NICs); false turns it off.
    std::uint32_t tx_chunks = 0;
    bool tx_zero_copy = true;
    // memif: ring buffers of 64 KiB (one per frame, 2^5 per direction: 4 MiB of shared memory), for frames up
    // to 64 KiB: the large TCP segments of ContextConfig::large_segments; received frames land whole in 64 KiB
    // mbufs of an RX pool of their own (511 of them, 33 MiB; 1023 with fault injection). Each frame
    // stays in one buffer: DPDK 22.11's memif does not clear a reused descriptor's chain flag, so a frame
    // chained over several buffers can later glue a one-buffer frame to the next one.
    bool memif_large_frames = false;
    // memif client only, on by default: DPDK memif's zero-copy mode. The client's own mbufs are the ring's
    // buffers: the server copies a frame straight into an mbuf the client then receives as it is (no copy out
    // of the ring), and takes what the client sends straight from the client's mbufs and TX chunks (no copy
    // into the ring). One copy per frame instead of two, in both directions (bench/RESULTS.md, "memif zero-copy
    // client"). Needs hugepages (EAL's single-file segments); without them the port copies, and says so once.
    // On the zero-copy side payload is framed into TX chunks, not sent from application memory (memif can
    // only point the peer at DPDK's own memory), and the driver keeps up to one ring of RX mbufs and one of
    // sent frames while the link is up (the port takes them back when the link goes down or it closes, which
    // DPDK 22.11 does not). DPDK 22.11's zero-copy client also closes the EAL's hugepage file descriptors at
    // each handshake; the port puts them back (io/port.cpp). Ignored by a server (zero-copy is the client's
    // mode; its peer needs nothing). Trust: in this mode the client shares all of its DPDK memory with the
    // server (each of the EAL's memory segment lists is a memif region the server maps), so the server
    // process can read and write every mbuf pool and TX chunk of this process, other ports' included. Set
    // false where the memif peer is not trusted: a copying client shares only its rings and their buffers.
    bool memif_zero_copy = true;
    // memif server only, on by default: the port moves frames between the client's ring buffers and its own
    // mbufs itself, with the C library's memcpy, instead of through DPDK 22.11's memif driver (whose copies,
    // in Debian's SSE4.2 build, were most of a memif server's time), and checks every descriptor the client
    // wrote against the client's shared memory first (the driver does not: a wrong descriptor made it read or
    // write elsewhere in this process). 128-256 KiB round trips 15-24 % shorter (bench/RESULTS.md, "The memif server's
    // own copies"). false: the driver's bursts. Ignored by a client.
    bool memif_own_server_path = true;
    // memif server with large frames (memif_large_frames, or ContextConfig::large_segments) and its own path,
    // run to completion, on by default: a received frame of 4 KiB or more is not copied out of the client's
    // ring. Its first 256 bytes (every header TCP/IP reads) are copied, the rest is read where the client wrote
    // it, through this process's own mapping of the client's memory, and each ring slot goes back to the
    // client once its frame has been placed (io::detail::MemifServerPath, "Borrowed receive"): 8 MiB streams
    // 10-13 % faster (bench/RESULTS.md, "Reading frames in place"). A segment TCP would keep out of order is copied
    // first. Off with an RX thread (the engine turns it off) and with fault injection on this port.
    bool memif_borrow_rx = true;
    // memif server with its own path, on CPUs with PREFETCHW: while the stack has nothing to do, the lines of
    // the buffers the client posted for our next frames are taken for writing (prefetchw), so the copy of a
    // reply into them does not wait for each line to come from the client's core, which read it last
    // (io::detail::MemifServerPath::pre_own). A 32 KiB reply's copy 2.0 -> 1.1 us, its SEND half round trip
    // 5.70 -> 5.28 us in a slow spell (bench/RESULTS.md, "Taking the client's buffers before the reply").
    bool memif_pre_own = true;
    // Write every frame sent and received to this pcap file (tshark/Wireshark); empty = off. Debug aid:
    // it costs a buffered file write per frame.
    std::string capture_path;
    // How long opening waits for the link (for memif: the peer process, quietly) before failing.
    std::chrono::milliseconds link_timeout{10000};
    // Off: opening returns without waiting for the link (a memif server whose client comes later, an
    // interface still coming up); a listener waits for its peer like one on a NIC, and frames sent before the
    // link is up are dropped (TCP sends them again). A memif client waits regardless (link_timeout): it
    // cannot start before its server.
    bool wait_for_link = true;
    // memif client: when its server leaves, connect again to the next server on the socket (every 20 ms
    // while the link is down; DPDK's memif client never does). Off, a client whose server left stays down
    // until closed. The drop-in libraries turn it on: qperf's server forks a child per test, each a new
    // memif server its client's device must reach.
    bool memif_reconnect = false;
    // Fault injection (tests, soak); SOFTRDMA_FAULTS in the environment overrides it.
    FaultConfig faults{};
};

// ---- the process's DPDK environment (EAL) and its cores ----------------------------------------------------
enum class Hugepages { automatic, required, off };

struct EalConfig {
    // Core pinning. Default: none. The thread that opens the Context, DPDK's own threads and the RX thread run
    // wherever the kernel puts them (within the process's affinity), as any program's threads do.
    // `lcores` (DPDK's -l syntax: "1", "2-3", "0,2"): pin the thread that opens the Context to the first core
    // of the list (DPDK's main lcore); each must be one this process may use.
    std::string lcores;
    // With `lcores` empty: pin to a core that no other softrdma process on this machine has claimed this way
    // (one lock file per core in /run/softrdma, or $TMPDIR when /run is not writable; the claim ends with the
    // process), so two processes asked to pin without a list get distinct cores. Opening fails when every
    // core is claimed.
    bool pin = false;
    // automatic: use hugepages when the machine has free 2 MiB pages and a hugetlbfs mount (scripts/setup
    // makes both), else run with --no-huge and say so once. required: fail with a clear error if absent.
    Hugepages hugepages = Hugepages::automatic;
    // Memory for --no-huge mode, MiB: the mbuf pool (see PortConfig) plus ~64 MiB of DPDK's own.
    unsigned no_huge_memory_mb = 512;
    // Distinct per process so two DPDK processes coexist; empty = "softrdma-<pid>".
    std::string file_prefix;
    // DPDK's own log level (1..8); errors only by default.
    int log_level = 4;
    // Devices to create: "--vdev" arguments (e.g. "net_memif0,role=server,socket=/run/x.sock").
    std::vector<std::string> vdevs;
    // Appended verbatim (experts: e.g. "--iova-mode=va").
    std::vector<std::string> extra_args;
};

// ---- IP ----------------------------------------------------------------------------------------------------
// An IPv4 address in network byte order.
struct Ipv4 {
    std::uint32_t be = 0;
    // "198.18.0.1" -> address; throws std::invalid_argument on bad text.
    static Ipv4 parse(std::string_view text);
    std::string str() const;
    friend bool operator==(Ipv4, Ipv4) = default;
};

struct IpConfig {
    Ipv4 address = Ipv4::parse("198.18.0.1");  // RFC 2544 benchmarking range: never routed anywhere
    Ipv4 netmask = Ipv4::parse("255.255.255.0");
    Ipv4 gateway{};
};

// ---- threads -----------------------------------------------------------------------------------------------
enum class ThreadingMode {
    // One thread (the application's) polls DPDK, runs lwIP, MPA/DDP/RDMAP and TX inside Context::poll().
    // For machines with few cores: nothing else competes for the core.
    run_to_completion,
    // A dedicated RX thread polls DPDK and returns each mbuf within its turn: frames of connections not yet
    // in RDMA mode are copied into a slot the application side owns (lwIP takes it without a copy); the
    // payload of each QP's stream is placed by the QP's receive half straight from the mbuf (the one copy),
    // only the headers going on to lwIP. The application thread runs lwIP, the protocol's TX, completions and
    // the CM. They meet only through bounded lock-free SPSC rings.
    rx_thread,
};

struct ThreadingConfig {
    ThreadingMode mode = ThreadingMode::run_to_completion;
    // Core for the RX thread; -1 = not pinned.
    int rx_core = -1;
    // Core to pin the application thread (the one opening the Context) to after DPDK started; -1 = leave it.
    int app_core = -1;
    IdlePolicy rx_idle{};  // the RX thread when it finds no frame
    // Frame buffers between the RX thread and the application thread. Sizing rule: frames in flight on the
    // ring plus what lwIP may hold (its out-of-order queue, TCP_OOSEQ_MAX_PBUFS = 256) plus frames of
    // connections still negotiating MPA; 4096 leaves room for 1024 QPs with a few frames each.
    unsigned rx_slots = 4096;
};

}  // namespace softrdma
