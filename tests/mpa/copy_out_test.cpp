// SPDX-License-Identifier: MIT
// base::copy_out (FpduTx's payload copy): the same bytes as memcpy at every distance between source and
// destination, including the aliasing distances it stages through its bounce buffer, and nothing written
// outside the destination.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "base/copy.hpp"

using softrdma::base::copy_aliases;
using softrdma::base::copy_out;
using softrdma::base::kBounce;

TEST_CASE("copy_aliases: destination 1-63 bytes above the source modulo 4 KiB") {
    alignas(4096) static std::byte page[3 * 4096];
    const std::byte* src = page + 4096;
    CHECK_FALSE(copy_aliases(src, src));
    for (std::size_t d = 1; d < 64; ++d) CHECK(copy_aliases(page + 4096 + d, src));
    CHECK(copy_aliases(page + 2 * 4096 + 20, src));  // a page further: still the same bits
    CHECK_FALSE(copy_aliases(page + 4096 + 64, src));
    CHECK_FALSE(copy_aliases(page + 4096 - 20, src));  // below the source
    CHECK_FALSE(copy_aliases(page + 2 * 4096, src));
}

TEST_CASE("copy_out copies what memcpy would, at every distance, touching nothing else") {
    constexpr std::size_t kGuard = 128;
    const std::size_t sizes[] = {1, 63, 1023, 1024, 5000, 8936, kBounce, kBounce + 1, 2 * kBounce + 777};
    std::vector<std::byte> src_mem(2 * kBounce + 777 + 8192), dst_mem(2 * kBounce + 777 + 8192 + 2 * kGuard);
    const auto page = [](std::byte* p) { return p + (4096 - reinterpret_cast<std::uintptr_t>(p) % 4096) % 4096; };
    std::byte* src = page(src_mem.data());
    std::byte* dst_page = page(dst_mem.data() + kGuard);
    for (std::size_t i = 0; i < src_mem.size() - (src - src_mem.data()); ++i)
        src[i] = static_cast<std::byte>((i * 0x9E3779B97F4A7C15ull) >> 56);  // no short period: a shifted
                                                                              // copy cannot match
    for (const std::size_t n : sizes) {
        for (std::size_t delta : {0u, 1u, 20u, 44u, 63u, 64u, 68u, 92u, 4000u, 4095u}) {
            std::byte* dst = dst_page + delta;
            if (static_cast<std::size_t>(dst - dst_mem.data()) + n + kGuard > dst_mem.size()) continue;
            std::fill(dst_mem.begin(), dst_mem.end(), std::byte{0xee});
            copy_out(dst, src, n);
            INFO("n " << n << " delta " << delta);
            CHECK(std::equal(dst, dst + n, src));
            CHECK(dst[-1] == std::byte{0xee});
            CHECK(dst[n] == std::byte{0xee});
            CHECK(std::all_of(dst_mem.data(), dst - 1, [](std::byte b) { return b == std::byte{0xee}; }));
            CHECK(std::all_of(dst + n, dst_mem.data() + dst_mem.size(),
                              [](std::byte b) { return b == std::byte{0xee}; }));
        }
    }
}

TEST_CASE("unaliased_start: a batch begun there keeps its first FPDUs' payloads clear of aliasing") {
    using softrdma::base::kUnaliasedReach;
    using softrdma::base::unaliased_start;
    alignas(4096) static std::byte page[2 * 4096];
    // Every source page offset, with a WRITE's (2 + 14) and a SEND's (2 + 18) lead, and 8 FPDUs drifting by
    // 24 bytes each (SEND: 18-byte header + length field + CRC; a WRITE drifts 20).
    for (std::size_t p = 0; p < 4096; ++p) {
        for (const std::size_t lead : {16u, 20u}) {
            const std::byte* src = page + p;
            const std::size_t s = unaliased_start(src, lead);
            INFO("source page offset " << p << ", lead " << lead << ", start " << s);
            REQUIRE(s % 64 == 0);
            REQUIRE(s < 4096);
            const std::byte* chunk = page + 4096;  // page-aligned, as a TX chunk
            for (std::size_t k = 0; k < 8; ++k) CHECK_FALSE(copy_aliases(chunk + s + lead + 8960 * k, src + 8936 * k));
            // Nothing moved when the first payload was clear already, with room for the batch's drift.
            const std::size_t d0 = (lead + 4096 - p) % 4096;
            if (d0 >= 64 && d0 <= 4096 - kUnaliasedReach) CHECK(s == 0);
        }
    }
    CHECK(unaliased_start(page, 20) == 64);       // a page-aligned SEND: 20 bytes above, moved to 84
    CHECK(unaliased_start(page + 16, 20) == 64);  // malloc's page + 16: 4 bytes above
    CHECK(unaliased_start(page + 1000, 20) == 0);
}
