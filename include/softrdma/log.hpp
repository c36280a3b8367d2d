// SPDX-License-Identifier: MIT
// softrdma's log: what the library says about itself (a port that came up, hugepages missing, a connection
// refused by a security limit, a peer's TERMINATE). Never on the data path. By default it goes to stderr, at
// level info, one line each ("[softrdma] [warn] ..."); standard output stays the application's.
//
//   softrdma::log::set_level(softrdma::log::Level::warn);   // quieter
//   softrdma::log::set_level(softrdma::log::Level::off);    // silent
//   softrdma::log::set_handler([](softrdma::log::Level l, std::string_view msg) { my_logger(l, msg); });
//
// Both may be called at any time from any thread; a handler is called from whichever thread logs (the
// application's, DPDK's link watcher, the RX thread), one call at a time, and must not call into softrdma.
// DPDK's own messages are separate (EalConfig::log_level).
#pragma once

#include <functional>
#include <string_view>

namespace softrdma::log {

enum class Level { trace, debug, info, warn, error, off };

// Messages below `level` are dropped before they are formatted.
void set_level(Level level) noexcept;
Level level() noexcept;
// Where messages go; an empty handler restores the default (stderr).
using Handler = std::function<void(Level level, std::string_view message)>;
void set_handler(Handler handler);

const char* to_string(Level level) noexcept;

}  // namespace softrdma::log
