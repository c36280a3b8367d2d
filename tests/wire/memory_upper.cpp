// SPDX-License-Identifier: MIT
#include "tests/wire/memory_upper.hpp"

#include <algorithm>

namespace softrdma::wire {

MemoryUpper::Region& MemoryUpper::add_region(std::uint32_t stag, std::uint64_t base_to, std::size_t size) {
    return regions[stag] = Region{base_to, std::vector<std::byte>(size), true};
}

rdmap::Mem MemoryUpper::tagged(std::uint32_t stag, std::uint64_t to, std::size_t len, rdmap::Access access) {
    const auto it = regions.find(stag);
    if (it == regions.end()) return {.err = rdmap::MemError::invalid_stag};
    Region& r = it->second;
    if (!r.valid) return {.err = rdmap::MemError::invalidated};
    if (access == rdmap::Access::remote_write && !r.remote_write) return {.err = rdmap::MemError::access};
    if (to < r.base_to || to - r.base_to > r.bytes.size() || len > r.bytes.size() - (to - r.base_to))
        return {.err = rdmap::MemError::bounds};
    return {r.bytes.data() + (to - r.base_to), len, rdmap::MemError::none};
}

rdmap::MemError MemoryUpper::recv_begin(std::uint32_t msn) {
    const auto free = std::find_if(receives_.begin(), receives_.end(), [](const Receive& r) { return !r.msn; });
    if (free == receives_.end()) return rdmap::MemError::no_receive;
    free->msn = msn;
    return rdmap::MemError::none;
}

rdmap::Mem MemoryUpper::recv_place(std::uint32_t msn, std::uint32_t mo, std::size_t len) {
    const auto it = std::find_if(receives_.begin(), receives_.end(), [&](const Receive& r) { return r.msn == msn; });
    if (it == receives_.end() || mo >= it->buffer.size()) return {.err = rdmap::MemError::bounds};
    return {it->buffer.data() + mo, std::min(len, it->buffer.size() - mo), rdmap::MemError::none};
}

rdmap::MemError MemoryUpper::invalidate(std::uint32_t stag) {
    const auto it = regions.find(stag);
    if (it == regions.end()) return rdmap::MemError::invalid_stag;
    it->second.valid = false;
    return rdmap::MemError::none;
}

void MemoryUpper::on_completion(const rdmap::Completion& c) {
    completions.push_back(c);
    if (c.kind != rdmap::WcKind::recv || c.status != rdmap::WcStatus::success) return;
    const auto it = std::find_if(receives_.begin(), receives_.end(), [&](const Receive& r) { return r.msn == c.msn; });
    if (it == receives_.end()) return;
    it->buffer.resize(c.byte_len);
    received.push_back(std::move(*it));
    receives_.erase(it);
}

void MemoryUpper::on_terminate(const rdmap::TermReport& t) {
    rdmap::TermReport copy = t;
    copy.attached = {};
    terminates.push_back(copy);
}

}  // namespace softrdma::wire
