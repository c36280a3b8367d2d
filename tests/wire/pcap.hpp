// SPDX-License-Identifier: MIT
// Capture files for the wire tests: write classic pcap, read pcap and pcapng.
//
// Only Ethernet link type is produced and accepted (every capture we use is Ethernet). These are test tools:
// a malformed or unsupported file raises std::runtime_error naming the problem.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace softrdma::wire {

// One captured link-layer frame; timestamps in microseconds since the epoch.
struct Frame {
    std::uint64_t time_us{0};
    std::vector<std::uint8_t> bytes;
};

// Accumulates Ethernet frames in memory; image() is a classic pcap file (microsecond, little-endian).
class PcapWriter {
public:
    void add(std::span<const std::uint8_t> ethernet_frame, std::uint64_t time_us);
    std::size_t frame_count() const { return frames_; }
    const std::vector<std::uint8_t>& image() const { return image_; }
    void save(const std::filesystem::path& path) const;

private:
    std::vector<std::uint8_t> image_ = header();
    std::size_t frames_{0};
    static std::vector<std::uint8_t> header();
};

// Parses a pcap (either byte order, micro- or nanosecond) or pcapng (SHB/IDB/EPB/SPB/PB, any number of
// sections) image into its Ethernet frames in file order.
std::vector<Frame> parse_capture(std::span<const std::uint8_t> file);
std::vector<Frame> read_capture(const std::filesystem::path& path);

// Where the real-peer captures are: $SOFTRDMA_CAPTURES, else ../shared/captures next to the source tree.
std::filesystem::path captures_dir();

}  // namespace softrdma::wire
