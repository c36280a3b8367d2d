// SPDX-License-Identifier: MIT
// Lifetimes between two processes over memif (fixture: tests/verbs/fixture.hpp; both threading modes, and the
// ASan run of scripts/test): objects destroyed in the orders libibverbs refuses with EBUSY, and memory
// deregistered while work still names it. The memory that goes is unmapped right after its MR, so a read or
// write into it afterwards is a fault, not a silent success.
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cstring>
#include <stdexcept>

#include "rdmap/messages.hpp"
#include "ddp/header.hpp"
#include "tests/verbs/fixture.hpp"
#include <softrdma/verbs.hpp>

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;  // with std::chrono_literals, WcOpcode, WcStatus

namespace {

// Anonymous memory the test can take away (munmap) once its MR is gone.
struct Mapping {
    std::byte* p{nullptr};
    std::size_t n{0};
    explicit Mapping(std::size_t bytes) : n(bytes) {
        void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) throw std::runtime_error("mmap");
        p = static_cast<std::byte*>(m);
        std::memset(p, 0x5a, n);
    }
    ~Mapping() { unmap(); }
    void unmap() {
        if (p != nullptr) ::munmap(p, n);
        p = nullptr;
    }
    std::span<std::byte> span() const { return {p, n}; }
};

// The stream ended with our TERMINATE `want` (sent), or with the peer's (received).
void expect_terminate(const Peer& p, bool received, TermCode want) {
    const auto& t = p.qp->terminate_info();
    if (!t) throw std::runtime_error("no TERMINATE");
    report(std::string(received ? "received " : "sent ") + t->describe());
    if (t->received != received) throw std::runtime_error("TERMINATE in the wrong direction");
    if (!(t->code == want)) throw std::runtime_error("TERMINATE " + term_str(t->code) + ", wanted " + term_str(want));
}

}  // namespace

TEST_CASE("an MR deregistered under an 8 MiB WRITE in flight: the WRITE fails with loc_prot_err, the buffer is "
          "not read again, the stream ends with TERMINATE local catastrophic",
          "[verbs][memif][lifetimes]") {
    constexpr std::size_t kLen = 8 << 20;
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, kLen, verbs::access::local_write | verbs::access::remote_write);
        p.serve();
        p.wait_event(verbs::CmEventType::disconnected);
        expect_terminate(p, true, rdmap::err::local_catastrophic);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        Mapping src(kLen);
        auto mr = p.pd->reg_mr(src.span(), verbs::access::local_write);
        p.connect();
        const verbs::Sge s = mr->sge(0, kLen);
        p.post_send({.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}, .rdma = {p.remote.addr, p.remote.rkey}});
        // Under way: some of it on the wire, the WR not complete (8 MiB is far beyond the TCP send buffer).
        const auto sent0 = verbs::diagnostics::stack(*p.ctx).tx_frames;
        p.ctx->run_until([&] { return verbs::diagnostics::stack(*p.ctx).tx_frames > sent0 + 8; }, kWait);
        if (p.cq->size() != 0) throw std::runtime_error("the WRITE completed before its MR went");
        mr.reset();
        src.unmap();  // from here a read of the source is a fault
        auto wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::loc_prot_err, WcOpcode::rdma_write, 1);
        p.wait_event(verbs::CmEventType::disconnected);
        expect_terminate(p, false, rdmap::err::local_catastrophic);
        report("WRITE: loc_prot_err after its source went");
        return p.end(0);
    };
    const auto out = run_pair(server, client);
    check_outcomes(out);
    CHECK(out[1].report.find("WRITE: loc_prot_err after its source went") != std::string::npos);
}

TEST_CASE("a READ sink deregistered before the response: the READ fails with loc_prot_err and nothing is written "
          "into it; a receive deregistered before its SEND: loc_prot_err, nothing written",
          "[verbs][memif][lifetimes]") {
    constexpr std::size_t kLen = 1 << 20;
    SECTION("READ sink") {
        auto server = [](const PeerConfig& cfg) {
            Peer p(cfg, kLen, verbs::access::local_write | verbs::access::remote_read);
            p.serve();
            p.wait_event(verbs::CmEventType::disconnected);
            expect_terminate(p, true, ddp::err::local_catastrophic);
            return p.end(0);
        };
        auto client = [](const PeerConfig& cfg) {
            Peer p(cfg, 4096, verbs::access::local_write);
            Mapping sink(kLen);
            auto mr = p.pd->reg_mr(sink.span(), verbs::access::local_write);
            p.connect();
            const verbs::Sge s = mr->sge(0, kLen);
            p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&s, 1}, .rdma = {p.remote.addr, p.remote.rkey}});
            mr.reset();
            sink.unmap();  // a response placed here would fault
            auto wc = p.wait_wc(1);
            Peer::expect(wc[0], WcStatus::loc_prot_err, WcOpcode::rdma_read, 2);
            p.wait_event(verbs::CmEventType::disconnected);
            expect_terminate(p, false, ddp::err::local_catastrophic);
            report("READ: loc_prot_err after its sink went");
            return p.end(0);
        };
        const auto out = run_pair(server, client);
        check_outcomes(out);
        CHECK(out[1].report.find("READ: loc_prot_err after its sink went") != std::string::npos);
    }
    SECTION("posted receive") {
        auto server = [](const PeerConfig& cfg) {
            Peer p(cfg, 4096, verbs::access::local_write);
            p.post_recv(1, 0, 64);
            p.serve();
            Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);  // the client's "go"
            const verbs::Sge s = p.mr->sge(0, 4096);
            p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::send, .sg_list = {&s, 1}});
            p.wait_event(verbs::CmEventType::disconnected);
            expect_terminate(p, true, ddp::err::local_catastrophic);
            return p.end(0);
        };
        auto client = [](const PeerConfig& cfg) {
            Peer p(cfg, 4096, verbs::access::local_write);
            Mapping rbuf(1 << 16);
            auto mr = p.pd->reg_mr(rbuf.span(), verbs::access::local_write);
            const verbs::Sge r = mr->sge(0, 1 << 16);
            const verbs::RecvWr rw{.wr_id = 4, .sg_list = {&r, 1}};
            if (!p.qp->post_recv({&rw, 1}).ok()) throw std::runtime_error("post_recv");
            p.connect();
            mr.reset();
            rbuf.unmap();
            const verbs::Sge s = p.mr->sge(0, 8);
            p.post_send({.wr_id = 5, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                         .sg_list = {&s, 1}});
            auto wc = p.wait_wc(2);
            Peer::expect(wc[0], WcStatus::success, WcOpcode::send, 5);
            Peer::expect(wc[1], WcStatus::loc_prot_err, WcOpcode::recv, 4);
            p.wait_event(verbs::CmEventType::disconnected);
            expect_terminate(p, false, ddp::err::local_catastrophic);
            report("receive: loc_prot_err after its buffer went");
            return p.end(0);
        };
        const auto out = run_pair(server, client);
        check_outcomes(out);
        CHECK(out[1].report.find("receive: loc_prot_err after its buffer went") != std::string::npos);
    }
}

TEST_CASE("a PD destroyed before its MR and QP leaves them working; a Context destroyed with a live connection, "
          "a listener and every handle still held resets the connection, flushes the QP, and leaves the handles "
          "safe to use and destroy in any order",
          "[verbs][memif][lifetimes]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(1, 0, 64);
        p.pd.reset();  // the MR and the QP carry the domain on
        p.serve();
        const auto wc = p.wait_wc(1);
        Peer::expect(wc[0], WcStatus::success, WcOpcode::recv, 1);
        if (wc[0].byte_len != 64 || std::to_integer<int>(p.buf[63]) != 0x63)
            throw std::runtime_error("the SEND did not arrive whole");
        // Tell the client it arrived (a Context closing under frames the peer has not read yet loses them
        // with the memif: on a loaded machine the SEND itself would go).
        const verbs::Sge ack = p.mr->sge(128, 8);
        p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::send, .sg_list = {&ack, 1}});
        // The client closes its Context with the connection up: we see it go (reset, or keepalive should the
        // reset go with the memif).
        const auto ev = p.ctx->wait_cm_event(kWait);
        if (!ev || ev->type != verbs::CmEventType::disconnected)
            throw std::runtime_error("no disconnected event after the peer's Context closed");
        report("server: " + ev->reason);
        p.disconnected = true;
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(9, 2048, 64);  // the server's word that our SEND arrived
        p.post_recv(7, 1024, 64);  // never used: flushed when the Context closes
        p.connect();
        for (int i = 0; i < 64; ++i) p.buf[static_cast<std::size_t>(i)] = std::byte(i + 0x24);
        const verbs::Sge s = p.mr->sge(0, 64);
        p.post_send({.wr_id = 2, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        const auto got = p.wait_wc(2);
        Peer::expect(got[0], WcStatus::success, WcOpcode::send, 2);
        Peer::expect(got[1], WcStatus::success, WcOpcode::recv, 9);
        p.listener = p.ctx->listen(static_cast<std::uint16_t>(cfg.tcp_port + 1));
        p.ctx.reset();  // everything else still held
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("QP not in ERR after the Context closed");
        std::array<verbs::WorkCompletion, 4> wcs;
        if (p.cq->poll(wcs) != 1 || wcs[0].wr_id != 7 || wcs[0].status != WcStatus::wr_flush_err)
            throw std::runtime_error("the posted receive was not flushed");
        const verbs::SendWr more{.wr_id = 8, .opcode = verbs::WrOpcode::send};
        if (!p.qp->post_send({&more, 1}).ok() || p.cq->poll(wcs) != 1 || wcs[0].status != WcStatus::wr_flush_err)
            throw std::runtime_error("a post after the close did not complete with a flush error");
        std::vector<std::byte> more_mem(64);
        bool refused = false;
        try {
            (void)p.pd->reg_mr(more_mem, verbs::access::local_write);
        } catch (const verbs::Error& e) {
            refused = std::string(e.what()).find("the Context is closed") != std::string::npos;
        }
        if (!refused) throw std::runtime_error("reg_mr after the close was not refused in words");
        p.id->disconnect();  // nothing left to disconnect: no effect, no fault
        // Worst order: the PD first, then the MR, the CQ, the QP, the id, the listener.
        p.pd.reset();
        p.mr.reset();
        p.cq.reset();
        p.qp.reset();
        p.id.reset();
        p.listener.reset();
        report("client: Context first, then everything else: no fault");
        return 0;  // no pool check: the pools went with the Context
    };
    const auto out = run_pair(server, client);
    check_outcomes({out[0]});
    // The client's pools went with its Context: no count to compare there.
    INFO(out[1].report);
    CHECK_FALSE(out[1].timed_out);
    CHECK(out[1].exit_code == 0);
    CHECK(out[1].report.find("Context first, then everything else: no fault") != std::string::npos);
}
