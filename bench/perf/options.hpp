// SPDX-License-Identifier: MIT
// rdma_perf command line and run plan: which test, which sizes, how many iterations per size. The client
// sends its plan to the server in the MPA private data (WireParams), so a server needs no test flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/port.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::perf {

enum class Test : std::uint8_t { send, write, read, atomic };
enum class Kind : std::uint8_t { lat, bw };
enum class Mode : std::uint8_t { local, server, client, core_rtt };

const char* to_string(Test t) noexcept;
const char* to_string(Kind k) noexcept;

// Largest message (-a sweeps 2 B .. this) and the auto-scaling budget when -n is not given.
inline constexpr std::uint32_t kMaxSize = 8u << 20;
inline constexpr std::uint32_t kDefaultLatIters = 1000;  // ib_*_lat default
inline constexpr std::uint32_t kDefaultBwIters = 5000;   // ib_*_bw default

// What both ends must agree on; travels client -> server in the MPA request's private data.
struct WireParams {
    std::uint32_t magic{0};
    std::uint8_t version{0};
    Test test{Test::send};
    Kind kind{Kind::lat};
    std::uint8_t sweep{0};        // 1: sizes 2 .. max_size in powers of two
    std::uint32_t size{0};        // single size (sweep == 0)
    std::uint32_t max_size{0};    // largest size in the plan
    std::uint32_t iters{0};       // 0 = default per size (scaled down for large messages)
    std::uint32_t warmup{0};      // ~0u = default
    std::uint32_t depth{0};       // TX depth: outstanding WRs
    std::uint32_t cq_mod{0};      // a signaled WR every cq_mod
    std::uint32_t inline_size{0}; // messages up to this many bytes posted inline
    std::uint32_t outs{0};        // IRD/ORD (outstanding READ/atomic)
    std::uint32_t rx_depth{0};    // receives kept posted (send tests)
    std::uint32_t pad{0};
    // The client's buffer (one MR; layout from Layout with max_size and depth).
    std::uint64_t addr{0};
    std::uint32_t rkey{0};
    std::uint32_t length{0};
};
inline constexpr std::uint32_t kWireMagic = 0x52504552;  // "REPR"
inline constexpr std::uint8_t kWireVersion = 1;
static_assert(sizeof(WireParams) <= 252, "MPA revision 2 private data limit");

// The server's answer in the MPA reply: its buffer.
struct WireRegion {
    std::uint64_t addr{0};
    std::uint32_t rkey{0};
    std::uint32_t length{0};
};

// One size of a run.
struct Phase {
    std::uint32_t size{0};
    std::uint32_t iters{0};   // timed messages
    std::uint32_t warmup{0};  // untimed messages before them
    std::uint32_t total() const noexcept { return iters + warmup; }
};
std::vector<Phase> plan(const WireParams& p);

struct Options {
    Mode mode{Mode::local};
    WireParams params{};
    std::string threading{"rtc"};  // rtc | rx-thread (verbs::ContextConfig::threading.mode)
    unsigned yield_after{~0u};     // idle turns before yielding the core; ~0u = default (rtc 0 = spin, rx-thread 64)
    std::uint16_t mtu{1500};
    bool no_huge{false};
    bool crc{false};
    // memif: TCP segments up to 64 KiB (verbs::ContextConfig::large_segments, on by
    // default; --mtu-segments turns it off)
    bool large_segments{verbs::ContextConfig{}.large_segments};
    // memif: the client end in memif's zero-copy mode (PortConfig::memif_zero_copy, on by default; needs
    // hugepages; --memif-copy turns it off)
    bool memif_zero_copy{io::PortConfig{}.memif_zero_copy};
    // memif: the server end's own receive and transmit (PortConfig::memif_own_server_path, on by default;
    // --memif-driver turns it off)
    bool memif_own_server_path{io::PortConfig{}.memif_own_server_path};
    bool memif_borrow_rx{io::PortConfig{}.memif_borrow_rx};  // --memif-no-borrow turns it off
    bool memif_pre_own{io::PortConfig{}.memif_pre_own};      // --memif-no-pre-own turns it off
    bool layers{false};  // print where the client's cycles went, by layer (verbs::LayerCycles; rtc only)
    std::string cpu;            // local: "A,B" (server core, client core); server/client: "N"
    std::string json;           // write the run as JSON here
    unsigned timeout_s{10};     // a wait without progress this long fails the run (peer gone)
    unsigned deadline_s{600};   // local: both processes are killed after this; server: wait for a client
    bool verbose{false};
    // server / client mode
    std::string peer;           // client: the server's address
    std::string addr;           // our address (default 198.18.0.1 server, 198.18.0.2 client)
    std::string netmask{"255.255.255.0"};
    std::uint16_t tcp_port{18515};
    Backend backend{Backend::memif};
    std::string iface;          // af_packet
    std::string device;         // device: PCI address or vdev string
    std::string memif_socket{"/run/softrdma-perf.sock"};
    // Not a flag: the cache line round trip between the two cores (core_round_trip_ns), measured by --local
    // before it forks; printed in the banner and the JSON. Unknown in server/client mode (the peer's core is
    // on another machine).
    std::optional<double> core_rtt_ns;
};

// Parses argv; on a bad or unsupported flag prints the reason (and usage) to stderr and returns false
// with exit_code set (0 for --help).
bool parse(int argc, char** argv, Options& out, int& exit_code);
void usage(const char* argv0);

}  // namespace softrdma::perf
