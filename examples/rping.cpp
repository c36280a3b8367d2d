// SPDX-License-Identifier: MIT
// rping: librdmacm's rping example (rdma-core, librdmacm/examples/rping.c) redone on softrdma's verbs API,
// with the same messages in the same order, so the protocol is the one rping users know:
//
//   client                                         server
//   SEND {start_buf addr, rkey, size}   ------->   (receive: the source to READ)
//                                       <-------   RDMA READ start_buf -> server's rdma_buf
//                                       <-------   SEND "go ahead" (the READ has completed)
//   SEND {rdma_buf addr, rkey, size}    ------->   (receive: the sink to WRITE)
//                                       <-------   RDMA WRITE server's rdma_buf -> client's rdma_buf
//                                       <-------   SEND "go ahead" (the WRITE has completed)
//   client compares rdma_buf with start_buf; next ping (a new text each time)
//
// The advertisement is rping's struct rping_rdma_info { __be64 buf; __be32 rkey; __be32 size; } (16 bytes,
// big-endian), sent by SEND; the server's "go ahead" SENDs are 16 bytes too (rping sends its send_buf
// unchanged: zeros). The ping text is rping's: "rdma-ping-<n>: " followed by letters 'A'..'z' starting one
// further each ping, NUL-terminated at size - 1.
//
//   rping                               both ends on this machine (two processes over DPDK memif)
//   rping -s [-vVP] [-S size] [-a addr] [-p port]
//   rping -c [-vV] [-S size] [-C count] [-I addr] -a addr [-p port] [--connects N]
//   iWARP modes: --crc (require MPA CRC), --p2p write|read|send[,..] (RFC 6581 peer-to-peer, offering those RTR
//   types), --first-fpdu nudge|hold|off[:MS] (the initiator's guard against a responder's accept window)
//
// Differences from rping: --local and the softrdma network flags (memif by default, --af-packet IFACE);
// -a on the server is the address of this end's own stack (there is no kernel interface to bind to);
// the client always verifies the data (-V is accepted); the count defaults to 10 and must be at least 1
// (every run ends); the server serves one connection and exits, or with -P (as rping's persistent server)
// one connection after another until none comes for --timeout seconds. --connects N makes the client run
// its session N times, each on a fresh connection (connect/disconnect cycles). A second client during a
// session is refused with an MPA reject ("busy"), and a session that goes wrong (an unexpected message or
// completion) ends with an orderly disconnect and an error line, not a crash.
#include <cinttypes>

#include "examples/common.hpp"

using namespace examples;

namespace {

// rping's advertisement, field for field.
struct rping_rdma_info {
    std::uint64_t buf;   // __be64: address of the buffer
    std::uint32_t rkey;  // __be32
    std::uint32_t size;  // __be32
};
static_assert(sizeof(rping_rdma_info) == 16);

constexpr std::uint32_t kMinSize = 26;          // rping's RPING_MIN_BUFSIZE: room for "rdma-ping-2147483647: "
constexpr std::uint32_t kMaxSize = 64 * 1024 - 1;  // rping's RPING_BUFSIZE - 1

struct Options {
    std::uint32_t size = 64;
    int count = 10;
    int connects = 1;
    bool verbose = false;
    bool debug = false;
    bool persistent = false;  // -P: the server serves connection after connection
    std::string a_addr;  // -a: client: the server; server: this end's own address
    std::string i_addr;  // -I: client: this end's own address
    verbs::ConnParam conn{.responder_resources = 1, .initiator_depth = 1};  // --crc, --p2p, --first-fpdu
};
Options opt;

#define DEBUG_LOG(...)                                   \
    do {                                                 \
        if (opt.debug) std::printf(__VA_ARGS__);         \
    } while (0)

// One end of the connection with rping's buffers.
struct Cb {
    NetOptions net;
    std::chrono::seconds limit;
    std::unique_ptr<verbs::Context> ctx;
    std::unique_ptr<verbs::ProtectionDomain> pd;
    std::unique_ptr<verbs::CompletionQueue> cq;
    rping_rdma_info recv_buf{};  // what the peer SENDs us
    rping_rdma_info send_buf{};  // what we SEND
    std::vector<std::byte> rdma_buf;   // client: the WRITE sink; server: the READ sink and WRITE source
    std::vector<std::byte> start_buf;  // client: the READ source
    std::unique_ptr<verbs::MemoryRegion> recv_mr, send_mr, rdma_mr, start_mr;
    std::unique_ptr<verbs::QueuePair> qp;
    std::unique_ptr<verbs::CmListener> listener;
    std::unique_ptr<verbs::CmId> id;
    std::array<verbs::WorkCompletion, 4> wcs{};
    unsigned sends_out = 0;  // SENDs posted, not yet completed
    bool disconnected = false;           // a flushed completion or the CM event: the connection ended
    bool seen_disconnect_event = false;  // the CM event itself

    Cb(const NetOptions& n, std::size_t rdma_size, bool client) : net(n), limit(n.timeout_s) {
        ctx = verbs::Context::open(context_config(net));
        pd = ctx->alloc_pd();
        cq = ctx->create_cq(32);  // rping: RPING_SQ_DEPTH * 2
        // The same regions and rights as rping: the receive buffer is written by the library (local_write);
        // the send buffer is only read (no rights); rdma_buf and start_buf are named by the peer's READ/WRITE.
        recv_mr = pd->reg_mr({reinterpret_cast<std::byte*>(&recv_buf), sizeof recv_buf}, verbs::access::local_write);
        send_mr = pd->reg_mr({reinterpret_cast<std::byte*>(&send_buf), sizeof send_buf}, 0);
        constexpr auto remote = verbs::access::local_write | verbs::access::remote_read | verbs::access::remote_write;
        rdma_buf.resize(rdma_size);
        rdma_mr = pd->reg_mr(rdma_buf, remote);
        if (client) {
            start_buf.resize(rdma_size);
            start_mr = pd->reg_mr(start_buf, remote);
        }
        new_qp();
    }
    // A QP for the next connection (the previous one's, if any, goes first with its connection).
    void new_qp() {
        id.reset();
        qp.reset();
        while (cq->poll(wcs) != 0) {  // the old QP's flushed completions
        }
        sends_out = 0;
        disconnected = seen_disconnect_event = false;
        // rping: max_send_wr 16, max_recv_wr 2, one SGE each.
        qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(),
                            .cap = {.max_send_wr = 16, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}});
    }
    ~Cb() {  // connection and QP before the regions
        id.reset();
        listener.reset();
        qp.reset();
        recv_mr.reset();
        send_mr.reset();
        rdma_mr.reset();
        start_mr.reset();
    }

    // Ownership: recv_buf belongs to the QP from here until the receive completes.
    void post_recv() {
        const verbs::Sge sge = recv_mr->sge(0, sizeof recv_buf);
        const verbs::RecvWr wr{.wr_id = 1, .sg_list = {&sge, 1}};
        if (const auto r = qp->post_recv({&wr, 1}); !r.ok()) throw std::runtime_error(std::string("post_recv: ") + verbs::to_string(r.err));
    }
    // Ownership: send_buf belongs to the QP until the SEND completes (wait_recv waits for that too).
    void post_send_buf() {
        const verbs::Sge sge = send_mr->sge(0, sizeof send_buf);
        const verbs::SendWr wr{.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                               .sg_list = {&sge, 1}};
        if (const auto r = qp->post_send({&wr, 1}); !r.ok()) throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
        ++sends_out;
    }
    void post_rdma(verbs::WrOpcode op, std::uint32_t len, std::uint64_t remote_addr, std::uint32_t rkey) {
        const verbs::Sge sge = rdma_mr->sge(0, len);
        const verbs::SendWr wr{.wr_id = 3, .opcode = op, .send_flags = verbs::send_flags::signaled, .sg_list = {&sge, 1},
                               .rdma = {.remote_addr = remote_addr, .rkey = rkey}};
        if (const auto r = qp->post_send({&wr, 1}); !r.ok()) throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
    }

    // Polls until a completion of opcode `want` has arrived and every SEND we posted has completed (so
    // send_buf is ours again). Returns false if the connection ended first (the peer disconnected: its
    // posted receive comes back flushed, and the CM reports the disconnect).
    bool wait_for(verbs::WcOpcode want, std::uint32_t* byte_len = nullptr) {
        bool got = false;
        const bool ok = poll_until(*ctx, [&] {
            const std::size_t n = cq->poll(wcs);
            for (std::size_t k = 0; k < n; ++k) {
                const auto& wc = wcs[k];
                if (wc.status == verbs::WcStatus::wr_flush_err) {
                    disconnected = true;
                    continue;
                }
                if (wc.status != verbs::WcStatus::success)
                    throw std::runtime_error(std::string("cq completion failed status ") + verbs::to_string(wc.status));
                if (wc.opcode == verbs::WcOpcode::send) {
                    --sends_out;
                    DEBUG_LOG("send completion\n");
                } else if (wc.opcode == want) {
                    got = true;
                    if (byte_len != nullptr) *byte_len = wc.byte_len;
                } else {
                    // e.g. a SEND where rping's protocol has the peer wait: the peer is not following rping
                    throw std::runtime_error(std::string("unexpected ") + (wc.opcode == verbs::WcOpcode::recv ? "message" : "completion") +
                                             " (waiting for " + (want == verbs::WcOpcode::recv ? "a message" : "an RDMA completion") + ")");
                }
            }
            // Events of this connection; a second client is refused (busy), others' events dropped.
            if (auto ev = take_event(*ctx, id.get(), "rping")) {
                if (ev->type != verbs::CmEventType::disconnected)
                    throw std::runtime_error(std::string("cma event ") + verbs::to_string(ev->type));
                disconnected = seen_disconnect_event = true;
                if (!ev->reason.empty()) DEBUG_LOG("disconnect: %s\n", ev->reason.c_str());
            }
            return (got && sends_out == 0) || disconnected;
        }, Clock::now() + limit);
        if (!ok) throw std::runtime_error(std::string("no ") + (want == verbs::WcOpcode::recv ? "message" : "RDMA completion") +
                                          " within " + std::to_string(limit.count()) + " s");
        return got && !disconnected;
    }
    // A receive of rping's 16-byte message, reposted at once (as rping's completion handler does).
    bool wait_recv() {
        std::uint32_t len = 0;
        if (!wait_for(verbs::WcOpcode::recv, &len)) return false;
        if (len != sizeof recv_buf) throw std::runtime_error("Received bogus data, size " + std::to_string(len));
        post_recv();
        return true;
    }
    // rping_format_send: advertise a buffer in send_buf (big-endian).
    void format_send(const std::vector<std::byte>& buf, const verbs::MemoryRegion& mr, std::uint32_t size) {
        send_buf.buf = to_be(std::uint64_t{reinterpret_cast<std::uintptr_t>(buf.data())});
        send_buf.rkey = to_be(mr.rkey());
        send_buf.size = to_be(size);
        DEBUG_LOG("RDMA addr %" PRIx64 " rkey %x len %u\n", from_be(send_buf.buf), from_be(send_buf.rkey), from_be(send_buf.size));
    }
};

// One session with a connected client: the pings until the client disconnects. Returns the pings served.
int serve_session(Cb& cb) {
    int pings = 0;
    for (;;) {
        // Wait for the client's source advertisement (or its disconnect: the normal end).
        if (!cb.wait_recv()) break;
        const std::uint64_t remote_addr = from_be(cb.recv_buf.buf);
        const std::uint32_t remote_rkey = from_be(cb.recv_buf.rkey);
        const std::uint32_t remote_len = from_be(cb.recv_buf.size);
        DEBUG_LOG("Received rkey %x addr %" PRIx64 " len %u from peer\n", remote_rkey, remote_addr, remote_len);
        if (remote_len == 0 || remote_len > cb.rdma_buf.size()) throw std::runtime_error("advertised size out of range");
        // RDMA READ the ping into rdma_buf.
        cb.post_rdma(verbs::WrOpcode::rdma_read, remote_len, remote_addr, remote_rkey);
        if (!cb.wait_for(verbs::WcOpcode::rdma_read)) throw std::runtime_error("disconnected during the READ");
        DEBUG_LOG("server received read complete\n");
        if (opt.verbose) std::printf("server ping data: %s\n", reinterpret_cast<const char*>(cb.rdma_buf.data()));
        // Tell the client to continue (rping's send_buf, never formatted on the server: zeros).
        cb.post_send_buf();
        // Wait for the client's sink advertisement.
        if (!cb.wait_recv()) throw std::runtime_error("disconnected before the sink advertisement");
        const std::uint64_t sink_addr = from_be(cb.recv_buf.buf);
        const std::uint32_t sink_rkey = from_be(cb.recv_buf.rkey);
        // RDMA WRITE the echo: the text and its NUL (rping: strlen(rdma_buf) + 1), at most what was read.
        const auto* text = reinterpret_cast<const char*>(cb.rdma_buf.data());
        const auto len = static_cast<std::uint32_t>(::strnlen(text, remote_len - 1) + 1);
        cb.post_rdma(verbs::WrOpcode::rdma_write, len, sink_addr, sink_rkey);
        if (!cb.wait_for(verbs::WcOpcode::rdma_write)) throw std::runtime_error("disconnected during the WRITE");
        DEBUG_LOG("server rdma write complete\n");
        // Tell the client to begin again.
        cb.post_send_buf();
        ++pings;
    }
    // The client's disconnect may be seen first as a flushed receive: wait for the CM event, then TCP's close.
    if (!cb.seen_disconnect_event) {
        auto ev = wait_event(*cb.ctx, cb.id.get(), "rping", Clock::now() + cb.limit);
        if (!ev || ev->type != verbs::CmEventType::disconnected) throw std::runtime_error("no disconnect event");
    }
    finish_close(*cb.ctx);
    return pings;
}

int server(const NetOptions& base) {
    NetOptions net = base;
    if (!opt.a_addr.empty()) net.ip = opt.a_addr;
    // The READ length is the client's size; the sink is rping's largest buffer so any valid -S fits.
    Cb cb(net, kMaxSize + 1, false);
    verbs::ConnParam defaults = opt.conn;  // the modes we accept (CRC policy, RTR types)
    cb.listener = cb.ctx->listen(net.port, defaults);
    DEBUG_LOG("rdma_listen\n");
    int sessions = 0, failed = 0;
    for (;;) {
        // rping takes any client (stock rping sends no private data). Without -P: one session, then exit;
        // with -P: until no client comes for the time limit.
        std::optional<verbs::CmEvent> req;
        try {
            req = next_client(*cb.ctx, "rping server", Clock::now() + cb.limit, [](const verbs::CmEvent&) { return std::string(); });
        } catch (const std::runtime_error&) {
            if (opt.persistent && sessions > 0) break;  // -P: the clients are done
            throw;
        }
        cb.new_qp();
        cb.post_recv();  // before accepting: the client's first SEND may follow the connection at once
        cb.id = std::move(req->request);
        verbs::ConnParam cp = opt.conn;
        if (!cb.id->accept(*cb.qp, cp) || !established(*cb.ctx, *cb.id, "rping server", cb.limit)) continue;
        DEBUG_LOG("ESTABLISHED\n");
        ++sessions;
        try {
            const int pings = serve_session(cb);
            if (!net.local_child) std::printf("rping server: %d pings served, client %s disconnected\n", pings, cb.id->peer().c_str());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "rping server: session with %s failed: %s\n", cb.id->peer().c_str(), e.what());
            close_quietly(*cb.ctx, cb.id.get(), "rping server");  // a FIN, not a reset
            ++failed;
            if (!opt.persistent) return 1;
        }
        std::fflush(stdout);
        if (!opt.persistent) break;
    }
    if (opt.persistent && !net.local_child)
        std::printf("rping server: %d sessions, %d failed; no client for %u s\n", sessions, failed, net.timeout_s);
    return failed == 0 ? 0 : 1;
}

// One session as rping's client: `count` pings, data compared each time, then an orderly disconnect.
void client_session(Cb& cb, std::uint32_t size) {
    char* start_buf = reinterpret_cast<char*>(cb.start_buf.data());
    const char* rdma_buf = reinterpret_cast<const char*>(cb.rdma_buf.data());
    unsigned char start = 65;
    for (int ping = 0; ping < opt.count; ++ping) {
        // Some ASCII text in the source: "rdma-ping-N: " then letters, NUL at the end (rping's content).
        const int cc = std::snprintf(start_buf, size, "rdma-ping-%d: ", ping);
        unsigned char c = start;
        for (std::uint32_t i = static_cast<std::uint32_t>(cc); i < size; ++i) {
            start_buf[i] = static_cast<char>(c);
            if (++c > 122) c = 65;
        }
        if (++start > 122) start = 65;
        start_buf[size - 1] = 0;
        std::memset(cb.rdma_buf.data(), 0, size);  // so stale data from the last ping cannot pass the check

        // Advertise the source; the server READs it and says "go ahead".
        cb.format_send(cb.start_buf, *cb.start_mr, size);
        cb.post_send_buf();
        if (!cb.wait_recv()) throw std::runtime_error("server disconnected (waiting for RDMA_WRITE_ADV)");
        // Advertise the sink; the server WRITEs the ping back and says "go ahead" again.
        cb.format_send(cb.rdma_buf, *cb.rdma_mr, size);
        cb.post_send_buf();
        if (!cb.wait_recv()) throw std::runtime_error("server disconnected (waiting for RDMA_WRITE_COMPLETE)");
        if (std::memcmp(start_buf, rdma_buf, size) != 0) throw std::runtime_error("data mismatch!");
        if (opt.verbose) std::printf("ping data: %s\n", rdma_buf);
    }
    DEBUG_LOG("first-FPDU nudges sent: %u\n", cb.id->nudges_sent());
    disconnect(*cb.ctx, *cb.id, "rping", cb.limit);
}

int client(const NetOptions& base) {
    NetOptions net = base;
    if (!opt.a_addr.empty()) net.peer_ip = opt.a_addr;
    if (!opt.i_addr.empty()) net.ip = opt.i_addr;
    const std::uint32_t size = opt.size;
    Cb cb(net, size, true);
    unsigned nudged = 0;
    for (int k = 0; k < opt.connects; ++k) {
        if (k > 0) cb.new_qp();
        cb.post_recv();  // before connecting: the server's first "go ahead" needs it
        cb.id = cb.ctx->connect(peer_address(net), net.port, *cb.qp, opt.conn);
        expect_established(*cb.ctx, *cb.id, "rping", cb.limit);
        DEBUG_LOG("rdma_connect successful\n");
        try {
            client_session(cb, size);
        } catch (const std::exception& e) {
            const std::string why = cb.qp->terminate_info() ? " (" + cb.qp->terminate_info()->describe() + ")" : "";
            close_quietly(*cb.ctx, cb.id.get(), "rping");
            throw std::runtime_error(std::string(e.what()) + why + (opt.connects > 1 ? " in connection " + std::to_string(k + 1) : ""));
        }
        if (cb.id->nudges_sent() != 0) ++nudged;
    }
    std::printf("rping: %d pings of %u bytes: data verified (READ by the server, WRITTEN back, compared)", opt.count, size);
    if (opt.connects > 1) std::printf(" on each of %d connections (%u were followed by first-FPDU nudges)", opt.connects, nudged);
    std::printf("\n");
    return 0;
}

// --p2p write,read,send: the RTR types offered (client) or accepted (server).
softrdma::RtrSet parse_rtr(const std::string& v) {
    softrdma::RtrSet r{};
    std::size_t pos = 0;
    while (pos <= v.size()) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        const std::string t = v.substr(pos, comma - pos);
        if (t == "write") r.write = true;
        else if (t == "read") r.read = true;
        else if (t == "send") r.send = true;
        else throw std::invalid_argument("--p2p takes write, read and/or send, comma-separated: " + v);
        pos = comma + 1;
    }
    return r;
}

// --first-fpdu nudge|hold|off[:MS]
verbs::FirstFpduGuard parse_guard(const std::string& v) {
    verbs::FirstFpduGuard g;
    const std::size_t colon = v.find(':');
    const std::string mode = v.substr(0, colon);
    if (mode == "nudge") g.mode = verbs::FirstFpduGuard::Mode::nudge;
    else if (mode == "hold") {
        g.mode = verbs::FirstFpduGuard::Mode::hold;
        g.delay = std::chrono::milliseconds(200);
    } else if (mode == "off") g.mode = verbs::FirstFpduGuard::Mode::off;
    else throw std::invalid_argument("--first-fpdu nudge|hold|off[:MS]: " + v);
    if (colon != std::string::npos) {
        char* end = nullptr;
        const unsigned long ms = std::strtoul(v.c_str() + colon + 1, &end, 10);
        if (end == v.c_str() + colon + 1 || *end != '\0' || ms > 60000) throw std::invalid_argument("--first-fpdu: bad delay in " + v);
        g.delay = std::chrono::milliseconds(ms);
    }
    return g;
}

}  // namespace

int main(int argc, char** argv) {
    NetOptions net;
    net.port = 7174;  // rping's default port
    const char* usage =
        "[--local] | -s [-vVdP] [-S size] [-a addr] [-p port] | -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]\n"
        "  -s / -c                 server / client side (neither: --local, both here)\n"
        "  -a addr                 client: the server's address; server: this end's address\n"
        "  -I addr                 client: this end's address\n"
        "  -p port                 port (default 7174)\n"
        "  -C count                pings (default 10)\n"
        "  -S size                 ping data size, 26..65535 (default 64)\n"
        "  -v                      display ping data\n"
        "  -V                      validate ping data (always done)\n"
        "  -d                      debug printfs\n"
        "  -P                      server: persistent, one connection after another until none comes for --timeout s\n"
        "  --connects N            client: run the session on N connections in turn (connect/disconnect cycles)\n"
        "  --crc                   require MPA CRC (default: use it when the peer asks)\n"
        "  --p2p TYPES             RFC 6581 peer-to-peer mode; client: RTR types offered, server: accepted\n"
        "                          (write, read, send; comma-separated; a server answers peer-to-peer requests anyway)\n"
        "  --first-fpdu MODE[:MS]  client: guard the first FPDU against a responder's accept window (Linux siw):\n"
        "                          nudge (default, 2 ms), hold (200 ms) or off\n";
    return run_main(argc, argv, usage, net,
                    [&net](const Args& args, const std::string& a, int& i) {
                        if (a == "-s") net.role = Role::server;
                        else if (a == "-c") net.role = Role::client;
                        else if (a == "-v") opt.verbose = true;
                        else if (a == "-V") {}
                        else if (a == "-d") opt.debug = true;
                        else if (a == "-P") opt.persistent = true;
                        else if (a == "-a") opt.a_addr = args.value(i);
                        else if (a == "-I") opt.i_addr = args.value(i);
                        else if (a == "-p") net.port = static_cast<std::uint16_t>(args.number(i));
                        else if (a == "-C") {
                            const unsigned long n = args.number(i);
                            if (n < 1 || n > 1000000000ul) throw std::invalid_argument("Invalid count (1 or more; every run ends)");
                            opt.count = static_cast<int>(n);
                        } else if (a == "-S") {
                            const unsigned long n = args.number(i);
                            if (n < kMinSize || n > kMaxSize)
                                throw std::invalid_argument("Invalid size " + std::to_string(n) + " (valid range is " +
                                                            std::to_string(kMinSize) + " to " + std::to_string(kMaxSize) + ")");
                            opt.size = static_cast<std::uint32_t>(n);
                        } else if (a == "--connects") {
                            const unsigned long n = args.number(i);
                            if (n < 1 || n > 100000) throw std::invalid_argument("--connects 1..100000");
                            opt.connects = static_cast<int>(n);
                        } else if (a == "--crc") {
                            opt.conn.crc = softrdma::CrcPolicy::required;
                        } else if (a == "--p2p") {
                            opt.conn.peer_to_peer = true;
                            opt.conn.rtr = parse_rtr(args.value(i));
                        } else if (a == "--first-fpdu") {
                            opt.conn.first_fpdu = parse_guard(args.value(i));
                        } else return false;
                        return true;
                    },
                    server, client);
}
