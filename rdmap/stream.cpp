// SPDX-License-Identifier: MIT
// Instantiates the MPA glue once so that contract breaks show at library build time.
#include "rdmap/stream.hpp"

template class softrdma::mpa::Deframer<softrdma::rdmap::Endpoint>;
