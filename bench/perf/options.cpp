// SPDX-License-Identifier: MIT
#include "bench/perf/options.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace softrdma::perf {

const char* to_string(Test t) noexcept {
    switch (t) {
    case Test::send: return "send";
    case Test::write: return "write";
    case Test::read: return "read";
    case Test::atomic: return "atomic";
    }
    return "?";
}

const char* to_string(Kind k) noexcept { return k == Kind::lat ? "lat" : "bw"; }

std::vector<Phase> plan(const WireParams& p) {
    std::vector<std::uint32_t> sizes;
    if (p.test == Test::atomic) {
        sizes = {8};
    } else if (p.sweep != 0) {
        for (std::uint64_t s = 2; s <= p.max_size; s *= 2) sizes.push_back(static_cast<std::uint32_t>(s));
    } else {
        sizes = {p.size};
    }
    // Without -n: perftest's defaults, scaled down for large messages so that one size moves at most
    // `budget` bytes (a sweep to 8 MiB then takes seconds, not minutes); never below 16 timed messages.
    const std::uint64_t budget = p.kind == Kind::lat ? (128ull << 20) : (1ull << 30);
    const std::uint32_t def = p.kind == Kind::lat ? kDefaultLatIters : kDefaultBwIters;
    std::vector<Phase> out;
    for (const std::uint32_t s : sizes) {
        Phase ph;
        ph.size = s;
        ph.iters = p.iters != 0 ? p.iters
                                : static_cast<std::uint32_t>(std::clamp<std::uint64_t>(budget / s, 16, def));
        // Warmup without -w: the first ~1024 frames after a port starts cost several microseconds more each
        // (memif's shared rings are touched for the first time: page faults in both processes), so a cold
        // 64-byte ping-pong reads 4-6x its steady latency for its first 1000 messages. The default warmup
        // pushes at least 2048 messages or 32 MiB (latency) / 64 MiB (bandwidth) through first, at least 16
        // messages (and one TX depth for bandwidth).
        if (p.warmup != ~0u) {
            ph.warmup = p.warmup;
        } else {
            const std::uint64_t bytes = p.kind == Kind::lat ? (32ull << 20) : (64ull << 20);
            const std::uint64_t lo = p.kind == Kind::lat ? 16 : std::max<std::uint32_t>(16, p.depth);
            const std::uint64_t hi = p.kind == Kind::lat ? 2048 : 8192;
            ph.warmup = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(bytes / s, lo, std::max(lo, hi)));
        }
        out.push_back(ph);
    }
    return out;
}

void usage(const char* argv0) {
    std::fprintf(stderr,
        "usage: %s [options]   perftest-style latency / bandwidth over softrdma verbs\n"
        "test:\n"
        "  --test send|write|read|atomic  operation (default send; atomic = 8-byte fetch-and-add)\n"
        "  --lat | --bw        latency ping-pong (default) or bandwidth stream\n"
        "  -s, --size N        message bytes (k/M suffix; default 2 for --lat, 65536 for --bw, 8 for atomic)\n"
        "  -a, --all           sweep 2 B .. 8 MiB in powers of two\n"
        "  -n, --iters N       timed messages per size (default 1000 lat / 5000 bw, fewer for large sizes)\n"
        "  -w, --warmup N      untimed messages before them (default: >= 2048 or 32/64 MiB)\n"
        "  -t, --tx-depth N    --bw: outstanding WRs (default 128)\n"
        "  -c, --cq-mod N      --bw: one signaled WR every N (default 64, at most -t)\n"
        "  -r, --rx-depth N    send: receives kept posted (default 2 x tx depth, at least 16)\n"
        "  -I, --inline N      post messages up to N bytes inline (default 0)\n"
        "  -o, --outs N        READ/atomic: IRD/ORD, outstanding requests (default min(tx depth, 128))\n"
        "  --crc               require MPA CRC (default off)\n"
        "  --large-segments    TCP segments up to 64 KiB on memif (both threading modes), two FPDUs of up to\n"
        "                      32672 bytes each, framed in place (ContextConfig::large_segments; the default)\n"
        "  --mtu-segments      MTU-sized TCP segments instead (large_segments off)\n"
        "  --memif-zc          memif: the client end (with --local: the client process) in memif's zero-copy\n"
        "                      mode: one copy per frame instead of two (PortConfig::memif_zero_copy; hugepages;\n"
        "                      the default)\n"
        "  --memif-copy        memif: the client end copying into and out of memif's ring instead\n"
        "  --memif-driver      memif: the server end moving frames through DPDK's driver instead of its own\n"
        "                      copies (PortConfig::memif_own_server_path off)\n"
        "  --memif-no-borrow   memif: the server end copies every frame out of the ring instead of reading\n"
        "                      large ones where the client wrote them (PortConfig::memif_borrow_rx off)\n"
        "  --memif-no-pre-own  memif: the server end does not take the client's posted buffers for writing\n"
        "                      while it waits (PortConfig::memif_pre_own off)\n"
        "  --layers            after each row, the client's cycles per message by layer (io, lwip, mpa+crc,\n"
        "                      ddp/rdmap, verbs) and its TX copies per payload byte; with rx-thread, its RX\n"
        "                      thread's too (rx io, rx place, rx forward); then the server's (its main\n"
        "                      thread's, sent back with the phase's verdict); costs ~0.1 us per 64 B half\n"
        "                      round trip (a TSC read at each layer boundary), nothing measurable at 32 KiB\n"
        "  --mtu 1500|9000     port MTU (default 1500)\n"
        "  --threading rtc|rx-thread  run to completion (default) or a dedicated RX thread per process\n"
        "  --yield-after N     idle polling turns before yielding the core (default 0 = spin; 64 with rx-thread)\n"
        "  --json FILE         write the results as JSON\n"
        "  --timeout SEC       fail a wait without progress after SEC (default 10)\n"
        "  --deadline SEC      --local: kill both processes after SEC; --server: wait this long for a client\n"
        "                      (default 600)\n"
        "  --no-huge           DPDK without hugepages\n"
        "  -v, --verbose       softrdma's info logs\n"
        "ends:\n"
        "  --local             (default) fork a server and a client on this machine, over memif\n"
        "  --server            one end: listen, take the test from the client\n"
        "  --client ADDR       one end: connect to the server at ADDR, print the table\n"
        "  --core-rtt          only measure the cache line round trip between the --cpu cores (default 0,1):\n"
        "                      the host's spell (scripts/compare --targets pairs runs by it); --json too\n"
        "  --cpu LIST          --local: SERVER,CLIENT cores (default 0,1); else this process's DPDK core\n"
        "  --addr IP           our address (default 198.18.0.1 server, 198.18.0.2 client)\n"
        "  --netmask MASK      (default 255.255.255.0)\n"
        "  --port N            TCP port (default 18515)\n"
        "  --backend memif|af_packet|device  (default memif; --iface / --device imply the others)\n"
        "  --memif-socket PATH memif socket shared by both ends (the server is the memif server)\n"
        "  --iface IF          af_packet: Linux interface (veth, tap or a NIC)\n"
        "  --device DEV        DPDK device: PCI address bound to vfio-pci, or a vdev string\n",
        argv0);
}

namespace {

bool to_u32(std::string_view text, std::uint32_t& out) {
    if (text.empty()) return false;
    char* end = nullptr;
    const std::string s(text);
    const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    std::uint64_t mult = 1;
    if (*end == 'k' || *end == 'K') mult = 1024, ++end;
    else if (*end == 'm' || *end == 'M') mult = 1024 * 1024, ++end;
    if (*end != '\0' || v * mult > 0xffffffffull) return false;
    out = static_cast<std::uint32_t>(v * mult);
    return true;
}

}  // namespace

bool parse(int argc, char** argv, Options& o, int& exit_code) {
    WireParams& p = o.params;
    p.magic = kWireMagic;
    p.version = kWireVersion;
    p.size = 0;
    p.iters = 0;
    p.warmup = ~0u;
    p.depth = 128;
    p.cq_mod = 0;
    p.inline_size = 0;
    p.outs = 0;
    p.rx_depth = 0;
    bool kind_set = false, size_set = false;
    exit_code = 2;
    auto fail = [&](const std::string& why) {
        std::fprintf(stderr, "rdma_perf: %s\n", why.c_str());
        return false;
    };
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        auto value = [&](std::string_view& v) {
            if (i + 1 >= argc) return false;
            v = argv[++i];
            return true;
        };
        auto number = [&](std::uint32_t& out) {
            std::string_view v;
            return value(v) && to_u32(v, out);
        };
        std::string_view v;
        std::uint32_t n = 0;
        if (a == "-h" || a == "--help") {
            usage(argv[0]);
            exit_code = 0;
            return false;
        } else if (a == "--test") {
            if (!value(v)) return fail("--test needs a value");
            if (v == "send") p.test = Test::send;
            else if (v == "write") p.test = Test::write;
            else if (v == "read") p.test = Test::read;
            else if (v == "atomic") p.test = Test::atomic;
            else return fail("--test: send, write, read or atomic, not " + std::string(v));
        } else if (a == "--lat") {
            p.kind = Kind::lat;
            kind_set = true;
        } else if (a == "--bw") {
            p.kind = Kind::bw;
            kind_set = true;
        } else if (a == "-s" || a == "--size") {
            if (!number(n) || n == 0 || n > kMaxSize) return fail("-s: a size from 1 to 8M bytes");
            p.size = n;
            size_set = true;
        } else if (a == "-a" || a == "--all") {
            p.sweep = 1;
        } else if (a == "-n" || a == "--iters") {
            if (!number(n) || n == 0) return fail("-n: a positive count");
            p.iters = n;
        } else if (a == "-w" || a == "--warmup") {
            if (!number(n) || n == ~0u) return fail("-w: a count");
            p.warmup = n;
        } else if (a == "-t" || a == "--tx-depth") {
            if (!number(n) || n == 0 || n > 4096) return fail("-t: 1 .. 4096 outstanding WRs");
            p.depth = n;
        } else if (a == "-r" || a == "--rx-depth") {
            if (!number(n) || n == 0 || n > 8192) return fail("-r: 1 .. 8192 receives");
            p.rx_depth = n;
        } else if (a == "-c" || a == "--cq-mod") {
            if (!number(n) || n == 0) return fail("-c: a positive count");
            p.cq_mod = n;
        } else if (a == "-I" || a == "--inline") {
            if (!number(n) || n > 4096) return fail("-I: 0 .. 4096 bytes");
            p.inline_size = n;
        } else if (a == "-o" || a == "--outs") {
            if (!number(n) || n == 0 || n > 128) return fail("-o: 1 .. 128 (IRD/ORD)");
            p.outs = n;
        } else if (a == "--crc") {
            o.crc = true;
        } else if (a == "--large-segments") {
            o.large_segments = true;
        } else if (a == "--mtu-segments") {
            o.large_segments = false;
        } else if (a == "--memif-zc") {
            o.memif_zero_copy = true;
        } else if (a == "--memif-copy") {
            o.memif_zero_copy = false;
        } else if (a == "--memif-driver") {
            o.memif_own_server_path = false;
        } else if (a == "--memif-no-borrow") {
            o.memif_borrow_rx = false;
        } else if (a == "--memif-no-pre-own") {
            o.memif_pre_own = false;
        } else if (a == "--layers") {
            o.layers = true;
        } else if (a == "--mtu") {
            if (!number(n) || (n != 1500 && n != 9000)) return fail("--mtu: 1500 or 9000");
            o.mtu = static_cast<std::uint16_t>(n);
        } else if (a == "--no-huge") {
            o.no_huge = true;
        } else if (a == "--threading") {
            if (!value(v)) return fail("--threading needs a value");
            if (v != "rtc" && v != "rx-thread") return fail("--threading: rtc or rx-thread");
            o.threading = std::string(v);
        } else if (a == "--yield-after") {
            if (!number(n) || n == ~0u) return fail("--yield-after: idle turns (0 = spin)");
            o.yield_after = n;
        } else if (a == "--cpu") {
            if (!value(v)) return fail("--cpu needs a core list");
            o.cpu = std::string(v);
        } else if (a == "--json") {
            if (!value(v)) return fail("--json needs a file name");
            o.json = std::string(v);
        } else if (a == "--timeout") {
            if (!number(n) || n == 0) return fail("--timeout: seconds > 0");
            o.timeout_s = n;
        } else if (a == "--deadline") {
            if (!number(n) || n == 0) return fail("--deadline: seconds > 0");
            o.deadline_s = n;
        } else if (a == "--verbose" || a == "-v") {
            o.verbose = true;
        } else if (a == "--local") {
            o.mode = Mode::local;
        } else if (a == "--server") {
            o.mode = Mode::server;
        } else if (a == "--core-rtt") {
            o.mode = Mode::core_rtt;
        } else if (a == "--client") {
            if (!value(v)) return fail("--client needs the server's address");
            o.mode = Mode::client;
            o.peer = std::string(v);
        } else if (a == "--addr") {
            if (!value(v)) return fail("--addr needs an address");
            o.addr = std::string(v);
        } else if (a == "--netmask") {
            if (!value(v)) return fail("--netmask needs a mask");
            o.netmask = std::string(v);
        } else if (a == "--port") {
            if (!number(n) || n == 0 || n > 65535) return fail("--port: 1 .. 65535");
            o.tcp_port = static_cast<std::uint16_t>(n);
        } else if (a == "--backend") {
            if (!value(v)) return fail("--backend needs a value");
            if (v == "memif") o.backend = Backend::memif;
            else if (v == "af_packet") o.backend = Backend::af_packet;
            else if (v == "device") o.backend = Backend::device;
            else return fail("--backend: memif, af_packet or device");
        } else if (a == "--memif-socket") {
            if (!value(v)) return fail("--memif-socket needs a path");
            o.memif_socket = std::string(v);
        } else if (a == "--iface") {
            if (!value(v)) return fail("--iface needs an interface name");
            o.iface = std::string(v);
            o.backend = Backend::af_packet;
        } else if (a == "--device") {
            if (!value(v)) return fail("--device needs a PCI address or vdev string");
            o.device = std::string(v);
            o.backend = Backend::device;
        } else {
            usage(argv[0]);
            return fail("unknown flag " + std::string(a));
        }
    }
    if (!kind_set) p.kind = Kind::lat;
    // Sizes: perftest's defaults (2 bytes for latency, 64 KiB for bandwidth); atomics are 8 bytes.
    if (p.test == Test::atomic) {
        if (size_set && p.size != 8) return fail("atomic: the size is 8 bytes (fetch-and-add of a 64-bit word)");
        if (p.sweep != 0) return fail("atomic: no size sweep (-a): the operand is 8 bytes");
        p.size = 8;
    } else if (!size_set) {
        p.size = p.kind == Kind::lat ? 2 : 65536;
    }
    if (p.sweep != 0 && size_set) return fail("-a and -s exclude each other");
    p.max_size = p.sweep != 0 ? kMaxSize : p.size;
    if (p.test == Test::write && p.kind == Kind::lat && p.max_size < 1) return fail("write latency needs >= 1 byte");
    if (p.kind == Kind::lat) p.depth = 1;  // ping-pong: one message in flight (the -t value is for --bw)
    if (p.cq_mod == 0) p.cq_mod = p.kind == Kind::bw ? 64 : 1;
    p.cq_mod = std::min(p.cq_mod, p.depth);  // a signaled WR must come within every window of depth WRs
    if (p.rx_depth == 0) p.rx_depth = std::max<std::uint32_t>(2 * p.depth, 16);
    if (p.outs == 0) p.outs = std::min<std::uint32_t>(p.depth, 128);
    if (o.mode == Mode::client && o.peer.empty()) return fail("--client needs the server's address");
    if (o.mode == Mode::local && o.backend != Backend::memif)
        return fail("--local runs both ends over memif; use --server/--client for af_packet or a device");
    if (o.backend == Backend::af_packet && o.iface.empty()) return fail("--backend af_packet needs --iface");
    if (o.backend == Backend::device && o.device.empty()) return fail("--backend device needs --device");
    return true;
}

}  // namespace softrdma::perf
