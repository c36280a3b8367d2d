// SPDX-License-Identifier: MIT
// The drop-in libraries as a verbs program sees them, where they must behave as the kernel's do and stock
// programs depend on it (qperf first): a signal handler without SA_RESTART interrupts a blocking
// ibv_get_cq_event / rdma_get_cm_event with EINTR (the kernel's read() on the channel fd), one with SA_RESTART
// does not; a process-directed signal runs on a thread of the program, not on one the library started; and
// rdma_bind_addr to port 0 takes a free port at once (rdma_get_src_port before rdma_listen). Linked against the
// drop-in libraries; configured through SOFTRDMA_* (tests/dropin/meson.build): a memif server with no client,
// whose device opens without waiting for one (PortConfig::wait_for_link off).
#include <catch2/catch.hpp>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <set>
#include <thread>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_handled{0};
std::atomic<long> g_handler_tid{0};
void on_signal(int) {
    g_handled.fetch_add(1);
    g_handler_tid.store(::syscall(SYS_gettid));
}

void install(int sig, bool restart) {
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    REQUIRE(::sigaction(sig, &sa, nullptr) == 0);
    g_handled = 0;
}

void alarm_in(std::chrono::milliseconds ms) {
    itimerval t{};
    t.it_value.tv_sec = ms.count() / 1000;
    t.it_value.tv_usec = (ms.count() % 1000) * 1000;
    REQUIRE(::setitimer(ITIMER_REAL, &t, nullptr) == 0);
}

struct Device {
    ibv_device** list = nullptr;
    ibv_context* ctx = nullptr;
    Device() {
        int n = 0;
        list = ibv_get_device_list(&n);
        REQUIRE(list != nullptr);
        REQUIRE(n == 1);
        ctx = ibv_open_device(list[0]);
        REQUIRE(ctx != nullptr);
    }
    ~Device() {
        ibv_close_device(ctx);
        ibv_free_device_list(list);
    }
};

sockaddr_in addr(const char* ip, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

}  // namespace

TEST_CASE("ibv_get_cq_event: a SIGALRM handler without SA_RESTART interrupts the wait with EINTR", "[dropin][signals]") {
    Device d;
    ibv_comp_channel* ch = ibv_create_comp_channel(d.ctx);
    REQUIRE(ch != nullptr);
    ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, ch, 0);
    REQUIRE(cq != nullptr);
    REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
    install(SIGALRM, false);
    alarm_in(100ms);
    const auto t0 = Clock::now();
    const long me = ::syscall(SYS_gettid);
    ibv_cq* got = nullptr;
    void* cq_ctx = nullptr;
    errno = 0;
    const int rc = ibv_get_cq_event(ch, &got, &cq_ctx);
    const int err = errno;
    const auto waited = Clock::now() - t0;
    CHECK(rc == -1);
    CHECK(err == EINTR);
    CHECK(g_handled == 1);
    CHECK(g_handler_tid == me);
    CHECK(waited >= 90ms);
    CHECK(waited < 2s);
    REQUIRE(ibv_destroy_cq(cq) == 0);
    REQUIRE(ibv_destroy_comp_channel(ch) == 0);
}

TEST_CASE("rdma_get_cm_event: EINTR without SA_RESTART; with SA_RESTART the handler runs and the wait goes on "
          "until its event",
          "[dropin][signals]") {
    rdma_event_channel* ch = rdma_create_event_channel();
    REQUIRE(ch != nullptr);
    rdma_cm_event* ev = nullptr;
    SECTION("without SA_RESTART") {
        install(SIGALRM, false);
        alarm_in(100ms);
        errno = 0;
        CHECK(rdma_get_cm_event(ch, &ev) == -1);
        CHECK(errno == EINTR);
        CHECK(g_handled == 1);
    }
    SECTION("with SA_RESTART") {
        install(SIGALRM, true);
        rdma_cm_id* id = nullptr;
        std::thread later([&] {  // an event for the channel, well after the signal, which it never takes
            sigset_t alrm;
            sigemptyset(&alrm);
            sigaddset(&alrm, SIGALRM);
            pthread_sigmask(SIG_BLOCK, &alrm, nullptr);
            std::this_thread::sleep_for(400ms);
            if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return;
            sockaddr_in dst = addr("198.18.0.2", 7471);
            rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 1000);
        });
        alarm_in(100ms);
        const auto t0 = Clock::now();
        const int rc = rdma_get_cm_event(ch, &ev);
        const auto waited = Clock::now() - t0;
        later.join();
        CHECK(rc == 0);
        CHECK(g_handled == 1);
        CHECK(g_handler_tid == ::syscall(SYS_gettid));  // ran on the waiting thread, and the wait went on
        CHECK(waited >= 350ms);
        if (rc == 0) {
            CHECK(ev->event == RDMA_CM_EVENT_ADDR_RESOLVED);
            rdma_ack_cm_event(ev);
        }
        if (id != nullptr) rdma_destroy_id(id);
    }
    rdma_destroy_event_channel(ch);
}

TEST_CASE("a process-directed signal runs on a thread of the program, not on one the library started",
          "[dropin][signals]") {
    Device d;  // the library's threads are up (DPDK's, the link watcher, the progress thread)
    install(SIGUSR1, true);
    // The main thread blocks SIGUSR1; one thread of ours does not: the kernel must pick it.
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    REQUIRE(pthread_sigmask(SIG_BLOCK, &usr1, &old) == 0);
    std::atomic<long> ours{0};
    std::atomic<bool> stop{false};
    std::thread t([&] {
        sigset_t none;
        sigemptyset(&none);
        pthread_sigmask(SIG_SETMASK, &none, nullptr);
        ours = ::syscall(SYS_gettid);
        while (!stop) std::this_thread::sleep_for(1ms);
    });
    while (ours == 0) std::this_thread::sleep_for(1ms);
    for (int i = 0; i < 20; ++i) {
        const int before = g_handled;
        REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
        const auto deadline = Clock::now() + 2s;
        while (g_handled == before && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
        REQUIRE(g_handled == before + 1);
        CHECK(g_handler_tid == ours);
    }
    stop = true;
    t.join();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

TEST_CASE("rdma_bind_addr to port 0 takes a free port at once, distinct per id, given back with the id; a bound "
          "port is refused to another id as the kernel's rdma_cm refuses it",
          "[dropin][cm]") {
    rdma_event_channel* ch = rdma_create_event_channel();
    REQUIRE(ch != nullptr);
    std::set<std::uint16_t> ports;
    rdma_cm_id* ids[3] = {};
    for (rdma_cm_id*& id : ids) {
        REQUIRE(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
        sockaddr_in any = addr("0.0.0.0", 0);
        REQUIRE(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&any)) == 0);
        const std::uint16_t p = ntohs(rdma_get_src_port(id));
        CHECK(p >= 32768);
        CHECK(p < 49152);
        ports.insert(p);
        CHECK(rdma_listen(id, 0) == 0);  // the port is ours to listen on
    }
    CHECK(ports.size() == 3);
    for (rdma_cm_id* id : ids) CHECK(rdma_destroy_id(id) == 0);
    // A port one id holds, picked or given, listened on or not, is refused to another until that id is
    // destroyed, as the kernel's rdma_cm does (cma_check_port): EADDRNOTAVAIL when either bind names the
    // wildcard address, EADDRINUSE when both name the device's; RDMA_OPTION_ID_REUSEADDR on both lets the
    // second bind through (a second listener still fails). An id binds once (EINVAL after).
    const auto bind = [](rdma_cm_id* id, const char* ip, std::uint16_t port) {
        sockaddr_in a = addr(ip, port);
        errno = 0;
        return rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) == 0 ? 0 : errno;
    };
    const auto make = [&] {
        rdma_cm_id* id = nullptr;
        REQUIRE(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
        return id;
    };
    constexpr const char* kAny = "0.0.0.0";
    constexpr const char* kOurs = "198.18.0.1";  // the device's (tests/dropin/meson.build)
    rdma_cm_id* a = make();
    rdma_cm_id* b = make();
    CHECK(bind(a, kAny, 7472) == 0);
    CHECK(bind(a, kAny, 7473) == EINVAL);    // bound already
    CHECK(bind(b, kAny, 7472) == EADDRNOTAVAIL);
    CHECK(bind(b, kOurs, 7472) == EADDRNOTAVAIL);
    REQUIRE(rdma_listen(a, 0) == 0);
    CHECK(bind(b, kAny, 7472) == EADDRNOTAVAIL);  // listened on
    CHECK(bind(b, kAny, 0) == 0);
    const std::uint16_t picked = ntohs(rdma_get_src_port(b));
    rdma_cm_id* c = make();
    CHECK(bind(c, kAny, picked) == EADDRNOTAVAIL);  // picked by b
    rdma_destroy_id(a);
    CHECK(bind(c, kAny, 7472) == 0);  // free again with a gone
    CHECK(rdma_listen(c, 0) == 0);
    rdma_destroy_id(b);
    rdma_destroy_id(c);
    // Both on the device's address: EADDRINUSE; with REUSEADDR on both the bind goes through, the second
    // listen does not.
    rdma_cm_id* d = make();
    rdma_cm_id* e = make();
    CHECK(bind(d, kOurs, 7474) == 0);
    CHECK(bind(e, kOurs, 7474) == EADDRINUSE);
    int on = 1;
    CHECK(rdma_set_option(d, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on) == 0);
    CHECK(rdma_set_option(e, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on) == 0);
    CHECK(bind(e, kOurs, 7474) == 0);
    CHECK(rdma_listen(d, 0) == 0);
    CHECK(rdma_listen(e, 0) == -1);
    rdma_destroy_id(d);
    rdma_destroy_id(e);
    rdma_destroy_event_channel(ch);
}

TEST_CASE("rdma_resolve_addr binds an unbound id as the kernel's rdma_cm does: to the source given (the device's "
          "address or the wildcard) or to a free port, which its connection leaves from",
          "[dropin][cm]") {
    rdma_event_channel* ch = rdma_create_event_channel();
    REQUIRE(ch != nullptr);
    const auto make = [&] {
        rdma_cm_id* id = nullptr;
        REQUIRE(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
        return id;
    };
    const auto resolve = [](rdma_cm_id* id, const char* src_ip, std::uint16_t src_port) {
        sockaddr_in dst = addr("198.18.0.2", 7499);
        sockaddr_in src = addr(src_ip != nullptr ? src_ip : "0.0.0.0", src_port);
        errno = 0;
        return rdma_resolve_addr(id, src_ip != nullptr ? reinterpret_cast<sockaddr*>(&src) : nullptr,
                                 reinterpret_cast<sockaddr*>(&dst), 2000) == 0 ? 0 : errno;
    };
    const auto bind = [](rdma_cm_id* id, const char* ip, std::uint16_t port) {
        sockaddr_in a = addr(ip, port);
        errno = 0;
        return rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) == 0 ? 0 : errno;
    };
    const auto port_of = [](rdma_cm_id* id) { return ntohs(rdma_get_src_port(id)); };
    rdma_cm_id* a = make();
    CHECK(resolve(a, "192.0.2.7", 0) == EADDRNOTAVAIL);  // not this device's address
    CHECK(port_of(a) == 0);
    CHECK(resolve(a, "198.18.0.1", 7495) == 0);  // the device's address and a port
    CHECK(port_of(a) == 7495);
    const auto* local = reinterpret_cast<const sockaddr_in*>(rdma_get_local_addr(a));
    CHECK(local->sin_addr.s_addr == addr("198.18.0.1", 0).sin_addr.s_addr);
    rdma_cm_id* b = make();
    CHECK(bind(b, "0.0.0.0", 7495) == EADDRNOTAVAIL);  // held by a
    CHECK(resolve(b, nullptr, 0) == 0);  // no source: a free port
    CHECK(port_of(b) >= 32768);
    CHECK(port_of(b) < 49152);
    rdma_cm_id* c = make();
    CHECK(bind(c, "0.0.0.0", 7496) == 0);
    CHECK(resolve(c, nullptr, 0) == 0);  // bound already: stays on its port
    CHECK(port_of(c) == 7496);
    rdma_cm_id* d = make();
    CHECK(bind(d, "0.0.0.0", 7497) == 0);
    REQUIRE(rdma_listen(d, 0) == 0);
    CHECK(resolve(d, nullptr, 0) == EINVAL);  // a listener
    for (rdma_cm_id* id : {a, b, c, d}) CHECK(rdma_destroy_id(id) == 0);
    rdma_cm_id* e = make();
    CHECK(bind(e, "0.0.0.0", 7495) == 0);  // given back with a
    CHECK(rdma_destroy_id(e) == 0);
    rdma_destroy_event_channel(ch);
}

TEST_CASE("a synchronous id (no channel) waits for each call's event and keeps it; rdma_get_request needs one",
          "[dropin][cm]") {
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) == 0);
    REQUIRE(id->channel != nullptr);  // its own
    sockaddr_in dst = addr("198.18.0.2", 7480);
    REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0);
    REQUIRE(id->event != nullptr);
    CHECK(id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(id->pd != nullptr);  // the device's PD once the id has the device (rdma_reg_msgs uses it)
    REQUIRE(rdma_resolve_route(id, 2000) == 0);
    REQUIRE(id->event != nullptr);
    CHECK(id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED);
    // rdma_create_qp without CQs makes both, with completion channels and the id as their context.
    ibv_qp_init_attr attr{};
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    REQUIRE(rdma_create_qp(id, nullptr, &attr) == 0);
    REQUIRE(id->send_cq != nullptr);
    REQUIRE(id->recv_cq != nullptr);
    CHECK(id->send_cq != id->recv_cq);
    CHECK(id->send_cq->cq_context == id);
    CHECK(id->send_cq_channel != nullptr);
    CHECK(id->recv_cq_channel != nullptr);
    CHECK(id->qp->pd == id->pd);
    rdma_destroy_qp(id);
    CHECK(id->send_cq == nullptr);
    CHECK(id->recv_cq_channel == nullptr);
    CHECK(rdma_destroy_id(id) == 0);  // with the event it kept and its channel
    // rdma_get_request: synchronous listeners only.
    rdma_event_channel* ch = rdma_create_event_channel();
    REQUIRE(ch != nullptr);
    rdma_cm_id* async_id = nullptr;
    REQUIRE(rdma_create_id(ch, &async_id, nullptr, RDMA_PS_TCP) == 0);
    rdma_cm_id* got = nullptr;
    errno = 0;
    CHECK(rdma_get_request(async_id, &got) == -1);
    CHECK(errno == EINVAL);
    rdma_destroy_id(async_id);
    rdma_destroy_event_channel(ch);
}

TEST_CASE("a synchronous rdma_connect that fails returns its errno, and a disconnect after it fails at once",
          "[dropin][cm]") {
    // No peer on this link (a memif server without a client): the connect gives up after connect_retry_ms
    // (tests/dropin/meson.build sets it short).
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) == 0);
    sockaddr_in dst = addr("198.18.0.2", 7481);
    REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0);
    REQUIRE(rdma_resolve_route(id, 2000) == 0);
    ibv_qp_init_attr attr{};
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    REQUIRE(rdma_create_qp(id, nullptr, &attr) == 0);
    errno = 0;
    const auto t0 = Clock::now();
    CHECK(rdma_connect(id, nullptr) == -1);
    CHECK(errno != 0);
    CHECK(Clock::now() - t0 < 15s);
    REQUIRE(id->event != nullptr);
    CHECK(id->event->event != RDMA_CM_EVENT_ESTABLISHED);
    errno = 0;
    const auto t1 = Clock::now();
    CHECK(rdma_disconnect(id) == -1);  // nothing to wait for: the connection ended with its event taken
    CHECK(errno == EINVAL);
    CHECK(Clock::now() - t1 < 2s);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);
}
