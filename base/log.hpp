// SPDX-License-Identifier: MIT
// The library's side of <softrdma/log.hpp>: the layers log through these (control path only, never per
// frame). One spdlog logger of our own, not registered with spdlog's registry, so an application's spdlog
// settings and ours do not touch each other; its sink forwards to the application's handler or to stderr.
#pragma once

#include <utility>

#include <spdlog/logger.h>

#include <softrdma/log.hpp>

namespace softrdma::log {

spdlog::logger& logger() noexcept;

template <class... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    logger().debug(fmt, std::forward<Args>(args)...);
}
template <class... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    logger().info(fmt, std::forward<Args>(args)...);
}
template <class... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    logger().warn(fmt, std::forward<Args>(args)...);
}
template <class... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
    logger().error(fmt, std::forward<Args>(args)...);
}

}  // namespace softrdma::log
