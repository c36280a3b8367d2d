// SPDX-License-Identifier: MIT
#include "io/pcap_writer.hpp"

#include <ctime>

#include <rte_mbuf.h>

#include "io/error.hpp"

namespace softrdma::io {
namespace {
// Classic pcap, nanosecond-resolution magic, Ethernet link type (pcap-savefile(5)).
struct FileHeader {
    std::uint32_t magic = 0xa1b23c4d;
    std::uint16_t major = 2, minor = 4;
    std::int32_t thiszone = 0;
    std::uint32_t sigfigs = 0;
    std::uint32_t snaplen = 65535;
    std::uint32_t linktype = 1;
};
static_assert(sizeof(FileHeader) == 24);
struct RecordHeader {
    std::uint32_t sec, nsec, caplen, len;
};
static_assert(sizeof(RecordHeader) == 16);
}  // namespace

PcapWriter::PcapWriter(const std::string& path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) throw Error("cannot create capture file '" + path + "'");
    // A large stdio buffer set once: frames are appended without allocation.
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
    const FileHeader h;
    std::fwrite(&h, sizeof h, 1, file_);
}

PcapWriter::~PcapWriter() {
    if (file_ != nullptr) std::fclose(file_);
}

void PcapWriter::record_header(std::uint32_t len) noexcept {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    const RecordHeader r{static_cast<std::uint32_t>(ts.tv_sec), static_cast<std::uint32_t>(ts.tv_nsec), len, len};
    std::fwrite(&r, sizeof r, 1, file_);
}

void PcapWriter::write(const rte_mbuf* frame) noexcept {
    record_header(frame->pkt_len);
    for (const rte_mbuf* seg = frame; seg != nullptr; seg = seg->next)
        std::fwrite(rte_pktmbuf_mtod(seg, const void*), 1, seg->data_len, file_);
}

void PcapWriter::write(std::span<const std::byte> frame) noexcept {
    record_header(static_cast<std::uint32_t>(frame.size()));
    std::fwrite(frame.data(), 1, frame.size(), file_);
}

void PcapWriter::flush() noexcept { std::fflush(file_); }

}  // namespace softrdma::io
