// SPDX-License-Identifier: MIT
// A memif server must survive connections that leave before it greets them. DPDK 22.11's memif server accepts a
// connection on its interrupt thread, registers the connection's interrupt callback and sends HELLO; when the
// client has already gone, the send fails and the driver's error path closes the socket but leaves the callback
// registered, and the interrupt thread's next epoll rebuild panics ("Error adding fd N epoll_ctl, Bad file
// descriptor"): one connect() and close() on the socket's name, by any process that can reach it, killed the
// server (SIGABRT before io/memif_guard.cpp, "Connections the listener gave up on").
//
// Here such knocks come before any client and again while a real client is linked; the server must keep
// running, count the callbacks it removed, still let the real client in, keep its link through the second
// volley, exchange frames both ways each time, and close cleanly. And a connection greeted but not taken by a
// device must end when the server closes.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <rte_log.h>
#include <rte_malloc.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "io/eal.hpp"
#include "io/memif_guard.hpp"
#include "io/memif_layout.hpp"
#include "io/port.hpp"
#include "tests/support/memif_frames.hpp"
#include "tests/support/processes.hpp"

using namespace softrdma;
using namespace softrdma::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kWait = 20s;        // the link, a frame (sanitizer builds start their EAL slowly)
constexpr unsigned kKnocks = 200;  // per volley: nearly every one leaves before the interrupt thread accepts it

// Shared between the two processes (an anonymous shared mapping made before they fork).
struct Shared {
    std::atomic<int> phase{0};  // 1: the server opened and knocked; 2: the client got its first answer;
                                // 3: the server knocked again while linked
};
Shared* g_shared = nullptr;

void wait_phase(int at_least) {
    const auto deadline = Clock::now() + kWait;
    while (g_shared->phase.load() < at_least && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
}

// Connects to the server socket's name (the driver binds it abstract) and stays: the descriptor (-1 when refused).
int connect_to(const std::string& name) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::size_t n = std::min(name.size(), sizeof a.sun_path - 2);
    std::memcpy(a.sun_path + 1, name.data(), n);
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&a), static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n)) != 0) {
        ::close(s);
        return -1;
    }
    return s;
}

// Connects and leaves at once. True if connected.
bool knock(const std::string& name) {
    const int s = connect_to(name);
    if (s < 0) return false;
    ::close(s);
    return true;
}

// What the next receive on `fd` brings within `wait`: bytes (> 0), 0 at the end of the connection, -1 on an
// error (the connection reset), -2 when nothing came.
long next_message(int fd, std::chrono::milliseconds wait) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return -2;
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    return n >= 0 ? static_cast<long>(n) : -1;
}

unsigned volley(const std::string& name) {
    unsigned connected = 0;
    for (unsigned i = 0; i < kKnocks; ++i) {
        connected += knock(name) ? 1 : 0;
        if (i % 16 == 15) std::this_thread::sleep_for(1ms);  // let the interrupt thread take some in between
    }
    return connected;
}

io::PortConfig port_config(const std::string& socket, bool server) {
    io::PortConfig cfg;
    cfg.backend = Backend::memif;
    cfg.memif_socket = socket;
    cfg.memif_server = server;
    cfg.memif_zero_copy = false;
    cfg.mbufs = 0;  // sized by the rule
    cfg.link_timeout = kWait;
    cfg.wait_for_link = !server;
    return cfg;
}

int server(const std::string& socket) {
    io::EalConfig eal;
    eal.lcores = "0";
    auto port = io::open_port(port_config(socket, true), eal);
    // The driver logs each HELLO it could not send: 2 x kKnocks lines otherwise.
    rte_log_set_level_pattern("pmd.net.memif*", RTE_LOG_EMERG);
    const unsigned first = volley(socket);
    std::this_thread::sleep_for(200ms);  // the interrupt thread takes the rest of the backlog
    g_shared->phase.store(1);
    std::string err;
    if (!wait_link_up(*port, kWait)) err += " the client never came;";
    if (err.empty() && (receive_tag(*port, kWait) != 101 || !send_tag(*port, 201, kWait))) err += " no first exchange;";
    wait_phase(2);
    const unsigned second = err.empty() ? volley(socket) : 0;
    std::this_thread::sleep_for(200ms);
    const bool still_up = port->link_up();
    g_shared->phase.store(3);
    if (err.empty() && (receive_tag(*port, kWait) != 102 || !send_tag(*port, 202, kWait))) err += " no second exchange;";
    if (err.empty() && receive_tag(*port, kWait) != 103) err += " no acknowledgement;";  // only then may the link go
    const bool clean = port->close() == io::Port::CloseResult::clean;
    report("server: knocks=" + std::to_string(first) + "+" + std::to_string(second) +
           " wrapped=" + std::to_string(io::detail::memif_listeners_wrapped()) +
           " dropped=" + std::to_string(io::detail::memif_channels_dropped()) +
           " still_up=" + std::to_string(still_up ? 1 : 0) + " clean=" + std::to_string(clean ? 1 : 0) + err);
    return err.empty() ? 0 : 1;
}

int client(const std::string& socket) {
    wait_phase(1);
    io::EalConfig eal;
    eal.lcores = "1";
    auto port = io::open_port(port_config(socket, false), eal);
    std::string err;
    if (!send_tag(*port, 101, kWait) || receive_tag(*port, kWait) != 201) err += " no first answer;";
    g_shared->phase.store(2);
    wait_phase(3);
    if (err.empty() && (!send_tag(*port, 102, kWait) || receive_tag(*port, kWait) != 202 || !send_tag(*port, 103, kWait))) err += " no second answer;";
    const auto gone = Clock::now() + kWait;  // the server closes
    while (port->link_losses() == 0 && Clock::now() < gone) std::this_thread::sleep_for(1ms);
    const bool clean = port->close() == io::Port::CloseResult::clean;
    report("client: losses=" + std::to_string(port->link_losses()) + " clean=" + std::to_string(clean ? 1 : 0) + err);
    return err.empty() ? 0 : 1;
}

unsigned field(const std::string& report, const std::string& name) {
    const auto at = report.find(name + "=");
    return at == std::string::npos ? ~0u : static_cast<unsigned>(std::stoul(report.substr(at + name.size() + 1)));
}

}  // namespace

TEST_CASE("memif: a server survives connections that leave before its HELLO, before and while it is linked",
          "[io][memif]") {
    const std::string socket = "/run/" + unique_name("softrdma-hello-");
    void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    g_shared = new (mem) Shared;
    const auto out = run_roles({{"server", [&] { return server(socket); }}, {"client", [&] { return client(socket); }}}, 90s);
    ::munmap(mem, sizeof(Shared));
    INFO("server:\n" << out[0].report << "client:\n" << out[1].report);
    CHECK_FALSE(out[0].timed_out);
    CHECK_FALSE(out[1].timed_out);
    CHECK(out[0].exit_code == 0);  // 134 (SIGABRT) when the interrupt thread panicked
    CHECK(out[1].exit_code == 0);
    const std::string& s = out[0].report;
    CHECK(field(s, "wrapped") >= 1);
    CHECK(field(s, "dropped") >= 1);  // the driver gave up on some: their callbacks were removed
    CHECK(field(s, "still_up") == 1);
    CHECK(field(s, "clean") == 1);
    CHECK(field(out[1].report, "clean") == 1);
    CHECK(field(out[1].report, "losses") == 1);
}

// A connection the server accepted and greeted but that no device took (its client has not sent INIT yet) kept a
// pointer to the server's socket, which the driver frees when its last device closes; an INIT coming later had
// the interrupt thread follow it. The server's close must end such a connection instead (left open before).
TEST_CASE("memif: a connection no device took ends when its server closes", "[io][memif]") {
    const std::string socket = "/run/" + unique_name("softrdma-hello-");
    const auto out = run_roles({{"server", [&] {
                                    io::EalConfig eal;
                                    eal.lcores = "0";
                                    auto port = io::open_port(port_config(socket, true), eal);
                                    const int c = connect_to(socket);
                                    const long hello = c >= 0 ? next_message(c, 5s) : -3;
                                    const bool clean = port->close() == io::Port::CloseResult::clean;
                                    const long after = c >= 0 ? next_message(c, 3s) : -3;
                                    report("hello=" + std::to_string(hello) + " after=" + std::to_string(after + 10) +
                                           " clean=" + std::to_string(clean ? 1 : 0) +
                                           " ended=" + std::to_string(io::detail::memif_channels_ended()) +
                                           " freed=" + std::to_string(io::detail::memif_channels_freed()) +
                                           " listeners_closed=" + std::to_string(io::detail::memif_listeners_closed()));
                                    if (c >= 0) ::close(c);
                                    return 0;
                                }}},
                               60s);
    INFO(out[0].report);
    CHECK(out[0].exit_code == 0);
    CHECK(field(out[0].report, "hello") > 0);  // accepted and greeted
    // Then ended: 10 (end of file) or 9 (reset), not left open (8: nothing within 3 s).
    CHECK(field(out[0].report, "after") >= 9);
    CHECK(field(out[0].report, "after") <= 10);
    CHECK(field(out[0].report, "clean") == 1);
    CHECK(field(out[0].report, "ended") == 1);  // by the port's close (io/memif_guard.cpp, end_untaken_channels)
    CHECK(field(out[0].report, "freed") == 1);  // the driver's state of it too
    CHECK(field(out[0].report, "listeners_closed") == 1);
}

namespace {

unsigned open_descriptors() {
    unsigned n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
        ::closedir(d);
    }
    return n;
}

std::size_t dpdk_heap_bytes() {
    std::size_t bytes = 0;
    for (int s = 0; s < RTE_MAX_NUMA_NODES; ++s) {
        rte_malloc_socket_stats st{};
        if (rte_malloc_get_socket_stats(s, &st) == 0) bytes += st.heap_allocsz_bytes;
    }
    return bytes;
}

}  // namespace

// DPDK 22.11 leaves a closed server socket's listener open (and registered), and the state of each connection it
// greeted that no device took in its heap: a process opening and closing servers ran out of descriptors. Each
// cycle here opens a server, has a connection greeted and left untaken, and closes the server: from the second
// cycle on, neither this process's descriptors nor DPDK's heap may grow.
TEST_CASE("memif: servers opened and closed again and again leave no descriptor or channel behind", "[io][memif]") {
    const auto out = run_roles({{"server", [&] {
                                    io::EalConfig eal;
                                    eal.lcores = "0";
                                    std::string counts;
                                    unsigned fds_first = 0, fds_last = 0;
                                    std::size_t heap_first = 0, heap_last = 0;
                                    constexpr int kCycles = 6;
                                    for (int i = 0; i < kCycles; ++i) {
                                        const std::string socket = "/run/" + unique_name("softrdma-hello-");
                                        auto port = io::open_port(port_config(socket, true), eal);
                                        const int c = connect_to(socket);
                                        const long hello = c >= 0 ? next_message(c, 5s) : -3;
                                        const bool clean = port->close() == io::Port::CloseResult::clean;
                                        port.reset();
                                        if (c >= 0) ::close(c);
                                        const bool refused = !knock(socket);  // the name is free again
                                        counts += " [hello=" + std::to_string(hello) + " clean=" + std::to_string(clean) +
                                                  " refused=" + std::to_string(refused) +
                                                  " fds=" + std::to_string(open_descriptors()) +
                                                  " heap=" + std::to_string(dpdk_heap_bytes()) + "]";
                                        if (hello <= 0 || !clean || !refused) {
                                            report("cycle " + std::to_string(i) + " failed:" + counts);
                                            return 1;
                                        }
                                        if (i == 1) fds_first = open_descriptors(), heap_first = dpdk_heap_bytes();
                                        if (i == kCycles - 1) fds_last = open_descriptors(), heap_last = dpdk_heap_bytes();
                                    }
                                    report("fds_grew=" + std::to_string(fds_last - fds_first) +
                                           " heap_grew=" + std::to_string(heap_last > heap_first ? heap_last - heap_first : 0) +
                                           " ended=" + std::to_string(io::detail::memif_channels_ended()) +
                                           " freed=" + std::to_string(io::detail::memif_channels_freed()) +
                                           " listeners_closed=" + std::to_string(io::detail::memif_listeners_closed()) +
                                           counts);
                                    return 0;
                                }}},
                               120s);
    INFO(out[0].report);
    REQUIRE(out[0].exit_code == 0);
    CHECK(field(out[0].report, "fds_grew") == 0);
    CHECK(field(out[0].report, "heap_grew") == 0);
    CHECK(field(out[0].report, "ended") == 6);
    CHECK(field(out[0].report, "freed") == 6);
    CHECK(field(out[0].report, "listeners_closed") == 6);
}

namespace {

// The flags word of the one memif device in this process (DPDK 22.11's struct pmd_internals).
std::uint32_t* memif_flags() {
    std::uint16_t pid = 0;
    char name[RTE_ETH_NAME_MAX_LEN];
    RTE_ETH_FOREACH_DEV(pid) {
        if (rte_eth_dev_get_name_by_port(pid, name) != 0 || std::strncmp(name, "net_memif", 9) != 0) continue;
        const auto* dev = reinterpret_cast<const io::detail::EthDevHead*>(rte_eth_dev_allocated(name));
        if (dev == nullptr || dev->data == nullptr) return nullptr;
        const auto* data = reinterpret_cast<const io::detail::EthDevDataHead*>(dev->data);
        return &static_cast<io::detail::MemifPmdHead*>(data->dev_private)->flags;
    }
    return nullptr;
}

}  // namespace

// The close sets the device's refusing bit (DISABLED) and waits for the driver's disconnect, which clears its link
// flags in the same word with plain read-modify-writes on the interrupt thread: the bit can be lost, and then a
// client's INIT be taken by the closing device. Here the bit is taken away once, as such a write would, the
// moment it appears: the close must notice, set it again, and still end cleanly.
TEST_CASE("memif: a server's close keeps refusing connections when the driver's disconnect loses the bit",
          "[io][memif]") {
    const std::string socket = "/run/" + unique_name("softrdma-hello-");
    void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    g_shared = new (mem) Shared;
    const auto out = run_roles(
        {{"server",
          [&] {
              io::EalConfig eal;
              eal.lcores = "0";
              auto port = io::open_port(port_config(socket, true), eal);
              g_shared->phase.store(1);
              std::string err;
              if (!wait_link_up(*port, kWait) || receive_tag(*port, kWait) != 101 || !send_tag(*port, 201, kWait))
                  err += " no exchange;";
              std::uint32_t* flags = memif_flags();
              if (flags == nullptr) err += " no memif device found;";
              std::atomic<bool> cleared{false};
              std::thread loser([&] {
                  const auto until = Clock::now() + kWait;
                  while (flags != nullptr && Clock::now() < until) {
                      if ((__atomic_load_n(flags, __ATOMIC_ACQUIRE) & io::detail::kFlagDisabled) != 0) {
                          __atomic_fetch_and(flags, ~io::detail::kFlagDisabled, __ATOMIC_SEQ_CST);
                          cleared.store(true);
                          return;
                      }
                      std::this_thread::yield();
                  }
              });
              const bool clean = port->close() == io::Port::CloseResult::clean;
              loser.join();
              report("cleared=" + std::to_string(cleared.load() ? 1 : 0) + " restored=" +
                     std::to_string(port->refusals_restored()) + " clean=" + std::to_string(clean ? 1 : 0) + err);
              return err.empty() ? 0 : 1;
          }},
         {"client",
          [&] {
              wait_phase(1);
              io::EalConfig eal;
              eal.lcores = "1";
              auto port = io::open_port(port_config(socket, false), eal);
              const bool ok = send_tag(*port, 101, kWait) && receive_tag(*port, kWait) == 201;
              const auto gone = Clock::now() + kWait;  // the server closes
              while (port->link_losses() == 0 && Clock::now() < gone) std::this_thread::sleep_for(1ms);
              const bool clean = port->close() == io::Port::CloseResult::clean;
              report("ok=" + std::to_string(ok ? 1 : 0) + " losses=" + std::to_string(port->link_losses()) +
                     " clean=" + std::to_string(clean ? 1 : 0));
              return ok ? 0 : 1;
          }}},
        90s);
    ::munmap(mem, sizeof(Shared));
    INFO("server:\n" << out[0].report << "client:\n" << out[1].report);
    CHECK(out[0].exit_code == 0);
    CHECK(out[1].exit_code == 0);
    CHECK(field(out[0].report, "cleared") == 1);
    CHECK(field(out[0].report, "restored") >= 1);  // noticed and set again
    CHECK(field(out[0].report, "clean") == 1);
    CHECK(field(out[1].report, "losses") == 1);
    CHECK(field(out[1].report, "clean") == 1);
}
