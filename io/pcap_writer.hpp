// SPDX-License-Identifier: MIT
// Writes Ethernet frames to a classic pcap file (nanosecond timestamps) that tshark and Wireshark open.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

struct rte_mbuf;

namespace softrdma::io {

class PcapWriter {
public:
    // Opens (truncates) `path` and writes the file header. Throws io::Error when the file cannot be created.
    explicit PcapWriter(const std::string& path);
    ~PcapWriter();
    PcapWriter(const PcapWriter&) = delete;
    PcapWriter& operator=(const PcapWriter&) = delete;

    // One frame; a chained mbuf is written as one record. Buffered: no allocation per frame.
    void write(const rte_mbuf* frame) noexcept;
    void write(std::span<const std::byte> frame) noexcept;
    void flush() noexcept;

private:
    void record_header(std::uint32_t len) noexcept;
    std::FILE* file_ = nullptr;
};

}  // namespace softrdma::io
