// SPDX-License-Identifier: MIT
// libFuzzer target: the DDP/RDMAP receive path (rdmap::Duplex behind the MPA deframer) over the guarded fake
// memory table of rdmap_rig.hpp. Input: [flags][split][stream...]; flags: RigConfig (bit 0 CRC, bit 1 RFC
// 7306, bit 2 opaque access errors); split: how the stream is cut into deliveries (see Splitter).
// Invariants: placement stays inside the pieces the memory table handed out (guards, under ASan at the first
// byte); receive completions name a bound receive and fit it; no more bytes are placed than arrived; at most
// one TERMINATE, and the stream is in error exactly when there was one; what we send after our own TERMINATE
// ends with it, and nothing answers a TERMINATE received; a dead stream takes more input without a call.
#include <vector>

#include "base/byteorder.hpp"
#include "mpa/fpdu.hpp"
#include "tests/fuzz/fuzz_util.hpp"
#include "tests/fuzz/rdmap_rig.hpp"

using namespace softrdma;

namespace {

// ULPDUs of a run of FPDUs (no Markers), or empty if the run is not whole FPDUs.
std::vector<std::vector<std::byte>> ulpdus(std::span<const std::byte> wire) {
    std::vector<std::vector<std::byte>> out;
    std::size_t off = 0;
    while (off + 2 <= wire.size()) {
        const std::size_t len = load_be16(wire, off);
        const std::size_t total = mpa::fpdu_size_unmarked(len);
        FUZZ_CHECK(off + total <= wire.size());
        out.emplace_back(wire.begin() + static_cast<std::ptrdiff_t>(off + 2),
                         wire.begin() + static_cast<std::ptrdiff_t>(off + 2 + len));
        off += total;
    }
    FUZZ_CHECK(off == wire.size());
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    const fuzz::RigConfig cfg = fuzz::RigConfig::from_flags(in.byte());
    fuzz::Splitter cut(in.byte());
    const std::span<const std::byte> stream = in.rest();

    fuzz::Rig rig(cfg);
    std::vector<std::byte> sent;
    for (std::size_t fed = 0; fed < stream.size();) {
        const std::size_t k = cut.next(stream.size() - fed);
        const std::vector<std::byte> piece(stream.begin() + static_cast<std::ptrdiff_t>(fed),
                                           stream.begin() + static_cast<std::ptrdiff_t>(fed + k));
        const ProtoStatus st = rig.feed(piece);
        fed += k;
        const std::vector<std::byte> out = rig.drain();  // READ/atomic responses, our TERMINATE
        sent.insert(sent.end(), out.begin(), out.end());
        if (st) break;
    }
    FUZZ_CHECK(rig.upper.guards_intact());
    FUZZ_CHECK(rig.ep.placed_bytes() <= stream.size());

    auto& terms = rig.upper.terminates;
    FUZZ_CHECK(terms.size() <= 1);
    FUZZ_CHECK((rig.ep.state() == rdmap::State::error) == (terms.size() == 1));
    const auto fpdus = ulpdus(sent);
    if (terms.size() == 1) {
        if (terms[0].received) {
            // Nothing after a TERMINATE received: its FPDU was the last thing fed that was handled.
            for (const auto& u : fpdus) FUZZ_CHECK(u.size() >= 2 && load_be16(u, 0) != 0x4147);
        } else {
            FUZZ_CHECK(!fpdus.empty());
            FUZZ_CHECK(fpdus.back().size() >= rdmap::kTerminateLen && load_be16(fpdus.back(), 0) == 0x4147);
            FUZZ_CHECK(rig.upper.term_attached[0].size() == fpdus.back().size() - rdmap::kTerminateLen);
        }
        // A dead stream: more input changes nothing.
        const std::size_t ncompl = rig.upper.completions.size();
        const std::byte more[64] = {};
        rig.feed(more);
        FUZZ_CHECK(rig.upper.completions.size() == ncompl && terms.size() == 1);
        FUZZ_CHECK(rig.drain().empty());
    }
    return 0;
}
