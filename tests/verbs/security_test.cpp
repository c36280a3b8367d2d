// SPDX-License-Identifier: MIT
// A peer must not touch memory it was not granted (README, "Security"). Each case attacks the way a hostile
// peer did against rping and a multi-connection server sharing one PD:
//   - SEND with Invalidate naming a region registered like ibv_reg_mr (rping's receive MR): refused, the
//     region stays valid;
//   - STags guessed from one's own (they were (index + 1) << 8 | a key counting up): every registration now
//     draws random bits, and the TERMINATEs give no oracle (a wrong STag and a right STag with a wrong address
//     both read "invalid STag");
//   - a cross-connection READ in a shared PD: it fails, leaks nothing, the host is refused further connections
//     after a few failures, and the victim's session goes on.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <stdexcept>

#include "rdmap/messages.hpp"
#include "tests/verbs/fixture.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;

TEST_CASE("SEND with Invalidate naming a region not registered for it: refused, the region stays valid",
          "[verbs][memif][security]") {
    // The server registers its receive buffer like rping (local write only) and a remote-read region without
    // remote_invalidate, and tells the client both STags; the client names each in turn on its own connection.
    for (const bool local_only : {true, false}) {
        auto server = [local_only](const PeerConfig& cfg) {
            Peer p(cfg, 4096, local_only ? verbs::access::local_write : verbs::access::local_write | verbs::access::remote_read);
            p.post_recv(1, 0, 64);
            p.serve();
            auto ev = p.wait_event(verbs::CmEventType::disconnected);
            const auto& t = p.qp->terminate_info();
            if (!t || t->received) throw std::runtime_error("no TERMINATE sent");
            report("server: " + t->describe());
            if (!(t->code == rdmap::err::o_cannot_invalidate)) throw std::runtime_error("wire code " + term_str(t->code));
            if (!(t->cause == rdmap::err::p_cannot_invalidate)) throw std::runtime_error("cause " + term_str(t->cause));
            if (!p.mr->valid()) throw std::runtime_error("the region was invalidated");
            // The region still works for this process: a new QP can post a receive into it.
            auto qp2 = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get()});
            const verbs::Sge sge = p.mr->sge(0, 64);
            const verbs::RecvWr wr{.wr_id = 9, .sg_list = {&sge, 1}};
            if (!qp2->post_recv({&wr, 1}).ok()) throw std::runtime_error("post_recv on the region refused");
            qp2.reset();
            return p.end(0);
        };
        auto client = [](const PeerConfig& cfg) {
            Peer p(cfg, 4096, verbs::access::local_write);
            p.connect();
            p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::send_with_inv, .invalidate_rkey = p.remote.rkey});
            p.wait_event(verbs::CmEventType::disconnected);
            const auto& t = p.qp->terminate_info();
            if (!t || !t->received || !(t->code == rdmap::err::o_cannot_invalidate))
                throw std::runtime_error("client: " + (t ? t->describe() : std::string("no TERMINATE")));
            return p.end(0);
        };
        INFO((local_only ? "local-only region" : "remote-read region without remote_invalidate"));
        check_outcomes(run_pair(server, client));
    }
}

namespace {

// Private data of the cross-connection case: who connects, and the region the server gives it.
struct Hello {
    std::uint32_t role;  // 1 victim, 2 attacker
};

}  // namespace

// One PD shared by two connections, as servers commonly do. The victim's region holds a secret and is
// advertised on the victim's connection only. The attacker holds a public region of the same PD (its STag and
// address) and guesses the victim's STag as the old layout allowed, then even uses the victim's exact STag (as
// if guessed) with a wrong address. Every try draws the same "invalid STag" TERMINATE (no bounds or access
// oracle) carrying nothing but its own header, its sink never sees a secret byte, and after
// SecurityConfig::max_access_errors_per_peer tries its host's new connections are reset at accept. The victim
// reads its secret throughout.
TEST_CASE("cross-connection READ in a shared PD: no oracle, no leak, the prober is shut out, the victim goes on",
          "[verbs][memif][security]") {
    constexpr int kTries = 12;  // more than the default limit of 8
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);  // the public region (p.mr), advertised to every attacker connection
        // Listening first, as serve() does: the client connects at once, and a SYN that finds no listener is
        // refused (the 64 registrations below took long enough under TSan in RX-thread mode for that).
        p.listener = p.ctx->listen(cfg.tcp_port);
        std::vector<std::byte> secret(4096);
        for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::byte>(0x5e ^ (i & 0xff));
        auto secret_mr = p.pd->reg_mr(secret, verbs::access::local_write | verbs::access::remote_read);
        // STags: never below 256, random in their upper bits: 64 registrations of the same slot differ.
        std::set<std::uint32_t> seen;
        for (int i = 0; i < 64; ++i) {
            auto m = p.pd->reg_mr(std::span(secret).first(64), verbs::access::local_write | verbs::access::remote_read);
            if (m->rkey() < 256) throw std::runtime_error("STag below 256");
            seen.insert(m->rkey());
        }
        if (seen.size() < 60) throw std::runtime_error("STags repeat: " + std::to_string(seen.size()) + " of 64 distinct");
        report("64 registrations of one slot: " + std::to_string(seen.size()) + " distinct STags");

        std::vector<std::unique_ptr<verbs::QueuePair>> qps;
        std::vector<std::unique_ptr<verbs::CmId>> ids;
        verbs::CmId* victim = nullptr;
        int attackers = 0, terminates = 0;
        bool done = false;
        std::array<verbs::WorkCompletion, 8> wcs;
        const auto until = std::chrono::steady_clock::now() + 30s;
        while (!done && std::chrono::steady_clock::now() < until) {
            p.ctx->poll();
            for (std::size_t n; (n = p.cq->poll(wcs)) != 0;)
                for (std::size_t i = 0; i < n; ++i)
                    if (wcs[i].wr_id == 77 && wcs[i].status == WcStatus::success) done = true;  // the victim's "done"
            auto ev = p.ctx->get_cm_event();
            if (!ev) continue;
            if (ev->type == verbs::CmEventType::connect_request) {
                Hello h{};
                if (ev->private_data.size == sizeof h) std::memcpy(&h, ev->private_data.bytes.data(), sizeof h);
                auto qp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get()});
                RemoteRegion advert = h.role == 1 ? RemoteRegion{secret_mr->addr(), secret_mr->rkey(), 4096} : p.local();
                if (h.role == 1) {
                    const verbs::Sge s = p.mr->sge(0, 64);
                    const verbs::RecvWr r{.wr_id = 77, .sg_list = {&s, 1}};
                    if (!qp->post_recv({&r, 1}).ok()) throw std::runtime_error("post_recv refused");
                    victim = ev->request.get();
                } else {
                    ++attackers;
                }
                verbs::ConnParam cp = p.conn;
                cp.private_data = as_bytes(advert);
                if (!ev->request->accept(*qp, cp)) throw std::runtime_error("accept");
                ids.push_back(std::move(ev->request));
                qps.push_back(std::move(qp));
            } else if (ev->type == verbs::CmEventType::disconnected && ev->id != victim) {
                for (std::size_t i = 0; i < ids.size(); ++i) {
                    if (ids[i].get() != ev->id) continue;
                    const auto& t = qps[i]->terminate_info();
                    if (t && !t->received) {
                        ++terminates;
                        if (!(t->code == rdmap::err::p_invalid_stag)) throw std::runtime_error("wire code " + term_str(t->code));
                    }
                    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i));  // the dead attacker's QP goes
                    qps.erase(qps.begin() + static_cast<std::ptrdiff_t>(i));
                    break;
                }
            }
        }
        if (!done) throw std::runtime_error("the victim never said done");
        if (!secret_mr->valid()) throw std::runtime_error("the secret region was invalidated");
        report("attacker connections accepted " + std::to_string(attackers) + ", TERMINATEs " + std::to_string(terminates) +
               ", connections reset at accept " + std::to_string(p.ctx->refused_connections()));
        if (attackers != 8 || terminates != 8) throw std::runtime_error("the prober got more than 8 tries");
        if (p.ctx->refused_connections() != kTries - 8) throw std::runtime_error("refusals");
        // The victim's connection ends in order; the rest is gone.
        ids.front()->disconnect();
        p.ctx->run_until([&] { return p.ctx->impl().stack().active_pcbs() == 0; }, 5s);
        ids.clear();
        qps.clear();
        secret_mr.reset();
        p.disconnected = true;
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 8192, verbs::access::local_write);
        // The victim: a legitimate connection that learns the secret region and reads it.
        auto vqp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get()});
        const Hello hv{1};
        auto vid = p.ctx->connect(cfg.peer, cfg.tcp_port, *vqp,
                                  {.private_data = {reinterpret_cast<const std::byte*>(&hv), sizeof hv}});
        auto vev = p.ctx->wait_cm_event(kWait);
        if (!vev || vev->type != verbs::CmEventType::established) throw std::runtime_error("victim not connected");
        const RemoteRegion secret = region_from(vev->private_data);
        auto victim_read = [&](std::uint64_t wr_id) {
            const verbs::Sge s = p.mr->sge(4096, 64);
            const verbs::SendWr wr{.wr_id = wr_id, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                                   .sg_list = {&s, 1}, .rdma = {secret.addr, secret.rkey}};
            if (!vqp->post_send({&wr, 1}).ok()) throw std::runtime_error("victim READ refused");
            std::array<verbs::WorkCompletion, 1> wc;
            if (!p.ctx->run_until([&] { return p.cq->poll(wc) == 1; }, kWait) || wc[0].status != WcStatus::success ||
                wc[0].wr_id != wr_id)
                throw std::runtime_error("victim READ failed");
            if (std::to_integer<int>(p.buf[4096]) != 0x5e) throw std::runtime_error("victim read the wrong bytes");
            std::memset(p.buf.data() + 4096, 0, 64);
        };
        victim_read(1);

        // The attacker: its own connection each try (a failed access ends the stream).
        int terminated = 0, refused = 0;
        for (int k = 0; k < kTries; ++k) {
            auto aqp = p.pd->create_qp({.send_cq = p.cq.get(), .recv_cq = p.cq.get()});
            const Hello ha{2};
            auto aid = p.ctx->connect(cfg.peer, cfg.tcp_port, *aqp,
                                      {.private_data = {reinterpret_cast<const std::byte*>(&ha), sizeof ha}});
            auto ev = p.ctx->wait_cm_event(kWait);
            if (!ev) throw std::runtime_error("no answer to attacker connection " + std::to_string(k));
            if (ev->type != verbs::CmEventType::established) {
                ++refused;  // reset at accept: shut out
                continue;
            }
            const RemoteRegion mine = region_from(ev->private_data);
            // Guesses: the old layout's neighbours of our own STag, then the victim's exact STag (a lucky guess)
            // with an address outside its region: no answer may tell those apart.
            std::uint32_t stag = mine.rkey + ((k % 2 == 0 ? 1u : -1u) << 8) * static_cast<std::uint32_t>(1 + k / 2);
            std::uint64_t addr = mine.addr;
            if (k == 3) {
                stag = secret.rkey;
                addr = secret.addr + (64u << 20);
            }
            const verbs::Sge s = p.mr->sge(0, 4096);  // the attacker's sink: must stay zero
            const verbs::SendWr wr{.wr_id = 100u + k, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                                   .sg_list = {&s, 1}, .rdma = {addr, stag}};
            if (!aqp->post_send({&wr, 1}).ok()) throw std::runtime_error("attacker READ refused at post");
            auto dev = p.ctx->wait_cm_event(kWait);
            if (!dev || dev->type != verbs::CmEventType::disconnected) throw std::runtime_error("attacker not terminated");
            const auto& t = aqp->terminate_info();
            if (!t || !t->received || !(t->code == rdmap::err::p_invalid_stag))
                throw std::runtime_error("try " + std::to_string(k) + ": " + (t ? t->describe() : std::string("no TERMINATE")));
            ++terminated;
            for (std::size_t i = 0; i < 4096; ++i)
                if (p.buf[i] != std::byte{0}) throw std::runtime_error("the attacker's sink received data");
            std::array<verbs::WorkCompletion, 4> drain;
            while (p.cq->poll(drain) != 0) {
            }
            aid.reset();
            aqp.reset();
        }
        report("attacker: " + std::to_string(terminated) + " tries terminated (invalid STag), then " +
               std::to_string(refused) + " connections refused");
        if (terminated != 8 || refused != kTries - 8) throw std::runtime_error("the attacker was not shut out after 8");
        // The victim's session is untouched: read the secret again, then say done.
        victim_read(2);
        const verbs::SendWr done{.wr_id = 3, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled};
        if (!vqp->post_send({&done, 1}).ok()) throw std::runtime_error("victim done refused");
        p.ctx->run_until([&] {
            while (auto ev = p.ctx->get_cm_event())
                if (ev->type == verbs::CmEventType::disconnected && ev->id == vid.get()) return true;
            return false;
        }, kWait);
        vid.reset();
        vqp.reset();
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}
