// SPDX-License-Identifier: MIT
// Linux kernel TCP, the comparison point for softrdma: one server and one client, normally each in its own
// network namespace on a veth pair (scripts/compare makes them and runs both ends with `ip netns exec`).
// Blocking sockets, TCP_NODELAY, one connection per measurement.
//
//   kernel_tcp server --port P [--cpu N] [--timeout S]
//   kernel_tcp client --host ADDR --port P [--cpu N] [--timeout S] [--sizes 64,...] [--iters N] [--warmup N] [--spin]
//                     [--stream-sizes 64,65536,...] [--stream-ms N] [--stream-reps N] [--json FILE]
//
//  - ping-pong: the client writes N bytes, the server reads them all and writes them back; half the round
//    trip, median / p99 / min over --iters exchanges per size. --spin: both ends busy-poll
//    recv(MSG_DONTWAIT) instead of sleeping in recv(), as softrdma polls (costs a core at each end).
//  - stream: the client writes N-byte messages for --stream-ms and then shuts its side down; the server counts
//    bytes from the first byte to end of stream and sends back what it counted: payload GB/s (10^9 bytes/s)
//    and messages per second (bytes / N); --stream-reps connections per size, the median one reported.
//
// Every socket has send/receive time limits and the process an overall alarm, so nothing hangs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"

namespace {

using Clock = std::chrono::steady_clock;

enum Op : std::uint32_t { op_pingpong = 1, op_stream = 2, op_quit = 3, op_pingpong_spin = 4 };

struct Request {  // client -> server at the start of each connection, host byte order (same machine)
    std::uint32_t op;
    std::uint32_t size;
    std::uint64_t count;  // ping-pong exchanges
};
struct StreamResult {  // server -> client after a stream
    std::uint64_t bytes;
    std::uint64_t ns;
};

struct Options {
    bool server = false;
    bool spin = false;  // ping-pong: both ends busy-poll recv(MSG_DONTWAIT) instead of blocking
    std::string host = "127.0.0.1";
    int port = 5201;
    int cpu = -1;
    unsigned timeout_s = 120;
    std::vector<std::uint32_t> sizes{64, 128, 256, 512, 1024, 1500, 2048, 4096, 8192, 9000, 16384, 65536};
    std::vector<std::uint32_t> stream_sizes{64, 256, 1024, 4096, 16384, 65536, 262144, 1048576};
    unsigned iters = 20000, warmup = 2000, stream_ms = 400, stream_reps = 5;
    std::string json;
};

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

void set_limits(int fd, unsigned seconds) {
    timeval tv{static_cast<time_t>(seconds), 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Reads exactly n bytes; false on a clean end of stream before the first byte. Throws on error/timeout.
// spin: busy-polls with MSG_DONTWAIT instead of sleeping in recv() (bounded by the process alarm).
bool read_all(int fd, void* buf, std::size_t n, bool spin = false) {
    auto* p = static_cast<char*>(buf);
    std::size_t got = 0;
    while (got < n) {
        const ssize_t r = ::recv(fd, p + got, n - got, spin ? MSG_DONTWAIT : 0);
        if (r == 0) {
            if (got == 0) return false;
            throw std::runtime_error("peer closed mid-message");
        }
        if (r < 0) {
            if (errno == EINTR || (spin && (errno == EAGAIN || errno == EWOULDBLOCK))) continue;
            fail("recv");
        }
        got += static_cast<std::size_t>(r);
    }
    return true;
}

void write_all(int fd, const void* buf, std::size_t n) {
    const auto* p = static_cast<const char*>(buf);
    std::size_t done = 0;
    while (done < n) {
        const ssize_t r = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR) continue;
            fail("send");
        }
        done += static_cast<std::size_t>(r);
    }
}

void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) fail("sched_setaffinity");
}

int run_server(const Options& o) {
    const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) fail("socket");
    int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(o.port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("bind");
    if (::listen(ls, 4) != 0) fail("listen");
    std::printf("listening on port %d\n", o.port);
    std::fflush(stdout);
    std::vector<char> buf(4u << 20);  // the largest ping-pong message, and the stream's read size
    for (;;) {
        const int fd = ::accept(ls, nullptr, nullptr);
        if (fd < 0) {
            if (errno == EINTR) continue;
            fail("accept");
        }
        set_limits(fd, 10);
        Request rq{};
        if (!read_all(fd, &rq, sizeof rq)) {
            ::close(fd);
            continue;
        }
        if (rq.op == op_quit) {
            ::close(fd);
            break;
        }
        if (rq.op == op_pingpong || rq.op == op_pingpong_spin) {
            if (rq.size > buf.size()) throw std::runtime_error("ping-pong message too large");
            for (std::uint64_t i = 0; i < rq.count; ++i) {
                if (!read_all(fd, buf.data(), rq.size, rq.op == op_pingpong_spin))
                    throw std::runtime_error("ping-pong ended early");
                write_all(fd, buf.data(), rq.size);
            }
        } else if (rq.op == op_stream) {
            std::uint64_t bytes = 0;
            Clock::time_point first{};
            for (;;) {
                const ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
                if (r == 0) break;
                if (r < 0) {
                    if (errno == EINTR) continue;
                    fail("recv (stream)");
                }
                if (bytes == 0) first = Clock::now();
                bytes += static_cast<std::uint64_t>(r);
            }
            const StreamResult res{
                bytes, static_cast<std::uint64_t>(
                           std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - first).count())};
            write_all(fd, &res, sizeof res);
        }
        ::close(fd);
    }
    ::close(ls);
    return 0;
}

int connect_to(const Options& o) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) fail("socket");
    set_limits(fd, 10);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(o.port));
    if (::inet_pton(AF_INET, o.host.c_str(), &a.sin_addr) != 1) throw std::runtime_error("bad address " + o.host);
    // The server may still be starting: retry for up to 5 s.
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (Clock::now() > until) fail("connect to " + o.host + ":" + std::to_string(o.port));
        ::usleep(20000);
    }
    return fd;
}

int run_client(const Options& o) {
    std::string lat_json, bw_json;
    std::vector<char> buf(4u << 20, 'x');
    std::vector<double> rtt(o.iters);  // preallocated: nothing allocates in the timed loop
    std::printf("# Linux kernel TCP to %s:%d (TCP_NODELAY; ping-pong %s)\n", o.host.c_str(), o.port,
                o.spin ? "busy-polling recv(MSG_DONTWAIT) at both ends" : "blocking recv()");
    std::printf("%-8s %10s %12s %12s %12s\n", "bytes", "iters", "half-RTT min", "median us", "p99 us");
    for (const std::uint32_t size : o.sizes) {
        if (size == 0 || size > buf.size()) continue;
        const int fd = connect_to(o);
        const Request rq{o.spin ? op_pingpong_spin : op_pingpong, size, std::uint64_t{o.warmup} + o.iters};
        write_all(fd, &rq, sizeof rq);
        for (unsigned i = 0; i < o.warmup + o.iters; ++i) {
            const auto t0 = Clock::now();
            write_all(fd, buf.data(), size);
            if (!read_all(fd, buf.data(), size, o.spin)) throw std::runtime_error("server closed during ping-pong");
            const auto t1 = Clock::now();
            if (i >= o.warmup) rtt[i - o.warmup] = std::chrono::duration<double, std::micro>(t1 - t0).count();
        }
        ::close(fd);
        std::sort(rtt.begin(), rtt.end());
        const auto q = [&](double f) {
            return rtt[std::min<std::size_t>(rtt.size() - 1,
                                             static_cast<std::size_t>(f * static_cast<double>(rtt.size())))];
        };
        std::printf("%-8u %10u %12.2f %12.2f %12.2f\n", size, o.iters, q(0) / 2, q(0.5) / 2, q(0.99) / 2);
        char j[256];
        std::snprintf(j, sizeof j,
                      "%s{\"bytes\":%u,\"iterations\":%u,\"half_rtt_min_us\":%.3f,\"half_rtt_median_us\":%.3f,"
                      "\"half_rtt_p99_us\":%.3f,\"rtt_median_us\":%.3f}",
                      lat_json.empty() ? "" : ",", size, o.iters, q(0) / 2, q(0.5) / 2, q(0.99) / 2, q(0.5));
        lat_json += j;
    }
    std::printf("# one-way stream of N-byte messages, median of %u repetitions of %u ms (min..max GB/s)\n",
                o.stream_reps, o.stream_ms);
    struct Rep {
        std::uint64_t bytes;
        double secs, gbs;
    };
    std::vector<Rep> reps;
    reps.reserve(o.stream_reps);
    for (const std::uint32_t size : o.stream_sizes) {
        if (size == 0 || size > buf.size()) continue;
        reps.clear();
        for (unsigned r = 0; r < o.stream_reps; ++r) {
            const int fd = connect_to(o);
            const Request rq{op_stream, size, 0};
            write_all(fd, &rq, sizeof rq);
            const auto stop = Clock::now() + std::chrono::milliseconds(o.stream_ms);
            std::uint64_t sent = 0;
            while (Clock::now() < stop) {  // a clock read per message: ~20 ns, small next to a send() call
                write_all(fd, buf.data(), size);
                sent += size;
            }
            if (::shutdown(fd, SHUT_WR) != 0) fail("shutdown");
            StreamResult res{};
            if (!read_all(fd, &res, sizeof res)) throw std::runtime_error("server sent no stream result");
            ::close(fd);
            if (res.bytes != sent)
                throw std::runtime_error("server counted " + std::to_string(res.bytes) + " of " + std::to_string(sent) +
                                         " bytes");
            const double secs = static_cast<double>(res.ns) / 1e9;
            reps.push_back({res.bytes, secs, secs > 0 ? static_cast<double>(res.bytes) / secs / 1e9 : 0});
        }  // repetitions: the median is reported (one descheduled stretch spoils one, not all)
        std::sort(reps.begin(), reps.end(), [](const Rep& a, const Rep& b) { return a.gbs < b.gbs; });
        const Rep& m = reps[reps.size() / 2];
        const double mps = m.secs > 0 ? static_cast<double>(m.bytes / size) / m.secs / 1e6 : 0;
        std::printf("%-8u %12llu bytes %8.3f s %8.3f GB/s %8.3f M msg/s  (%.3f..%.3f)\n", size,
                    static_cast<unsigned long long>(m.bytes), m.secs, m.gbs, mps, reps.front().gbs, reps.back().gbs);
        char j[320];
        std::snprintf(j, sizeof j,
                      "%s{\"bytes\":%u,\"total_bytes\":%llu,\"seconds\":%.6f,\"gb_s\":%.4f,\"mmsg_s\":%.4f,"
                      "\"gb_s_min\":%.4f,\"gb_s_max\":%.4f,\"repetitions\":%zu}",
                      bw_json.empty() ? "" : ",", size, static_cast<unsigned long long>(m.bytes), m.secs, m.gbs, mps,
                      reps.front().gbs, reps.back().gbs, reps.size());
        bw_json += j;
    }
    std::fflush(stdout);
    if (!o.json.empty()) {
        FILE* f = std::fopen(o.json.c_str(), "w");
        if (f == nullptr) fail("cannot write " + o.json);
        std::fprintf(f, "{\"tool\":\"kernel_tcp\",\"lat\":[%s],\"bw\":[%s]}\n", lat_json.c_str(), bw_json.c_str());
        std::fclose(f);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    bool quit = false;
    if (argc < 2 || (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0 &&
                     std::strcmp(argv[1], "quit") != 0)) {
        std::fprintf(stderr,
                     "usage: %s server --port P [--cpu N] [--timeout S]\n"
                     "       %s client --host ADDR --port P [--cpu N] [--timeout S] [--sizes 64,...] [--iters N] [--spin]\n"
                     "                 [--warmup N] [--stream-sizes 64,65536,...] [--stream-ms N] [--stream-reps N] "
                     "[--json FILE]\n"
                     "       %s quit --host ADDR --port P   (stops a server)\n",
                     argv[0], argv[0], argv[0]);
        return 2;
    }
    o.server = std::strcmp(argv[1], "server") == 0;
    quit = std::strcmp(argv[1], "quit") == 0;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--spin") {
            o.spin = true;
            continue;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "kernel_tcp: %s needs a value\n", a.c_str());
            return 2;
        }
        const char* v = argv[++i];
        if (a == "--host")
            o.host = v;
        else if (a == "--port")
            o.port = std::atoi(v);
        else if (a == "--cpu")
            o.cpu = std::atoi(v);
        else if (a == "--timeout")
            o.timeout_s = std::max(1, std::atoi(v));
        else if (a == "--sizes")
            o.sizes = softrdma::compare::parse_list(v);
        else if (a == "--stream-sizes")
            o.stream_sizes = softrdma::compare::parse_list(v);
        else if (a == "--iters")
            o.iters = std::max(1, std::atoi(v));
        else if (a == "--warmup")
            o.warmup = static_cast<unsigned>(std::max(0, std::atoi(v)));
        else if (a == "--stream-ms")
            o.stream_ms = std::max(10, std::atoi(v));
        else if (a == "--stream-reps")
            o.stream_reps = std::max(1, std::atoi(v));
        else if (a == "--json")
            o.json = v;
        else {
            std::fprintf(stderr, "kernel_tcp: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    std::signal(SIGALRM, SIG_DFL);  // the overall limit: the default action ends the process
    ::alarm(o.timeout_s);
    try {
        pin(o.cpu);
        if (quit) {
            const int fd = connect_to(o);
            const Request rq{op_quit, 0, 0};
            write_all(fd, &rq, sizeof rq);
            ::close(fd);
            return 0;
        }
        return o.server ? run_server(o) : run_client(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kernel_tcp %s: %s\n", argv[1], e.what());
        return 1;
    }
}
