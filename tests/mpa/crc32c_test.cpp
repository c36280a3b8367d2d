// SPDX-License-Identifier: MIT
// CRC32c: RFC 3720 appendix B.4 vectors, hw == sw on random data, fused copy, and the wire byte order of a real
// siw FPDU.
#include <catch2/catch.hpp>

#include <cstring>

#include "mpa/crc32c.hpp"
#include "test_util.hpp"

using namespace softrdma::mpa;
using softrdma::mpa::test::hex;

namespace {

using UpdateFn = std::uint32_t (*)(std::uint32_t, const std::byte*, std::size_t) noexcept;

std::uint32_t one_shot(UpdateFn f, const std::vector<std::byte>& v) {
    return crc32c_final(f(kCrc32cInit, v.data(), v.size()));
}

// Bit-at-a-time reference, straight from the definition (RFC 3720 section 12.1).
std::uint32_t reference(std::uint32_t state, const std::byte* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        state ^= std::to_integer<std::uint32_t>(p[i]);
        for (int k = 0; k < 8; ++k) state = (state & 1u) ? (state >> 1) ^ 0x82F63B78u : state >> 1;
    }
    return state;
}

std::vector<UpdateFn> impls() {
    std::vector<UpdateFn> v{&crc32c_update_sw, &crc32c_update};
    if (crc32c_hw_available()) v.push_back(&crc32c_update_hw);
    return v;
}

}  // namespace

TEST_CASE("crc32c: RFC 3720 B.4 test vectors, wire byte order", "[crc32c]") {
    std::vector<std::byte> zeros(32, std::byte{0}), ones(32, std::byte{0xff}), inc(32), dec(32);
    for (int i = 0; i < 32; ++i) {
        inc[static_cast<std::size_t>(i)] = static_cast<std::byte>(i);
        dec[static_cast<std::size_t>(i)] = static_cast<std::byte>(31 - i);
    }
    struct Case {
        const std::vector<std::byte>* data;
        const char* wire;  // the CRC bytes as RFC 3720 B.4 prints them
    };
    const Case cases[] = {{&zeros, "aa36918a"}, {&ones, "43aba862"}, {&inc, "4e79dd46"}, {&dec, "5cdb3f11"}};
    for (auto f : impls()) {
        for (const auto& c : cases) {
            std::byte out[4];
            store_crc32c(out, one_shot(f, *c.data));
            CHECK(std::memcmp(out, hex(c.wire).data(), 4) == 0);
        }
        // The usual check value: "123456789" -> 0xE3069283.
        const auto s = softrdma::mpa::test::bytes_of("123456789");
        CHECK(one_shot(f, s) == 0xE3069283u);
    }
    CHECK(load_crc32c(hex("aa36918a").data()) == 0x8A9136AAu);
}

TEST_CASE("crc32c: implementation names", "[crc32c]") {
    const std::string name = crc32c_impl_name();
    CHECK((name == "sse4.2" || name == "slice-by-8"));
    if (crc32c_hw_available()) CHECK(name == "sse4.2");
}

TEST_CASE("crc32c: hw == sw == reference at every length 0..300 and misalignment", "[crc32c]") {
    std::mt19937 rng(12345);
    auto buf = softrdma::mpa::test::random_bytes(rng, 300 + 16);
    for (std::size_t align = 0; align < 8; ++align) {
        for (std::size_t len = 0; len <= 300; ++len) {
            const std::byte* p = buf.data() + align;
            const std::uint32_t init = (len & 1) ? kCrc32cInit : static_cast<std::uint32_t>(rng());
            const std::uint32_t want = reference(init, p, len);
            for (auto f : impls()) REQUIRE(f(init, p, len) == want);
        }
    }
}

TEST_CASE("crc32c: long buffers cross the 3-stream block sizes", "[crc32c]") {
    std::mt19937 rng(7);
    for (std::size_t len : {383u, 384u, 385u, 767u, 768u, 1448u, 12287u, 12288u, 12289u, 65536u, 65536u + 777u}) {
        auto v = softrdma::mpa::test::random_bytes(rng, len + 3);
        const std::byte* p = v.data() + (len % 4);
        const std::uint32_t want = reference(kCrc32cInit, p, len);
        for (auto f : impls()) REQUIRE(f(kCrc32cInit, p, len) == want);
        // Incremental in odd pieces gives the same state.
        std::uint32_t s = kCrc32cInit;
        std::size_t off = 0, step = 1;
        while (off < len) {
            const std::size_t k = std::min(step, len - off);
            s = crc32c_update(s, p + off, k);
            off += k;
            step = step * 3 + 1;
        }
        REQUIRE(s == want);
    }
}

TEST_CASE("crc32c: fused copy copies and matches the CRC", "[crc32c]") {
    std::mt19937 rng(99);
    using CopyFn = std::uint32_t (*)(std::uint32_t, std::byte*, const std::byte*, std::size_t) noexcept;
    std::vector<CopyFn> copies{&crc32c_copy_sw, &crc32c_copy};
    if (crc32c_hw_available()) copies.push_back(&crc32c_copy_hw);
    for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 100u, 383u, 384u, 1000u, 1448u, 5000u, 13000u, 65536u}) {
        auto src = softrdma::mpa::test::random_bytes(rng, len + 8);
        for (auto f : copies) {
            for (std::size_t mis : {0u, 3u}) {
                std::vector<std::byte> dst(len + 16, std::byte{0xee});
                const std::uint32_t got = f(kCrc32cInit, dst.data() + mis, src.data() + 1, len);
                REQUIRE(got == reference(kCrc32cInit, src.data() + 1, len));
                REQUIRE(std::memcmp(dst.data() + mis, src.data() + 1, len) == 0);
                // No write outside [mis, mis+len).
                for (std::size_t i = 0; i < mis; ++i) REQUIRE(dst[i] == std::byte{0xee});
                for (std::size_t i = mis + len; i < dst.size(); ++i) REQUIRE(dst[i] == std::byte{0xee});
            }
        }
    }
    Crc32c c;
    std::byte d[3];
    const auto s = softrdma::mpa::test::bytes_of("abc");
    c.copy(d, s.data(), 3);
    CHECK(c.value() == crc32c(s));
}

TEST_CASE("crc32c: CRC field of real siw FPDUs (rping_crc.pcapng)", "[crc32c]") {
    // Frame 15 (10.99.0.2 -> .3): SEND, ULPDU length 0x22, no pad, CRC bytes 84 60 9a 12 on the wire.
    const auto f15 = hex(
        "00224143000000000000000000000001000000000000000000000000000000000000000084609a12");
    // Frame 14 (10.99.0.3 -> .2): READ response, ULPDU length 0x4e -> 2 pad bytes before the CRC.
    const auto f14 = hex(
        "004ec14211a236000000560cda9fff3072646d612d70696e672d303a204142434445464748494a4b4c4d4e4f5051525354"
        "55565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717200724edf49");
    for (const auto* f : {&f15, &f14}) {
        const std::size_t body = f->size() - 4;
        std::byte out[4];
        store_crc32c(out, crc32c(std::span(f->data(), body)));
        CHECK(std::memcmp(out, f->data() + body, 4) == 0);
        CHECK(load_crc32c(f->data() + body) == crc32c(std::span(f->data(), body)));
    }
    CHECK(load_crc32c(f15.data() + 36) == 0x129a6084u);
}
