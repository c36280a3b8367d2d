// SPDX-License-Identifier: MIT
// copy_ceiling: what this machine's caches allow a stream of messages of a given size, with no protocol,
// no TCP and no device in the way: only the copies a payload byte must take.
//
//   two copies   one thread (core A) copies each message from a source buffer into 64 KiB chunks of a ring
//                of --ring chunks; a second (core B) copies each chunk on into a target buffer, as a sender's
//                framing copy and a receiver's placement do (softrdma with memif: the requester frames into TX
//                chunks the memif server reads and places; kernel TCP: user -> skb, skb -> user);
//   one copy     one thread copies each message from source to target in 64 KiB pieces (the most a design
//                placing straight from the sender's memory could do).
// The source and the target are each one message long and reused for every message, as perftest's and
// rdma_perf's buffers are, so a 64 KiB stream runs within the cores' caches and an 8 MiB one does not. The
// ratio of the two is the ceiling for "large messages at X % of 64 KiB" on this machine.
//
//   copy_ceiling [--sizes 65536,1048576,...] [--ms N] [--reps N] [--ring N] [--cpus A,B] [--json FILE]
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kChunk = 64 * 1024;

struct Options {
    std::vector<std::size_t> sizes{64 * 1024, 1 << 20, 2 << 20, 4 << 20, 8 << 20};
    unsigned ms = 300, reps = 3, ring = 32;
    int cpu_a = 1, cpu_b = 0;
    std::string json;
};

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr,
                 "copy_ceiling: %s\nusage: copy_ceiling [--sizes B,B,...] [--ms N] [--reps N] [--ring N] "
                 "[--cpus A,B] [--json FILE]\n",
                 why);
    std::exit(2);
}

unsigned long parse_num(const char* s, const char* what) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(s, &end, 10);
    if (end == s || *end != '\0' || v == 0) usage((std::string("bad ") + what + ": " + s).c_str());
    return v;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) usage((a + " needs a value").c_str());
            return argv[++i];
        };
        if (a == "--sizes") {
            o.sizes.clear();
            std::string list = next();
            for (std::size_t p = 0; p <= list.size();) {
                const std::size_t q = std::min(list.find(',', p), list.size());
                const std::size_t v = parse_num(list.substr(p, q - p).c_str(), "size");
                if (v % kChunk != 0) usage("sizes must be multiples of 65536");
                o.sizes.push_back(v);
                p = q + 1;
            }
        } else if (a == "--ms") {
            o.ms = static_cast<unsigned>(parse_num(next(), "--ms"));
        } else if (a == "--reps") {
            o.reps = static_cast<unsigned>(parse_num(next(), "--reps"));
        } else if (a == "--ring") {
            o.ring = static_cast<unsigned>(parse_num(next(), "--ring"));
        } else if (a == "--cpus") {
            const std::string v = next();
            if (std::sscanf(v.c_str(), "%d,%d", &o.cpu_a, &o.cpu_b) != 2) usage("--cpus wants A,B");
        } else if (a == "--json") {
            o.json = next();
        } else {
            usage(("unknown argument " + a).c_str());
        }
    }
    return o;
}

void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort: fewer cores still measures
}

struct Buffer {
    explicit Buffer(std::size_t n) : p(static_cast<std::byte*>(std::aligned_alloc(4096, n))), size(n) {
        if (p == nullptr) usage("out of memory");
        std::memset(p, 0x5a, n);  // touched: no page faults while timed
    }
    ~Buffer() { std::free(p); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    std::byte* p;
    std::size_t size;
};

struct alignas(64) Index {
    std::atomic<std::uint64_t> v{0};
};

// Two copies through a ring of 64 KiB chunks, the producer pinned to cpu_a, the consumer to cpu_b. Returns GB/s
// (10^9 B/s) delivered into the target.
double two_copies(const Options& o, std::size_t size) {
    Buffer src(size), dst(size), ring(o.ring * kChunk);
    Index head, tail;  // chunks filled (producer), chunks emptied (consumer)
    std::atomic<bool> stop{false};
    std::thread producer([&] {
        pin(o.cpu_a);
        std::size_t off = 0;
        while (!stop.load(std::memory_order_relaxed)) {
            const std::uint64_t h = head.v.load(std::memory_order_relaxed);
            if (h - tail.v.load(std::memory_order_acquire) == o.ring) continue;  // ring full
            std::memcpy(ring.p + (h % o.ring) * kChunk, src.p + off, kChunk);
            head.v.store(h + 1, std::memory_order_release);
            off = off + kChunk == size ? 0 : off + kChunk;
        }
    });
    pin(o.cpu_b);
    std::size_t off = 0;
    auto run_for = [&](std::chrono::milliseconds d) {
        const auto end = Clock::now() + d;
        std::uint64_t n = 0;
        while (Clock::now() < end) {
            for (int k = 0; k < 16; ++k) {
                const std::uint64_t t = tail.v.load(std::memory_order_relaxed);
                if (head.v.load(std::memory_order_acquire) == t) continue;  // ring empty
                std::memcpy(dst.p + off, ring.p + (t % o.ring) * kChunk, kChunk);
                tail.v.store(t + 1, std::memory_order_release);
                off = off + kChunk == size ? 0 : off + kChunk;
                ++n;
            }
        }
        return n;
    };
    run_for(std::chrono::milliseconds(o.ms / 4 + 1));  // warm-up: caches and the producer's first laps
    const auto t0 = Clock::now();
    const std::uint64_t consumed = run_for(std::chrono::milliseconds(o.ms));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    stop = true;
    producer.join();
    return static_cast<double>(consumed * kChunk) / s / 1e9;
}

// One copy, source to target in 64 KiB pieces, on cpu_b.
double one_copy(const Options& o, std::size_t size) {
    Buffer src(size), dst(size);
    pin(o.cpu_b);
    auto run_for = [&](std::chrono::milliseconds d) {
        const auto end = Clock::now() + d;
        std::uint64_t n = 0;
        std::size_t off = 0;
        while (Clock::now() < end)
            for (int k = 0; k < 16; ++k) {
                std::memcpy(dst.p + off, src.p + off, kChunk);
                off = off + kChunk == size ? 0 : off + kChunk;
                ++n;
            }
        return n;
    };
    run_for(std::chrono::milliseconds(o.ms / 4 + 1));
    const auto t0 = Clock::now();
    const std::uint64_t n = run_for(std::chrono::milliseconds(o.ms));
    return static_cast<double>(n * kChunk) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 != 0 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    struct Row {
        std::size_t size;
        double two, one;
    };
    std::vector<Row> rows;
    for (std::size_t size : o.sizes) {
        std::vector<double> two, one;
        for (unsigned r = 0; r < o.reps; ++r) {  // interleaved, so a spell of the host hits both alike
            two.push_back(two_copies(o, size));
            one.push_back(one_copy(o, size));
        }
        rows.push_back({size, median(two), median(one)});
    }
    const Row& base = rows.front();
    std::printf("# copy ceilings: medians of %u runs of %u ms; source and target one message each, reused; "
                "two copies through a %u x 64 KiB ring on cores %d -> %d\n",
                o.reps, o.ms, o.ring, o.cpu_a, o.cpu_b);
    std::printf("%-10s %14s %10s %14s %10s\n", "#bytes", "two copies GB/s", "of first", "one copy GB/s", "of first");
    for (const Row& r : rows)
        std::printf("%-10zu %14.2f %9.0f%% %14.2f %9.0f%%\n", r.size, r.two, 100 * r.two / base.two, r.one,
                    100 * r.one / base.one);
    if (!o.json.empty()) {
        std::FILE* f = std::fopen(o.json.c_str(), "w");
        if (f == nullptr) {
            std::perror(o.json.c_str());
            return 1;
        }
        std::fprintf(f, "{\"tool\":\"copy_ceiling\",\"ms\":%u,\"reps\":%u,\"ring\":%u,\"results\":[", o.ms,
                     o.reps, o.ring);
        for (std::size_t i = 0; i < rows.size(); ++i)
            std::fprintf(f, "%s{\"bytes\":%zu,\"two_copies_gb_s\":%.3f,\"one_copy_gb_s\":%.3f}", i ? "," : "",
                         rows[i].size, rows[i].two, rows[i].one);
        std::fprintf(f, "]}\n");
        std::fclose(f);
    }
    return 0;
}
