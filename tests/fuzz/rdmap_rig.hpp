// SPDX-License-Identifier: MIT
// The receiving side of the rdmap fuzz targets (fuzz_rdmap_rx, fuzz_terminate) and of their seeds: an
// rdmap::Duplex behind the real MPA deframer, over a fake memory table whose every region and receive buffer
// is a set of separately allocated blocks between guard zones. The guards are poisoned for AddressSanitizer,
// so a write or read one byte outside what a lookup handed out stops the run there; without ASan their
// canary bytes are compared by check_guards(). Lookups answer in pieces (a region of scattered pages), so a
// placement that runs past the piece it was given is caught as well as one that runs past the region.
//
// Before the input arrives the rig has posted work of its own, so that responses in the input have something
// to answer: a READ (64 bytes into STag 0x200 from the peer's STag 0x300) and, with RFC 7306, a FetchAdd on
// the peer's STag 0x400. The seed generator runs the same rig and so produces streams that match it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "mpa/deframer.hpp"
#include "mpa/fpdu.hpp"
#include "rdmap/duplex.hpp"
#include "rdmap/endpoint.hpp"
#include "rdmap/stream.hpp"
#include "rdmap/upper.hpp"
#include "tests/fuzz/fuzz_util.hpp"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOFTRDMA_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SOFTRDMA_FUZZ_ASAN 1
#endif
#ifdef SOFTRDMA_FUZZ_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace softrdma::fuzz {

// One block of memory between two guard zones.
class GuardedBlock {
public:
    static constexpr std::size_t kGuard = 64;
    static constexpr std::byte kCanary{0xA5};

    explicit GuardedBlock(std::size_t size) : size_(size), mem_(new std::byte[size + 2 * kGuard]) {
        std::memset(mem_.get(), static_cast<int>(kCanary), kGuard);
        std::memset(mem_.get() + kGuard, 0, size);
        std::memset(mem_.get() + kGuard + size, static_cast<int>(kCanary), kGuard);
        poison(true);
    }
    ~GuardedBlock() { poison(false); }
    GuardedBlock(const GuardedBlock&) = delete;
    GuardedBlock& operator=(const GuardedBlock&) = delete;

    std::byte* data() { return mem_.get() + kGuard; }
    std::size_t size() const { return size_; }
    bool guards_intact() {
        poison(false);
        static const auto canaries = [] {
            std::array<std::byte, kGuard> c;
            c.fill(kCanary);
            return c;
        }();
        const bool ok = std::memcmp(mem_.get(), canaries.data(), kGuard) == 0 &&
                        std::memcmp(mem_.get() + kGuard + size_, canaries.data(), kGuard) == 0;
        poison(true);
        return ok;
    }

private:
    void poison(bool on) {
#ifdef SOFTRDMA_FUZZ_ASAN
        if (on) {
            ASAN_POISON_MEMORY_REGION(mem_.get(), kGuard);
            ASAN_POISON_MEMORY_REGION(mem_.get() + kGuard + size_, kGuard);
        } else {
            ASAN_UNPOISON_MEMORY_REGION(mem_.get(), size_ + 2 * kGuard);
        }
#else
        (void)on;
#endif
    }
    std::size_t size_;
    std::unique_ptr<std::byte[]> mem_;
};

// Memory of `size` bytes as blocks of `piece` bytes (the last may be shorter).
class PieceMemory {
public:
    PieceMemory(std::size_t size, std::size_t piece) : size_(size), piece_(piece) {
        for (std::size_t off = 0; off < size; off += piece)
            blocks_.push_back(std::make_unique<GuardedBlock>(std::min(piece, size - off)));
    }
    std::size_t size() const { return size_; }
    // Up to `len` contiguous bytes at `off` (off < size()).
    rdmap::Mem at(std::size_t off, std::size_t len) {
        FUZZ_CHECK(off < size_ && len != 0);
        GuardedBlock& b = *blocks_[off / piece_];
        const std::size_t in = off % piece_;
        return {b.data() + in, std::min(len, b.size() - in), rdmap::MemError::none};
    }
    bool guards_intact() {
        for (auto& b : blocks_)
            if (!b->guards_intact()) return false;
        return true;
    }

private:
    std::size_t size_;
    std::size_t piece_;
    std::vector<std::unique_ptr<GuardedBlock>> blocks_;
};

inline std::uint8_t right(rdmap::Access a) { return static_cast<std::uint8_t>(1u << static_cast<unsigned>(a)); }

class GuardedUpper final : public rdmap::Upper {
public:
    struct Region {
        PieceMemory mem;
        std::uint8_t rights;
        bool other_pd{false};
        bool invalidated{false};
    };
    std::map<std::uint32_t, std::unique_ptr<Region>> regions;
    std::vector<std::unique_ptr<PieceMemory>> posted;                  // receive buffers, in posting order
    std::size_t next_posted{0};
    std::map<std::uint32_t, PieceMemory*> bound;                       // MSN -> receive buffer
    std::vector<rdmap::Completion> completions;
    std::vector<rdmap::TermReport> terminates;
    std::vector<std::vector<std::byte>> term_attached;

    void add_region(std::uint32_t stag, std::size_t size, std::size_t piece, std::uint8_t rights) {
        regions[stag] = std::make_unique<Region>(Region{PieceMemory(size, piece), rights});
    }
    void post_recv(std::size_t size, std::size_t piece) { posted.push_back(std::make_unique<PieceMemory>(size, piece)); }
    bool guards_intact() {
        for (auto& [stag, r] : regions)
            if (!r->mem.guards_intact()) return false;
        for (auto& p : posted)
            if (!p->guards_intact()) return false;
        return true;
    }

    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access access) override {
        FUZZ_CHECK(len != 0);
        auto it = regions.find(stag);
        if (it == regions.end()) return {nullptr, 0, rdmap::MemError::invalid_stag};
        Region& r = *it->second;
        if (r.invalidated) return {nullptr, 0, rdmap::MemError::invalidated};
        if (r.other_pd) return {nullptr, 0, rdmap::MemError::wrong_pd};
        if ((r.rights & right(access)) == 0) return {nullptr, 0, rdmap::MemError::access};
        if (to >= r.mem.size() || len > r.mem.size() - to) return {nullptr, 0, rdmap::MemError::bounds};
        return r.mem.at(static_cast<std::size_t>(to), len);
    }
    rdmap::MemError recv_begin(std::uint32_t msn) override {
        if (next_posted == posted.size()) return rdmap::MemError::no_receive;
        FUZZ_CHECK(bound.find(msn) == bound.end());  // one receive per message
        bound[msn] = posted[next_posted++].get();
        return rdmap::MemError::none;
    }
    rdmap::Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override {
        FUZZ_CHECK(len != 0);
        auto it = bound.find(msn);
        if (it == bound.end()) return {nullptr, 0, rdmap::MemError::no_receive};
        if (mo >= it->second->size()) return {nullptr, 0, rdmap::MemError::bounds};
        return it->second->at(mo, len);
    }
    rdmap::MemError invalidate(std::uint32_t stag) override {
        auto it = regions.find(stag);
        if (it == regions.end()) return rdmap::MemError::invalid_stag;
        if (it->second->other_pd) return rdmap::MemError::wrong_pd;
        it->second->invalidated = true;
        return rdmap::MemError::none;
    }
    void on_completion(const rdmap::Completion& c) override {
        if (c.kind == rdmap::WcKind::recv && c.status == rdmap::WcStatus::success) {
            auto it = bound.find(c.msn);
            FUZZ_CHECK(it != bound.end());                 // completes a message that had a receive
            FUZZ_CHECK(c.byte_len <= it->second->size());  // never more than the buffer holds
        }
        completions.push_back(c);
    }
    void on_terminate(const rdmap::TermReport& t) override {
        terminates.push_back(t);
        term_attached.emplace_back(t.attached.begin(), t.attached.end());
        terminates.back().attached = {};
    }
};

struct RigConfig {
    bool crc{false};
    bool rfc7306{true};
    bool opaque{false};

    std::uint8_t flags() const { return static_cast<std::uint8_t>((crc ? 1 : 0) | (rfc7306 ? 2 : 0) | (opaque ? 4 : 0)); }
    static RigConfig from_flags(std::uint8_t f) { return RigConfig{(f & 1) != 0, (f & 2) != 0, (f & 4) != 0}; }
};

// STags of the rig's memory table.
inline constexpr std::uint32_t kStagWrite = 0x100;   // 400 bytes, all rights, 37-byte pieces
inline constexpr std::uint32_t kStagSink = 0x200;    // 64 bytes: our READ's sink
inline constexpr std::uint32_t kStagSource = 0x300;  // 256 bytes, remote read only, 100-byte pieces
inline constexpr std::uint32_t kStagAtomic = 0x400;  // 16 bytes, remote atomic
inline constexpr std::uint32_t kStagOtherPd = 0x500;
inline constexpr std::uint32_t kStagRtr = 1;         // 8 bytes, remote write (siw's WRITE RTR names STag 1)
inline constexpr std::uint32_t kPeerSource = 0x300;  // the peer's READ source
inline constexpr std::uint32_t kPeerAtomic = 0x400;  // the peer's atomic target

class Rig {
public:
    explicit Rig(const RigConfig& c)
        : tx_(mpa::FpduTxConfig{c.crc, false, 1448}),
          framer_(tx_),
          ep(upper, framer_, rdmap::Config{.sq_depth = 16, .ird = 4, .ord = 4, .rfc7306 = c.rfc7306,
                                           .opaque_access_errors = c.opaque}),
          rx_(mpa::DeframerConfig{c.crc, false, 0}) {
        using rdmap::Access;
        const std::uint8_t all = right(Access::local_write) | right(Access::remote_write) |
                                 right(Access::remote_read) | right(Access::remote_atomic);
        upper.add_region(kStagWrite, 400, 37, all);
        upper.add_region(kStagSink, 64, 64, right(Access::local_write));
        upper.add_region(kStagSource, 256, 100, right(Access::remote_read));
        upper.add_region(kStagAtomic, 16, 16, right(Access::remote_atomic));
        upper.add_region(kStagOtherPd, 32, 32, all);
        upper.regions[kStagOtherPd]->other_pd = true;
        upper.add_region(kStagRtr, 8, 8, right(Access::remote_write));
        upper.post_recv(300, 50);
        upper.post_recv(8, 8);
        upper.post_recv(1, 1);
        upper.post_recv(1000, 128);
        upper.post_recv(64, 64);

        rdmap::WorkRequest r;
        r.wr_id = 1;
        r.op = rdmap::WrOp::read;
        r.local_stag = kStagSink;
        r.remote_stag = kPeerSource;
        r.read_len = 64;
        FUZZ_CHECK(ep.post(r) == rdmap::PostStatus::ok);
        if (c.rfc7306) {
            rdmap::WorkRequest a;
            a.wr_id = 2;
            a.op = rdmap::WrOp::fetch_add;
            a.remote_stag = kPeerAtomic;
            a.swap_add = 5;
            FUZZ_CHECK(ep.post(a) == rdmap::PostStatus::ok);
        }
        requests = drain();
    }
    Rig(const Rig&) = delete;
    Rig& operator=(const Rig&) = delete;

    // One delivery of stream bytes (as one TCP segment's payload).
    ProtoStatus feed(std::span<const std::byte> in) { return rdmap::receive(rx_, ep, in); }
    std::vector<std::byte> drain() {
        std::vector<std::byte> all;
        static std::array<std::byte, 1 << 14> buf;  // more than the largest FPDU (EMSS 1448); reused
        for (;;) {
            const std::size_t n = ep.pull_tx(buf);
            if (n == 0) break;
            all.insert(all.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
        }
        return all;
    }

    GuardedUpper upper;  // declared first: the endpoints below borrow it

private:
    mpa::FpduTx tx_;
    rdmap::FpduFramer framer_;

public:
    rdmap::Duplex ep;
    std::vector<std::byte> requests;  // what the rig sent before the input: its READ and atomic requests

private:
    mpa::Deframer<rdmap::Duplex> rx_;
};

}  // namespace softrdma::fuzz
