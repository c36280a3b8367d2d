// SPDX-License-Identifier: MIT
// How a Context runs its data path: one thread (run to completion) or a dedicated RX thread.
#pragma once

#include <softrdma/config.hpp>

namespace softrdma::threading {

// The mode and its settings are the API's (<softrdma/config.hpp>).
using Mode = softrdma::ThreadingMode;
using softrdma::ThreadingConfig;

// Pins the calling thread to `core` (-1 = every core the machine has). Throws std::system_error.
void pin_this_thread(int core);

}  // namespace softrdma::threading
