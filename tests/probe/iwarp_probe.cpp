// SPDX-License-Identifier: MIT
// iwarp_probe: checks against a real iWARP peer (tests/interop/ runs it against a stock Linux siw) what an
// application sees when it uses RFC 7306 on a connection that did not agree to it.
//
//   iwarp_probe --client --af-packet IFACE --ip OURS --peer-ip THEIRS [--port 7174] [--timeout S]
//
// Connects (as rping would: no private data, IRD/ORD 1/1, RFC 7306 not agreed), then posts SEND with
// immediate data, WRITE with immediate data, fetch-and-add and compare-and-swap: each must be refused at post
// time with PostErrc::not_agreed, the QP must stay in RTS and nothing may reach the wire (the capture shows it).
// Then it disconnects in order. Exit 0 when all of that held.
#include "examples/common.hpp"

using namespace examples;

namespace {

int probe(const NetOptions& net) {
    const std::string me = "iwarp_probe";
    const auto limit = std::chrono::seconds(net.timeout_s);
    auto ctx = verbs::Context::open(context_config(net));
    auto pd = ctx->alloc_pd();
    auto cq = ctx->create_cq(16);
    std::vector<std::byte> buf(4096);
    auto mr = pd->reg_mr(buf, verbs::access::local_write);
    auto qp = pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 8, .max_recv_wr = 2}});
    auto id = ctx->connect(peer_address(net), net.port, *qp, {.responder_resources = 1, .initiator_depth = 1});
    expect_established(*ctx, *id, me, limit);
    std::printf("%s: connected to %s (RFC 7306 not agreed)\n", me.c_str(), id->peer().c_str());

    const verbs::Sge d = mr->sge(0, 16), r = mr->sge(64, 8);
    const std::pair<const char*, verbs::SendWr> wrs[] = {
        {"SEND with immediate data",
         {.wr_id = 1, .opcode = verbs::WrOpcode::send_with_imm, .sg_list = {&d, 1}, .imm_data = 7}},
        {"RDMA WRITE with immediate data",
         {.wr_id = 2, .opcode = verbs::WrOpcode::rdma_write_with_imm, .sg_list = {&d, 1}, .imm_data = 8,
          .rdma = {.remote_addr = 0x1000, .rkey = 0x100}}},
        {"fetch-and-add",
         {.wr_id = 3, .opcode = verbs::WrOpcode::atomic_fetch_and_add, .sg_list = {&r, 1},
          .atomic = {.remote_addr = 0x1000, .compare_add = 1, .rkey = 0x100}}},
        {"compare-and-swap",
         {.wr_id = 4, .opcode = verbs::WrOpcode::atomic_cmp_and_swp, .sg_list = {&r, 1},
          .atomic = {.remote_addr = 0x1000, .swap = 1, .rkey = 0x100}}},
    };
    int bad = 0;
    for (const auto& [name, wr] : wrs) {
        const auto res = qp->post_send({&wr, 1});
        const bool refused = res.err == verbs::PostErrc::not_agreed && res.bad_wr == &wr;
        std::printf("%s: %s: %s (%s)\n", me.c_str(), name, refused ? "refused at post time" : "NOT refused",
                    verbs::to_string(res.err));
        if (!refused) ++bad;
    }
    // Nothing was sent: the connection is as it was.
    poll_until(*ctx, [] { return false; }, Clock::now() + std::chrono::milliseconds(300));
    if (qp->state() != verbs::QpState::rts) {
        std::printf("%s: the QP left RTS: %s\n", me.c_str(), verbs::to_string(qp->state()));
        ++bad;
    }
    if (const auto& t = qp->terminate_info()) {
        std::printf("%s: %s\n", me.c_str(), t->describe().c_str());
        ++bad;
    }
    disconnect(*ctx, *id, me, limit);
    std::printf("%s: %s\n", me.c_str(), bad == 0 ? "ok: every RFC 7306 post refused, connection intact, closed in order"
                                                  : "FAILED");
    return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    NetOptions net;
    net.port = 7174;  // rping's port: a stock `rping -s -P` is a convenient peer
    const char* usage = "--client --af-packet IFACE --ip OURS --peer-ip THEIRS [--port N] [--timeout S]\n";
    return run_main(argc, argv, usage, net, [](const Args&, const std::string&, int&) { return false; },
                    [](const NetOptions&) -> int { throw std::runtime_error("iwarp_probe runs as --client only"); },
                    probe);
}
