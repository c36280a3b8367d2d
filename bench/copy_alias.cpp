// SPDX-License-Identifier: MIT
// copy_alias: what 4K aliasing costs a copy into memory another process reads next, and what
// base::copy_out() wins back (base/copy.hpp).
//
// Two processes (cores 0 and 1) share one memfd. A ping-pong of --size bytes: each side copies its private,
// page-aligned source into the shared buffer in FPDU-like pieces (--piece bytes, then a 24-byte gap: the next
// FPDU's header and the CRC field), then hands over; the other side copies the buffer into private memory and
// answers the same way. The shared buffer starts --offset bytes into a page, so the first pieces sit
// (offset + 24 k) bytes above their source modulo 4 KiB. Printed per run, --rounds runs of each mode
// (memcpy, copy_out) alternating: the median time of the writer's copy and the median half round trip.
// --publish N: the writer hands the message over every N bytes as it goes and the reader copies each part as
// it comes, as a stack pipelines a message segment by segment: the floor a two-copy ping-pong has on this
// host (0, the default: the whole message at once).
// --rotate N: message i goes into the (i mod N)-th of N shared buffers per direction, as a memif ring's buffers
// are used in turn (1, the default: the same buffer every time).
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/copy.hpp"

namespace {

struct Args {
    std::size_t size = 32768, piece = 8936, offset = 20, publish = 0, rotate = 1;
    int iters = 3000;
    int rounds = 3;
};

void pin(int core) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(core, &s);
    sched_setaffinity(0, sizeof s, &s);
}

// Copies one message into the shared buffer in pieces and hands it over: `handed` (the bytes written into this
// buffer over the whole run) moves from `base` to base + `total` at the end, and every --publish bytes on the
// way when set.
void pieces(bool bounce, std::byte* dst, const std::byte* src, const Args& a, std::atomic<long>& handed, long base,
            std::size_t total) {
    std::size_t out = 0, told = 0;
    for (std::size_t done = 0; done < a.size;) {
        const std::size_t k = std::min(a.piece, a.size - done);
        if (bounce)
            softrdma::base::copy_out(dst + out, src + done, k);
        else
            std::memcpy(dst + out, src + done, k);
        out += k + 24;
        done += k;
        if (a.publish != 0 && out - told >= a.publish && done < a.size) {
            told = out;
            handed.store(base + static_cast<long>(out), std::memory_order_release);
        }
    }
    handed.store(base + static_cast<long>(total), std::memory_order_release);
}

// Copies one message of `total` bytes out of the shared buffer as its writer hands it over. False when the peer
// is gone (`gone()`, asked now and then while waiting).
template <class Gone>
bool drain(std::byte* dst, const std::byte* src, const std::atomic<long>& handed, long base, std::size_t total,
           Gone&& gone) {
    std::size_t got = 0;
    while (got < total) {
        long at;
        for (std::uint32_t spins = 1; (at = handed.load(std::memory_order_acquire)) <= base + static_cast<long>(got);
             ++spins)
            if ((spins & 0xFFFFF) == 0 && gone()) return false;
        const std::size_t upto = std::min(total, static_cast<std::size_t>(at - base));
        std::memcpy(dst + got, src + got, upto - got);
        got = upto;
    }
    return true;
}

struct Shared {
    std::atomic<long> ping alignas(64){0};  // bytes core 0 has handed over in ab (the run's running total)
    std::atomic<long> pong alignas(64){0};  // bytes core 1 has handed over in ba
};

// One mode: returns {writer's copy median us, half round trip median us}; {-1, -1} on failure.
std::pair<double, double> run(bool bounce, const Args& a) {
    const std::size_t span = a.size + (a.size / a.piece + 1) * 24 + a.offset;
    const std::size_t stride = (span + 4095) / 4096 * 4096;  // one message's shared buffer, page-rounded
    const std::size_t len = 4096 + 2 * (a.rotate * stride + 4096);
    const int fd = memfd_create("copy_alias", 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(len)) != 0) return {-1, -1};
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return {-1, -1};
    auto* base = static_cast<std::byte*>(m);
    std::memset(base, 0, len);
    auto* sh = new (base) Shared;
    const std::size_t half = (len - 4096) / 2;
    std::byte* ab = base + 4096 + a.offset;         // core 0 writes, core 1 reads
    std::byte* ba = base + 4096 + half + a.offset;  // core 1 writes, core 0 reads
    std::vector<std::byte> src(a.size + 4096), dst(span + 4096);
    std::byte* s = src.data() + (4096 - reinterpret_cast<std::uintptr_t>(src.data()) % 4096) % 4096;
    std::memset(s, 1, a.size);
    const pid_t child = fork();
    if (child < 0) {
        munmap(m, len);
        return {-1, -1};
    }
    const std::size_t total = span - a.offset;  // what each message occupies in its shared buffer
    const auto base_of = [total](long i) { return (i - 1) * static_cast<long>(total); };
    const auto slot_of = [&a, stride](long i) { return static_cast<std::size_t>(i - 1) % a.rotate * stride; };
    if (child == 0) {
        pin(1);
        for (long i = 1; i <= a.iters; ++i) {
            const std::size_t at = slot_of(i);
            if (!drain(dst.data(), ab + at, sh->ping, base_of(i), total, [] { return getppid() == 1; }))
                _exit(1);  // the parent is gone
            pieces(bounce, ba + at, s, a, sh->pong, base_of(i), total);
        }
        _exit(0);
    }
    pin(0);
    using clock = std::chrono::steady_clock;
    const auto us = [](clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
    std::vector<double> wr, rtt;
    for (long i = 1; i <= a.iters; ++i) {
        const std::size_t at = slot_of(i);
        const auto t0 = clock::now();
        pieces(bounce, ab + at, s, a, sh->ping, base_of(i), total);
        const auto t1 = clock::now();
        if (!drain(dst.data(), ba + at, sh->pong, base_of(i), total,
                   [child] { return waitpid(child, nullptr, WNOHANG) == child; })) {  // the child died
            munmap(m, len);
            return {-1, -1};
        }
        const auto t2 = clock::now();
        wr.push_back(us(t1 - t0));
        rtt.push_back(us(t2 - t0) / 2);
    }
    int st = 0;
    waitpid(child, &st, 0);
    munmap(m, len);
    std::sort(wr.begin(), wr.end());
    std::sort(rtt.begin(), rtt.end());
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return {-1, -1};
    return {wr[wr.size() / 2], rtt[rtt.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        const auto v = std::strtoul(argv[i + 1], nullptr, 0);
        if (k == "--size") a.size = v;
        else if (k == "--piece") a.piece = v;
        else if (k == "--offset") a.offset = v;
        else if (k == "--publish") a.publish = v;
        else if (k == "--iters") a.iters = static_cast<int>(v);
        else if (k == "--rounds") a.rounds = static_cast<int>(v);
        else if (k == "--rotate") a.rotate = v;
        else {
            std::fprintf(stderr,
                         "usage: %s [--size N] [--piece N] [--offset N] [--publish N] [--iters N] [--rounds N] "
                         "[--rotate N]\n",
                         argv[0]);
            return 2;
        }
    }
    if (a.size == 0 || a.piece == 0 || a.iters <= 0 || a.rounds <= 0 || a.offset >= 4096 ||
        a.rotate == 0 || a.rotate > 1024) {
        std::fprintf(stderr,
                     "copy_alias: size, piece, iters and rounds must be positive, offset below 4096, "
                     "rotate 1 to 1024\n");
        return 2;
    }
    std::printf("# %zu bytes in %zu-byte pieces, shared buffer at page offset %zu, %d round trips, handed over %s, "
                "%zu shared buffer(s) a direction\n",
                a.size, a.piece, a.offset, a.iters,
                a.publish != 0 ? ("every " + std::to_string(a.publish) + " bytes").c_str() : "whole", a.rotate);
    std::printf("%-9s %14s %16s\n", "mode", "copy_us_p50", "half_rtt_us_p50");
    // Rounds alternate the two modes (the host's spells change within seconds); each line is one run.
    for (int r = 0; r < a.rounds; ++r) {
        for (const bool bounce : {false, true}) {
            const auto [w, h] = run(bounce, a);
            if (w < 0) {
                std::fprintf(stderr, "copy_alias: a run failed\n");
                return 1;
            }
            std::printf("%-9s %14.2f %16.2f\n", bounce ? "copy_out" : "memcpy", w, h);
        }
    }
    return 0;
}
