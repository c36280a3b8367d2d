// SPDX-License-Identifier: MIT
#include "tests/wire/pcap.hpp"

#include <cstdlib>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace softrdma::wire {
namespace {

constexpr std::uint32_t linktype_ethernet = 1;

void put_le32(std::vector<std::uint8_t>& out, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_le16(std::vector<std::uint8_t>& out, std::uint16_t v) {
    out.push_back(static_cast<std::uint8_t>(v));
    out.push_back(static_cast<std::uint8_t>(v >> 8));
}

// Bounds-checked reader of a capture image in the byte order of the current file/section.
class Cursor {
public:
    explicit Cursor(std::span<const std::uint8_t> data) : data_(data) {}

    bool big_endian{false};

    std::uint32_t u32(std::size_t at) const {
        need(at, 4);
        std::uint32_t v = 0;
        for (int i = 0; i < 4; ++i) {
            const int shift = big_endian ? 8 * (3 - i) : 8 * i;
            v |= std::uint32_t{data_[at + i]} << shift;
        }
        return v;
    }
    std::uint16_t u16(std::size_t at) const {
        need(at, 2);
        return big_endian ? static_cast<std::uint16_t>(data_[at] << 8 | data_[at + 1])
                          : static_cast<std::uint16_t>(data_[at + 1] << 8 | data_[at]);
    }
    std::span<const std::uint8_t> bytes(std::size_t at, std::size_t n) const {
        need(at, n);
        return data_.subspan(at, n);
    }
    std::size_t size() const { return data_.size(); }

private:
    std::span<const std::uint8_t> data_;
    void need(std::size_t at, std::size_t n) const {
        if (at > data_.size() || n > data_.size() - at) throw std::runtime_error("capture: truncated file");
    }
};

void require_ethernet(std::uint32_t linktype) {
    if (linktype != linktype_ethernet)
        throw std::runtime_error("capture: unsupported link type " + std::to_string(linktype));
}

std::vector<Frame> parse_pcap(Cursor c) {
    const std::uint32_t magic_le = c.u32(0);
    bool nanoseconds = false;
    if (magic_le == 0xa1b2c3d4 || magic_le == 0xa1b23c4d) {
        nanoseconds = magic_le == 0xa1b23c4d;
    } else {
        c.big_endian = true;
        nanoseconds = c.u32(0) == 0xa1b23c4d;
    }
    require_ethernet(c.u32(20) & 0x0fffffff);  // upper bits: FCS length flags

    std::vector<Frame> frames;
    for (std::size_t at = 24; at < c.size();) {
        const std::uint64_t sec = c.u32(at), frac = c.u32(at + 4);
        const std::uint32_t caplen = c.u32(at + 8);
        auto data = c.bytes(at + 16, caplen);
        frames.push_back({sec * 1'000'000 + (nanoseconds ? frac / 1000 : frac), {data.begin(), data.end()}});
        at += 16 + caplen;
    }
    return frames;
}

// pcapng (draft-ietf-opsawg-pcapng): a sequence of blocks [type, total length, body, total length].
std::vector<Frame> parse_pcapng(Cursor c) {
    constexpr std::uint32_t shb = 0x0A0D0D0A, idb = 1, pb = 2, spb = 3, epb = 6;
    struct Interface {
        std::uint64_t units_per_second{1'000'000};
    };
    std::vector<Interface> interfaces;
    std::vector<Frame> frames;

    auto timestamp_us = [&](std::uint32_t iface, std::uint32_t hi, std::uint32_t lo) {
        if (iface >= interfaces.size()) throw std::runtime_error("capture: packet on an undeclared interface");
        const std::uint64_t ts = std::uint64_t{hi} << 32 | lo;
        const std::uint64_t ups = interfaces[iface].units_per_second;
        return ups == 1'000'000 ? ts : ts / ups * 1'000'000 + ts % ups * 1'000'000 / ups;
    };

    for (std::size_t at = 0; at < c.size();) {
        if (c.u32(at) == shb) {  // a palindrome; the section's byte order is set by the magic that follows
            c.big_endian = false;
            c.big_endian = c.u32(at + 8) != 0x1A2B3C4D;
            if (c.u32(at + 8) != 0x1A2B3C4D) throw std::runtime_error("capture: bad pcapng byte-order magic");
            interfaces.clear();
        }
        const std::uint32_t type = c.u32(at), len = c.u32(at + 4);
        if (len < 12 || len % 4 != 0) throw std::runtime_error("capture: bad pcapng block length");
        c.bytes(at, len);  // the whole block is present

        if (type == idb) {
            require_ethernet(c.u16(at + 8));
            Interface itf;
            // Options from offset 16: if_tsresol (code 9) changes the timestamp unit.
            for (std::size_t o = at + 16; o + 4 <= at + len - 4;) {
                const std::uint16_t code = c.u16(o), olen = c.u16(o + 2);
                if (code == 0) break;
                if (code == 9 && olen >= 1) {
                    const std::uint8_t r = c.bytes(o + 4, 1)[0];
                    std::uint64_t ups = 1;
                    for (int i = 0; i < (r & 0x7f); ++i) ups *= (r & 0x80) ? 2 : 10;
                    itf.units_per_second = ups;
                }
                o += 4 + (olen + 3u) / 4 * 4;
            }
            interfaces.push_back(itf);
        } else if (type == epb) {
            const std::uint32_t caplen = c.u32(at + 20);
            auto data = c.bytes(at + 28, caplen);
            frames.push_back({timestamp_us(c.u32(at + 8), c.u32(at + 12), c.u32(at + 16)),
                              {data.begin(), data.end()}});
        } else if (type == pb) {
            const std::uint32_t caplen = c.u32(at + 20);
            auto data = c.bytes(at + 28, caplen);
            frames.push_back({timestamp_us(c.u16(at + 8), c.u32(at + 12), c.u32(at + 16)),
                              {data.begin(), data.end()}});
        } else if (type == spb) {
            if (interfaces.empty()) throw std::runtime_error("capture: simple packet before any interface");
            const std::uint32_t orig = c.u32(at + 8);
            auto data = c.bytes(at + 12, std::min<std::size_t>(orig, len - 16));
            frames.push_back({0, {data.begin(), data.end()}});
        }
        at += len;
    }
    return frames;
}

}  // namespace

std::vector<std::uint8_t> PcapWriter::header() {
    std::vector<std::uint8_t> h;
    put_le32(h, 0xa1b2c3d4);  // microsecond timestamps
    put_le16(h, 2);           // version 2.4
    put_le16(h, 4);
    put_le32(h, 0);           // thiszone
    put_le32(h, 0);           // sigfigs
    put_le32(h, 262144);      // snaplen
    put_le32(h, linktype_ethernet);
    return h;
}

void PcapWriter::add(std::span<const std::uint8_t> frame, std::uint64_t time_us) {
    put_le32(image_, static_cast<std::uint32_t>(time_us / 1'000'000));
    put_le32(image_, static_cast<std::uint32_t>(time_us % 1'000'000));
    put_le32(image_, static_cast<std::uint32_t>(frame.size()));
    put_le32(image_, static_cast<std::uint32_t>(frame.size()));
    image_.insert(image_.end(), frame.begin(), frame.end());
    ++frames_;
}

void PcapWriter::save(const std::filesystem::path& path) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(image_.data()), static_cast<std::streamsize>(image_.size()));
    if (!out) throw std::runtime_error("capture: cannot write " + path.string());
}

std::vector<Frame> parse_capture(std::span<const std::uint8_t> file) {
    Cursor c(file);
    const std::uint32_t magic = c.u32(0);
    if (magic == 0x0A0D0D0A) return parse_pcapng(c);
    if (magic == 0xa1b2c3d4 || magic == 0xd4c3b2a1 || magic == 0xa1b23c4d || magic == 0x4d3cb2a1)
        return parse_pcap(c);
    throw std::runtime_error("capture: neither pcap nor pcapng");
}

std::vector<Frame> read_capture(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("capture: cannot open " + path.string());
    const std::vector<std::uint8_t> file{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    return parse_capture(file);
}

std::filesystem::path captures_dir() {
    if (const char* env = std::getenv("SOFTRDMA_CAPTURES")) return env;
    return std::filesystem::path(SOFTRDMA_SOURCE_ROOT) / ".." / "shared" / "captures";
}

}  // namespace softrdma::wire
