// SPDX-License-Identifier: MIT
#include "verbs/memory.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "verbs/engine.hpp"
#include <softrdma/verbs.hpp>

namespace softrdma::verbs::detail {
namespace {

// Random bits for STags: the kernel's CSPRNG (control path only: one call per registration).
std::uint32_t random32() {
    std::uint32_t v = 0;
    if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v))
        throw Error(std::string("reg_mr: getrandom: ") + std::strerror(errno));
    return v;
}

constexpr auto relaxed = std::memory_order_relaxed;

}  // namespace

MemoryTable::MemoryTable(std::uint32_t max_mr) : max_mr_(max_mr), entries_(std::make_unique<Entry[]>(max_mr)) {
    while ((1u << slot_bits_) <= max_mr) ++slot_bits_;  // slot + 1 fits; max_mr < 2^24 (checked by Context)
    free_.reserve(max_mr);
    for (std::uint32_t i = max_mr; i-- > 0;) free_.push_back(i);
}

MemoryTable::Registration MemoryTable::add(std::span<std::byte> bytes, std::uint32_t pd, std::uint32_t access) {
    if (free_.empty()) throw Error("reg_mr: MR table full (ContextConfig::max_mr)");
    const std::uint32_t rnd = random32();
    const std::uint32_t index = free_.back();
    free_.pop_back();
    const auto key = static_cast<std::uint8_t>(rnd & 0xffu);
    const std::uint32_t tag = ((rnd >> 8) << slot_bits_ | (index + 1)) & 0xffffffu;
    Entry& e = entries_[index];
    e.tag.store(tag, relaxed);
    e.base.store(bytes.data(), relaxed);
    e.length.store(bytes.size(), relaxed);
    e.pd.store(pd, relaxed);
    e.access.store(access, relaxed);
    e.key.store(key, relaxed);
    e.valid.store(true, relaxed);
    e.in_use.store(true, std::memory_order_release);
    return {index, tag << 8 | key};
}

void MemoryTable::release(std::uint32_t index, const std::function<void()>& quiesce) {
    Entry& e = entries_[index];
    e.valid.store(false, relaxed);
    e.in_use.store(false, relaxed);
    e.tag.store(0, relaxed);
    e.gen.fetch_add(1, relaxed);  // every lease of this registration is dead from here (quiesce publishes it)
    // The RX thread may be placing into this region right now (a check passed just before): wait until it has
    // finished that turn, so the memory is not written after the application frees it.
    if (quiesce) quiesce();
    e.base.store(nullptr, relaxed);
    e.length.store(0, relaxed);
    free_.push_back(index);  // capacity reserved at construction
}

void MemoryTable::set_valid(std::uint32_t index, bool valid) noexcept { entries_[index].valid.store(valid, relaxed); }

bool MemoryTable::valid(std::uint32_t index) const noexcept { return entries_[index].valid.load(relaxed); }

std::uint32_t MemoryTable::rekey(std::uint32_t index, std::uint8_t key) noexcept {
    Entry& e = entries_[index];
    e.key.store(key, relaxed);
    e.valid.store(true, relaxed);
    return e.tag.load(relaxed) << 8 | key;
}

// The entry an STag names: its tag's low bits give the slot, and the whole tag (random bits included) must be
// the entry's; the key is checked by the callers (a stale key reads "invalidated").
MemoryTable::Entry* MemoryTable::entry(std::uint32_t stag) const noexcept {
    const std::uint32_t tag = stag >> 8;
    const std::uint32_t slot = tag & ((1u << slot_bits_) - 1);
    if (slot == 0 || slot > max_mr_) return nullptr;
    Entry& e = entries_[slot - 1];
    if (!e.in_use.load(std::memory_order_acquire) || e.tag.load(relaxed) != tag) return nullptr;
    return &e;
}

rdmap::MemError MemoryTable::invalidate(std::uint32_t stag, std::uint32_t pd) noexcept {
    Entry* e = entry(stag);
    if (e == nullptr) return rdmap::MemError::invalid_stag;
    if (e->key.load(relaxed) != (stag & 0xffu) || !e->valid.load(relaxed)) return rdmap::MemError::invalidated;
    if (e->pd.load(relaxed) != pd) return rdmap::MemError::wrong_pd;
    if ((e->access.load(relaxed) & access::remote_invalidate) == 0) return rdmap::MemError::access;
    e->valid.store(false, relaxed);
    return rdmap::MemError::none;
}

rdmap::Mem MemoryTable::lookup(std::uint32_t stag, std::uint64_t to, std::size_t len, std::uint32_t pd,
                               std::uint32_t need) const noexcept {
    using rdmap::MemError;
    const Entry* e = entry(stag);
    if (e == nullptr) return {.err = MemError::invalid_stag};
    if (e->key.load(relaxed) != (stag & 0xffu) || !e->valid.load(relaxed)) return {.err = MemError::invalidated};
    if (e->pd.load(relaxed) != pd) return {.err = MemError::wrong_pd};
    if ((e->access.load(relaxed) & need) != need) return {.err = MemError::access};
    std::byte* const b = e->base.load(relaxed);
    const std::size_t length = e->length.load(relaxed);
    const auto base = reinterpret_cast<std::uint64_t>(b);
    if (to < base || to - base > length || len > length - (to - base)) return {.err = MemError::bounds};
    return {b + (to - base), len, MemError::none};
}

rdmap::Mem MemoryTable::lookup_local(std::uint32_t stag, std::uint64_t to, std::size_t len, std::uint32_t pd,
                                     std::uint32_t need, Lease& lease) const noexcept {
    const rdmap::Mem m = lookup(stag, to, len, pd, need);
    if (m.err == rdmap::MemError::none) {
        const std::uint32_t index = ((stag >> 8) & ((1u << slot_bits_) - 1)) - 1;  // lookup found the slot valid
        lease = {index, entries_[index].gen.load(relaxed)};
    }
    return m;
}

}  // namespace softrdma::verbs::detail

// ==== the handles =============================================================================================

namespace softrdma::verbs {

MemoryRegion::MemoryRegion(std::shared_ptr<detail::Engine> engine, std::uint32_t index, std::uint32_t stag,
                           std::span<std::byte> bytes, std::uint32_t access)
    : engine_(std::move(engine)), index_(index), stag_(stag), bytes_(bytes), access_(access) {}

MemoryRegion::~MemoryRegion() {
    // After release() nothing reads or writes these bytes: every lease of the registration is dead, and WRs
    // still naming it fail at their next use (memory.hpp).
    // Payload still sent from these bytes (stack::FillBook) goes into its TX chunks first.
    engine_->settle_fills();
    threading::RxThread* rx = engine_->rx_thread();
    engine_->memory().release(index_, [rx] {
        if (rx != nullptr) rx->quiesce();
    });
}

void MemoryRegion::invalidate() noexcept { engine_->memory().set_valid(index_, false); }

bool MemoryRegion::valid() const noexcept { return engine_->memory().valid(index_); }

std::uint32_t MemoryRegion::rekey(std::uint8_t key) noexcept {
    stag_ = engine_->memory().rekey(index_, key);
    return stag_;
}

ProtectionDomain::~ProtectionDomain() = default;

std::unique_ptr<MemoryRegion> ProtectionDomain::reg_mr(std::span<std::byte> bytes, std::uint32_t access_flags) {
    // RFC 5040: remote write/atomic need local write too (as ibv_reg_mr refuses remote write without it).
    if ((access_flags & (access::remote_write | access::remote_atomic)) != 0 && !(access_flags & access::local_write))
        throw Error("reg_mr: remote write/atomic access requires local write");
    constexpr std::uint32_t remote = access::remote_write | access::remote_read | access::remote_atomic;
    if ((access_flags & access::remote_invalidate) != 0 && (access_flags & remote) == 0)
        throw Error("reg_mr: remote_invalidate needs a remote access right");
    engine_->check_open("reg_mr");
    const detail::MemoryTable::Registration r = engine_->memory().add(bytes, handle_, access_flags);
    try {
        return std::make_unique<MemoryRegion>(engine_, r.index, r.stag, bytes, access_flags);
    } catch (...) {
        engine_->memory().release(r.index, {});
        throw;
    }
}

}  // namespace softrdma::verbs
