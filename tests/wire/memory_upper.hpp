// SPDX-License-Identifier: MIT
// A small rdmap::Upper for wire tests: registered regions by STag, a FIFO of posted receives, and a record of
// every completion and TERMINATE. Test code only: it allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "rdmap/upper.hpp"

namespace softrdma::wire {

class MemoryUpper final : public rdmap::Upper {
public:
    struct Region {
        std::uint64_t base_to{0};
        std::vector<std::byte> bytes;
        bool valid{true};
        bool remote_write{true};  // false: a WRITE into it is an access violation (RDMAP remote protection)
    };
    struct Receive {
        std::vector<std::byte> buffer;
        std::optional<std::uint32_t> msn;  // bound by recv_begin
    };

    // Registers `size` zeroed bytes at tagged offset `base_to` under `stag` (any access allowed).
    Region& add_region(std::uint32_t stag, std::uint64_t base_to, std::size_t size);
    void post_receive(std::size_t size) { receives_.push_back({std::vector<std::byte>(size), std::nullopt}); }

    std::map<std::uint32_t, Region> regions;
    std::vector<Receive> received;  // receives whose message completed, in completion order
    std::vector<rdmap::Completion> completions;
    std::vector<rdmap::TermReport> terminates;  // `attached` spans are cleared: they die after the callback

    rdmap::Mem tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access access) override;
    rdmap::MemError recv_begin(std::uint32_t msn) override;
    rdmap::Mem recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) override;
    rdmap::MemError invalidate(std::uint32_t stag) override;
    void on_completion(const rdmap::Completion& c) override;
    void on_terminate(const rdmap::TermReport& t) override;

private:
    std::deque<Receive> receives_;  // posted, oldest first; bound ones keep their place until completion
};

}  // namespace softrdma::wire
