// SPDX-License-Identifier: MIT
// RDMAP opcode table and message headers: every opcode's header round trip, the prebuilt control words,
// Terminate control word, RFC 7306 atomic semantics, and the memory-error -> TERMINATE code table.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <vector>

#include "ddp/header.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/opcode.hpp"
#include "rdmap/upper.hpp"

using namespace softrdma;
using namespace softrdma::rdmap;

TEST_CASE("opcode table rows", "[rdmap]") {
    struct Expect {
        Opcode op;
        bool tagged;
        std::uint32_t qn;
        std::size_t hdr;
        std::uint16_t ctrl_last;
    };
    const Expect rows[] = {
        {Opcode::write, true, 0, 14, 0xC140},
        {Opcode::read_request, false, 1, 46, 0x4141},
        {Opcode::read_response, true, 0, 14, 0xC142},
        {Opcode::send, false, 0, 18, 0x4143},
        {Opcode::send_inv, false, 0, 18, 0x4144},
        {Opcode::send_se, false, 0, 18, 0x4145},
        {Opcode::send_se_inv, false, 0, 18, 0x4146},
        {Opcode::terminate, false, 2, 22, 0x4147},
        {Opcode::imm_data, false, 0, 26, 0x4148},
        {Opcode::imm_data_se, false, 0, 26, 0x4149},
        {Opcode::atomic_request, false, 1, 70, 0x414A},
        {Opcode::atomic_response, false, 3, 30, 0x414B},
    };
    for (const Expect& e : rows) {
        const OpInfo& i = op_info(e.op);
        INFO(i.name);
        CHECK(i.valid);
        CHECK(i.tagged == e.tagged);
        if (!e.tagged) CHECK(i.qn == e.qn);
        CHECK(i.hdr_len == e.hdr);
        CHECK(ddp::ctrl_with_last(i.ctrl, true) == e.ctrl_last);
        CHECK(ctrl_opcode(i.ctrl) == static_cast<std::uint8_t>(e.op));
        CHECK(ctrl_rdmap_version(i.ctrl) == 1);
        CHECK(ddp::ctrl_ddp_version(i.ctrl) == 1);
        CHECK(i.dirs == (kDirTx | kDirRx));
        CHECK(i.rx_header != nullptr);
        CHECK(i.rx_end != nullptr);
        CHECK(i.hdr_len <= kMaxHeaderLen);
    }
    for (std::size_t op = 12; op < kOpcodeCount; ++op) {
        CHECK_FALSE(kOpTable[op].valid);
        CHECK(kOpTable[op].rx_header == nullptr);
    }
    CHECK(op_info(Opcode::send_se).solicited);
    CHECK(op_info(Opcode::imm_data_se).solicited);
    CHECK_FALSE(op_info(Opcode::send).solicited);
    CHECK(op_info(Opcode::send_inv).invalidate);
    CHECK(op_info(Opcode::send_se_inv).invalidate);
    CHECK(op_info(Opcode::read_response).flow == Flow::response);
    CHECK(op_info(Opcode::atomic_response).flow == Flow::response);
    CHECK(op_info(Opcode::atomic_request).flow == Flow::request);
    CHECK(op_info(Opcode::read_request).payload == Payload::none);
    CHECK(op_info(Opcode::terminate).payload == Payload::term_info);
}

TEST_CASE("every opcode: full header round trip through the table", "[rdmap]") {
    for (std::size_t code = 0; code < 12; ++code) {
        const OpInfo& op = kOpTable[code];
        INFO(op.name);
        std::array<std::byte, kMaxHeaderLen> b{};
        const std::uint16_t ctrl = ddp::ctrl_with_last(op.ctrl, true);
        if (op.tagged) {
            ddp::TaggedHeader{ctrl, 0x1234, 0xABCDEF0011ULL}.encode(b);
            const auto d = ddp::TaggedHeader::decode(std::span<const std::byte>(b).first(op.hdr_len));
            REQUIRE(d);
            CHECK(d->stag == 0x1234);
            CHECK(d->to == 0xABCDEF0011ULL);
            CHECK(ctrl_opcode(d->ctrl) == code);
            continue;
        }
        const ddp::UntaggedHeader uh{ctrl, op.invalidate ? 0x77u : 0u, op.qn, 5, 0};
        uh.encode(b);
        const std::span<const std::byte> in = std::span<const std::byte>(b).first(op.hdr_len);
        switch (static_cast<Opcode>(code)) {
        case Opcode::read_request: {
            const ReadRequest rr{1, 2, 3, 4, 5};
            rr.encode(b);
            CHECK(ReadRequest::decode(in) == rr);
            break;
        }
        case Opcode::terminate: {
            const TerminateHeader th{ddp::err::u_invalid_mo, true, true, false};
            th.encode(b);
            CHECK(TerminateHeader::decode(in) == th);
            break;
        }
        case Opcode::imm_data:
        case Opcode::imm_data_se:
            encode_imm(b, 0x0102030405060708ULL);
            CHECK(decode_imm(in) == 0x0102030405060708ULL);
            CHECK(load_be64(b, 18) == 0x0102030405060708ULL);
            break;
        case Opcode::atomic_request: {
            const AtomicRequest a{2, 9, 0x55, 0x1000, 11, 12, 13, 14};
            a.encode(b);
            CHECK(AtomicRequest::decode(in) == a);
            CHECK(load_be32(b, 18) == 2);
            break;
        }
        case Opcode::atomic_response: {
            const AtomicResponse r{9, 0xFEEDFACECAFEBEEFULL};
            r.encode(b);
            CHECK(AtomicResponse::decode(in) == r);
            break;
        }
        default:
            break;
        }
        const auto d = ddp::UntaggedHeader::decode(in);
        REQUIRE(d);
        CHECK(*d == uh);
    }
}

TEST_CASE("READ request wire bytes (48 with the MPA length, as siw)", "[rdmap]") {
    std::array<std::byte, kReadRequestLen> b{};
    ddp::UntaggedHeader{0x4141, 0, 1, 1, 0}.encode(b);
    ReadRequest{0x11111111, 0x2222222222222222ULL, 0x33333333, 0x44444444, 0x5555555555555555ULL}.encode(b);
    const std::uint8_t expect[] = {0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
                                   0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
                                   0x33, 0x33, 0x33, 0x33, 0x44, 0x44, 0x44, 0x44, 0x55, 0x55, 0x55, 0x55,
                                   0x55, 0x55, 0x55, 0x55};
    for (std::size_t i = 0; i < sizeof expect; ++i) CHECK(b[i] == std::byte{expect[i]});
}

TEST_CASE("Terminate control word bits", "[rdmap]") {
    CHECK(TerminateHeader{ddp::err::u_no_buffer, true, true, false}.word() == 0x1202C000u);
    CHECK(TerminateHeader{err::p_access, true, true, true}.word() == 0x0102E000u);
    CHECK(TerminateHeader{TermCode{TermLayer::llp, 0, 2}, false, false, false}.word() == 0x20020000u);
    std::array<std::byte, kTerminateLen> b{};
    TerminateHeader{err::o_catastrophic_stream, false, false, false}.encode(b);
    CHECK(load_be32(b, 18) == 0x02070000u);
}

TEST_CASE("RFC 7306 atomic operations", "[rdmap]") {
    AtomicRequest a{};
    a.op = static_cast<std::uint8_t>(AtomicOp::fetch_add);
    a.add_swap = 5;
    CHECK(atomic_apply(a, 10) == 15u);
    CHECK(atomic_apply(a, ~std::uint64_t{0}) == 4u);  // wraps
    // Masked add: bit 31 set in the mask = no carry out of the low 32-bit field.
    a.add_swap = 1;
    a.add_swap_mask = 0x80000000ULL;
    CHECK(atomic_apply(a, 0x00000000FFFFFFFFULL) == 0x0000000000000000ULL);
    CHECK(atomic_apply(a, 0x00000001FFFFFFFEULL) == 0x00000001FFFFFFFFULL);
    a = {};
    a.op = static_cast<std::uint8_t>(AtomicOp::swap);
    a.add_swap = 0xAAAA;
    a.add_swap_mask = 0xFF00;
    CHECK(atomic_apply(a, 0x1234) == 0xAA34u);
    a = {};
    a.op = static_cast<std::uint8_t>(AtomicOp::cmp_swap);
    a.compare = 7;
    a.compare_mask = ~std::uint64_t{0};
    a.add_swap = 9;
    a.add_swap_mask = ~std::uint64_t{0};
    CHECK(atomic_apply(a, 7) == 9u);
    CHECK(atomic_apply(a, 8) == 8u);
    a.compare_mask = 0xF0;  // only the high nibble of the low byte compared
    CHECK(atomic_apply(a, 0x0F) == 9u);
    a.op = 3;
    CHECK_FALSE(atomic_apply(a, 1).has_value());
}

TEST_CASE("memory errors map to the RFC codes in one table", "[rdmap]") {
    CHECK(term_code_for(MemError::invalid_stag, MemUse::tagged_sink) == ddp::err::t_invalid_stag);
    CHECK(term_code_for(MemError::bounds, MemUse::tagged_sink) == ddp::err::t_base_bounds);
    CHECK(term_code_for(MemError::wrong_pd, MemUse::tagged_sink) == ddp::err::t_stag_not_assoc);
    CHECK(term_code_for(MemError::access, MemUse::tagged_sink) == err::p_access);
    CHECK(term_code_for(MemError::invalidated, MemUse::tagged_sink) == ddp::err::t_invalid_stag);
    CHECK(term_code_for(MemError::invalid_stag, MemUse::rdma_source) == err::p_invalid_stag);
    CHECK(term_code_for(MemError::bounds, MemUse::rdma_source) == err::p_base_bounds);
    CHECK(term_code_for(MemError::access, MemUse::rdma_source) == err::p_access);
    CHECK(term_code_for(MemError::wrong_pd, MemUse::rdma_source) == err::p_stag_not_assoc);
    CHECK(term_code_for(MemError::misaligned, MemUse::rdma_source) == err::p_base_bounds);
    CHECK(term_code_for(MemError::no_receive, MemUse::receive) == ddp::err::u_no_buffer);
    // Our own buffer deregistered under a message (a READ sink, a posted receive): a local error, not the peer's.
    CHECK(term_code_for(MemError::local_gone, MemUse::tagged_sink) == ddp::err::local_catastrophic);
    CHECK(term_code_for(MemError::local_gone, MemUse::receive) == ddp::err::local_catastrophic);
    CHECK(term_code_for(MemError::bounds, MemUse::receive) == ddp::err::u_too_long);
    CHECK(term_code_for(MemError::access, MemUse::invalidate) == err::p_cannot_invalidate);
    CHECK(term_code_for(MemError::invalid_stag, MemUse::invalidate) == err::o_cannot_invalidate);
    // RFC values.
    CHECK(err::p_access == TermCode{TermLayer::rdmap, 1, 2});
    CHECK(err::o_opcode == TermCode{TermLayer::rdmap, 2, 6});
    CHECK(err::o_version == TermCode{TermLayer::rdmap, 2, 5});
    CHECK(ddp::err::u_no_buffer == TermCode{TermLayer::ddp, 2, 2});
}
