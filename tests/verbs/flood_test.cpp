// SPDX-License-Identifier: MIT
// A connection flood while a session runs (README, "Security"): an unauthenticated host opened 2000 TCP
// connections and held them, filling lwIP's 1088 PCBs; new clients then got no answer for ~25 s. Now
// connections waiting for their MPA request are bounded per host and in all (SecurityConfig), the oldest give
// way to new ones, and lwIP never sacrifices an RDMA-mode connection. Here, over af_packet on a veth pair
// between two namespaces: a softrdma server; in the other namespace a softrdma client (DPDK on the veth) and
// the kernel flooding from 16 addresses (tests/verbs/flood.py). The client's running session must keep
// echoing with no long gap, and a new client must get in during the flood.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "tests/support/netns.hpp"
#include "tests/verbs/fixture.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

namespace {

constexpr int kFlood = 1500;
constexpr int kSources = 16;
constexpr auto kFloodStart = 1500ms;  // after the session is up
constexpr auto kRun = 9s;             // the client's session length

verbs::ContextConfig config_for(const PeerConfig& cfg) {
    verbs::ContextConfig cc;
    cc.port = cfg.port;
    cc.eal = cfg.eal;
    cc.ip = cfg.stack.ip;
    cc.max_mr = 16;
    cc.max_qp = 8;
    return cc;
}

// The server: accepts clients that say "SESSION" in their private data, echoes every SEND on every
// connection, until a connection sends "QUIT".
int flood_server(const PeerConfig& cfg) {
    enter_netns(cfg.netns);
    auto ctx = verbs::Context::open(config_for(cfg));
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(256);
    std::vector<std::byte> buf(64 * 64);
    auto mr = pd->reg_mr(buf, verbs::access::local_write);
    auto listener = ctx->listen(cfg.tcp_port);
    std::vector<std::unique_ptr<verbs::QueuePair>> qps;
    std::vector<std::unique_ptr<verbs::CmId>> ids;
    bool quit = false;
    int sessions = 0, refused_requests = 0;
    std::array<verbs::WorkCompletion, 16> wcs;
    const auto until = std::chrono::steady_clock::now() + 40s;
    while (!quit && std::chrono::steady_clock::now() < until) {
        ctx->poll();
        for (std::size_t n; (n = cq->poll(wcs)) != 0;) {
            for (std::size_t i = 0; i < n; ++i) {
                const auto& wc = wcs[i];
                if (wc.status != WcStatus::success || wc.opcode != WcOpcode::recv) continue;
                const auto q = static_cast<std::size_t>(wc.wr_id >> 8), slot = static_cast<std::size_t>(wc.wr_id & 0xff);
                std::byte* msg = buf.data() + 64 * (q * 8 + slot);
                if (wc.byte_len == 4 && std::memcmp(msg, "QUIT", 4) == 0) quit = true;
                // Echo from a send slot, then repost the receive.
                const verbs::Sge s = mr->sge(64 * (q * 8 + slot), wc.byte_len);
                const verbs::SendWr wr{.wr_id = 0, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::inline_data,
                                       .sg_list = {&s, 1}};
                if (!qps[q]->post_send({&wr, 1}).ok()) throw std::runtime_error("echo refused");
                const verbs::Sge r = mr->sge(64 * (q * 8 + slot), 64);
                const verbs::RecvWr rw{.wr_id = wc.wr_id, .sg_list = {&r, 1}};
                if (!qps[q]->post_recv({&rw, 1}).ok()) throw std::runtime_error("post_recv refused");
            }
        }
        auto ev = ctx->get_cm_event();
        if (!ev || ev->type != verbs::CmEventType::connect_request) continue;
        if (ev->private_data.size != 7 || std::memcmp(ev->private_data.bytes.data(), "SESSION", 7) != 0 || qps.size() >= 8) {
            ++refused_requests;
            if (!ev->request->reject({})) throw std::runtime_error("reject");
            continue;
        }
        const std::size_t q = qps.size();
        qps.push_back(pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 16, .max_recv_wr = 8,
                                                                                     .max_inline_data = 64}}));
        for (std::uint32_t slot = 0; slot < 8; ++slot) {
            const verbs::Sge r = mr->sge(64 * (q * 8 + slot), 64);
            const verbs::RecvWr rw{.wr_id = q << 8 | slot, .sg_list = {&r, 1}};
            if (!qps[q]->post_recv({&rw, 1}).ok()) throw std::runtime_error("post_recv refused");
        }
        if (!ev->request->accept(*qps[q], {})) throw std::runtime_error("accept");
        ids.push_back(std::move(ev->request));
        ++sessions;
    }
    report("sessions " + std::to_string(sessions) + ", connections reset at accept " +
           std::to_string(ctx->refused_connections()) + ", requests rejected " + std::to_string(refused_requests));
    if (!quit) throw std::runtime_error("no QUIT");
    if (ctx->refused_connections() == 0) throw std::runtime_error("the flood met no limit");
    for (auto& id : ids) id->disconnect();
    ctx->run_until([&] { return ctx->impl().stack().active_pcbs() == 0; }, 3s);
    ids.clear();
    qps.clear();
    return 0;
}

// The client: session A up before the flood, pinging all along; session B connects in the middle of it.
int flood_client(const PeerConfig& cfg) {
    enter_netns(cfg.netns);
    auto ctx = verbs::Context::open(config_for(cfg));
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(64);
    std::vector<std::byte> buf(1024);
    auto mr = pd->reg_mr(buf, verbs::access::local_write);
    const char hello[] = "SESSION";
    auto connect = [&](std::unique_ptr<verbs::QueuePair>& qp, std::uint64_t tag) {
        qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 8, .max_recv_wr = 8}});
        for (std::uint32_t i = 0; i < 4; ++i) {
            const verbs::Sge r = mr->sge(64 * (tag * 4 + i), 64);
            const verbs::RecvWr rw{.wr_id = tag, .sg_list = {&r, 1}};
            if (!qp->post_recv({&rw, 1}).ok()) throw std::runtime_error("post_recv refused");
        }
        auto id = ctx->connect(cfg.peer, cfg.tcp_port, *qp, {.private_data = std::as_bytes(std::span(hello, 7))});
        std::optional<verbs::CmEvent> ev;
        ctx->run_until([&] {
            while ((ev = ctx->get_cm_event()))
                if (ev->id == id.get()) return true;
            return false;
        }, 10s);
        if (!ev || ev->type != verbs::CmEventType::established)
            throw std::runtime_error(std::string("connect: ") + (ev ? verbs::to_string(ev->type) + (": " + ev->reason) : "no answer"));
        return id;
    };
    std::array<verbs::WorkCompletion, 8> wcs;
    // One ping on `qp` (tag: which receive slots), echoed; returns the round trip. The last one (QUIT) makes the
    // server disconnect every session right after its echo: receives still posted are then flushed, maybe in
    // the same poll as the echo.
    auto ping = [&](verbs::QueuePair& qp, std::uint64_t tag, const char* what, bool last = false) {
        std::memcpy(buf.data() + 512 + 64 * tag, what, 4);
        const verbs::Sge s = mr->sge(512 + 64 * tag, 4);
        const verbs::SendWr wr{.wr_id = 100 + tag, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}};
        const auto t0 = std::chrono::steady_clock::now();
        if (!qp.post_send({&wr, 1}).ok()) throw std::runtime_error("ping refused");
        bool got = false;
        ctx->run_until([&] {
            for (std::size_t n; (n = cq->poll(wcs)) != 0;)
                for (std::size_t i = 0; i < n; ++i) {
                    if (last && wcs[i].status == WcStatus::wr_flush_err && wcs[i].opcode == WcOpcode::recv) continue;
                    if (wcs[i].status != WcStatus::success)
                        throw std::runtime_error(std::string("completion failed: ") + verbs::to_string(wcs[i].opcode) +
                                                 " wr_id " + std::to_string(wcs[i].wr_id) + ", " +
                                                 verbs::to_string(wcs[i].status));
                    if (wcs[i].opcode == WcOpcode::recv && wcs[i].wr_id == tag) {
                        got = true;
                        const verbs::Sge r = mr->sge(64 * (tag * 4), 64);
                        const verbs::RecvWr rw{.wr_id = tag, .sg_list = {&r, 1}};
                        if (!qp.post_recv({&rw, 1}).ok()) throw std::runtime_error("post_recv refused");
                    }
                }
            return got;
        }, 10s);
        if (!got) throw std::runtime_error("no echo");
        return std::chrono::steady_clock::now() - t0;
    };

    std::unique_ptr<verbs::QueuePair> qa, qb;
    auto ida = connect(qa, 0);
    report("session A up");
    const auto t0 = std::chrono::steady_clock::now();
    std::chrono::steady_clock::duration worst{};
    std::uint64_t pings = 0;
    std::unique_ptr<verbs::CmId> idb;
    double b_connect_ms = -1;
    while (std::chrono::steady_clock::now() - t0 < kRun) {
        worst = std::max(worst, ping(*qa, 0, "PING"));
        ++pings;
        if (!idb && std::chrono::steady_clock::now() - t0 > kFloodStart + 2500ms) {
            const auto c0 = std::chrono::steady_clock::now();
            idb = connect(qb, 1);  // a new client in the middle of the flood
            b_connect_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
            ping(*qb, 1, "PING");
        }
        ctx->run_until([] { return false; }, 1ms);
    }
    const double worst_ms = std::chrono::duration<double, std::milli>(worst).count();
    report("session A: " + std::to_string(pings) + " pings, slowest " + std::to_string(worst_ms) + " ms; client B connected in " +
           std::to_string(b_connect_ms) + " ms during the flood");
    if (!idb) throw std::runtime_error("client B never connected");
    if (worst_ms > 1000) throw std::runtime_error("session A stalled");
    ping(*qa, 0, "QUIT", true);
    ctx->run_until([&] { return false; }, 200ms);
    ida->disconnect();
    idb->disconnect();
    ctx->run_until([&] { return ctx->impl().stack().active_pcbs() == 0; }, 5s);
    idb.reset();
    ida.reset();
    return 0;
}

}  // namespace

TEST_CASE("a connection flood: the running session goes on and a new client gets in", "[verbs][security][flood][af_packet]") {
    std::string why;
    if (!VethPair::can_create(why) || std::system("command -v ethtool >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1") != 0) {
        WARN("skipped: " << (why.empty() ? "needs ethtool and python3" : why));
        return;
    }
    if (std::getenv("SOFTRDMA_TEST_THREADING") != nullptr) {  // one mode is enough: the limits live in the CM
        SUCCEED("run in the run-to-completion suite");
        return;
    }
    VethPair veth;
    auto [server, client] = memif_pair();
    server.port = client.port = io::PortConfig{};
    server.port.backend = client.port.backend = Backend::af_packet;
    server.port.iface = veth.if_a;
    client.port.iface = veth.if_b;
    server.netns = veth.ns_a;
    client.netns = veth.ns_b;
    // The kernel shares the client's veth: 16 addresses of its own, real checksums (veth offloads them otherwise).
    std::string sources;
    for (int i = 0; i < kSources; ++i) {
        const std::string a = "198.18.0." + std::to_string(100 + i);
        if (std::system(("ip -n " + veth.ns_b + " addr add " + a + "/24 dev " + veth.if_b).c_str()) != 0)
            FAIL("cannot add " << a);
        sources += " " + a;
    }
    REQUIRE(std::system(("ip netns exec " + veth.ns_b + " ethtool -K " + veth.if_b + " tx off >/dev/null").c_str()) == 0);
    const std::string out = "/tmp/" + unique_name("flood-") + ".txt";
    const std::string flood = "ip netns exec " + veth.ns_b + " python3 " + std::string(SOFTRDMA_SOURCE_DIR) +
                              "/tests/verbs/flood.py " + server.stack.ip.address.str() + " " + std::to_string(server.tcp_port) +
                              " " + std::to_string(kFlood) + " 5" + sources + " >" + out + " 2>&1";
    const auto outcomes = run_roles({{"server", [&] { return flood_server(server); }},
                                     {"client", [&] { return flood_client(client); }, 300ms},
                                     {"flooder", [&] {
                                          std::this_thread::sleep_for(kFloodStart);
                                          const int rc = std::system(flood.c_str());
                                          std::string line;
                                          if (FILE* f = std::fopen(out.c_str(), "r")) {
                                              char b[256];
                                              while (std::fgets(b, sizeof b, f)) line += b;
                                              std::fclose(f);
                                          }
                                          report(line);
                                          return rc == 0 ? 0 : 1;
                                      }, 300ms}},
                                    90s);
    std::remove(out.c_str());
    for (const auto& o : outcomes) {
        INFO(o.name << " exit=" << o.exit_code << (o.timed_out ? " TIMED OUT" : "") << "\n" << o.report);
        CHECK_FALSE(o.timed_out);
        CHECK(o.exit_code == 0);
    }
    for (const auto& o : outcomes) WARN(o.name << ": " << o.report);
}
