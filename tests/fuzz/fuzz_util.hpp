// SPDX-License-Identifier: MIT
// Shared by the libFuzzer targets and the seed generator: reading an input's option bytes, and an invariant
// check that aborts (libFuzzer then keeps the input as a crash) even in a build with NDEBUG.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#define FUZZ_CHECK(cond)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);    \
            std::abort();                                                                         \
        }                                                                                         \
    } while (0)

namespace softrdma::fuzz {

// The front of a fuzz input: option bytes first, then the rest as the bytes under test. Reading past the end
// gives 0, so every input is usable.
class Input {
public:
    Input(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
    std::uint8_t byte() {
        if (n_ == 0) return 0;
        --n_;
        return *p_++;
    }
    std::uint16_t be16() { return static_cast<std::uint16_t>(byte() << 8 | byte()); }
    std::uint32_t be32() { return std::uint32_t{be16()} << 16 | be16(); }
    std::span<const std::byte> take(std::size_t k) {
        if (k > n_) k = n_;
        const std::span<const std::byte> s(reinterpret_cast<const std::byte*>(p_), k);
        p_ += k;
        n_ -= k;
        return s;
    }
    std::span<const std::byte> rest() { return take(n_); }
    std::size_t left() const { return n_; }

private:
    const std::uint8_t* p_;
    std::size_t n_;
};

// Cuts [0, total) into pieces whose sizes come from a small generator seeded by the input (TCP cuts a stream
// anywhere): `seed` 0 = one piece; else pieces of 1..seed bytes, varying.
class Splitter {
public:
    explicit Splitter(std::uint8_t seed) : max_(seed), s_(seed * 2654435761u + 1) {}
    std::size_t next(std::size_t left) {
        if (max_ == 0) return left;
        s_ = s_ * 1664525u + 1013904223u;
        const std::size_t k = 1 + (s_ >> 8) % max_;
        return k < left ? k : left;
    }

private:
    std::uint32_t max_;
    std::uint32_t s_;
};

}  // namespace softrdma::fuzz
