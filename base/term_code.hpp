// SPDX-License-Identifier: MIT
// The (layer, error type, error code) triple that names every iWARP protocol error.
//
// RFC 5040 section 4.8 (Terminate header) and 7.4 (error codes) define it; every layer (MPA/LLP, DDP,
// RDMAP) reports its violations as one of these values, and RDMAP turns it into a TERMINATE message at a
// single choke point. The type is the API's (<softrdma/iwarp.hpp>, TerminateInfo hands it to applications);
// this header adds the data path's result type.
#pragma once

#include <optional>

#include <softrdma/iwarp.hpp>

namespace softrdma {

// Result of a data-path protocol step: std::nullopt = success, otherwise the TERMINATE cause.
// Data-path functions return this; they never throw.
using ProtoStatus = std::optional<TermCode>;

}  // namespace softrdma
