// SPDX-License-Identifier: MIT
// pingpong: SEND/RECV latency between two processes over softrdma's verbs API.
//
// The client SENDs a message, the server SENDs it back, and the client measures the round trip; half of it
// is the one-way latency, printed as percentiles (min, p50, p90, p99, p99.9, max in µs).
//
//   pingpong                          both ends on this machine (two processes over DPDK memif)
//   pingpong --server [...]           one end; the other runs  pingpong --client [...]
//   pingpong --client --af-packet eth1 --ip 10.0.0.2 --peer-ip 10.0.0.1
//
// RDMA in five nouns, for a reader new to it (libibverbs uses the same names):
//   Context  the "device": here DPDK + a user-level TCP stack instead of an RDMA NIC.
//   PD       protection domain: a scope; regions and queue pairs of one PD may be used together.
//   MR       memory region: memory the application registered. The library moves bytes only from/into
//            registered memory, named by a key (lkey locally, rkey when the peer names it).
//   QP       queue pair: one connection's send queue and receive queue. Work requests (WRs) are posted to
//            them; the library works on them asynchronously and owns their buffers until they complete.
//   CQ       completion queue: where finished WRs are reported ("work completions"). A completion is the
//            moment a buffer comes back to the application: a send buffer may be reused, a receive buffer
//            holds a message (byte_len says how much).
//
// Why receives are posted before the peer sends: a SEND consumes one receive WR the peer posted earlier.
// There is no waiting room: in iWARP a SEND that finds no posted receive is a fatal error that ends the
// connection (DDP "no buffer"). So each side posts its receives first and re-posts one each time one
// completes, and only then answers.
#include "examples/common.hpp"

using namespace examples;

namespace {

// What the client tells the server in its connection request (MPA private data): how many messages
// to expect. Big-endian, like every field that crosses the wire.
struct Hello {
    std::uint32_t magic;  // "PING"
    std::uint32_t size;
    std::uint64_t count;  // warmup + iterations
};
constexpr std::uint32_t kMagic = 0x50494e47;

struct Options {
    std::uint32_t size = 64;
    std::uint64_t iters = 10000;
    std::uint64_t warmup = 1000;
};
Options opt;

// Receive slots the server keeps posted. A ping-pong has one message in flight; 4 leave room.
constexpr std::uint32_t kSlots = 4;

// ---- server: echo every message back until the client disconnects ----------------------------------------
// A request that is not a pingpong client's is refused with an MPA reject saying why (stock ucmatose sends no
// private data); a client that vanishes before its session begins sends us back to waiting; a second client
// during the session is refused ("busy"). The server serves one session and exits.
int server(const NetOptions& net) {
    const std::string me = "pingpong server";
    const auto limit = std::chrono::seconds(net.timeout_s);
    auto ctx = verbs::Context::open(context_config(net));
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(2 * kSlots);  // sizing: every outstanding WR (sends + receives) may complete

    auto listener = ctx->listen(net.port);
    if (!net.local_child) {
        std::printf("pingpong server: listening on %s port %u\n", context_config(net).ip.address.str().c_str(), net.port);
        std::fflush(stdout);
    }
    const auto deadline = Clock::now() + limit;
    for (;;) {
        auto req = next_client(*ctx, me, deadline, [](const verbs::CmEvent& ev) -> std::string {
            const auto hello = from_private_data<Hello>(ev.private_data);
            if (!hello) return unexpected_private_data(ev.private_data, sizeof(Hello), "pingpong --client's hello");
            if (from_be(hello->magic) != kMagic) return "the private data is not a pingpong hello (wrong magic)";
            const std::uint32_t size = from_be(hello->size);
            if (size == 0 || size > (16u << 20)) return "message size " + std::to_string(size) + " out of range";
            return {};
        });
        const Hello hello = *from_private_data<Hello>(req.private_data);
        const std::uint32_t size = from_be(hello.size);
        const std::uint64_t expected = from_be(hello.count);

        // Now that we know the message size: one registered buffer cut into kSlots message slots. Receives need
        // local_write (the library writes into them); the echo is sent from the slot the message arrived in.
        std::vector<std::byte> buf(std::size_t{kSlots} * size);
        auto mr = pd->reg_mr(buf, verbs::access::local_write);
        auto qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = kSlots, .max_recv_wr = kSlots}});

        // Post a receive for a slot. Ownership: from here until its completion the slot belongs to the QP.
        auto post_recv = [&](std::uint32_t slot) {
            const verbs::Sge sge = mr->sge(std::size_t{slot} * size, size);
            const verbs::RecvWr wr{.wr_id = slot, .sg_list = {&sge, 1}};
            if (const auto r = qp->post_recv({&wr, 1}); !r.ok())
                throw std::runtime_error(std::string("post_recv: ") + verbs::to_string(r.err));
        };
        // Before accepting: once the connection is up the client may send at once.
        for (std::uint32_t s = 0; s < kSlots; ++s) post_recv(s);
        std::unique_ptr<verbs::CmId> id = std::move(req.request);  // the connection; we own it
        if (!id->accept(*qp, {}) || !established(*ctx, *id, me, limit)) {
            // The client went away (a reset right after its request): its QP and region go, we wait again.
            id.reset();
            qp.reset();
            std::array<verbs::WorkCompletion, 8> flushed;
            while (cq->poll(flushed) != 0) {
            }
            continue;
        }

        // The loop: a receive completion -> SEND the same bytes back from that slot; the send completion ->
        // the slot is ours again -> post it as a receive. Ends when the client disconnects.
        std::uint64_t echoed = 0;
        bool disconnected = false;
        std::array<verbs::WorkCompletion, 8> wcs;
        auto last_progress = Clock::now();
        softrdma::Idler idle(idle_policy(*ctx));
        try {
            while (!disconnected) {
                poll_turn(*ctx, idle);
                const std::size_t n = cq->poll(wcs);
                for (std::size_t k = 0; k < n; ++k) {
                    const auto& wc = wcs[k];
                    // When the client disconnects, the QP goes to the error state and hands back the receives still
                    // posted as "flushed" completions: the end of the run, not a failure.
                    if (wc.status == verbs::WcStatus::wr_flush_err) continue;
                    if (wc.status != verbs::WcStatus::success)
                        throw std::runtime_error(std::string("completion failed: ") + verbs::to_string(wc.status));
                    const auto slot = static_cast<std::uint32_t>(wc.wr_id);
                    if (wc.opcode == verbs::WcOpcode::recv) {
                        // Ownership: the slot passes from the receive queue to the send queue, unchanged.
                        const verbs::Sge sge = mr->sge(std::size_t{slot} * size, wc.byte_len);
                        const verbs::SendWr wr{.wr_id = slot, .opcode = verbs::WrOpcode::send,
                                               .send_flags = verbs::send_flags::signaled, .sg_list = {&sge, 1}};
                        if (const auto r = qp->post_send({&wr, 1}); !r.ok())
                            throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
                        ++echoed;
                    } else {
                        post_recv(slot);  // the echo is out: the slot goes back to the receive queue
                    }
                    last_progress = Clock::now();
                }
                if (n == 0) {
                    if (auto ev = take_event(*ctx, id.get(), me)) {
                        if (ev->type != verbs::CmEventType::disconnected)
                            throw std::runtime_error(std::string("CM event ") + verbs::to_string(ev->type));
                        if (echoed != expected && !ev->reason.empty())
                            std::fprintf(stderr, "pingpong server: the connection ended: %s\n", ev->reason.c_str());
                        disconnected = true;  // the client is done
                    }
                }
                if (n == 0 && Clock::now() - last_progress > limit)
                    throw std::runtime_error("no message for " + std::to_string(net.timeout_s) + " s");
            }
        } catch (...) {
            close_quietly(*ctx, id.get(), me);  // a FIN, not a reset, for the client
            throw;
        }
        finish_close(*ctx);
        if (echoed == 0 && expected != 0) {
            // Gone before its first message (e.g. a reset right after its request): not a session; wait again.
            std::fprintf(stderr, "pingpong server: the client at %s left before its first message; waiting for another\n",
                         id->peer().c_str());
            continue;
        }
        if (echoed != expected) {
            std::fprintf(stderr, "pingpong server: echoed %llu of %llu messages\n", static_cast<unsigned long long>(echoed),
                         static_cast<unsigned long long>(expected));
            return 1;
        }
        return 0;
    }
}

// ---- client: send, wait for the echo, measure -------------------------------------------------------------
int client(const NetOptions& net) {
    const auto limit = std::chrono::seconds(net.timeout_s);
    auto ctx = verbs::Context::open(context_config(net));
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(4);
    // Two slots: [0] receives the echo, [1] is the message we send.
    std::vector<std::byte> buf(2 * std::size_t{opt.size});
    auto mr = pd->reg_mr(buf, verbs::access::local_write);
    auto qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 2, .max_recv_wr = 2}});
    const verbs::Sge rx = mr->sge(0, opt.size);
    const verbs::Sge tx = mr->sge(opt.size, opt.size);
    const verbs::RecvWr recv_wr{.wr_id = 1, .sg_list = {&rx, 1}};
    const verbs::SendWr send_wr{.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                                .sg_list = {&tx, 1}};

    // The first receive goes up before connecting: the echo of the first ping needs it.
    if (const auto r = qp->post_recv({&recv_wr, 1}); !r.ok()) throw std::runtime_error(std::string("post_recv: ") + verbs::to_string(r.err));
    const std::uint64_t total = opt.warmup + opt.iters;
    const Hello hello{to_be(kMagic), to_be(opt.size), to_be(total)};
    auto id = ctx->connect(peer_address(net), net.port, *qp, {.private_data = bytes_of(hello)});
    const auto est = expect_established(*ctx, *id, "pingpong client", limit);
    if (est.private_data.size != 0) {  // a pingpong server accepts with none
        close_quietly(*ctx, id.get(), "pingpong client");
        throw std::runtime_error("the server at " + id->peer() + " is not a pingpong server: it accepted with " +
                                 private_data_text(est.private_data) + ", a pingpong server sends none");
    }

    Latency lat(opt.iters);  // samples preallocated: nothing is allocated inside the loop
    std::array<verbs::WorkCompletion, 4> wcs;
    for (std::uint64_t i = 0; i < total; ++i) {
        // The message carries its number; the echo must bring it back.
        std::memcpy(buf.data() + opt.size, &i, std::min<std::size_t>(sizeof i, opt.size));
        const auto t0 = Clock::now();
        // Ownership: the send slot belongs to the QP until the send completion.
        if (const auto r = qp->post_send({&send_wr, 1}); !r.ok())
            throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
        // A round is over when both have completed: our SEND (buffer free again) and the receive (the echo).
        bool sent = false, echoed = false;
        std::uint32_t echo_len = 0;
        const bool in_time = poll_until(*ctx, [&] {
            const std::size_t n = cq->poll(wcs);
            for (std::size_t k = 0; k < n; ++k) {
                if (wcs[k].status != verbs::WcStatus::success) return true;  // reported below
                if (wcs[k].opcode == verbs::WcOpcode::recv) {
                    echoed = true;
                    echo_len = wcs[k].byte_len;
                } else {
                    sent = true;
                }
            }
            return sent && echoed;
        }, t0 + limit);
        const auto t1 = Clock::now();
        if (!in_time || !sent || !echoed) {
            // Why: the stream's end (a TERMINATE from a server that is not pingpong's says what it refused).
            std::string why = "QP " + std::string(verbs::to_string(qp->state()));
            if (const auto& t = qp->terminate_info()) why += ", " + t->describe();
            close_quietly(*ctx, id.get(), "pingpong client");
            throw std::runtime_error("round " + std::to_string(i) + ": no echo (" + why + ")");
        }
        std::uint64_t back = 0;
        std::memcpy(&back, buf.data(), std::min<std::size_t>(sizeof back, opt.size));
        if (echo_len != opt.size || (opt.size >= sizeof back && back != i)) {
            close_quietly(*ctx, id.get(), "pingpong client");
            throw std::runtime_error("round " + std::to_string(i) + ": echo of " + std::to_string(echo_len) +
                                     " bytes, wrong content (is the server at " + id->peer() + " pingpong's?)");
        }
        if (i >= opt.warmup) lat.add((t1 - t0) / 2);  // half the round trip: one way
        // The receive slot is ours again: give it back for the next echo before sending the next ping.
        if (const auto r = qp->post_recv({&recv_wr, 1}); !r.ok())
            throw std::runtime_error(std::string("post_recv: ") + verbs::to_string(r.err));
    }
    disconnect(*ctx, *id, "pingpong client", limit);
    const bool rx_thread = net.threading == softrdma::ThreadingMode::rx_thread;
    lat.print("pingpong: SEND/RECV " + std::to_string(opt.size) + " bytes, half round trip (" +
              std::to_string(opt.warmup) + " warmup rounds not counted" + (rx_thread ? ", RX thread" : "") + ")");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    NetOptions net;
    const char* usage =
        "[--local | --server | --client] [--size BYTES] [--iters N] [--warmup N] [network flags]\n"
        "  --size BYTES            message size (default 64)\n"
        "  --iters N               measured round trips (default 10000)\n"
        "  --warmup N              round trips before measuring (default 1000)\n"
        "  --threading rtc|rx-thread  one thread per process (default), or a dedicated RX thread in each\n";
    return run_main(argc, argv, usage, net,
                    [&net](const Args& args, const std::string& a, int& i) {
                        if (a == "--size") opt.size = static_cast<std::uint32_t>(std::clamp(args.number(i), 1ul, 16ul << 20));
                        else if (a == "--iters") opt.iters = std::max(1ul, args.number(i));
                        else if (a == "--warmup") opt.warmup = args.number(i);
                        else if (a == "--threading") {
                            const std::string v = args.value(i);
                            if (v != "rtc" && v != "rx-thread") throw std::invalid_argument("--threading rtc|rx-thread");
                            net.threading = v == "rtc" ? softrdma::ThreadingMode::run_to_completion
                                                       : softrdma::ThreadingMode::rx_thread;
                        } else return false;
                        return true;
                    },
                    server, client);
}
