// SPDX-License-Identifier: MIT
// Internal to io/ (installed only because io::Port holds one): keeps DPDK 22.11's memif driver from
// unmapping a connection's shared memory while this process may still be inside rx/tx burst on it. What the
// driver does and why this is needed: memif_guard.cpp. How io::Port uses it: port.cpp (Port::watch_link,
// Port::close).
#pragma once

#include <cstdint>
#include <string>

namespace softrdma::io::detail {

// What port.cpp asked the driver for, to recognise the driver's private state.
struct MemifExpect {
    std::string socket;
    bool server = true;
    unsigned id = 0;
    std::uint16_t buffer_size = 0;
    std::uint8_t log2_ring_size = 0;
    bool zero_copy = false;          // a zero-copy client: find the queues whose lent mbufs reclaim_lent() returns
    const void* rx_pool = nullptr;   // the RX queue's mempool
};

// The memif driver's control-channel lock, held by io::Port for as long as the data path may touch the
// shared memory. memif_disconnect() is the only code in the driver that unmaps it, and it takes this lock
// first (after marking the link down), so while we hold it, nothing is unmapped.
//
// Threads: every call comes from the control side of one Port (its link watcher thread, or close() after
// the watcher stopped): never two at once. None of them blocks.
class MemifGuard {
public:
    // Finds the driver's private state of started port `port_id` and checks that it is the DPDK 22.11 layout
    // this file knows (version, names, queues, id, role, socket, ring sizes). False, with the reason in `why`,
    // when not: then no other call may be made.
    bool attach(std::uint16_t port_id, const std::string& name, const MemifExpect& expect, std::string& why);
    bool attached() const noexcept { return pmd_ != nullptr; }

    // Takes the lock if free (the driver holds it only briefly, inside memif_disconnect).
    bool try_hold() noexcept;
    void release() noexcept;
    bool held() const noexcept { return held_; }

    // Only while held: refuses new connections (server) and shuts the control channel's socket down, so the
    // driver's interrupt thread, and only it, runs the disconnect once release() lets it through. Returns
    // whether there was a channel to shut.
    bool shut_channel() noexcept;
    // No disconnect work left: no control channel and the connection parameters cleared (the last thing
    // memif_disconnect does after unmapping).
    bool settled() const noexcept;
    // The driver state settled() looks at, for error messages.
    std::string describe() const;

    // Zero-copy client only, with the burst gate shut and the lock held since the link came up (so the
    // driver's disconnect, if under way, waits for us and the rings are mapped): gives the mbufs the driver
    // lent out back to their pools (RX buffers posted to the peer, sent frames it had not finished with), as
    // DPDK 22.11's disconnect does not. No effect when attach() did not recognise the queues (it then says
    // why and attached() still holds).
    void reclaim_lent() noexcept;
    // Zero-copy client, closing, once settled(): frees the driver's arrays of lent mbufs, which it allocates
    // per connection and never frees.
    void release_lent_arrays() noexcept;

private:
    void* pmd_ = nullptr;  // the driver's struct pmd_internals (see memif_guard.cpp)
    const void* dev_ = nullptr;  // zero-copy client: its struct rte_eth_dev, and its queues (struct memif_queue)
    void* txq_ = nullptr;
    void* rxq_ = nullptr;
    bool held_ = false;
};

}  // namespace softrdma::io::detail
