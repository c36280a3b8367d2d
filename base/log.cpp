// SPDX-License-Identifier: MIT
#include "base/log.hpp"

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

namespace softrdma::log {
namespace {

Level from_spdlog(spdlog::level::level_enum l) noexcept {
    switch (l) {
    case spdlog::level::trace: return Level::trace;
    case spdlog::level::debug: return Level::debug;
    case spdlog::level::info: return Level::info;
    case spdlog::level::warn: return Level::warn;
    case spdlog::level::err:
    case spdlog::level::critical: return Level::error;
    default: return Level::off;
    }
}

spdlog::level::level_enum to_spdlog(Level l) noexcept {
    switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: break;
    }
    return spdlog::level::off;
}

// base_sink's mutex makes sink_it_ one call at a time, so the handler is too; set_handler takes the same lock.
class Sink final : public spdlog::sinks::base_sink<std::mutex> {
public:
    void set(Handler h) {
        std::lock_guard<std::mutex> lock(mutex_);
        handler_ = std::move(h);
    }

protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
        const std::string_view text(msg.payload.data(), msg.payload.size());
        const Level l = from_spdlog(msg.level);
        if (handler_) {
            handler_(l, text);
            return;
        }
        std::fprintf(stderr, "[softrdma] [%s] %.*s\n", to_string(l), static_cast<int>(text.size()), text.data());
    }
    void flush_() override { std::fflush(stderr); }

private:
    Handler handler_;
};

struct State {
    std::shared_ptr<Sink> sink = std::make_shared<Sink>();
    spdlog::logger logger{"softrdma", sink};
    State() { logger.set_level(spdlog::level::info); }
};

State& state() {
    static State s;  // constructed on first use, from any thread (magic static)
    return s;
}

}  // namespace

spdlog::logger& logger() noexcept { return state().logger; }

void set_level(Level l) noexcept { state().logger.set_level(to_spdlog(l)); }
Level level() noexcept { return from_spdlog(state().logger.level()); }
void set_handler(Handler h) { state().sink->set(std::move(h)); }

const char* to_string(Level l) noexcept {
    switch (l) {
    case Level::trace: return "trace";
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: return "error";
    case Level::off: return "off";
    }
    return "?";
}

}  // namespace softrdma::log
