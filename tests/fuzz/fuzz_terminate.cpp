// SPDX-License-Identifier: MIT
// libFuzzer target: the TERMINATE parser, i.e. a TERMINATE message received by the rdmap receive path (rig of
// rdmap_rig.hpp) and the text and siw-layout readings applications get of its control word.
// Input: [flags][control word: 4][DDP fields: 14][attached...]. flags: bit 0 CRC, bit 1 RFC 7306, bit 2 use
// the DDP fields (16-bit control word with the opcode forced to TERMINATE, QN, MSN, MO) as given instead of a
// well-formed untagged header (QN 2, MSN 1, MO 0, Last), bit 3 send it as the second FPDU, after a
// zero-length SEND. The FPDU is built
// with our encoder, so the fuzzer spends its time past the framing.
// Invariants: a well-formed TERMINATE is reported once, as received, with the code and M/D/R bits of its
// control word, and its attached bytes as sent (up to what the endpoint keeps); nothing is sent in answer;
// the stream is in error; every work request still posted completes flushed.
#include <cstring>
#include <vector>

#include "base/byteorder.hpp"
#include "ddp/header.hpp"
#include "mpa/fpdu.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/opcode.hpp"
#include "rdmap/term_text.hpp"
#include "tests/fuzz/fuzz_util.hpp"
#include "tests/fuzz/rdmap_rig.hpp"

using namespace softrdma;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    const std::uint8_t flags = in.byte();
    const std::uint32_t word = in.be32();
    const std::uint16_t ctrl_raw = in.be16();
    const std::uint32_t qn = in.be32();
    const std::uint32_t msn = in.be32();
    const std::uint32_t mo = in.be32();
    const std::span<const std::byte> attached = in.take(1400);
    const bool raw_ddp = (flags & 4) != 0;
    const bool after_send = (flags & 8) != 0;

    fuzz::RigConfig rc{(flags & 1) != 0, (flags & 2) != 0, false};
    fuzz::Rig rig(rc);

    std::array<std::byte, rdmap::kTerminateLen> hdr{};
    const rdmap::OpInfo& op = rdmap::kOpTable[static_cast<std::size_t>(rdmap::Opcode::terminate)];
    ddp::UntaggedHeader uh{ddp::ctrl_with_last(op.ctrl, true), 0, rdmap::kQnTerminate, 1, 0};
    if (raw_ddp) uh = ddp::UntaggedHeader{static_cast<std::uint16_t>((ctrl_raw & 0xfff0) | 7), 0, qn, msn, mo};
    uh.encode(hdr);
    store_be32(hdr, 18, word);

    mpa::FpduTx tx(mpa::FpduTxConfig{rc.crc, false, 1448});
    std::vector<std::byte> wire(2 * (tx.wire_size(rdmap::kTerminateLen + attached.size()) + 64));
    std::size_t n = 0;
    if (after_send) {  // a zero-length SEND first (it takes the first receive)
        std::array<std::byte, ddp::kUntaggedHeaderLen> sh{};
        const rdmap::OpInfo& s = rdmap::kOpTable[static_cast<std::size_t>(rdmap::Opcode::send)];
        ddp::UntaggedHeader{ddp::ctrl_with_last(s.ctrl, true), 0, rdmap::kQnSend, 1, 0}.encode(sh);
        n += tx.write(wire, sh, std::span<const std::byte>{});
    }
    const std::size_t t = tx.write(std::span<std::byte>(wire).subspan(n), hdr, attached);
    FUZZ_CHECK(t != 0);
    n += t;
    wire.resize(n);

    rig.feed(wire);
    FUZZ_CHECK(rig.upper.guards_intact());
    const std::vector<std::byte> out = rig.drain();
    auto& terms = rig.upper.terminates;
    FUZZ_CHECK(terms.size() <= 1);
    FUZZ_CHECK((rig.ep.state() == rdmap::State::error) == (terms.size() == 1));

    const rdmap::TerminateHeader th = rdmap::TerminateHeader::decode(hdr);
    const bool well_formed = !raw_ddp || (uh.ctrl == ddp::ctrl_with_last(op.ctrl, true) &&
                                          uh.qn == rdmap::kQnTerminate && uh.msn == 1 && uh.mo == 0);
    if (well_formed) {
        FUZZ_CHECK(terms.size() == 1 && terms[0].received);
    }
    if (terms.size() == 1 && terms[0].received) {
        const rdmap::TermReport& r = terms[0];
        FUZZ_CHECK(r.code == th.code && r.cause == th.code);
        FUZZ_CHECK(r.m == th.m && r.d == th.d && r.r == th.r);
        FUZZ_CHECK(r.raw == th.word() && (r.raw & 0xffffe000u) == (word & 0xffffe000u));
        const std::vector<std::byte>& got = rig.upper.term_attached[0];
        FUZZ_CHECK(got.size() <= 2 + rdmap::kMaxHeaderLen && got.size() <= attached.size());
        FUZZ_CHECK(got.size() == std::min(attached.size(), 2 + rdmap::kMaxHeaderLen));
        FUZZ_CHECK(got.empty() || std::memcmp(got.data(), attached.data(), got.size()) == 0);
        FUZZ_CHECK(out.empty());  // a TERMINATE is never answered
        // The rig's READ (and atomic) were outstanding: flushed, not completed.
        std::size_t flushed = 0;
        for (const rdmap::Completion& c : rig.upper.completions)
            if (c.kind != rdmap::WcKind::recv) {
                FUZZ_CHECK(c.status == rdmap::WcStatus::flushed);
                ++flushed;
            }
        FUZZ_CHECK(flushed == (rc.rfc7306 ? 2u : 1u));
        // What applications and logs read of it.
        const char* text = rdmap::term_text(r.code);
        if (text != nullptr) FUZZ_CHECK(std::strlen(text) > 0);
        const TermCode siw = rdmap::term_code_siw_x86(r.raw);
        FUZZ_CHECK(static_cast<unsigned>(siw.layer) <= 0xf && siw.etype <= 0xf);
        (void)rdmap::term_text(siw);
    }
    return 0;
}
