// SPDX-License-Identifier: MIT
// verbs between two processes over memif (the fixture: tests/verbs/fixture.hpp; every case runs in both threading
// modes). What a peer is refused: each violation draws its TERMINATE, both QPs go to ERR and every outstanding WR
// is flushed, in posting order.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>
#include <sys/epoll.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include "ddp/header.hpp"
#include "rdmap/messages.hpp"
#include "rdmap/upper.hpp"
#include "mpa/fpdu.hpp"
#include "tests/support/checks.hpp"
#include "tests/support/processes.hpp"
#include "tests/support/tcp_roles.hpp"
#include "stack/tcp.hpp"
#include "tests/verbs/fixture.hpp"
#include "tests/wire/pcap.hpp"
#include <softrdma/verbs.hpp>

using namespace softrdma;
using namespace softrdma::test;
using namespace softrdma::test::verbs_fixture;  // with std::chrono_literals, WcOpcode, WcStatus


namespace {

// One page of memory between two inaccessible pages: a byte written just outside it ends the process
// (SIGSEGV), so a violation test that passes wrote nothing outside the region it was refused.
struct GuardedPage {
    std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::byte* base = static_cast<std::byte*>(::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
                                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    GuardedPage() {
        if (base == MAP_FAILED || ::mprotect(base, page, PROT_NONE) != 0 ||
            ::mprotect(base + 2 * page, page, PROT_NONE) != 0)
            throw std::runtime_error("guard pages");
    }
    ~GuardedPage() { ::munmap(base, 3 * page); }
    GuardedPage(const GuardedPage&) = delete;
    GuardedPage& operator=(const GuardedPage&) = delete;
    std::span<std::byte> span() const { return {base + page, page}; }
};

// The violation cases: the client does something the server must refuse. The server finds `want` (its
// TerminateInfo::cause), sends the TERMINATE the security policy allows (SecurityConfig::opaque_access_errors,
// on by default: every failed access to its memory reads "invalid STag", DDP's for a tagged offence, RDMAP's
// for a READ or atomic request) and goes to ERR with its receives flushed; the client receives that TERMINATE
// and goes to ERR with its receives (and any outstanding send WR) flushed.
// `consumed`: how many of the server's two receives the offence uses first (they complete successfully; the
// rest are flushed). The region the server advertises is a page between guard pages (GuardedPage).
// `wrong_pd`: the server advertises a region of another PD. `tagged`: the offence is a
// tagged message (WRITE), not a READ/atomic request.
// The requester learns the cause three ways besides terminate_info(): the CM event's reason names it in words,
// an async QP error (qp_access_err or qp_req_err, naming the QP) is queued at both ends, and the oldest send WR
// the TERMINATE kills (`killed`: the offending READ/atomic, else the READ behind the offence) completes with
// `killed_status` (rem_access_err, rem_inv_req_err), every later one with wr_flush_err.
void violation_case(const std::function<void(Peer&)>& offend, const TermCode want, std::uint32_t server_access,
                    int consumed = 0, bool wrong_pd = false, bool tagged = true, std::uint64_t killed = 99,
                    WcStatus killed_status = WcStatus::rem_access_err) {
    const TermCode wire = rdmap::opaque_access_error(want, tagged);
    const verbs::AsyncEventType async_want = killed_status == WcStatus::rem_access_err
                                                 ? verbs::AsyncEventType::qp_access_err
                                                 : verbs::AsyncEventType::qp_req_err;
    auto check_async = [async_want](Peer& p) {
        const auto ev = p.ctx->get_async_event();
        if (!ev) throw std::runtime_error("no async event");
        report("async: " + ev->describe());
        if (ev->type != async_want || ev->qp_num != p.qp->qp_num())
            throw std::runtime_error(std::string("async event ") + verbs::to_string(ev->type) + ", wanted " +
                                     verbs::to_string(async_want));
        if (ev->describe().find(verbs::to_string(ev->term.code)) == std::string::npos)
            throw std::runtime_error("async event without the cause in words");
    };
    auto server = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, server_access);
        GuardedPage target, other;
        auto gmr = p.pd->reg_mr(target.span(), server_access);
        auto pd2 = p.ctx->alloc_pd();
        auto mr2 = pd2->reg_mr(other.span(), kAll);
        p.post_recv(1, 0, 64);
        p.post_recv(2, 64, 64);
        const auto& adv = wrong_pd ? mr2 : gmr;
        p.serve(RemoteRegion{adv->addr(), adv->rkey(), static_cast<std::uint32_t>(adv->length())});
        auto wc = p.wait_wc(2);
        for (int i = 0; i < 2; ++i)
            Peer::expect(wc[i], i < consumed ? WcStatus::success : WcStatus::wr_flush_err, WcOpcode::recv, 1 + i);
        p.wait_event(verbs::CmEventType::disconnected);
        const auto& t = p.qp->terminate_info();
        if (!t || t->received) throw std::runtime_error("server sent no TERMINATE");
        report("server: " + t->describe() + ", QP " + verbs::to_string(p.qp->state()));
        if (!(t->cause == want)) throw std::runtime_error("wrong cause " + term_str(t->cause) + ", wanted " + term_str(want));
        if (!(t->code == wire)) throw std::runtime_error("wrong TERMINATE " + term_str(t->code) + ", wanted " + term_str(wire));
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("server QP not in ERR");
        check_async(p);
        for (std::byte b : target.span())
            if (b != std::byte{0}) throw std::runtime_error("the refused region was written");
        mr2.reset();
        gmr.reset();
        return p.end(0);
    };
    auto client = [&](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.post_recv(7, 0, 64);
        p.connect();
        std::fill(p.buf.begin(), p.buf.end(), std::byte{0xab});  // what a refused WRITE would have put there
        offend(p);
        const auto ev = p.wait_event(verbs::CmEventType::disconnected);
        if (ev.reason.find(verbs::to_string(wire)) == std::string::npos)
            throw std::runtime_error("CM reason without the cause in words: " + ev.reason);
        const auto& t = p.qp->terminate_info();
        if (!t || !t->received) throw std::runtime_error("client received no TERMINATE");
        report("client: " + t->describe() + ", QP " + verbs::to_string(p.qp->state()));
        if (!(t->code == wire)) throw std::runtime_error("wrong TERMINATE " + term_str(t->code) + ", wanted " + term_str(wire));
        if (p.qp->state() != verbs::QpState::err) throw std::runtime_error("client QP not in ERR");
        check_async(p);
        // Completions: an offending SEND/WRITE (success when framed, as siw), the flushed receive, the oldest
        // request killed with the cause, the READ behind it flushed.
        std::array<verbs::WorkCompletion, 16> wcs;
        const std::size_t n = p.cq->poll(wcs);
        bool recv_flushed = false, killed_ok = false, read_flushed = killed == 99;
        std::string got;
        for (std::size_t i = 0; i < n; ++i) {
            got += " " + std::to_string(wcs[i].wr_id) + ":" + verbs::to_string(wcs[i].status);
            if (wcs[i].wr_id == 7 && wcs[i].status == WcStatus::wr_flush_err) recv_flushed = true;
            if (wcs[i].wr_id == killed && wcs[i].status == killed_status) killed_ok = true;
            if (wcs[i].wr_id == 99 && killed != 99 && wcs[i].status == WcStatus::wr_flush_err) read_flushed = true;
        }
        report("client completions:" + got);
        if (!recv_flushed || !killed_ok || !read_flushed) throw std::runtime_error("client completions wrong:" + got);
        // Posting in ERR completes at once with a flush error.
        const verbs::SendWr more{.wr_id = 100, .opcode = verbs::WrOpcode::send};
        if (!p.qp->post_send({&more, 1}).ok()) throw std::runtime_error("post in ERR refused");
        Peer::expect(p.wait_wc(1)[0], WcStatus::wr_flush_err, WcOpcode::send, 100);
        p.disconnected = true;
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

// The offending WR, then a READ queued behind it: the server fails on the offence first and never answers
// the READ, so it is outstanding when the TERMINATE arrives and is flushed at the client.
void post_offence_then_read(Peer& p, const verbs::SendWr& bad) {
    p.post_send(bad);
    const verbs::Sge s = p.mr->sge(1024, 16);
    p.post_send({.wr_id = 99, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
                 .sg_list = {&s, 1}, .rdma = {p.remote.addr, 0x0}});  // STag 0: never answered anyway
}

}  // namespace

TEST_CASE("WRITE without the remote-write right: TERMINATE access violation, ERR and flushes at both ends",
          "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        rdmap::err::p_access, verbs::access::local_write | verbs::access::remote_read);
}

TEST_CASE("WRITE with a stale key: TERMINATE invalid STag at the peer", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey ^ 0x01u}});
        },
        ddp::err::t_invalid_stag, kAll);
}

TEST_CASE("SEND without a posted receive: TERMINATE no buffer", "[verbs][memif]") {
    // The server posts two receives; the client sends three.
    violation_case(
        [](Peer& p) {
            for (int i = 0; i < 2; ++i)
                p.post_send({.wr_id = 50u + i, .opcode = verbs::WrOpcode::send});
            post_offence_then_read(p, {.wr_id = 52, .opcode = verbs::WrOpcode::send});
        },
        ddp::err::u_no_buffer, kAll, /*consumed=*/2, false, true, 99, WcStatus::rem_inv_req_err);
}

TEST_CASE("READ without the remote-read right: TERMINATE access violation", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 98, .opcode = verbs::WrOpcode::rdma_read, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        rdmap::err::p_access, verbs::access::local_write | verbs::access::remote_write, 0, false, /*tagged=*/false,
        /*killed=*/98);
}

TEST_CASE("fetch-add without the remote-atomic right: TERMINATE access violation", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 8);
            post_offence_then_read(p, {.wr_id = 98, .opcode = verbs::WrOpcode::atomic_fetch_and_add,
                                       .sg_list = {&s, 1}, .atomic = {p.remote.addr, 1, 0, p.remote.rkey}});
        },
        rdmap::err::p_access, verbs::access::local_write | verbs::access::remote_write | verbs::access::remote_read, 0,
        false, /*tagged=*/false, /*killed=*/98);
}

TEST_CASE("WRITE above and below the region: TERMINATE base or bounds", "[verbs][memif]") {
    for (const std::int64_t at : {std::int64_t{4096 - 16}, std::int64_t{-8}}) {
        INFO("offset " << at);
        violation_case(
            [at](Peer& p) {
                const verbs::Sge s = p.mr->sge(0, 32);
                post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                           .rdma = {p.remote.addr + static_cast<std::uint64_t>(at), p.remote.rkey}});
            },
            ddp::err::t_base_bounds, kAll);
    }
}

// A WRITE (or READ) whose target address plus length wraps past 2^64 never reaches the wire: post_send refuses it
// as a bad remote address (it said "invalid opcode" before; the
// receiver's own check, TERMINATE "TO wrap", is tested on the endpoints in tests/rdmap), and the QP goes on.
TEST_CASE("WRITE whose address plus length wraps past 2^64: refused at post, the connection goes on",
          "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.post_recv(1, 0, 64);
        p.serve();
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::recv, 1);
        if (std::to_integer<int>(p.buf[100]) != 0x5a) throw std::runtime_error("the valid WRITE did not land");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.connect();
        std::fill(p.buf.begin(), p.buf.end(), std::byte{0x5a});
        const verbs::Sge s = p.mr->sge(0, 32);
        const verbs::SendWr wrap{.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                 .rdma = {~std::uint64_t{0} - 15, p.remote.rkey}};
        if (const auto r = p.qp->post_send({&wrap, 1}); r.err != verbs::PostErrc::bad_remote_address)
            throw std::runtime_error(std::string("a wrapping WRITE: ") + (r.ok() ? "accepted" : verbs::to_string(r.err)));
        verbs::Sge sink = p.mr->sge(0, 32);
        const verbs::SendWr read_wrap{.wr_id = 4, .opcode = verbs::WrOpcode::rdma_read, .sg_list = {&sink, 1},
                                      .rdma = {~std::uint64_t{0} - 7, p.remote.rkey}};
        if (const auto r = p.qp->post_send({&read_wrap, 1}); r.err != verbs::PostErrc::bad_remote_address)
            throw std::runtime_error(std::string("a wrapping READ: ") + (r.ok() ? "accepted" : verbs::to_string(r.err)));
        const verbs::SendWr ok{.wr_id = 2, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                               .rdma = {p.remote.addr + 96, p.remote.rkey}};
        p.post_send(ok);
        p.post_send({.wr_id = 3, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
                     .sg_list = {&s, 1}});
        Peer::expect(p.wait_wc(1)[0], WcStatus::success, WcOpcode::send, 3);
        if (p.qp->state() != verbs::QpState::rts) throw std::runtime_error("QP left RTS");
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("WRITE to a region of another PD: TERMINATE STag not associated", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        ddp::err::t_stag_not_assoc, kAll, 0, /*wrong_pd=*/true);
}

TEST_CASE("WRITE to an STag the peer invalidated by SEND_INV: TERMINATE invalid STag", "[verbs][memif]") {
    violation_case(
        [](Peer& p) {
            p.post_send({.wr_id = 60, .opcode = verbs::WrOpcode::send_with_inv, .invalidate_rkey = p.remote.rkey});
            const verbs::Sge s = p.mr->sge(0, 32);
            post_offence_then_read(p, {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_write, .sg_list = {&s, 1},
                                       .rdma = {p.remote.addr, p.remote.rkey}});
        },
        ddp::err::t_invalid_stag, kAll | verbs::access::remote_invalidate, /*consumed=*/1);
}

// A TERMINATE flushes in posting order, as siw does (its ORQ, then its SQ) and as verbs applications read a
// send CQ: with ORD 1, a READ the peer refuses is on the wire, a second READ waits for the credit and a SEND
// waits behind it; the TERMINATE completes the READ on the wire first (held by the receive half) with its
// cause (remote access error), then flushes the two still queued (held by the transmit half), whichever
// thread ran the receive half.
TEST_CASE("a TERMINATE flushes the send queue in posting order: the request on the wire first", "[verbs][memif]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, kAll);
        p.serve();
        p.wait_event(verbs::CmEventType::disconnected);
        const auto& t = p.qp->terminate_info();
        if (!t || t->received) throw std::runtime_error("server sent no TERMINATE");
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 4096, verbs::access::local_write);
        p.conn.initiator_depth = 1;  // ORD 1: the second READ waits in the send queue
        p.connect();
        const verbs::Sge s1 = p.mr->sge(0, 16), s2 = p.mr->sge(64, 16), s3 = p.mr->sge(128, 16);
        const verbs::SendWr wrs[] = {
            {.wr_id = 1, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
             .sg_list = {&s1, 1}, .rdma = {p.remote.addr, p.remote.rkey ^ 0x100u}},  // an STag the server refuses
            {.wr_id = 2, .opcode = verbs::WrOpcode::rdma_read, .send_flags = verbs::send_flags::signaled,
             .sg_list = {&s2, 1}, .rdma = {p.remote.addr, p.remote.rkey}},
            {.wr_id = 3, .opcode = verbs::WrOpcode::send, .send_flags = verbs::send_flags::signaled,
             .sg_list = {&s3, 1}},
        };
        if (!p.qp->post_send(wrs).ok()) throw std::runtime_error("post_send refused");
        p.wait_event(verbs::CmEventType::disconnected);
        const auto wc = p.wait_wc(3);
        std::string got;
        for (const auto& w : wc) got += " " + std::to_string(w.wr_id) + ":" + verbs::to_string(w.status);
        report("client completions:" + got);
        Peer::expect(wc[0], WcStatus::rem_access_err, WcOpcode::rdma_read, 1);
        Peer::expect(wc[1], WcStatus::wr_flush_err, WcOpcode::rdma_read, 2);
        Peer::expect(wc[2], WcStatus::wr_flush_err, WcOpcode::send, 3);
        return p.end(0);
    };
    check_outcomes(run_pair(server, client));
}

TEST_CASE("a CQ and an SRQ destroyed before the QP that uses them: the QP keeps them; flushing into them and "
          "destroying the QP afterwards stay safe (ASan run)",
          "[verbs][memif][lifetimes]") {
    auto server = [](const PeerConfig& cfg) {
        Peer p(cfg, 64, verbs::access::local_write);
        p.ctx->run_until([] { return false; }, 300ms);
        return p.end(0);
    };
    auto client = [](const PeerConfig& cfg) {
        Peer p(cfg, 256, verbs::access::local_write);
        auto cq = p.ctx->create_cq(16);
        auto srq = p.pd->create_srq({.max_wr = 8});
        auto plain = p.pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 4, .max_recv_wr = 4}});
        auto shared = p.pd->create_qp({.send_cq = cq.get(), .recv_cq = cq.get(), .cap = {.max_send_wr = 4}, .srq = srq.get()});
        for (std::uint64_t i = 0; i < 3; ++i) {
            const verbs::Sge s = p.mr->sge(64 * i, 64);
            const verbs::RecvWr r{.wr_id = i, .sg_list = {&s, 1}};
            if (!plain->post_recv({&r, 1}).ok() || !srq->post_recv({&r, 1}).ok()) throw std::runtime_error("post_recv");
        }
        // The handles go first, in the order libibverbs would refuse (EBUSY): the QPs hold what they use.
        cq.reset();
        srq.reset();
        // ERR flushes the plain QP's three receives into the CQ nobody holds a handle to any more.
        if (!plain->modify_state(verbs::QpState::err) || !shared->modify_state(verbs::QpState::err))
            throw std::runtime_error("modify to ERR refused");
        if (plain->state() != verbs::QpState::err || shared->state() != verbs::QpState::err)
            throw std::runtime_error("not in ERR");
        plain.reset();   // the CQ goes with the last QP using it
        shared.reset();  // the SRQ (and its three receives) too
        report("handles first, then the QPs: no fault");
        p.disconnected = true;
        return p.end(0);
    };
    const auto out = run_pair(server, client);
    check_outcomes(out);
    CHECK(out[1].report.find("handles first, then the QPs: no fault") != std::string::npos);
}
