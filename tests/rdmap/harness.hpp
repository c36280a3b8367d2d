// SPDX-License-Identifier: MIT
// Test doubles for rdmap: a fake upper layer over plain std::vector memory, and two endpoints wired
// back-to-back through byte buffers with the real MPA FpduTx and Deframer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/byteorder.hpp"
#include "mpa/deframer.hpp"
#include "mpa/fpdu.hpp"
#include "rdmap/duplex.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"
#include "rdmap/upper.hpp"

namespace softrdma::test {

using rdmap::Access;
using rdmap::Mem;
using rdmap::MemError;

inline std::vector<std::byte> bytes_of(std::size_t n, std::uint8_t seed) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 7 + (i >> 8));
    return v;
}

inline std::uint8_t bit(Access a) { return static_cast<std::uint8_t>(1u << static_cast<unsigned>(a)); }
inline constexpr std::uint8_t kAllRights = 0x0F;

// A registered region: TO is the byte offset into `mem` (zero-based addressing).
struct Region {
    std::vector<std::byte> mem;
    std::uint8_t rights{kAllRights};
    bool other_pd{false};
    bool invalidated{false};
    std::size_t chunk{0};  // >0: answer lookups in pieces ending at multiples of `chunk` (non-contiguous pages)
};

class FakeUpper : public rdmap::Upper {
public:
    std::map<std::uint32_t, Region> regions;
    std::deque<std::vector<std::byte>> posted;               // receive buffers, oldest first
    std::map<std::uint32_t, std::vector<std::byte>> bound;   // MSN -> receive buffer (moved from posted)
    std::size_t recv_chunk{0};                               // >0: receive buffer handed out in pieces (SGEs)
    std::vector<rdmap::Completion> completions;
    std::vector<rdmap::TermReport> terminates;
    std::vector<std::vector<std::byte>> term_attached;       // copies of TermReport::attached
    std::vector<std::uint32_t> invalidated;
    std::size_t lookups{0};

    Region& add_region(std::uint32_t stag, std::size_t size, std::uint8_t rights = kAllRights) {
        Region& r = regions[stag];
        r.mem.assign(size, std::byte{0});
        r.rights = rights;
        return r;
    }
    void post_recv(std::size_t size) { posted.emplace_back(size, std::byte{0xEE}); }

    Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, Access access) override {
        ++lookups;
        auto it = regions.find(stag);
        if (it == regions.end()) return {nullptr, 0, MemError::invalid_stag};
        Region& r = it->second;
        if (r.invalidated) return {nullptr, 0, MemError::invalidated};
        if (r.other_pd) return {nullptr, 0, MemError::wrong_pd};
        if ((r.rights & bit(access)) == 0) return {nullptr, 0, MemError::access};
        if (to > r.mem.size() || len > r.mem.size() - to) return {nullptr, 0, MemError::bounds};
        std::size_t n = len;
        if (r.chunk > 0) n = std::min(n, r.chunk - (to % r.chunk));
        return {r.mem.data() + to, n, MemError::none};
    }
    MemError recv_begin(std::uint32_t msn) override {
        if (posted.empty()) return MemError::no_receive;
        bound[msn] = std::move(posted.front());
        posted.pop_front();
        return MemError::none;
    }
    Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override {
        auto it = bound.find(msn);
        if (it == bound.end()) return {nullptr, 0, MemError::no_receive};
        std::vector<std::byte>& b = it->second;
        if (mo >= b.size()) return {nullptr, 0, MemError::bounds};
        std::size_t n = std::min(len, b.size() - mo);
        if (recv_chunk > 0) n = std::min(n, recv_chunk - (mo % recv_chunk));
        return {b.data() + mo, n, MemError::none};
    }
    MemError invalidate(std::uint32_t stag) override {
        auto it = regions.find(stag);
        if (it == regions.end()) return MemError::invalid_stag;
        if (it->second.other_pd) return MemError::wrong_pd;
        it->second.invalidated = true;
        invalidated.push_back(stag);
        return MemError::none;
    }
    void on_completion(const rdmap::Completion& c) override { completions.push_back(c); }
    void on_terminate(const rdmap::TermReport& t) override {
        terminates.push_back(t);
        term_attached.emplace_back(t.attached.begin(), t.attached.end());
        terminates.back().attached = {};
    }
};

struct SideConfig {
    rdmap::Config ep{.rfc7306 = true};  // most cases exercise Immediate Data and atomics; the gate has its own
    std::uint32_t emss{1448};
    bool crc{true};
};

// One endpoint with its own MPA TX framing and RX deframer. Not movable (members reference each other).
struct Side {
    explicit Side(const SideConfig& c = {})
        : tx(mpa::FpduTxConfig{c.crc, false, c.emss}), framer(tx), ep(upper, framer, c.ep), rx(mpa::DeframerConfig{c.crc, false, 0}) {}
    Side(const Side&) = delete;
    Side& operator=(const Side&) = delete;

    FakeUpper upper;
    mpa::FpduTx tx;
    rdmap::FpduFramer framer;
    rdmap::Duplex ep;  // the stream's tx and rx endpoints, joined as a QP joins them
    mpa::Deframer<rdmap::Duplex> rx;

    // Feeds bytes to this side's RX in pieces of `chunk` (TCP cuts the stream anywhere).
    ProtoStatus feed(std::span<const std::byte> in, std::size_t chunk = 0) {
        if (chunk == 0) chunk = in.size() ? in.size() : 1;
        ProtoStatus st;
        for (std::size_t off = 0; off < in.size(); off += chunk) {
            st = rdmap::receive(rx, ep, in.subspan(off, std::min(chunk, in.size() - off)));
            if (st) return st;
        }
        return st;
    }
    // Everything this side would send now (out buffer of `cap` bytes per pull).
    std::vector<std::byte> drain(std::size_t cap = 1 << 16) {
        std::vector<std::byte> all, buf(cap);
        for (;;) {
            const std::size_t n = ep.pull_tx(buf);
            if (n == 0) break;
            all.insert(all.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
        }
        return all;
    }
};

// Moves bytes both ways until neither side has anything to send. Returns the last RX status seen.
inline void pump(Side& a, Side& b, std::size_t chunk = 0, std::size_t cap = 1 << 16) {
    for (int rounds = 0; rounds < 10000; ++rounds) {
        const std::vector<std::byte> ab = a.drain(cap);
        if (!ab.empty()) b.feed(ab, chunk);
        const std::vector<std::byte> ba = b.drain(cap);
        if (!ba.empty()) a.feed(ba, chunk);
        if (ab.empty() && ba.empty()) return;
    }
}

// One FPDU on the wire -> its ULPDU (length field checked, pad and CRC skipped).
struct Fpdu {
    std::vector<std::byte> ulpdu;
    std::size_t wire{0};
};
inline std::vector<Fpdu> split_fpdus(std::span<const std::byte> wire) {
    std::vector<Fpdu> out;
    std::size_t off = 0;
    while (off + 2 <= wire.size()) {
        const std::size_t len = load_be16(wire, off);
        const std::size_t total = mpa::fpdu_size_unmarked(len);
        if (off + total > wire.size()) break;
        out.push_back(Fpdu{std::vector<std::byte>(wire.begin() + static_cast<std::ptrdiff_t>(off + 2),
                                                  wire.begin() + static_cast<std::ptrdiff_t>(off + 2 + len)),
                           total});
        off += total;
    }
    return out;
}

// Builds one FPDU (CRC on) carrying `hdr` + `payload`, as a misbehaving peer would.
inline std::vector<std::byte> make_fpdu(std::span<const std::byte> hdr, std::span<const std::byte> payload = {},
                                        bool crc = true) {
    mpa::FpduTx tx(mpa::FpduTxConfig{crc, false, 1448});
    std::vector<std::byte> out(tx.wire_size(hdr.size() + payload.size()) + 16);
    const std::size_t n = tx.write(out, hdr, payload);
    out.resize(n);
    return out;
}

}  // namespace softrdma::test
