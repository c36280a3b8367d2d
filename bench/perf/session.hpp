// SPDX-License-Identifier: MIT
// rdma_perf's two ends over softrdma verbs (run-to-completion: one thread, Context::poll()).
//
// The client connects with its plan (WireParams) in the MPA private data; the server answers with its
// buffer. Each size is one phase; phases are separated by a control SEND each way (client first), which
// also carries each end's content-check verdict of the previous phase. Every wait fails after --timeout
// seconds without progress (the peer died or the QP failed), so both ends always terminate.
#pragma once

#include "bench/perf/options.hpp"
#include "tests/support/tcp_roles.hpp"

namespace softrdma::perf {

// Listens, serves one client's run, disconnects. Returns the process exit code (errors on stderr).
int run_server(const test::PeerConfig& pc, const Options& o, double ticks_per_us);
// Connects, runs every phase, prints perftest's table on stdout, writes the JSON file. Exit code.
int run_client(const test::PeerConfig& pc, const Options& o, double ticks_per_us);

}  // namespace softrdma::perf
