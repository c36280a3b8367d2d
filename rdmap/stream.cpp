// SPDX-License-Identifier: MIT
// Instantiates the MPA glue once so that contract breaks show at library build time.
#include "rdmap/stream.hpp"

template class softrdma::mpa::Deframer<softrdma::rdmap::Endpoint>;

namespace softrdma::rdmap {

Framer& no_framer() {
    struct None final : Framer {
        std::size_t mulpdu() const override { return 0; }
        std::size_t wire_size(std::size_t) const override { return ~std::size_t{0}; }
        std::size_t write(std::span<std::byte>, std::span<const std::byte>, std::span<const std::span<const std::byte>>) override {
            return 0;
        }
    };
    static None none;
    return none;
}

}  // namespace softrdma::rdmap
