// SPDX-License-Identifier: MIT
// An out-of-tree program built against an *installed* softrdma through pkg-config alone
// (tests/examples/consumer_test.sh). Two processes (fork) over DPDK memif without hugepages: the server
// echoes one SEND; the client checks the echo. Prints one line the test checks; exit code 0 on success.
#include <softrdma/diagnostics.hpp>  // pkg-config --cflags softrdma: -I<prefix>/include
#include <softrdma/verbs.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

using namespace softrdma;
using namespace std::chrono_literals;

namespace {

verbs::ContextConfig config(const std::string& socket, bool server) {
    verbs::ContextConfig cc;
    cc.port.backend = Backend::memif;
    cc.port.memif_socket = socket;
    cc.port.memif_server = server;
    cc.port.link_timeout = 10s;
    cc.eal.hugepages = Hugepages::off;
    cc.eal.no_huge_memory_mb = 256;
    cc.eal.lcores = server ? "0" : (std::thread::hardware_concurrency() > 1 ? "1" : "0");
    cc.ip.address = Ipv4::parse(server ? "198.18.0.1" : "198.18.0.2");
    cc.max_mr = 4;
    cc.max_qp = 2;
    return cc;
}

// Polls until one completion or 10 s; returns it (status fatal_err if none came).
verbs::WorkCompletion next(verbs::Context& ctx, verbs::CompletionQueue& cq) {
    verbs::WorkCompletion wc{};
    wc.status = verbs::WcStatus::fatal_err;
    ctx.run_until([&] { return cq.poll({&wc, 1}) == 1; }, 10s);
    return wc;
}

int run(const std::string& socket, bool server) {
    auto ctx = verbs::Context::open(config(socket, server));
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(8);
    std::array<std::byte, 128> buf{};  // [0, 64) receives, [64, 128) is sent
    auto mr = pd->reg_mr(buf, verbs::access::local_write);
    auto qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 2, .max_recv_wr = 2}});
    const verbs::Sge rx = mr->sge(0, 64), tx = mr->sge(64, 64);
    const verbs::RecvWr rwr{.wr_id = 1, .sg_list = {&rx, 1}};
    if (!qp->post_recv({&rwr, 1}).ok()) return 10;
    std::unique_ptr<verbs::CmListener> listener;
    std::unique_ptr<verbs::CmId> id;
    if (server) {
        listener = ctx->listen(7000);
        auto ev = ctx->wait_cm_event(10s);
        if (!ev || ev->type != verbs::CmEventType::connect_request) return 11;
        id = std::move(ev->request);
        if (!id->accept(*qp, {})) return 12;
    } else {
        id = ctx->connect(Ipv4::parse("198.18.0.1"), 7000, *qp, {});
    }
    auto ev = ctx->wait_cm_event(10s);
    if (!ev || ev->type != verbs::CmEventType::established) return 13;
    const char msg[] = "hello from an installed softrdma";
    static_assert(sizeof msg <= 64);
    if (!server) std::memcpy(buf.data() + 64, msg, sizeof msg);
    const verbs::SendWr swr{.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                            .sg_list = {&tx, 1}};
    if (server) {  // receive, then echo it back
        const auto wc = next(*ctx, *cq);
        if (wc.status != verbs::WcStatus::success || wc.opcode != verbs::WcOpcode::recv) return 14;
        std::memcpy(buf.data() + 64, buf.data(), 64);
        if (!qp->post_send({&swr, 1}).ok()) return 15;
        if (next(*ctx, *cq).status != verbs::WcStatus::success) return 16;
        // Wait for the client's disconnect.
        auto end = ctx->wait_cm_event(10s);
        if (!end || end->type != verbs::CmEventType::disconnected) return 17;
    } else {
        if (!qp->post_send({&swr, 1}).ok()) return 15;
        int got = 0;
        for (int k = 0; k < 2; ++k) {
            const auto wc = next(*ctx, *cq);
            if (wc.status != verbs::WcStatus::success) return 16;
            got += wc.opcode == verbs::WcOpcode::recv;
        }
        if (got != 1 || std::memcmp(buf.data(), msg, sizeof msg) != 0) return 18;
        std::printf("consumer: echo received: \"%s\" (MR rkey 0x%x, QP %u)\n", reinterpret_cast<const char*>(buf.data()),
                    mr->rkey(), qp->qp_num());
        id->disconnect();
        auto end = ctx->wait_cm_event(10s);
        if (!end || end->type != verbs::CmEventType::disconnected) return 17;
    }
    // The disconnected event comes when the QP is done; TCP's close (our FIN, the peer's FIN acknowledged)
    // needs a few more turns, or the peer never hears of the end.
    ctx->run_until([&] { return softrdma::verbs::diagnostics::tcp_connections(*ctx) == 0; }, 2s);
    std::fflush(stdout);
    std::this_thread::sleep_for(300ms);  // stop polling before exit (DPDK 22.11 memif teardown race)
    id.reset();
    listener.reset();
    qp.reset();
    mr.reset();
    return 0;
}

}  // namespace

int main() {
    const std::string socket = "/tmp/softrdma-consumer-" + std::to_string(::getpid()) + ".sock";
    std::fflush(stdout);
    const pid_t child = ::fork();
    if (child == 0) {
        int rc = 1;
        try {
            rc = run(socket, true);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "server: %s\n", e.what());
        }
        std::fflush(nullptr);
        ::_exit(rc);
    }
    std::this_thread::sleep_for(200ms);  // the memif server creates the socket
    int rc = 1;
    try {
        rc = run(socket, false);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "client: %s\n", e.what());
    }
    // The server ends by itself (it waits at most 10 s per step); bounded wait, then kill.
    int status = 0;
    bool reaped = false;
    for (int i = 0; i < 3000 && !reaped; ++i) {
        reaped = ::waitpid(child, &status, WNOHANG) == child;
        if (!reaped) std::this_thread::sleep_for(10ms);
    }
    if (!reaped) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        std::fprintf(stderr, "server did not end; killed\n");
        rc = rc == 0 ? 1 : rc;
    }
    ::unlink(socket.c_str());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "server failed (status %d)\n", status);
        rc = rc == 0 ? 1 : rc;
    }
    if (rc != 0) std::fprintf(stderr, "client failed (%d)\n", rc);
    return rc;
}
