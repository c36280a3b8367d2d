// SPDX-License-Identifier: MIT
#include "bench/perf/session.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/perf/output.hpp"
#include "bench/perf/stats.hpp"
#include "tests/support/processes.hpp"
#include "verbs/engine.hpp"  // white-box: the stack and port behind a Context (impl())
#include <softrdma/diagnostics.hpp>
#include <softrdma/verbs.hpp>

namespace softrdma::perf {
namespace {

using namespace std::chrono_literals;
using verbs::WcOpcode;
using verbs::WcStatus;
using verbs::WorkCompletion;

// ---- buffer layout ---------------------------------------------------------------------------------------
// One MR per end, the same layout on both (computed from max_size and depth), so each end knows the other's
// offsets from its base address:
//   rx[A|B|C]  where the peer's messages land (SEND receives, WRITE targets, READ sinks)
//   tx[A|B|C]  what this end sends (SEND/WRITE sources, READ sources for the peer)
//   A = the first timed message, B = the last, C = every other (warmup included). A and B are checked in full
//   after the phase, outside the timed loop; C is reused as perftest reuses its one buffer.
//   ctrl_tx, ctrl_rx[2] (alternating by phase), credit word, atomic counter, atomic result slots.
struct Layout {
    std::size_t slot{0};
    std::size_t rx[3]{}, tx[3]{};
    std::size_t ctrl_tx{0}, ctrl_rx[2]{}, credit{0}, credit_src{0}, counter{0}, results{0};
    std::size_t total{0};
    std::uint32_t nresults{0};

    Layout(std::uint32_t max_size, std::uint32_t depth) {
        slot = (static_cast<std::size_t>(max_size) + 63) & ~std::size_t{63};
        std::size_t off = 0;
        for (auto& r : rx) r = off, off += slot;
        for (auto& t : tx) t = off, off += slot;
        ctrl_tx = off, off += 64;
        for (auto& c : ctrl_rx) c = off, off += 64;
        credit = off, off += 64;
        credit_src = off, off += 64;
        counter = off, off += 64;
        results = off;
        nresults = depth + 2;  // [0] first, [1] last, [2 + m % depth] the others
        off += 8ull * nresults;
        total = (off + 4095) & ~std::size_t{4095};
    }
};

// Control message: phase barrier and verdict, and with --layers the server's cycles by layer in the phase
// before (its main thread's five layers; 0 cycles_per_ns: none). One 64-byte control slot, sent inline.
struct Ctrl {
    std::uint32_t magic{0};
    std::uint32_t phase{0};
    std::uint32_t status{0};  // 0: the content this end received in the previous phase was right
    std::uint32_t pad{0};
    double cycles_per_ns{0};
    std::uint64_t io{0}, lwip{0}, mpa{0}, ddp_rdmap{0}, verbs{0};
};
static_assert(sizeof(Ctrl) == 64);  // Layout's control slots; QpCap::max_inline_data
constexpr std::uint32_t kCtrlMagic = 0x4354524c;  // "CTRL"

// wr_id = tag | message index.
constexpr std::uint64_t kTagMask = 0xfull << 60;
constexpr std::uint64_t kData = 0;
constexpr std::uint64_t kCtrlTag = 1ull << 60;
constexpr std::uint64_t kCreditTag = 2ull << 60;

constexpr std::uint64_t kAtomicAdd = 1;
std::uint64_t atomic_base(std::uint32_t phase) { return 0x0123456700000000ull + (std::uint64_t{phase} << 20); }
// Pattern seeds: direction (0 client -> server, 1 server -> client), phase, which buffer (A, B, C).
std::uint64_t seed(unsigned dir, std::uint32_t phase, unsigned which) {
    return 0x5eed0000ull + dir * 1000003ull + phase * 16ull + which;
}
// WRITE latency: the last byte of message m, which the receiver polls for (never 0, the cleared value; two
// consecutive messages into C always differ).
std::uint8_t marker(std::uint32_t m) { return static_cast<std::uint8_t>(1 + m % 251); }

struct Mapping {
    std::byte* p{nullptr};
    std::size_t n{0};
    explicit Mapping(std::size_t bytes) : n(bytes) {
        void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (m == MAP_FAILED) throw std::runtime_error("cannot map " + std::to_string(n) + " bytes");
        p = static_cast<std::byte*>(m);
    }
    ~Mapping() { ::munmap(p, n); }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
};

[[noreturn]] [[gnu::noinline]] void fail(const std::string& what) { throw std::runtime_error(what); }


// One end. Members are destroyed in reverse order: connection objects before the Context.
class Peer {
public:
    Peer(const test::PeerConfig& pc, const Options& o, double tpu, bool server)
        : pc_(pc), o_(o), tpu_(tpu), server_(server), dir_(server ? 1u : 0u) {
        verbs::ContextConfig cc;
        cc.port = pc.port;
        cc.port.memif_zero_copy = o.memif_zero_copy;  // (the server end ignores it)
        cc.port.memif_own_server_path = o.memif_own_server_path;  // (the client end ignores it)
        cc.port.memif_borrow_rx = o.memif_borrow_rx;
        cc.port.memif_pre_own = o.memif_pre_own;
        cc.eal = pc.eal;
        cc.ip = pc.stack.ip;
        cc.max_mr = 16;
        cc.max_qp = 4;
        cc.threading.mode = o.threading == "rx-thread" ? ThreadingMode::rx_thread : ThreadingMode::run_to_completion;
        cc.layer_cycles = o.layers;
        cc.large_segments = o.large_segments;
        ctx_ = verbs::Context::open(cc);
        baseline_ = ctx_->impl().stack().pool_usage();
        pd_ = ctx_->alloc_pd();
        stall_ = static_cast<std::uint64_t>(static_cast<double>(o.timeout_s) * 1e6 * tpu);
        const unsigned yield_after = o.yield_after != ~0u ? o.yield_after : (o.threading == "rx-thread" ? 64 : 0);
        idle_ = Idler(yield_after == 0 ? IdlePolicy::spin_only() : IdlePolicy{.spin_turns = yield_after});
    }

    int client() {
        p_ = o_.params;
        build();
        WireParams wp = p_;
        wp.addr = mr_->addr();
        wp.rkey = mr_->rkey();
        wp.length = static_cast<std::uint32_t>(mr_->length());
        const verbs::ConnParam cp{.private_data = {reinterpret_cast<const std::byte*>(&wp), sizeof wp},
                                  .responder_resources = static_cast<std::uint16_t>(p_.outs),
                                  .initiator_depth = static_cast<std::uint16_t>(p_.outs),
                                  .crc = o_.crc ? CrcPolicy::required : CrcPolicy::off,
                                  .rfc7306 = p_.test == Test::atomic};  // both ends agree (RFC 7306 is out of band)
        // The server may not listen yet (started at the same time, or later by hand): retry a refused
        // connect until the timeout.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(o_.timeout_s);
        for (;;) {
            id_ = ctx_->connect(pc_.peer, pc_.tcp_port, *qp_, cp);
            auto ev = ctx_->wait_cm_event(std::chrono::seconds(o_.timeout_s));
            if (!ev) fail("no answer from " + pc_.peer.str() + " within the timeout");
            if (ev->type == verbs::CmEventType::established) {
                if (ev->private_data.size != sizeof(WireRegion)) {
                    // Not an rdma_perf server (stock tools accept with none): close in order, then say so.
                    const std::string who = id_->peer();
                    end_quietly();
                    fail("the server at " + who + " is not an rdma_perf server: it accepted with " +
                         std::to_string(ev->private_data.size) + " bytes of private data, rdma_perf sends " +
                         std::to_string(sizeof(WireRegion)));
                }
                std::memcpy(&remote_, ev->private_data.bytes.data(), sizeof remote_);
                break;
            }
            if (ev->type == verbs::CmEventType::rejected)
                fail("the server at " + id_->peer() + " rejected the connection: " + text_of(ev->private_data));
            if (ev->type != verbs::CmEventType::unreachable || std::chrono::steady_clock::now() >= until)
                fail(std::string("connect: ") + verbs::to_string(ev->type) + " " + ev->reason);
            id_.reset();
            qp_.reset();
            cq_.reset();
            make_qp();
            ctx_->run_until([] { return false; }, 100ms);
        }
        print_banner(stdout, p_, o_, verbs::diagnostics::memif_zero_copy(*ctx_));
        print_header(stdout, p_.kind);

        const std::size_t nph = phases_.size();
        std::uint32_t status = 0, peer_status = 0;
        for (std::uint32_t k = 0; k <= nph; ++k) {
            std::string why;
            if (k > 0) {
                const std::uint32_t st = verify(k - 1, why);
                if (st != 0) std::fprintf(stderr, "rdma_perf client: %u bytes: %s\n", phases_[k - 1].size, why.c_str());
                status |= st;
            }
            if (k < nph) setup(k);
            send_ctrl(k, status);
            const Ctrl c = wait_ctrl(k);
            if (o_.layers && k > 0 && c.cycles_per_ns > 0) print_server_layers(c, phases_[k - 1]);
            if (c.status != 0 && peer_status == 0)
                std::fprintf(stderr, "rdma_perf client: the server found wrong content (phase %u); see its output\n", k - 1);
            peer_status |= c.status;
            if (k < nph) run_client_phase(k);
        }
        if (!o_.json.empty()) {
            if (status == 0 && peer_status == 0) write_json(o_.json, p_, o_, lat_, bw_);
            else std::fprintf(stderr, "rdma_perf client: no JSON written (content check failed)\n");
        }
        return end(status != 0 || peer_status != 0 ? 5 : 0);
    }

    int server() {
        listener_ = ctx_->listen(pc_.tcp_port);
        // A server started by hand waits for its client as long as a run may last (--deadline); in --local
        // mode the client starts at the same time and gives up connecting after --timeout, so the server
        // gives up after twice that.
        const unsigned wait_s = o_.mode == Mode::server ? o_.deadline_s : 2 * o_.timeout_s + 5;
        // A request that is not an rdma_perf client's (stock tools send no private data) is refused with an MPA
        // reject saying why, and the wait goes on.
        std::optional<verbs::CmEvent> ev;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
        for (;;) {
            ev.reset();
            while (!ev && std::chrono::steady_clock::now() < until) {
                ev = ctx_->wait_cm_event(1s);
                if (ev && ev->type != verbs::CmEventType::connect_request) ev.reset();  // a refused one's end
            }
            if (!ev) fail("no client within " + std::to_string(wait_s) + " s");
            const std::string why = check_client(ev->private_data);
            if (why.empty()) break;
            std::fprintf(stderr, "rdma_perf server: refused a connection from %s: %s\n", ev->request->peer().c_str(),
                         why.c_str());
            const std::string text = "rdma_perf server: " + why;
            if (!ev->request->reject({reinterpret_cast<const std::byte*>(text.data()), std::min<std::size_t>(text.size(), 252)}))
                std::fprintf(stderr, "rdma_perf server: the reject could not be sent\n");
        }
        std::memcpy(&p_, ev->private_data.bytes.data(), sizeof p_);
        remote_ = {p_.addr, p_.rkey, p_.length};
        build();
        id_ = std::move(ev->request);
        const WireRegion me{mr_->addr(), mr_->rkey(), static_cast<std::uint32_t>(mr_->length())};
        if (!id_->accept(*qp_, {.private_data = {reinterpret_cast<const std::byte*>(&me), sizeof me},
                                .responder_resources = static_cast<std::uint16_t>(p_.outs),
                                .initiator_depth = static_cast<std::uint16_t>(p_.outs),
                                .crc = o_.crc ? CrcPolicy::required : CrcPolicy::off,
                                .rfc7306 = p_.test == Test::atomic}))
            fail("accept refused");
        auto est = ctx_->wait_cm_event(std::chrono::seconds(o_.timeout_s));
        if (!est || est->type != verbs::CmEventType::established)
            fail(std::string("not established: ") + (est ? verbs::to_string(est->type) : "no event"));
        if (o_.mode == Mode::server) {
            std::printf("# rdma_perf server: test %s %s, %zu size(s)\n", to_string(p_.test), to_string(p_.kind),
                        phases_.size());
            std::fflush(stdout);
        }

        const std::size_t nph = phases_.size();
        std::uint32_t status = 0;
        for (std::uint32_t k = 0; k <= nph; ++k) {
            const Ctrl c = wait_ctrl(k);
            (void)c;
            std::string why;
            if (k > 0) {
                const std::uint32_t st = verify(k - 1, why);
                if (st != 0) std::fprintf(stderr, "rdma_perf server: %u bytes: %s\n", phases_[k - 1].size, why.c_str());
                status |= st;
            }
            if (k < nph) setup(k);
            send_ctrl(k, status);
            if (k < nph) run_server_phase(k);
        }
        return end(status != 0 ? 5 : 0);
    }

private:
    // ---- setup (control path: allocates) ----
    void build() {
        phases_ = plan(p_);
        layout_.emplace(p_.max_size, p_.depth);
        mem_ = std::make_unique<Mapping>(layout_->total);
        mr_ = pd_->reg_mr({mem_->p, layout_->total}, verbs::access::local_write | verbs::access::remote_write |
                                                          verbs::access::remote_read | verbs::access::remote_atomic);
        std::uint32_t max_iters = 0, max_marks = 0;
        for (const Phase& ph : phases_) {
            max_iters = std::max(max_iters, ph.iters);
            max_marks = std::max(max_marks, ph.iters / p_.cq_mod + 3);
        }
        samples_.resize(max_iters);
        marks_.resize(max_marks);
        wrs_.resize(p_.depth);
        sges_.resize(p_.depth);
        for (std::uint32_t j = 0; j < p_.depth; ++j) wrs_[j].sg_list = {&sges_[j], 1};
        lat_.reserve(phases_.size());
        bw_.reserve(phases_.size());
        make_qp();
    }
    void make_qp() {
        const verbs::QpCap cap{.max_send_wr = p_.depth + 8, .max_recv_wr = p_.rx_depth + 4, .max_send_sge = 1,
                               .max_recv_sge = 1, .max_inline_data = std::max<std::uint32_t>(64, p_.inline_size)};
        cq_ = ctx_->create_cq(cap.max_send_wr + cap.max_recv_wr);
        qp_ = pd_->create_qp({.send_cq = cq_.get(), .recv_cq = cq_.get(), .cap = cap});
        ctrl_posted_ = ctrl_got_ = 0;
        post_ctrl_recv();  // R_ctrl(0), before the connection
    }

    std::byte* at(std::size_t off) const { return mem_->p + off; }
    std::uint64_t addr(std::size_t off) const { return mr_->addr() + off; }

    // Which buffer message m of the current phase uses: 0 = A (first timed), 1 = B (last), 2 = C.
    unsigned which(std::uint32_t m) const {
        if (m == first_) return 0;
        if (m == last_) return 1;
        return 2;
    }
    bool receives_data() const {
        if (p_.test != Test::send) return false;
        return p_.kind == Kind::lat || server_;
    }

    // Before phase k's barrier: clear what the peer will fill, write what we will send, post receives.
    void setup(std::uint32_t k) {
        ph_ = phases_[k];
        phase_ = k;
        first_ = ph_.warmup;
        last_ = ph_.total() - 1;
        const std::size_t n = ph_.size;
        for (unsigned w = 0; w < 3; ++w) {
            std::memset(at(layout_->rx[w]), 0, n);
            test::fill_pattern(seed(dir_, k, w), 0, {at(layout_->tx[w]), n});
        }
        if (p_.test == Test::write && p_.kind == Kind::lat) {
            *reinterpret_cast<std::uint8_t*>(at(layout_->tx[0] + n - 1)) = marker(first_);
            *reinterpret_cast<std::uint8_t*>(at(layout_->tx[1] + n - 1)) = marker(last_);
        }
        if (p_.test == Test::atomic) {
            const std::uint64_t v = atomic_base(k);
            std::memcpy(at(layout_->counter), &v, 8);
            std::memset(at(layout_->results), 0, 8ull * layout_->nresults);
        }
        received_ = 0;
        recv_posted_ = 0;
        if (receives_data()) {
            const std::uint32_t initial = std::min(p_.rx_depth, ph_.total());
            for (std::uint32_t i = 0; i < initial; ++i) post_data_recv();
        } else {
            post_ctrl_recv();
        }
        if (p_.test == Test::send && p_.kind == Kind::bw && server_) post_credit(true);
    }

    // ---- receives, control messages, credits ----
    void post_data_recv() {
        const std::uint32_t m = recv_posted_++;
        const verbs::Sge sge = mr_->sge(layout_->rx[which(m)], ph_.size);
        const verbs::RecvWr wr{.wr_id = kData | m, .sg_list = {&sge, 1}};
        if (const auto r = qp_->post_recv({&wr, 1}); !r.ok()) fail(std::string("post_recv: ") + verbs::to_string(r.err));
        ++recv_total_;
        // The next phase's control message lands after this phase's last data message: its receive goes
        // right behind the last data receive.
        if (recv_posted_ == ph_.total()) post_ctrl_recv();
    }
    void post_ctrl_recv() {
        const std::uint32_t k = ctrl_posted_++;
        const verbs::Sge sge = mr_->sge(layout_->ctrl_rx[k % 2], sizeof(Ctrl));
        const verbs::RecvWr wr{.wr_id = kCtrlTag | k, .sg_list = {&sge, 1}};
        if (const auto r = qp_->post_recv({&wr, 1}); !r.ok()) fail(std::string("post_recv (control): ") + verbs::to_string(r.err));
    }
    void send_ctrl(std::uint32_t k, std::uint32_t status) {
        Ctrl c{.magic = kCtrlMagic, .phase = k, .status = status};
        if (server_ && o_.layers && k > 0) {
            const verbs::LayerCycles l = verbs::diagnostics::layer_cycles(*ctx_).since(server_l0_);
            c.cycles_per_ns = l.cycles_per_ns;
            c.io = l.io, c.lwip = l.lwip, c.mpa = l.mpa, c.ddp_rdmap = l.ddp_rdmap, c.verbs = l.verbs;
        }
        std::memcpy(at(layout_->ctrl_tx), &c, sizeof c);
        const verbs::Sge sge = mr_->sge(layout_->ctrl_tx, sizeof c);
        const verbs::SendWr wr{.wr_id = kCtrlTag | k, .opcode = verbs::WrOpcode::send,
                               .send_flags = verbs::send_flags::inline_data, .sg_list = {&sge, 1}};
        arm();
        for (;;) {
            const auto r = qp_->post_send({&wr, 1});
            if (r.ok()) return;
            if (r.err != verbs::PostErrc::queue_full) fail(std::string("post_send (control): ") + verbs::to_string(r.err));
            turn([](const WorkCompletion&) {});
        }
    }
    Ctrl wait_ctrl(std::uint32_t k) {
        arm();
        while (ctrl_got_ <= k) turn([](const WorkCompletion& wc) {
            if (wc.opcode == WcOpcode::recv) fail("a data message outside a phase");
        });
        if (last_ctrl_.magic != kCtrlMagic || last_ctrl_.phase != k)
            fail("control message out of step (phase " + std::to_string(last_ctrl_.phase) + ", wanted " +
                 std::to_string(k) + ")");
        return last_ctrl_;
    }
    // SEND flow control (iWARP has no receiver-not-ready retry: a SEND without a posted receive is fatal):
    // the receiver WRITEs its running count of posted data receives into the sender's credit word, every
    // `credit_batch` receives and when a phase's receives are all posted.
    void post_credit(bool force) {
        const std::uint32_t batch = std::max<std::uint32_t>(1, p_.rx_depth / 8);
        if (recv_total_ == credit_sent_ || (!force && recv_total_ - credit_sent_ < batch && recv_posted_ < ph_.total()))
            return;
        std::memcpy(at(layout_->credit_src), &recv_total_, 8);
        const verbs::Sge sge = mr_->sge(layout_->credit_src, 8);
        verbs::SendWr wr{.wr_id = kCreditTag, .opcode = verbs::WrOpcode::rdma_write,
                         .send_flags = verbs::send_flags::inline_data, .sg_list = {&sge, 1}};
        wr.rdma.remote_addr = remote_.addr + layout_->credit;
        wr.rdma.rkey = remote_.rkey;
        const auto r = qp_->post_send({&wr, 1});
        if (r.ok()) credit_sent_ = recv_total_;
        else if (r.err != verbs::PostErrc::queue_full) fail(std::string("post_send (credit): ") + verbs::to_string(r.err));
    }
    std::uint64_t credit() const {
        return *reinterpret_cast<const volatile std::uint64_t*>(at(layout_->credit));
    }

    // ---- the polling turn ----
    // Two limits. A wait with no frame and no completion for --timeout fails (deadline_, checked every idle
    // turn). And once per --timeout (checkpoint_) payload must have moved or something completed: frames alone
    // do not count there, or an established connection's TCP keepalive probes (after 3 s idle) would keep a
    // transfer that stopped moving alive until --deadline.
    void arm() {
        const std::uint64_t now = tsc();
        deadline_ = checkpoint_ = now + stall_;
        moved_at_checkpoint_ = moved();
    }
    // Payload bytes framed and placed, and completions, so far: grows while anything moves.
    std::uint64_t moved() const {
        return verbs::diagnostics::tx_copies(*ctx_).payload_bytes + verbs::diagnostics::rx_copies(*ctx_).payload_bytes +
               completions_;
    }
    [[gnu::noinline]] void at_checkpoint(std::uint64_t now) {
        const std::uint64_t m = moved();
        if (m == moved_at_checkpoint_) stalled(" (frames only)");
        moved_at_checkpoint_ = m;
        checkpoint_ = now + stall_;
    }
    [[gnu::noinline]] void stalled(const char* what = "") {
        fail(std::string("no progress for ") + std::to_string(o_.timeout_s) + " s" + what + " (QP " +
             verbs::to_string(qp_->state()) + "; phase " + std::to_string(phase_) + ", " +
             std::to_string(received_) + " received, " + std::to_string(completed_) + " completed): peer gone?");
    }
    [[gnu::noinline]] void bad_wc(const WorkCompletion& wc) {
        std::string t;
        if (const auto& ti = qp_->terminate_info())
            t = std::string(", TERMINATE ") + (ti->received ? "received" : "sent") + " layer " +
                std::to_string(static_cast<int>(ti->code.layer)) + " etype " + std::to_string(ti->code.etype) +
                " ecode " + std::to_string(ti->code.ecode);
        fail(std::string("completion ") + verbs::to_string(wc.status) + " (opcode " +
             std::to_string(static_cast<int>(wc.opcode)) + ", wr_id " + std::to_string(wc.wr_id & ~kTagMask) +
             ", QP " + verbs::to_string(qp_->state()) + t + ")");
    }
    // One Context turn, then every completion: control receives here, the rest to on_data. A turn that
    // received frames or completed something pushes the stall deadline on.
    template <class F>
    void turn(F&& on_data) {
        const unsigned frames = ctx_->poll();
        std::size_t n;
        bool progress = frames != 0;
        while ((n = cq_->poll(wcs_)) != 0) {
            progress = true;
            completions_ += n;
            for (std::size_t i = 0; i < n; ++i) {
                const WorkCompletion& wc = wcs_[i];
                if (wc.status != WcStatus::success) [[unlikely]] bad_wc(wc);
                const std::uint64_t tag = wc.wr_id & kTagMask;
                if (tag == kData) {
                    on_data(wc);
                } else if (tag == kCtrlTag && wc.opcode == WcOpcode::recv) {
                    std::memcpy(&last_ctrl_, at(layout_->ctrl_rx[ctrl_got_ % 2]), sizeof last_ctrl_);
                    ++ctrl_got_;
                }
            }
        }
        const std::uint64_t now = tsc();
        if (now > checkpoint_) [[unlikely]] at_checkpoint(now);
        if (progress) {
            deadline_ = now + stall_;
            idle_.busy();
        } else {
            if (now > deadline_) [[unlikely]] stalled();
            // Idle policy: with an RX thread each process has two busy threads; on a small machine an idle
            // application thread yields its core after --yield-after idle turns (0 = always spin).
            idle_.idle();
        }
    }
    void on_recv(const WorkCompletion& wc) {
        if (wc.opcode != WcOpcode::recv) return;
        if (wc.byte_len != ph_.size) [[unlikely]]
            fail("received " + std::to_string(wc.byte_len) + " bytes, expected " + std::to_string(ph_.size));
        ++received_;
        if (recv_posted_ < ph_.total()) post_data_recv();
    }

    // ---- work requests ----
    void fill_wr(verbs::SendWr& wr, verbs::Sge& sge, std::uint32_t m) {
        const unsigned w = which(m);
        const std::uint32_t size = ph_.size;
        wr.wr_id = kData | m;
        // Signaled: every cq_mod-th, the last, and the last warmup message (bw_client waits for it).
        wr.send_flags = ((m + 1) % p_.cq_mod == 0 || m == last_ || m + 1 == first_) ? verbs::send_flags::signaled : 0;
        switch (p_.test) {
        case Test::send:
        case Test::write:
            sge = mr_->sge(layout_->tx[w], size);
            if (size <= p_.inline_size) wr.send_flags |= verbs::send_flags::inline_data;
            wr.opcode = p_.test == Test::send ? verbs::WrOpcode::send : verbs::WrOpcode::rdma_write;
            wr.rdma.remote_addr = remote_.addr + layout_->rx[w];
            wr.rdma.rkey = remote_.rkey;
            break;
        case Test::read:
            sge = mr_->sge(layout_->rx[w], size);
            wr.opcode = verbs::WrOpcode::rdma_read;
            wr.rdma.remote_addr = remote_.addr + layout_->tx[w];
            wr.rdma.rkey = remote_.rkey;
            break;
        case Test::atomic: {
            const std::uint32_t slot = w < 2 ? w : 2 + m % p_.depth;
            sge = mr_->sge(layout_->results + 8ull * slot, 8);
            wr.opcode = verbs::WrOpcode::atomic_fetch_and_add;
            wr.atomic.remote_addr = remote_.addr + layout_->counter;
            wr.atomic.compare_add = kAtomicAdd;
            wr.atomic.rkey = remote_.rkey;
            break;
        }
        }
    }
    void post_one(std::uint32_t m) {
        fill_wr(wrs_[0], sges_[0], m);
        for (;;) {
            const auto r = qp_->post_send({wrs_.data(), 1});
            if (r.ok()) return;
            if (r.err != verbs::PostErrc::queue_full) [[unlikely]] fail(std::string("post_send: ") + verbs::to_string(r.err));
            turn([this](const WorkCompletion& wc) { on_recv(wc); });
        }
    }
    std::uint8_t last_byte(unsigned w) const {
        return *reinterpret_cast<const volatile std::uint8_t*>(at(layout_->rx[w] + ph_.size - 1));
    }

    // ---- phases ----
    void run_client_phase(std::uint32_t k) {
        (void)k;
        const verbs::LayerCycles l0 = o_.layers ? verbs::diagnostics::layer_cycles(*ctx_) : verbs::LayerCycles{};
        const verbs::TxCopyStats tx0 = verbs::diagnostics::tx_copies(*ctx_);
        if (p_.kind == Kind::lat) lat_client();
        else bw_client();
        if (o_.layers) {  // warmup included: the same per-message work
            const verbs::TxCopyStats tx1 = verbs::diagnostics::tx_copies(*ctx_);
            const verbs::TxCopyStats tx{tx1.payload_bytes - tx0.payload_bytes, tx1.copied_bytes - tx0.copied_bytes};
            std::printf("# client TX copies per payload byte: %.3f (%llu payload bytes framed)\n",
                        tx.copies_per_payload_byte(), static_cast<unsigned long long>(tx.payload_bytes));
            const std::uint64_t msgs = std::uint64_t{ph_.iters} + ph_.warmup;
            std::printf("# client cycles per %s by layer:\n", p_.kind == Kind::lat ? "iteration" : "message");
            print_table(verbs::diagnostics::layer_cycles(*ctx_).since(l0).table(msgs));
        }
    }
    void run_server_phase(std::uint32_t k) {
        // Counted up to the next control message (send_ctrl): a WRITE or READ phase's data is handled while
        // the server waits for it, after serve_phase() has returned.
        if (o_.layers) server_l0_ = verbs::diagnostics::layer_cycles(*ctx_);
        serve_phase(k);
    }
    // The server's table, which it sent in the control message after the phase: below the client's.
    void print_server_layers(const Ctrl& c, const Phase& ph) const {
        verbs::LayerCycles l;
        l.cycles_per_ns = c.cycles_per_ns;
        l.io = c.io, l.lwip = c.lwip, l.mpa = c.mpa, l.ddp_rdmap = c.ddp_rdmap, l.verbs = c.verbs;
        std::printf("# server cycles per %s by layer:\n", p_.kind == Kind::lat ? "iteration" : "message");
        print_table(l.table(ph.total()));
    }
    static void print_table(const std::string& t) {
        for (std::size_t at = 0; at < t.size();) {
            const std::size_t nl = t.find('\n', at);
            std::printf("#   %s\n", t.substr(at, nl - at).c_str());
            at = nl == std::string::npos ? t.size() : nl + 1;
        }
        std::fflush(stdout);  // the forked client ends with _exit
    }
    void serve_phase(std::uint32_t) {
        if (p_.kind == Kind::lat && p_.test == Test::send) send_lat_server();
        else if (p_.kind == Kind::lat && p_.test == Test::write) write_lat_server();
        else if (p_.kind == Kind::bw && p_.test == Test::send) send_bw_server();
        // write bw, read, atomic: the server's CPU only answers inside Context::poll() (wait_ctrl turns it).
    }

    // Ping-pong / request-response, one message in flight; samples in TSC ticks.
    void lat_client() {
        const std::uint32_t total = ph_.total();
        arm();
        for (std::uint32_t m = 0; m < total; ++m) {
            const unsigned w = which(m);
            if (p_.test == Test::write && w == 2)
                *reinterpret_cast<std::uint8_t*>(at(layout_->tx[2] + ph_.size - 1)) = marker(m);
            const std::uint64_t t0 = tsc();
            post_one(m);
            switch (p_.test) {
            case Test::send:
                while (received_ <= m) turn([this](const WorkCompletion& wc) { on_recv(wc); });
                break;
            case Test::write:
                while (last_byte(w) != marker(m)) turn([](const WorkCompletion&) {});
                break;
            case Test::read:
            case Test::atomic:
                while (completed_ <= m) turn([this](const WorkCompletion& wc) { completed_ = (wc.wr_id & ~kTagMask) + 1; });
                break;
            }
            const std::uint64_t t1 = tsc();
            if (m >= first_) samples_[m - first_] = t1 - t0;
        }
        completed_ = 0;
        const double div = (p_.test == Test::send || p_.test == Test::write) ? 2.0 : 1.0;
        lat_.push_back(lat_stats(ph_.size, {samples_.data(), ph_.iters}, div, tpu_));
        print_row(stdout, lat_.back());
    }
    void send_lat_server() {
        arm();
        for (std::uint32_t m = 0; m < ph_.total(); ++m) {
            while (received_ <= m) turn([this](const WorkCompletion& wc) { on_recv(wc); });
            post_one(m);
        }
    }
    void write_lat_server() {
        arm();
        for (std::uint32_t m = 0; m < ph_.total(); ++m) {
            const unsigned w = which(m);
            while (last_byte(w) != marker(m)) turn([](const WorkCompletion&) {});
            if (w == 2) *reinterpret_cast<std::uint8_t*>(at(layout_->tx[2] + ph_.size - 1)) = marker(m);
            post_one(m);
        }
    }
    void send_bw_server() {
        arm();
        while (received_ < ph_.total()) {
            turn([this](const WorkCompletion& wc) { on_recv(wc); });
            post_credit(false);
        }
        // The last credits must reach the client even if the send queue was full at the last receive.
        arm();
        while (credit_sent_ != recv_total_) {
            post_credit(true);
            turn([](const WorkCompletion&) {});
        }
    }

    // Up to `depth` WRs outstanding, a signaled one every cq_mod; SENDs also bounded by the receiver's
    // credits. Time runs from posting the first timed message to the last completion, as perftest's BW average
    // does, and the warmup has completed before that first timed message is posted: posted behind it, up to
    // depth - cq_mod warmup messages would still be on their way in the timed interval (at 8 MiB with the
    // default depth, 64 of them against 128 timed: the stream read 67 % of its speed).
    void bw_client() {
        const std::uint32_t total = ph_.total();
        std::uint32_t posted = 0, warmup_in_flight = 0;
        std::size_t nmarks = 0;
        completed_ = 0;
        auto on_done = [&](const WorkCompletion& wc) {
            if (wc.opcode == WcOpcode::recv) return;
            const std::uint32_t m = static_cast<std::uint32_t>(wc.wr_id & ~kTagMask);
            completed_ = m + 1;
            if (m >= first_ && nmarks < marks_.size()) marks_[nmarks++] = {m + 1 - first_, tsc()};
        };
        arm();
        while (completed_ < total) {
            if (posted < total && (posted != first_ || completed_ == first_)) {
                std::uint32_t room = std::min<std::uint32_t>(p_.depth - (posted - completed_), total - posted);
                if (posted < first_) room = std::min(room, first_ - posted);  // the warmup's last batch
                if (p_.test == Test::send) room = static_cast<std::uint32_t>(std::min<std::uint64_t>(room, credit() - sent_total_));
                if (room != 0) {
                    for (std::uint32_t j = 0; j < room; ++j) fill_wr(wrs_[j], sges_[j], posted + j);
                    const std::uint64_t t = tsc();
                    const auto r = qp_->post_send({wrs_.data(), room});
                    const std::uint32_t took = r.ok() ? room : static_cast<std::uint32_t>(r.bad_wr - wrs_.data());
                    if (!r.ok() && r.err != verbs::PostErrc::queue_full) [[unlikely]]
                        fail(std::string("post_send: ") + verbs::to_string(r.err));
                    if (posted <= first_ && posted + took > first_) {
                        marks_[nmarks++] = {0, t};
                        const std::uint64_t done = std::min<std::uint64_t>(completed_, first_);
                        warmup_in_flight = static_cast<std::uint32_t>(first_ - done);
                    }
                    posted += took;
                    if (p_.test == Test::send) sent_total_ += took;
                }
            }
            turn(on_done);
        }
        bw_.push_back(bw_stats(ph_.size, ph_.iters, {marks_.data(), nmarks}, tpu_));
        bw_.back().warmup_in_flight = warmup_in_flight;
        print_row(stdout, bw_.back());
    }

    // ---- content checks (after the phase, untimed) ----
    // What this end received in phase k: 0 if right, else 1 and `why`.
    std::uint32_t verify(std::uint32_t k, std::string& why) {
        const Phase& ph = phases_[k];
        const unsigned peer = 1 - dir_;
        const bool one = ph.iters == 1;  // the first timed message is also the last: only A is used
        auto check = [&](unsigned w, std::size_t len, std::uint64_t sd, const char* what) {
            const long long bad = test::check_pattern(sd, 0, {at(layout_->rx[w]), len});
            if (bad >= 0) {
                why = std::string(what) + " message: wrong byte at offset " + std::to_string(bad);
                return false;
            }
            return true;
        };
        auto both = [&](std::size_t len, std::uint32_t rseed_phase) {
            if (!check(0, len, seed(peer, rseed_phase, 0), "first")) return false;
            return one || check(1, len, seed(peer, rseed_phase, 1), "last");
        };
        const std::uint32_t first = ph.warmup, last = ph.total() - 1;
        bool ok = true;
        switch (p_.test) {
        case Test::send:
            if (receives_data()) ok = both(ph.size, k);
            break;
        case Test::write:
            if (p_.kind == Kind::lat) {
                ok = both(ph.size - 1, k);
                auto mk = [&](unsigned w) { return *reinterpret_cast<const std::uint8_t*>(at(layout_->rx[w] + ph.size - 1)); };
                if (ok && (mk(0) != marker(first) || (!one && mk(1) != marker(last)))) {
                    ok = false;
                    why = "last byte (marker) of the first/last message wrong";
                }
            } else if (server_) {
                ok = both(ph.size, k);
            }
            break;
        case Test::read:
            if (!server_) ok = both(ph.size, k);  // the server's tx buffers, read into our rx buffers
            break;
        case Test::atomic: {
            const std::uint64_t base = atomic_base(k);
            if (server_) {
                std::uint64_t v;
                std::memcpy(&v, at(layout_->counter), 8);
                if (v != base + kAtomicAdd * ph.total()) {
                    ok = false;
                    why = "counter " + std::to_string(v - base) + " adds, expected " + std::to_string(ph.total());
                }
            } else {
                std::uint64_t r0, r1;
                std::memcpy(&r0, at(layout_->results), 8);
                std::memcpy(&r1, at(layout_->results + 8), 8);
                if (r0 != base + kAtomicAdd * first || (!one && r1 != base + kAtomicAdd * last)) {
                    ok = false;
                    why = "fetch-add returned wrong originals";
                }
            }
            break;
        }
        }
        return ok ? 0 : 1;
    }

    // ---- end ----
    // Why a connect request's private data is not an rdma_perf client's ("" when it is).
    static std::string check_client(const PrivateData& pd) {
        if (pd.size != sizeof(WireParams))
            return "expected " + std::to_string(sizeof(WireParams)) + " bytes of private data (rdma_perf's parameters), got " +
                   (pd.size == 0 ? std::string("none (stock perftest, rping and ucmatose send none)") : std::to_string(pd.size));
        WireParams p;
        std::memcpy(&p, pd.bytes.data(), sizeof p);
        if (p.magic != kWireMagic || p.version != kWireVersion) return "a client of another rdma_perf version";
        if (p.max_size == 0 || p.max_size > kMaxSize || p.depth == 0 || p.depth > 4096 || p.rx_depth == 0 ||
            p.rx_depth > 8192 || p.cq_mod == 0 || p.cq_mod > p.depth || p.outs == 0 || p.outs > 128 || p.size == 0 ||
            p.size > p.max_size || static_cast<unsigned>(p.test) > 3 || static_cast<unsigned>(p.kind) > 1)
            return "client's parameters out of range";
        return {};
    }
    // A peer's private data as text when printable (a reject's reason).
    static std::string text_of(const PrivateData& pd) {
        std::string t;
        for (std::size_t i = 0; i < pd.size; ++i) {
            const auto c = static_cast<unsigned char>(pd.bytes[i]);
            if (c == 0 && i + 1 == pd.size) break;
            if (c < 0x20 || c > 0x7e) return std::to_string(pd.size) + " bytes of private data";
            t += static_cast<char>(c);
        }
        return pd.size == 0 ? std::string("no reason given") : "\"" + t + "\"";
    }
    // An orderly close (FIN) of a connection we will not use; bounded.
    void end_quietly() {
        if (!id_) return;
        id_->disconnect();
        ctx_->run_until([&] {
            while (auto ev = ctx_->get_cm_event())
                if (ev->type == verbs::CmEventType::disconnected) return true;
            return false;
        }, 2s);
        ctx_->drain(1s);
        id_.reset();
    }

    int end(int rc) {
        if (id_) {
            bool down = false;
            if (!server_) id_->disconnect();
            ctx_->run_until([&] {
                while (auto ev = ctx_->get_cm_event())
                    if (ev->type == verbs::CmEventType::disconnected) down = true;
                return down;
            }, std::chrono::seconds(o_.timeout_s));
            if (!down) std::fprintf(stderr, "rdma_perf %s: no disconnect event\n", server_ ? "server" : "client");
        }
        ctx_->run_until([] { return false; }, 50ms);
        if (o_.verbose) {
            const auto pc = ctx_->impl().port().counters();
            const auto& sc = ctx_->impl().stack().counters();
            const rte_eth_stats ds = ctx_->impl().port().device_stats();
            std::fprintf(stderr, "# %s: port rx %llu tx %llu tx_refused %llu imissed %llu | stack rx_dropped %llu "
                                 "tx_dropped %llu tx_deferred %llu | %s\n",
                         server_ ? "server" : "client", static_cast<unsigned long long>(pc.rx_packets),
                         static_cast<unsigned long long>(pc.tx_packets), static_cast<unsigned long long>(pc.tx_refused),
                         static_cast<unsigned long long>(ds.imissed), static_cast<unsigned long long>(sc.rx_dropped),
                         static_cast<unsigned long long>(sc.tx_dropped),
                         static_cast<unsigned long long>(sc.tx_deferred), ctx_->impl().stack().protocol_counters().c_str());
        }
        if (cq_ && cq_->overruns() != 0) {
            std::fprintf(stderr, "rdma_perf: CQ overruns %llu\n", static_cast<unsigned long long>(cq_->overruns()));
            rc = rc == 0 ? 4 : rc;
        }
        id_.reset();
        listener_.reset();
        qp_.reset();
        cq_.reset();
        mr_.reset();
        return test::finish_checks(ctx_->impl().stack(), ctx_->impl().port(), baseline_, rc);
    }

    const test::PeerConfig& pc_;
    const Options& o_;
    double tpu_;
    bool server_;
    unsigned dir_;
    std::uint64_t stall_{0};
    std::uint64_t deadline_{0};
    std::uint64_t checkpoint_{~std::uint64_t{0}};  // not before the first arm()
    std::uint64_t moved_at_checkpoint_{0};
    std::uint64_t completions_{0};
    Idler idle_{IdlePolicy::spin_only()};

    std::unique_ptr<verbs::Context> ctx_;
    stack::PoolUsage baseline_;
    std::unique_ptr<verbs::ProtectionDomain> pd_;
    std::unique_ptr<Mapping> mem_;
    std::unique_ptr<verbs::MemoryRegion> mr_;
    std::unique_ptr<verbs::CompletionQueue> cq_;
    std::unique_ptr<verbs::QueuePair> qp_;
    std::unique_ptr<verbs::CmListener> listener_;
    std::unique_ptr<verbs::CmId> id_;

    WireParams p_{};
    WireRegion remote_{};
    std::vector<Phase> phases_;
    std::optional<Layout> layout_;

    // Preallocated at build(): nothing below grows inside a phase.
    std::vector<std::uint64_t> samples_;
    std::vector<Mark> marks_;
    std::vector<verbs::SendWr> wrs_;
    std::vector<verbs::Sge> sges_;
    std::array<WorkCompletion, 64> wcs_{};
    std::vector<LatStats> lat_;
    std::vector<BwStats> bw_;

    // Phase state.
    Phase ph_{};
    std::uint32_t phase_{0};
    std::uint32_t first_{0}, last_{0};
    std::uint32_t received_{0};
    std::uint32_t recv_posted_{0};
    std::uint64_t completed_{0};
    // Connection-wide counters.
    std::uint32_t ctrl_posted_{0}, ctrl_got_{0};
    Ctrl last_ctrl_{};
    verbs::LayerCycles server_l0_{};  // server, --layers: the counters when the last phase began
    std::uint64_t recv_total_{0};   // data receives posted (the credit the sender gets)
    std::uint64_t credit_sent_{0};
    std::uint64_t sent_total_{0};   // data SENDs posted (client, send bw)
};

template <class F>
int guarded(const char* who, F&& f) {
    try {
        return f();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rdma_perf %s: %s\n", who, e.what());
        std::fflush(stderr);
        return 1;
    }
}

}  // namespace

int run_server(const test::PeerConfig& pc, const Options& o, double ticks_per_us) {
    return guarded("server", [&] {
        Peer peer(pc, o, ticks_per_us, true);
        return peer.server();
    });
}

int run_client(const test::PeerConfig& pc, const Options& o, double ticks_per_us) {
    return guarded("client", [&] {
        Peer peer(pc, o, ticks_per_us, false);
        return peer.client();
    });
}

}  // namespace softrdma::perf
