// SPDX-License-Identifier: MIT
// rdma_perf output: perftest's columns on stdout, and the JSON object the comparison script reads.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench/perf/options.hpp"
#include "bench/perf/stats.hpp"

namespace softrdma::perf {

inline constexpr const char* kLatHeader =
    "#bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec] "
    "99% percentile[usec] 99.9% percentile[usec]";
inline constexpr const char* kBwHeader = "#bytes #iterations BW peak[MiB/sec] BW average[MiB/sec] MsgRate[Mpps]";

// `memif_zero_copy`: whether this end's port runs memif's zero-copy client mode (diagnostics::memif_zero_copy).
void print_banner(std::FILE* f, const WireParams& p, const Options& o, bool memif_zero_copy);
void print_header(std::FILE* f, Kind k);
void print_row(std::FILE* f, const LatStats& s);
void print_row(std::FILE* f, const BwStats& s);

// {"tool":"rdma_perf","test":..,"kind":..,"threading":..,"mtu":..,"core_rtt_ns":..|null,"results":[..]};
// throws on I/O failure.
void write_json(const std::string& path, const WireParams& p, const Options& o, const std::vector<LatStats>& lat,
                const std::vector<BwStats>& bw);

}  // namespace softrdma::perf
