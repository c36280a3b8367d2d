// SPDX-License-Identifier: MIT
#include "tests/support/tcp_roles.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "stack/tcp.hpp"
#include "tests/support/processes.hpp"

namespace softrdma::test {
void enter_netns(const std::string& name) {
    if (name.empty()) return;
    const std::string path = "/run/netns/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) throw std::runtime_error("cannot enter netns " + name);
    ::close(fd);
}

namespace {

using namespace std::chrono_literals;
using stack::RecvBuffer;
using stack::TcpConnection;
using stack::TcpError;

struct Env {
    std::unique_ptr<io::Port> port;
    std::unique_ptr<stack::Stack> stack;
    stack::PoolUsage baseline;
};

Env start(const PeerConfig& cfg) {
    enter_netns(cfg.netns);
    Env env;
    env.port = io::open_port(cfg.port, cfg.eal);
    env.stack = std::make_unique<stack::Stack>(*env.port, cfg.stack);
    env.baseline = env.stack->pool_usage();
    return env;
}

int finish(Env& env, int rc) { return finish_checks(*env.stack, *env.port, env.baseline, rc); }

// Receives one stream: an 8-byte seed, then `bytes` of pattern(seed); closes after the peer's FIN.
struct StreamSink : TcpConnection::Handler {
    std::unique_ptr<TcpConnection> conn;
    std::uint64_t expected = 0;
    std::uint64_t received = 0;  // pattern bytes received
    std::array<std::byte, 8> seed_bytes{};
    std::size_t seed_have = 0;
    std::uint64_t seed = 0;
    bool closed = false;
    std::string error;

    void on_receive(TcpConnection&, RecvBuffer data) override {
        data.for_each_segment([&](std::span<const std::byte> seg) {
            while (seed_have < 8 && !seg.empty()) {
                seed_bytes[seed_have++] = seg[0];
                seg = seg.subspan(1);
                if (seed_have == 8) std::memcpy(&seed, seed_bytes.data(), 8);
            }
            if (seg.empty() || !error.empty()) return;
            if (const auto bad = check_pattern(seed, received, seg); bad >= 0)
                error = "content mismatch at stream offset " + std::to_string(received + bad);
            received += seg.size();
        });
        // Leaving scope frees the pbufs (mbufs back to DPDK) and reopens the window.
    }
    void on_remote_close(TcpConnection& c) override {
        c.close();
        closed = true;
    }
    void on_error(TcpConnection&, TcpError e) override { error = stack::to_string(e); }
};

struct Acceptor : stack::TcpListener::Handler {
    std::vector<std::unique_ptr<StreamSink>> sinks;
    std::uint64_t expected = 0;
    void on_accept(std::unique_ptr<TcpConnection> c) override {
        auto sink = std::make_unique<StreamSink>();
        sink->expected = expected;
        c->set_handler(sink.get());
        sink->conn = std::move(c);
        sinks.push_back(std::move(sink));
    }
};

// Sends one stream: seed, then `bytes` of pattern(seed) in chunks, then FIN.
// Writers a full lwIP memory pool turned away: no on_sent() may come for them (nothing of theirs is in
// flight), so the driver loop retries exactly these each turn instead of polling every connection.
struct RetryList {
    std::vector<struct StreamSource*> waiting;
    std::uint64_t refusals = 0;  // writes lwIP refused for memory (tcp_write's ERR_MEM: its pools were dry)
};

// Sends one stream: seed, then `bytes` of pattern(seed) in chunks, then FIN. Kept small (the chunk buffer
// lives on the heap) so that walking many sources stays in cache.
struct StreamSource : TcpConnection::Handler {
    std::unique_ptr<TcpConnection> conn;
    RetryList* retry = nullptr;
    std::uint64_t seed = 0;
    std::uint64_t total = 0;
    std::uint64_t sent = 0;       // pattern bytes handed to TCP
    bool header_sent = false;
    bool connected = false;
    bool fin_sent = false;
    bool remote_closed = false;
    bool waiting = false;         // in retry->waiting
    bool mixed = false;           // see stream_client
    std::string error;
    static constexpr std::size_t kChunk = 65535;  // tcp_write's largest single call
    static constexpr std::size_t kRef = 1024;     // mixed: bytes sent from a TX chunk before each copied write
    std::unique_ptr<std::byte[]> chunk = std::make_unique<std::byte[]>(kChunk);
    std::uint64_t chunk_offset = ~0ull;  // stream offset chunk holds the pattern of, and how much
    std::size_t chunk_len = 0;

    bool done() const { return fin_sent || !error.empty(); }
    void pump() {
        if (!connected || fin_sent || !conn || !conn->open()) return;
        if (!header_sent) {
            std::array<std::byte, 8> h;
            std::memcpy(h.data(), &seed, 8);
            if (conn->write(h) != 8) return wait_for_memory();
            header_sent = true;
        }
        while (sent < total) {
            const std::size_t n = std::min<std::uint64_t>(kChunk, total - sent);
            std::size_t room = std::min(n, conn->send_space());
            if (room == 0) break;  // send buffer full: on_sent() comes when ACKs arrive
            if (mixed && room > kRef) {  // the first kRef bytes from a TX chunk, by reference
                const std::span<std::byte> ref = conn->tx_buffer(kRef);
                if (ref.size() == kRef) {
                    fill_pattern(seed, sent, ref);
                    conn->tx_commit(kRef);
                    const std::size_t pushed = conn->tx_push();
                    conn->tx_drop_staged();
                    sent += pushed;
                    if (pushed < kRef) break;
                    room -= kRef;
                }
            }
            if (chunk_offset != sent || chunk_len < room) {  // a refused write keeps its chunk for the retry
                fill_pattern(seed, sent, std::span(chunk.get(), room));
                chunk_offset = sent;
                chunk_len = room;
            }
            const std::size_t took = conn->write(std::span(chunk.get(), room));
            sent += took;
            if (took < room) {
                if (took == 0) wait_for_memory();
                break;
            }
        }
        conn->flush();
        if (sent == total && conn->close()) fin_sent = true;
    }
    void wait_for_memory() {
        if (retry != nullptr) ++retry->refusals;
        if (retry != nullptr && !waiting) {
            waiting = true;
            retry->waiting.push_back(this);
        }
    }
    void on_connected(TcpConnection&) override {
        connected = true;
        pump();
    }
    void on_receive(TcpConnection&, RecvBuffer) override {}
    void on_sent(TcpConnection&, std::size_t) override { pump(); }
    void on_remote_close(TcpConnection&) override { remote_closed = true; }
    void on_error(TcpConnection&, TcpError e) override { error = stack::to_string(e); }
};

}  // namespace

// Waits for every connection to finish closing, drops TIME_WAIT, and compares pools with the start.
int finish_checks(stack::Stack& stack, io::Port& port, const stack::PoolUsage& baseline, int rc,
                  const RunUntil& run_given) {
    const RunUntil run = run_given ? run_given : RunUntil([&stack](const std::function<bool()>& done,
                                                                   std::chrono::milliseconds t) {
        return stack.run_until(done, t);
    });
    run([&] { return stack.active_pcbs() == 0; }, 10s);
    const std::string still_open = stack.describe_active_pcbs();
    // The last ACKs of the peer's close must go out: those still queued behind a full ring to a slow peer
    // first (a 1024-QP server under TSan left 12 client connections in CLOSING when it stopped after a fixed
    // 20 ms), then a little longer so that the peer reads them before our port goes.
    // (Nothing is owed to a peer that is gone: the link is down.) The limit allows for a peer that polls
    // nothing for a while: a 1024-QP server under TSan destroying its QPs (1.4-2.8 s with an RX thread, each
    // a round trip to it; longer on a loaded machine) once left the client's 1024 queued frames untaken for
    // over 5 s.
    run([&] { return stack.owed_output() == 0 || !port.link_up(); }, 20s);
    const unsigned owed = port.link_up() ? stack.owed_output() : 0;
    run([] { return false; }, 20ms);
    // With fault injection (on either side) that ACK may be lost, and the peer, in LAST_ACK or CLOSING, resends
    // its FIN until answered: stay in TIME_WAIT, answering, until the peer has finished too (its port gone: link
    // down), at most 3 s. Purging at once left the peer's pcb retransmitting to nobody past its own 10 s wait.
    if ((port.faults_on() || g_lossy_link) && stack.time_wait_pcbs() != 0) run([&] { return !port.link_up(); }, 3s);
    stack.purge_time_wait();
    if (owed != 0) {
        report(std::to_string(owed) + " frames or ACKs still owed to the peer after 20 s");
        rc = rc == 0 ? 3 : rc;
    }
    // lwIP's TCP timer stops re-arming itself one tick after the last pcb is gone.
    run([] { return false; }, 30ms);
    // Compared at an instant when nothing is in flight, sampled once a millisecond while polling, for at most
    // 2 s: a peer still closing (our last ACK refused by its full ring, its FIN resent to a TIME_WAIT purged
    // above) is answered with resets, which wait in the TX queue while its ring stays full, and an RX thread
    // holds the mbufs of the burst it is processing (a 1024-QP server under TSan ended with 70 and 178 mbufs
    // out that way, its client still draining). A leak shows in every sample.
    std::string diff = baseline.diff(stack.pool_usage());
    if (!diff.empty()) {
        const std::string first = diff + " (output owed " + std::to_string(stack.owed_output()) + ")";
        const auto t0 = std::chrono::steady_clock::now();
        auto next = t0;
        run([&] {
            const auto now = std::chrono::steady_clock::now();
            if (now < next) return false;
            next = now + 1ms;
            diff = baseline.diff(stack.pool_usage());
            return diff.empty();
        }, 2s);
        if (diff.empty())
            std::fprintf(stderr, "finish_checks: pools back to start after %lld ms; first sample: %s\n",
                         static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    std::chrono::steady_clock::now() - t0).count()),
                         first.c_str());
    }
    if (!diff.empty()) {
        report("pools not back to start: " + diff + " (output owed " + std::to_string(stack.owed_output()) +
               ", link " + (port.link_up() ? "up" : "down") + ")");
        if (!still_open.empty()) report("still open after 10 s: " + still_open);
        rc = rc == 0 ? 3 : rc;
    } else {
        report("pools back to start");
    }
    const auto& c = stack.counters();
    report("stack rx_frames=" + std::to_string(c.rx_frames) + " rx_chained=" + std::to_string(c.rx_chained) +
           " rx_dropped=" + std::to_string(c.rx_dropped) +
           " tx_frames=" + std::to_string(c.tx_frames) + " tx_dropped=" + std::to_string(c.tx_dropped) +
           " tx_deferred=" + std::to_string(c.tx_deferred) +
           " unsent_reordered=" + std::to_string(c.unsent_reordered) +
           " tx_from_source=" + std::to_string(c.tx_from_source) +
           " tx_fill_deferred=" + std::to_string(c.tx_fill_deferred) + " tx_fill_copied=" + std::to_string(c.tx_fill_copied));
    report(stack.protocol_counters());
    const auto d = port.device_stats();
    report("port tx_refused=" + std::to_string(port.counters().tx_refused) + " imissed=" +
           std::to_string(d.imissed) + " ierrors=" + std::to_string(d.ierrors) + " rx_nombuf=" +
           std::to_string(d.rx_nombuf) + " oerrors=" + std::to_string(d.oerrors));
    return rc;
}

std::pair<PeerConfig, PeerConfig> memif_pair(std::uint16_t mtu) {
    PeerConfig s, c;
    s.port.backend = c.port.backend = Backend::memif;
    s.port.memif_socket = c.port.memif_socket = "/run/" + unique_name("softrdma-test-") + ".sock";
    s.port.memif_server = true;
    c.port.memif_server = false;
    s.port.mtu = c.port.mtu = mtu;
    s.eal.lcores = "0";
    c.eal.lcores = "1";
    s.stack.ip.address = c.peer = Ipv4::parse("198.18.0.1");
    c.stack.ip.address = s.peer = Ipv4::parse("198.18.0.2");
    return {s, c};
}

int stream_server(const PeerConfig& cfg, std::uint64_t bytes, unsigned connections, std::chrono::milliseconds stall) {
    Env env = start(cfg);
    int rc = 0;
    {
        Acceptor acceptor;
        acceptor.expected = bytes;
        stack::TcpListener listener(*env.stack, cfg.tcp_port, acceptor);
        std::optional<std::chrono::steady_clock::time_point> first;
        bool stalled = stall.count() == 0;
        auto all_done = [&] {
            if (!first && !acceptor.sinks.empty()) first = std::chrono::steady_clock::now();
            if (!stalled) {
                std::uint64_t got = 0;
                for (auto& s : acceptor.sinks) got += s->received;
                if (got >= bytes * connections / 4) {
                    std::this_thread::sleep_for(stall);
                    stalled = true;
                    report("stalled " + std::to_string(stall.count()) + " ms after " + std::to_string(got) + " bytes");
                }
            }
            if (acceptor.sinks.size() < connections) return false;
            for (auto& s : acceptor.sinks)
                if (!s->closed && s->error.empty()) return false;
            return true;
        };
        const bool ok = env.stack->run_until(all_done, 120s);
        const double secs =
            first ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *first).count() : 0.0;
        std::uint64_t total = 0;
        for (auto& s : acceptor.sinks) {
            total += s->received;
            if (!s->error.empty()) {
                report("stream error: " + s->error);
                rc = 1;
            } else if (s->received != bytes) {
                report("stream short: " + std::to_string(s->received) + " of " + std::to_string(bytes));
                rc = 1;
            }
        }
        if (!ok) {
            report("timed out with " + std::to_string(acceptor.sinks.size()) + " connections accepted");
            rc = 1;
        }
        report("rx_bytes=" + std::to_string(total) + " seconds=" + std::to_string(secs) +
               " MBps=" + std::to_string(secs > 0 ? total / secs / 1e6 : 0.0));
        env.stack->run_until([&] { return env.stack->active_pcbs() == 0; }, 10s);
        for (auto& s : acceptor.sinks) s->conn.reset();
    }
    return finish(env, rc);
}

int stream_client(const PeerConfig& cfg, std::uint64_t bytes, unsigned connections, bool mixed) {
    Env env = start(cfg);
    int rc = 0;
    {
        RetryList retry;
        std::vector<std::unique_ptr<StreamSource>> sources;
        for (unsigned i = 0; i < connections; ++i) {
            auto s = std::make_unique<StreamSource>();
            s->seed = 1000 + i;
            s->total = bytes;
            s->mixed = mixed;
            s->retry = &retry;
            s->conn = stack::connect(*env.stack, cfg.peer, cfg.tcp_port, *s, 10s);
            sources.push_back(std::move(s));
        }
        std::vector<StreamSource*> again;
        std::size_t next_check = 0;
        std::uint64_t max_queued = 0;  // bytes written and not yet acknowledged, most seen at a turn's end
        auto done = [&] {
            max_queued = std::max(max_queued, env.stack->queued_bytes());
            again.swap(retry.waiting);  // writers refused for memory try again (they may re-queue)
            for (StreamSource* s : again) {
                s->waiting = false;
                s->pump();
            }
            again.clear();
            // All finished (FIN queued: lwIP completes the close)? Checked incrementally.
            while (next_check < sources.size() && sources[next_check]->done()) ++next_check;
            return next_check == sources.size();
        };
        const bool ok = env.stack->run_until(done, 120s);
        report("client max_queued=" + std::to_string(max_queued) + " refused_for_memory=" +
               std::to_string(retry.refusals));
        for (auto& s : sources)
            if (!s->error.empty()) {
                report("client stream error: " + s->error);
                rc = 1;
            }
        if (!ok) {
            report("client timed out");
            rc = 1;
        }
        sources.clear();
    }
    return finish(env, rc);
}

int dead_peer_detecting_server(const PeerConfig& cfg) {
    Env env = start(cfg);
    int rc = 1;
    {
        Acceptor acceptor;
        acceptor.expected = ~0ull;
        stack::TcpListener listener(*env.stack, cfg.tcp_port, acceptor);
        if (!env.stack->run_until([&] { return !acceptor.sinks.empty(); }, 20s)) {
            report("no connection");
            return finish(env, 1);
        }
        StreamSink& sink = *acceptor.sinks[0];
        sink.conn->set_keepalive(1s, 500ms, 3);
        std::uint64_t last = 0;
        auto quiet_since = std::chrono::steady_clock::now();
        env.stack->run_until([&] {
            if (sink.received != last) {
                last = sink.received;
                quiet_since = std::chrono::steady_clock::now();
            }
            return !sink.error.empty() || sink.closed;
        }, 60s);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - quiet_since).count();
        report("received " + std::to_string(sink.received) + " bytes; connection ended with: " +
               (sink.error.empty() ? std::string(sink.closed ? "orderly close" : "nothing (still open)") : sink.error));
        report("peer loss detected after " + std::to_string(secs) + " s");
        if (sink.error == stack::to_string(TcpError::timed_out)) rc = 0;
        sink.conn.reset();
    }
    return finish(env, rc);
}

int dying_client(const PeerConfig& cfg, std::uint64_t bytes_before_death) {
    Env env = start(cfg);
    StreamSource s;
    s.seed = 7;
    s.total = 1ull << 40;  // never finishes on its own
    s.conn = stack::connect(*env.stack, cfg.peer, cfg.tcp_port, s, 10s);
    env.stack->run_until([&] { return s.sent >= bytes_before_death || !s.error.empty(); }, 30s);
    env.stack->run_until([] { return false; }, 50ms);  // let the data go out
    report("dying after sending " + std::to_string(s.sent) + " bytes");
    ::_exit(0);  // no FIN, no RST, no DPDK teardown: as if killed
}

int idle_peer(const PeerConfig& cfg, unsigned seconds) {
    Env env = start(cfg);
    // Polls until the peer has gone (its link drops; io::Port makes that safe at any moment).
    unsigned turns = 0;
    env.stack->run_until([&] { return (++turns & 1023) == 0 && !env.port->link_up(); },
                         std::chrono::seconds(seconds));
    return finish(env, 0);
}

int refused_client(const PeerConfig& cfg) {
    Env env = start(cfg);
    int rc = 1;
    {
        StreamSource s;
        // 10 s: the SYN peer of hostile_test refuses 3.2 s after the first SYN it sees, which waits for its ARP
        // answer (a Python script starting beside a busy machine's other processes: seen 2 s late under load).
        s.conn = stack::connect(*env.stack, cfg.peer, cfg.tcp_port, s, 10s);
        env.stack->run_until([&] { return !s.error.empty() || s.connected; }, 15s);
        report("connect result: " + (s.error.empty() ? std::string(s.connected ? "connected" : "nothing") : s.error));
        if (s.error == stack::to_string(TcpError::refused)) rc = 0;
    }
    return finish(env, rc);
}

int aborting_server(const PeerConfig& cfg) {
    Env env = start(cfg);
    struct AbortOnData : TcpConnection::Handler {
        bool aborted = false;
        void on_receive(TcpConnection& c, RecvBuffer) override {
            c.abort();
            aborted = true;
        }
    } handler;
    struct Keep : stack::TcpListener::Handler {
        TcpConnection::Handler* h = nullptr;
        std::unique_ptr<TcpConnection> conn;
        void on_accept(std::unique_ptr<TcpConnection> c) override {
            c->set_handler(h);
            conn = std::move(c);
        }
    } keep;
    keep.h = &handler;
    int rc;
    {
        stack::TcpListener listener(*env.stack, cfg.tcp_port, keep);
        rc = env.stack->run_until([&] { return handler.aborted; }, 20s) ? 0 : 1;
        report(rc == 0 ? "aborted the connection" : "no connection to abort");
        keep.conn.reset();
    }
    return finish(env, rc);
}

int reset_expecting_client(const PeerConfig& cfg) {
    Env env = start(cfg);
    int rc = 1;
    {
        StreamSource s;
        s.total = 1ull << 30;  // keeps sending until the reset comes
        s.conn = stack::connect(*env.stack, cfg.peer, cfg.tcp_port, s, 5s);
        env.stack->run_until([&] { return !s.error.empty(); }, 20s);
        report("client saw: " + (s.error.empty() ? std::string("no error") : s.error));
        if (s.error == stack::to_string(TcpError::reset)) rc = 0;
    }
    return finish(env, rc);
}

}  // namespace softrdma::test
