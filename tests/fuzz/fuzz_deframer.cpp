// SPDX-License-Identifier: MIT
// libFuzzer target: the MPA deframer (mpa/deframer.hpp) with and without Markers and CRC.
// Input: [flags][split][offset/4][stream...]; flags bit 0 CRC, bit 1 Markers; split: how the stream is cut
// (see Splitter); offset: the stream position of the first octet, in 4-octet units (Markers sit at multiples
// of 512). Header lengths come from the real RDMAP opcode table.
// The stream goes through three deframers: in one piece, cut into pieces, and cut with a handler that fuses
// the CRC into its copy (CrcFusingHandler). Invariants: a handler never gets more payload than it was given,
// nor than the ULPDU header announced, nor bytes outside the piece being fed; headers have the length the
// handler asked for; on_ulpdu_end comes only with the announced payload complete; all three see the same
// completed ULPDUs and the same final error; a failed deframer stays failed and calls nothing.
#include <cstring>
#include <optional>
#include <vector>

#include "base/byteorder.hpp"
#include "mpa/crc32c.hpp"
#include "mpa/deframer.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/opcode.hpp"
#include "tests/fuzz/fuzz_util.hpp"

using namespace softrdma;

namespace {

struct Ulpdu {
    std::vector<std::byte> header;
    std::vector<std::byte> payload;
    bool operator==(const Ulpdu&) const = default;
};

struct Recorder {
    std::vector<Ulpdu> done;
    Ulpdu cur;
    std::size_t announced = 0;
    bool in_ulpdu = false;
    std::size_t asked = 0;  // header length returned for the current control word
    std::size_t payload_total = 0;
    const std::byte* lo = nullptr;  // the piece being fed
    const std::byte* hi = nullptr;
    bool closed = false;  // set after an error: no call may come

    std::size_t ulpdu_header_length(std::uint16_t ctrl) {
        FUZZ_CHECK(!closed);
        const rdmap::OpInfo& op = rdmap::kOpTable[rdmap::ctrl_opcode(ctrl)];
        const bool ok = op.valid && op.tagged == ddp::ctrl_tagged(ctrl) && ddp::ctrl_ddp_version(ctrl) == 1 &&
                        rdmap::ctrl_rdmap_version(ctrl) == 1;
        asked = ok ? op.hdr_len : 0;
        return asked;
    }
    ProtoStatus on_ulpdu_header(std::span<const std::byte> h, std::size_t n) {
        FUZZ_CHECK(!closed);
        FUZZ_CHECK(!in_ulpdu);
        if (asked == 0) {  // an invalid control word: the bare word, no payload
            FUZZ_CHECK(h.size() == 2 && n == 0);
            return std::nullopt;  // the deframer reports the DDP error itself
        }
        FUZZ_CHECK(h.size() == asked);
        FUZZ_CHECK(h.size() + n <= 0xffff);
        cur = Ulpdu{{h.begin(), h.end()}, {}};
        announced = n;
        in_ulpdu = true;
        return std::nullopt;
    }
    ProtoStatus on_ulpdu_payload(std::span<const std::byte> b) {
        FUZZ_CHECK(!closed);
        FUZZ_CHECK(in_ulpdu);
        FUZZ_CHECK(!b.empty());
        FUZZ_CHECK(b.data() >= lo && b.data() + b.size() <= hi);  // zero copy, inside the piece fed
        cur.payload.insert(cur.payload.end(), b.begin(), b.end());
        FUZZ_CHECK(cur.payload.size() <= announced);
        payload_total += b.size();
        return std::nullopt;
    }
    ProtoStatus on_ulpdu_end() {
        FUZZ_CHECK(!closed);
        FUZZ_CHECK(in_ulpdu && cur.payload.size() == announced);
        done.push_back(std::move(cur));
        cur = {};
        in_ulpdu = false;
        return std::nullopt;
    }
};

struct FusingRecorder : Recorder {
    std::vector<std::byte> sink = std::vector<std::byte>(1 << 16);
    ProtoStatus on_ulpdu_payload_crc(std::span<const std::byte> b, std::uint32_t& crc) {
        FUZZ_CHECK(!b.empty() && b.size() <= sink.size());
        crc = mpa::crc32c_copy(crc, sink.data(), b.data(), b.size());
        FUZZ_CHECK(std::memcmp(sink.data(), b.data(), b.size()) == 0);
        return on_ulpdu_payload(b);
    }
};
static_assert(mpa::CrcFusingHandler<FusingRecorder>);
static_assert(!mpa::CrcFusingHandler<Recorder>);

struct Result {
    std::vector<Ulpdu> done;
    ProtoStatus error;
};

template <class H>
Result run(const mpa::DeframerConfig& cfg, std::span<const std::byte> stream, std::uint8_t split) {
    mpa::Deframer<H> d(cfg);
    H h;
    fuzz::Splitter cut(split);
    std::size_t fed = 0;
    ProtoStatus st;
    // Each piece in a buffer of its own, so "inside the piece" is exact.
    while (fed < stream.size()) {
        const std::size_t k = cut.next(stream.size() - fed);
        std::vector<std::byte> piece(stream.begin() + static_cast<std::ptrdiff_t>(fed),
                                     stream.begin() + static_cast<std::ptrdiff_t>(fed + k));
        h.lo = piece.data();
        h.hi = piece.data() + piece.size();
        const std::size_t before = h.payload_total;
        const std::uint64_t pos = d.stream_position();
        st = d.feed(piece, h);
        FUZZ_CHECK(h.payload_total - before <= k);  // never more payload than given
        fed += k;
        if (st) {
            FUZZ_CHECK(d.failed() && d.error() == st);
            break;
        }
        FUZZ_CHECK(d.stream_position() == pos + k);  // all of it consumed
    }
    FUZZ_CHECK(h.payload_total <= stream.size());
    if (st) {
        h.closed = true;
        const std::byte more[8] = {};
        FUZZ_CHECK(d.feed(more, h) == st);  // stays failed, calls nothing
    } else if (d.at_fpdu_boundary()) {
        FUZZ_CHECK(!h.in_ulpdu);
    }
    return Result{std::move(h.done), st};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    const std::uint8_t flags = in.byte();
    const std::uint8_t split = in.byte();
    const std::uint64_t offset = std::uint64_t{in.byte()} * 4;
    const std::span<const std::byte> stream = in.rest();
    const mpa::DeframerConfig cfg{(flags & 1) != 0, (flags & 2) != 0, offset};

    const Result whole = run<Recorder>(cfg, stream, 0);
    const Result cut = run<Recorder>(cfg, stream, split == 0 ? 1 : split);
    const Result fused = run<FusingRecorder>(cfg, stream, split);
    FUZZ_CHECK(whole.error == cut.error && whole.error == fused.error);
    FUZZ_CHECK(whole.done == cut.done && whole.done == fused.done);
    return 0;
}
