// SPDX-License-Identifier: MIT
// rdma_lat: RDMA WRITE and RDMA READ latency, in the manner of perftest's ib_write_lat / ib_read_lat.
//
//   rdma_lat                          both ends on this machine (two processes over DPDK memif)
//   rdma_lat --server [...]           one end; the other runs  rdma_lat --client [...]
//   rdma_lat --op write|read|both --size 64 --iters 10000
//
// One-sided operations: the peer's application takes no part in them. A WRITE puts our bytes into the
// peer's memory, a READ fetches the peer's bytes into ours, both addressed by (address, rkey) of a region
// the peer registered with remote_write / remote_read and told us about. Here that exchange happens in the
// connection's private data (the MPA request and reply carry up to 252 bytes each way).
//
// WRITE latency (as ib_write_lat): a ping-pong of WRITEs. The client WRITEs `size` bytes into the server's
// region, the server watches the last byte of that region change (WRITE gives the target no completion:
// the data simply appears), then WRITEs back; the client watches its own last byte. Half the round trip is
// printed. The last byte is the right one to watch: the bytes of one WRITE are placed in order, so when the
// last one has changed the whole message is there.
// READ latency (as ib_read_lat): the client READs `size` bytes and waits for the READ's completion, which
// comes when the response arrived; a full round trip is printed (the server's CPU is not involved beyond
// its polling loop, which answers the READ).
#include <atomic>

#include "examples/common.hpp"

using namespace examples;

namespace {

// Client -> server in the connection request, server -> client in the reply. Big-endian.
struct Region {
    std::uint64_t addr;    // where the peer may WRITE (and READ): our target area
    std::uint32_t rkey;
    std::uint32_t size;    // message size
    std::uint64_t writes;  // client -> server: warmup + iterations of the WRITE ping-pong (0 = none)
};

struct Options {
    std::uint32_t size = 64;
    std::uint64_t iters = 10000;
    std::uint64_t warmup = 1000;
    bool write = true;
    bool read = true;
};
Options opt;

// The value of the watched last byte in round i: never 0 (the region starts zeroed) and different from
// the previous round's.
std::uint8_t mark(std::uint64_t i) { return static_cast<std::uint8_t>(i % 255 + 1); }

// One end: context, PD, CQ, QP and one region of 2 x size bytes.
//   [0, size)        target: the peer WRITEs here; the server's READ source
//   [size, 2 size)   source of our WRITEs; the client's READ sink
struct End {
    std::unique_ptr<verbs::Context> ctx;
    std::unique_ptr<verbs::ProtectionDomain> pd;
    std::unique_ptr<verbs::CompletionQueue> cq;
    std::vector<std::byte> buf;
    std::unique_ptr<verbs::MemoryRegion> mr;
    std::unique_ptr<verbs::QueuePair> qp;
    std::unique_ptr<verbs::CmListener> listener;
    std::unique_ptr<verbs::CmId> id;
    Region remote{};  // the peer's target area (host order)
    std::array<verbs::WorkCompletion, 4> wcs{};
    std::uint64_t outstanding = 0;  // send WRs posted and not completed

    explicit End(const NetOptions& net) {
        ctx = verbs::Context::open(context_config(net));
        pd = ctx->alloc_pd();
        cq = ctx->create_cq(8);  // sizing: max_send_wr + max_recv_wr of the one QP
    }
    // The region and the QP, once the message size is known (the server learns it from the request).
    void setup(std::uint32_t size) {
        buf.assign(2 * std::size_t{size}, std::byte{0});
        // Remote rights: the peer WRITEs into the target and READs it. Remote write needs local write.
        mr = pd->reg_mr(buf, verbs::access::local_write | verbs::access::remote_write | verbs::access::remote_read);
        qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 4, .max_recv_wr = 1}});
    }
    // Destruction order: the connection and the QP before the region and its memory.
    ~End() {
        id.reset();
        listener.reset();
        qp.reset();
        mr.reset();
    }
    Region advert(std::uint32_t size, std::uint64_t writes) const {
        return {to_be(std::uint64_t{mr->addr()}), to_be(mr->rkey()), to_be(size), to_be(writes)};
    }
    std::uint8_t watched(std::uint32_t size) {
        // Written by the library inside ctx->poll() (or its RX thread): an atomic load, not a plain read the
        // compiler could keep in a register.
        return static_cast<std::uint8_t>(std::atomic_ref<std::byte>(buf[size - 1]).load(std::memory_order_acquire));
    }
    // Takes completions; any failure ends the run.
    void reap() {
        const std::size_t n = cq->poll(wcs);
        for (std::size_t k = 0; k < n; ++k) {
            if (wcs[k].status != verbs::WcStatus::success)
                throw std::runtime_error(std::string("completion failed: ") + verbs::to_string(wcs[k].status));
            --outstanding;
        }
    }
    // WRITE our source [size, 2 size) to the peer's target, or READ the peer's target into it. Ownership: the
    // source/sink bytes belong to the QP until the completion.
    void post(verbs::WrOpcode op, std::uint32_t size) {
        const verbs::Sge sge = mr->sge(size, size);
        const verbs::SendWr wr{.wr_id = 1, .opcode = op, .send_flags = verbs::send_flags::signaled,
                               .sg_list = {&sge, 1}, .rdma = {.remote_addr = remote.addr, .rkey = remote.rkey}};
        if (const auto r = qp->post_send({&wr, 1}); !r.ok())
            throw std::runtime_error(std::string("post_send: ") + verbs::to_string(r.err));
        ++outstanding;
    }
    // The WRITE ping-pong's step: wait until the target's last byte shows `m` (reaping completions meanwhile).
    void wait_mark(std::uint8_t m, std::uint32_t size, Clock::time_point deadline, std::uint64_t round) {
        if (!poll_until(*ctx, [&] { reap(); return watched(size) == m; }, deadline))
            throw std::runtime_error("WRITE round " + std::to_string(round) + ": the peer's data did not arrive (QP " +
                                     verbs::to_string(qp->state()) + ")");
    }
    // Before changing the source again: the previous WRITE must have completed (the buffer is ours again).
    void wait_idle(Clock::time_point deadline) {
        if (!poll_until(*ctx, [&] { reap(); return outstanding == 0; }, deadline))
            throw std::runtime_error("a WRITE did not complete");
    }
};

const std::string kServer = "rdma_lat server";

int server(const NetOptions& net) {
    const auto limit = std::chrono::seconds(net.timeout_s);
    // The size comes with the request, so the region and QP are made between the request and the accept.
    End e(net);
    e.listener = e.ctx->listen(net.port);
    if (!net.local_child)
        std::printf("rdma_lat server: listening on %s port %u\n", context_config(net).ip.address.str().c_str(), net.port);
    std::fflush(stdout);
    // A request that is not rdma_lat's is refused with an MPA reject saying why; a client gone before its
    // session began sends us back to waiting.
    const auto deadline = Clock::now() + limit;
    std::uint32_t size = 0;
    std::uint64_t writes = 0;
    for (;;) {
        auto req = next_client(*e.ctx, kServer, deadline, [](const verbs::CmEvent& ev) -> std::string {
            const auto hello = from_private_data<Region>(ev.private_data);
            if (!hello) return unexpected_private_data(ev.private_data, sizeof(Region), "rdma_lat --client's region");
            const std::uint32_t sz = from_be(hello->size);
            if (sz == 0 || sz > (16u << 20)) return "message size " + std::to_string(sz) + " out of range";
            return {};
        });
        const Region hello = *from_private_data<Region>(req.private_data);
        size = from_be(hello.size);
        writes = from_be(hello.writes);
        e.remote = {from_be(hello.addr), from_be(hello.rkey), size, 0};
        e.id.reset();
        e.qp.reset();
        e.setup(size);
        e.id = std::move(req.request);
        const Region mine = e.advert(size, 0);
        // IRD: how many of the client's READs we answer at once.
        if (e.id->accept(*e.qp, {.private_data = bytes_of(mine), .responder_resources = 4, .initiator_depth = 4}) &&
            established(*e.ctx, *e.id, kServer, limit))
            break;
    }
    try {
        // WRITE ping-pong, server side: wait for the client's mark, answer with the same mark.
        for (std::uint64_t i = 0; i < writes; ++i) {
            const auto deadline = Clock::now() + limit;
            e.wait_mark(mark(i), size, deadline, i);
            e.wait_idle(deadline);
            e.buf[2 * std::size_t{size} - 1] = std::byte{mark(i)};
            e.post(verbs::WrOpcode::rdma_write, size);
        }
        // Then the client READs as it likes; we keep polling (that is what answers READs) until it disconnects,
        // or until nothing has arrived for the time limit.
        auto last = Clock::now();
        softrdma::Idler idle(idle_policy(*e.ctx));
        for (unsigned turn = 1;; ++turn) {
            if (poll_turn(*e.ctx, idle) != 0) last = Clock::now();
            e.reap();
            if (auto ev = take_event(*e.ctx, e.id.get(), kServer)) {
                if (ev->type == verbs::CmEventType::disconnected) break;
                throw std::runtime_error(std::string("CM event ") + verbs::to_string(ev->type));
            }
            if ((turn & 1023) == 0 && Clock::now() - last > limit)
                throw std::runtime_error("nothing from the client for " + std::to_string(net.timeout_s) + " s");
        }
    } catch (...) {
        close_quietly(*e.ctx, e.id.get(), kServer);  // a FIN, not a reset, for the client
        throw;
    }
    finish_close(*e.ctx);
    return 0;
}

int client(const NetOptions& net) {
    const auto limit = std::chrono::seconds(net.timeout_s);
    const std::uint32_t size = opt.size;
    End e(net);
    e.setup(size);
    const std::uint64_t writes = opt.write ? opt.warmup + opt.iters : 0;
    const Region mine = e.advert(size, writes);
    // ORD: how many READs we may have outstanding.
    e.id = e.ctx->connect(peer_address(net), net.port, *e.qp,
                          {.private_data = bytes_of(mine), .responder_resources = 4, .initiator_depth = 4});
    auto ev = expect_established(*e.ctx, *e.id, "rdma_lat client", limit);
    const auto theirs = from_private_data<Region>(ev.private_data);
    if (!theirs) {  // not an rdma_lat server: nothing to WRITE to or READ from; close in order
        close_quietly(*e.ctx, e.id.get(), "rdma_lat client");
        throw std::runtime_error("the server at " + e.id->peer() + " is not an rdma_lat server: " +
                                 unexpected_private_data(ev.private_data, sizeof(Region), "rdma_lat --server's region"));
    }
    e.remote = {from_be(theirs->addr), from_be(theirs->rkey), size, 0};
    try {
        if (opt.write) {
            Latency lat(opt.iters);
            for (std::uint64_t i = 0; i < writes; ++i) {
                const auto deadline = Clock::now() + limit;
                e.wait_idle(deadline);  // our previous WRITE's source is ours again
                e.buf[2 * std::size_t{size} - 1] = std::byte{mark(i)};
                const auto t0 = Clock::now();
                e.post(verbs::WrOpcode::rdma_write, size);
                e.wait_mark(mark(i), size, deadline, i);  // the server's WRITE back has landed
                const auto t1 = Clock::now();
                if (i >= opt.warmup) lat.add((t1 - t0) / 2);
            }
            e.wait_idle(Clock::now() + limit);
            lat.print("rdma_lat: RDMA WRITE " + std::to_string(size) + " bytes, half round trip (ping-pong polled on the last byte)");
        }
        if (opt.read) {
            Latency lat(opt.iters);
            for (std::uint64_t i = 0; i < opt.warmup + opt.iters; ++i) {
                const auto t0 = Clock::now();
                e.post(verbs::WrOpcode::rdma_read, size);
                // The READ's completion: the response has been placed in our sink.
                if (!poll_until(*e.ctx, [&] { e.reap(); return e.outstanding == 0; }, t0 + limit))
                    throw std::runtime_error("READ " + std::to_string(i) + " did not complete");
                const auto t1 = Clock::now();
                if (i >= opt.warmup) lat.add(t1 - t0);
            }
            // The server's target holds the last mark of the WRITE phase (or zeros): check the READ brought it.
            const auto expect = opt.write ? std::byte{mark(writes - 1)} : std::byte{0};
            if (e.buf[2 * std::size_t{size} - 1] != expect) throw std::runtime_error("READ brought the wrong bytes");
            lat.print("rdma_lat: RDMA READ " + std::to_string(size) + " bytes, full round trip");
        }
    } catch (...) {
        close_quietly(*e.ctx, e.id.get(), "rdma_lat client");
        throw;
    }
    disconnect(*e.ctx, *e.id, "rdma_lat client", limit);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    NetOptions net;
    const char* usage =
        "[--local | --server | --client] [--op write|read|both] [--size BYTES] [--iters N] [--warmup N] [network flags]\n"
        "  --op write|read|both    which latency to measure (default both)\n"
        "  --size BYTES            message size (default 64)\n"
        "  --iters N               measured operations (default 10000)\n"
        "  --warmup N              operations before measuring (default 1000)\n";
    return run_main(argc, argv, usage, net,
                    [](const Args& args, const std::string& a, int& i) {
                        if (a == "--size") opt.size = static_cast<std::uint32_t>(std::clamp(args.number(i), 1ul, 16ul << 20));
                        else if (a == "--iters") opt.iters = std::max(1ul, args.number(i));
                        else if (a == "--warmup") opt.warmup = args.number(i);
                        else if (a == "--op") {
                            const std::string v = args.value(i);
                            if (v != "write" && v != "read" && v != "both") throw std::invalid_argument("--op write|read|both");
                            opt.write = v != "read";
                            opt.read = v != "write";
                        } else return false;
                        return true;
                    },
                    server, client);
}
