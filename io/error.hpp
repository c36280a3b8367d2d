// SPDX-License-Identifier: MIT
// Setup-time errors of the io layer: one clear message that names the fix. The data path never throws.
#pragma once

#include <stdexcept>
#include <string>

namespace softrdma::io {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace softrdma::io
