// SPDX-License-Identifier: MIT
// The drop-in libibverbs.so.1: the libibverbs ABI of rdma-core 44 (Debian 12's <infiniband/verbs.h>, symbol
// versions as libibverbs.map) over one softrdma Context, presented as the iWARP device "softrdma0".
// The data path (post_send, post_recv, poll_cq, req_notify_cq) is reached through the context's ops, as the
// header's inline functions call it. What softrdma does not offer returns what a provider without it returns
// (EOPNOTSUPP for AHs, multicast, memory windows, extended verbs; NULL with errno from creators).
#include <infiniband/verbs.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "verbs/dropin/objects.hpp"
#include "verbs/engine.hpp"

// The header's macros that route to inline wrappers: the real functions are defined here.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

namespace softrdma::dropin {
namespace {

static_assert(sizeof(ibv_sge) == sizeof(verbs::Sge) && offsetof(ibv_sge, addr) == offsetof(verbs::Sge, addr) &&
                  offsetof(ibv_sge, length) == offsetof(verbs::Sge, length) &&
                  offsetof(ibv_sge, lkey) == offsetof(verbs::Sge, lkey),
              "ibv_sge and verbs::Sge share a layout: SGE lists pass without a copy");

std::span<const verbs::Sge> sges(const ibv_sge* s, int n) {
    return {reinterpret_cast<const verbs::Sge*>(s), static_cast<std::size_t>(std::max(n, 0))};
}

ibv_device g_device = [] {
    ibv_device d{};
    d.node_type = IBV_NODE_RNIC;
    d.transport_type = IBV_TRANSPORT_IWARP;
    std::strcpy(d.name, "softrdma0");
    std::strcpy(d.dev_name, "softrdma0");
    return d;
}();

ibv_context g_context{};
bool g_context_ready = false;
std::mutex g_context_mu;

// CQs armed with req_notify: after each engine turn, those whose event came are marked and their channel's fd
// made readable. Control-path sized (one entry per armed CQ).
std::vector<Cq*> g_armed;
struct PendingEvent {
    Cq* cq;
    unsigned n;
};
std::vector<PendingEvent> g_pending;

// A channel's fd is readable exactly while one of its CQs has an event pending: written once when the first
// comes, read (reset) when the last is taken. The application may make it non-blocking (O_NONBLOCK:
// ibv_get_cq_event then returns EAGAIN instead of waiting); our own read never waits either way.
void refresh(Channel* ch) noexcept {
    const bool any = std::any_of(g_pending.begin(), g_pending.end(), [ch](const PendingEvent& p) { return p.cq->ch == ch; });
    if (any == ch->readable) return;
    ch->readable = any;
    std::uint64_t v = 1;
    [[maybe_unused]] const auto r = any ? ::write(ch->ch.fd, &v, sizeof v) : ::read(ch->ch.fd, &v, sizeof v);
}

void after_turn() noexcept {
    for (std::size_t i = 0; i < g_armed.size();) {
        Cq* c = g_armed[i];
        if (!c->h->get_event()) {
            ++i;
            continue;
        }
        c->armed = false;
        g_armed[i] = g_armed.back();
        g_armed.pop_back();
        if (c->ch == nullptr) continue;
        auto it = std::find_if(g_pending.begin(), g_pending.end(), [c](const PendingEvent& p) { return p.cq == c; });
        if (it == g_pending.end()) g_pending.push_back({c, 1});
        else ++it->n;
        refresh(c->ch);
    }
}

int wr_error(verbs::PostErrc e) {
    switch (e) {
    case verbs::PostErrc::none: return 0;
    case verbs::PostErrc::queue_full: return ENOMEM;
    case verbs::PostErrc::not_agreed: return EOPNOTSUPP;
    default: return EINVAL;
    }
}

ibv_qp_state state_of(verbs::QpState s) {
    switch (s) {
    case verbs::QpState::reset: return IBV_QPS_RESET;
    case verbs::QpState::init: return IBV_QPS_INIT;
    case verbs::QpState::rtr: return IBV_QPS_RTR;
    case verbs::QpState::rts: return IBV_QPS_RTS;
    case verbs::QpState::sqd: return IBV_QPS_SQD;
    case verbs::QpState::sqe: return IBV_QPS_SQE;
    case verbs::QpState::err: return IBV_QPS_ERR;
    }
    return IBV_QPS_ERR;
}

void to_ibv(const verbs::WorkCompletion& w, ibv_wc& o) {
    o = ibv_wc{};
    o.wr_id = w.wr_id;
    switch (w.status) {
    case verbs::WcStatus::success: o.status = IBV_WC_SUCCESS; break;
    case verbs::WcStatus::wr_flush_err: o.status = IBV_WC_WR_FLUSH_ERR; break;
    case verbs::WcStatus::loc_prot_err: o.status = IBV_WC_LOC_PROT_ERR; break;
    case verbs::WcStatus::fatal_err: o.status = IBV_WC_FATAL_ERR; break;
    case verbs::WcStatus::rem_access_err: o.status = IBV_WC_REM_ACCESS_ERR; break;
    case verbs::WcStatus::rem_op_err: o.status = IBV_WC_REM_OP_ERR; break;
    case verbs::WcStatus::rem_inv_req_err: o.status = IBV_WC_REM_INV_REQ_ERR; break;
    case verbs::WcStatus::retry_exc_err: o.status = IBV_WC_RETRY_EXC_ERR; break;
    }
    switch (w.opcode) {
    case verbs::WcOpcode::send: o.opcode = IBV_WC_SEND; break;
    case verbs::WcOpcode::rdma_write: o.opcode = IBV_WC_RDMA_WRITE; break;
    case verbs::WcOpcode::rdma_read: o.opcode = IBV_WC_RDMA_READ; break;
    case verbs::WcOpcode::comp_swap: o.opcode = IBV_WC_COMP_SWAP; break;
    case verbs::WcOpcode::fetch_add: o.opcode = IBV_WC_FETCH_ADD; break;
    case verbs::WcOpcode::recv: o.opcode = IBV_WC_RECV; break;
    case verbs::WcOpcode::recv_rdma_with_imm: o.opcode = IBV_WC_RECV_RDMA_WITH_IMM; break;
    }
    o.byte_len = w.byte_len;
    o.qp_num = w.qp_num;
    if ((w.wc_flags & verbs::wc_flags::with_imm) != 0) {
        o.wc_flags |= IBV_WC_WITH_IMM;
        o.imm_data = htonl(static_cast<std::uint32_t>(w.imm_data));
    } else if ((w.wc_flags & verbs::wc_flags::with_inv) != 0) {
        o.wc_flags |= IBV_WC_WITH_INV;
        o.invalidated_rkey = w.invalidated_rkey;
    }
}

// ---- the context's ops (the data path) ----

int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || n < 0) return -1;
    Guard g(*rt);
    rt->turn();
    auto& buf = of(cq)->scratch;
    int got = 0;
    while (got < n) {
        const std::size_t want = std::min<std::size_t>(buf.size(), static_cast<std::size_t>(n - got));
        const std::size_t k = of(cq)->h->poll(std::span(buf).first(want));
        for (std::size_t i = 0; i < k; ++i) to_ibv(buf[i], wc[got + static_cast<int>(i)]);
        got += static_cast<int>(k);
        if (k < want) break;
    }
    return got;
}

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    Cq* c = of(cq);
    c->h->req_notify(solicited_only != 0);
    if (!c->armed) {
        c->armed = true;
        g_armed.push_back(c);
    }
    return 0;
}

int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return errno = ENODEV;
    Guard g(*rt);
    Qp* q = of(qp);
    for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
        verbs::SendWr s{.wr_id = w->wr_id, .sg_list = sges(w->sg_list, w->num_sge)};
        switch (w->opcode) {
        case IBV_WR_SEND: s.opcode = verbs::WrOpcode::send; break;
        case IBV_WR_SEND_WITH_IMM: s.opcode = verbs::WrOpcode::send_with_imm; break;
        case IBV_WR_SEND_WITH_INV: s.opcode = verbs::WrOpcode::send_with_inv; break;
        case IBV_WR_RDMA_WRITE: s.opcode = verbs::WrOpcode::rdma_write; break;
        case IBV_WR_RDMA_WRITE_WITH_IMM: s.opcode = verbs::WrOpcode::rdma_write_with_imm; break;
        case IBV_WR_RDMA_READ: s.opcode = verbs::WrOpcode::rdma_read; break;
        case IBV_WR_ATOMIC_CMP_AND_SWP: s.opcode = verbs::WrOpcode::atomic_cmp_and_swp; break;
        case IBV_WR_ATOMIC_FETCH_AND_ADD: s.opcode = verbs::WrOpcode::atomic_fetch_and_add; break;
        default:
            *bad = w;
            return errno = EINVAL;
        }
        if ((w->send_flags & IBV_SEND_SIGNALED) != 0) s.send_flags |= verbs::send_flags::signaled;
        if ((w->send_flags & IBV_SEND_SOLICITED) != 0) s.send_flags |= verbs::send_flags::solicited;
        if ((w->send_flags & IBV_SEND_INLINE) != 0) s.send_flags |= verbs::send_flags::inline_data;
        if (w->opcode == IBV_WR_SEND_WITH_INV) s.invalidate_rkey = w->invalidate_rkey;
        else s.imm_data = ntohl(w->imm_data);
        if (w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
            s.atomic = {w->wr.atomic.remote_addr, w->wr.atomic.compare_add, w->wr.atomic.swap, w->wr.atomic.rkey};
        } else {
            s.rdma = {w->wr.rdma.remote_addr, w->wr.rdma.rkey};
        }
        const auto r = q->h->post_send({&s, 1});
        if (!r.ok()) {
            *bad = w;
            rt->flush_post();  // what was posted before it goes out all the same
            return errno = wr_error(r.err);  // errno too: programs print it (qperf's "failed to post ...")
        }
    }
    rt->flush_post();
    return 0;
}

// A receive list into a QP's or an SRQ's post_recv, one WR at a time (no copy of the SGE lists).
template <class Queue>
int post_recvs(Queue& q, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return errno = ENODEV;
    Guard g(*rt);
    for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
        const verbs::RecvWr r{.wr_id = w->wr_id, .sg_list = sges(w->sg_list, w->num_sge)};
        const auto res = q.post_recv({&r, 1});
        if (!res.ok()) {
            *bad = w;
            return errno = wr_error(res.err);
        }
    }
    return 0;
}

int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return post_recvs(*of(qp)->h, wr, bad); }
int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) { return post_recvs(*of(srq)->h, wr, bad); }

ibv_mw* op_alloc_mw(ibv_pd*, ibv_mw_type) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int op_bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*) { return EOPNOTSUPP; }
int op_dealloc_mw(ibv_mw*) { return EOPNOTSUPP; }

std::uint64_t guid_of(const MacAddress& m) {
    // EUI-64 from the MAC (as iWARP providers derive their node GUID).
    const std::array<std::uint8_t, 8> b{static_cast<std::uint8_t>(m[0] ^ 2u), m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]};
    std::uint64_t g = 0;
    std::memcpy(&g, b.data(), 8);  // network order in memory, as libibverbs hands GUIDs out
    return g;
}

}  // namespace

ibv_context* device_context() {
    std::lock_guard<std::mutex> lk(g_context_mu);
    if (g_context_ready) return &g_context;
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return nullptr;
    ibv_context& c = g_context;
    c.device = &g_device;
    c.cmd_fd = -1;
    c.async_fd = -1;
    c.num_comp_vectors = 1;
    pthread_mutex_init(&c.mutex, nullptr);
    c.abi_compat = nullptr;  // not a verbs_context: the header's extended verbs find no ops (EOPNOTSUPP / legacy)
    c.ops.poll_cq = op_poll_cq;
    c.ops.req_notify_cq = op_req_notify_cq;
    c.ops.post_send = op_post_send;
    c.ops.post_recv = op_post_recv;
    c.ops.post_srq_recv = op_post_srq_recv;
    c.ops.alloc_mw = op_alloc_mw;
    c.ops.bind_mw = op_bind_mw;
    c.ops.dealloc_mw = op_dealloc_mw;
    rt->add_after_turn(&after_turn);
    g_context_ready = true;
    return &g_context;
}

Qp* make_qp(Guard& g, ibv_pd* pd, ibv_qp_init_attr* a) {
    if (a == nullptr || a->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;  // iWARP: reliable connected only
        return nullptr;
    }
    if (a->send_cq == nullptr || a->recv_cq == nullptr) {
        errno = EINVAL;
        return nullptr;
    }
    verbs::QpInitAttr qa;
    qa.send_cq = of(a->send_cq)->h.get();
    qa.recv_cq = of(a->recv_cq)->h.get();
    qa.srq = a->srq != nullptr ? of(a->srq)->h.get() : nullptr;
    qa.sq_sig_all = a->sq_sig_all != 0;
    qa.cap.max_send_wr = std::max<std::uint32_t>(a->cap.max_send_wr, 1);
    qa.cap.max_recv_wr = a->srq != nullptr ? 0 : std::max<std::uint32_t>(a->cap.max_recv_wr, 1);
    qa.cap.max_send_sge = std::max<std::uint32_t>(a->cap.max_send_sge, 1);
    qa.cap.max_recv_sge = std::max<std::uint32_t>(a->cap.max_recv_sge, 1);
    qa.cap.max_inline_data = std::max<std::uint32_t>(a->cap.max_inline_data, 64);
    if (qa.cap.max_send_sge > verbs::kMaxSge || qa.cap.max_recv_sge > verbs::kMaxSge) {
        errno = EINVAL;
        return nullptr;
    }
    auto q = std::make_unique<Qp>();
    try {
        q->h = of(pd)->h->create_qp(qa);
    } catch (const std::exception&) {
        errno = ENOMEM;
        return nullptr;
    }
    (void)g;
    ibv_qp& o = q->qp;
    o.context = pd->context;
    o.qp_context = a->qp_context;
    o.pd = pd;
    o.send_cq = a->send_cq;
    o.recv_cq = a->recv_cq;
    o.srq = a->srq;
    o.qp_num = q->h->qp_num();
    o.handle = o.qp_num;
    o.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&o.mutex, nullptr);
    pthread_cond_init(&o.cond, nullptr);
    a->cap.max_send_wr = qa.cap.max_send_wr;
    a->cap.max_recv_wr = qa.cap.max_recv_wr;
    a->cap.max_send_sge = qa.cap.max_send_sge;
    a->cap.max_recv_sge = qa.cap.max_recv_sge;
    a->cap.max_inline_data = qa.cap.max_inline_data;
    q->max_inline = qa.cap.max_inline_data;
    sync_qp_state(q.get());
    return q.release();
}

void sync_qp_state(Qp* q) noexcept { q->qp.state = state_of(q->h->state()); }

}  // namespace softrdma::dropin

using namespace softrdma;
using namespace softrdma::dropin;

// ---- the C ABI ---------------------------------------------------------------------------------------------

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
    const bool have = Runtime::configured();
    auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
    if (list == nullptr) {
        errno = ENOMEM;
        return nullptr;
    }
    if (have) list[0] = &g_device;
    if (num != nullptr) *num = have ? 1 : 0;
    return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device != nullptr ? device->name : nullptr; }

ibv_context* ibv_open_device(ibv_device* device) {
    if (device != &g_device) {
        errno = ENODEV;
        return nullptr;
    }
    return device_context();
}

int ibv_close_device(ibv_context*) { return 0; }  // the Context lives until exit (one per process)

int ibv_query_device(ibv_context* context, ibv_device_attr* a) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || context == nullptr) return ENODEV;
    Guard g(*rt);
    const verbs::ContextConfig& cc = rt->settings().context;
    *a = ibv_device_attr{};
    std::snprintf(a->fw_ver, sizeof a->fw_ver, "softrdma 0.1");
    a->node_guid = guid_of(rt->ctx().impl().port().mac());
    a->sys_image_guid = a->node_guid;
    a->max_mr_size = ~std::uint64_t{0};
    a->page_size_cap = 4096;
    a->vendor_id = 0x626d74;  // as siw: "bmt"
    a->max_qp = static_cast<int>(cc.max_qp);
    a->max_qp_wr = 16384;
    a->max_sge = static_cast<int>(verbs::kMaxSge);
    a->max_sge_rd = static_cast<int>(verbs::kMaxSge);
    a->max_cq = 1 << 16;
    a->max_cqe = 1 << 20;
    a->max_mr = static_cast<int>(cc.max_mr);
    a->max_pd = 1 << 20;
    a->max_qp_rd_atom = 128;
    a->max_qp_init_rd_atom = 128;
    a->max_res_rd_atom = 128 * a->max_qp;
    a->max_srq = 1 << 16;
    a->max_srq_wr = 16384;
    a->max_srq_sge = static_cast<int>(verbs::kMaxSge);
    // RFC 7306 atomics need an agreement rdma_cm cannot carry: the rfc7306 key makes it for every connection.
    a->atomic_cap = rt->settings().rfc7306 ? IBV_ATOMIC_HCA : IBV_ATOMIC_NONE;
    a->phys_port_cnt = 1;
    return 0;
}

int ibv_query_port(ibv_context* context, std::uint8_t port, struct _compat_ibv_port_attr* out) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || context == nullptr) return ENODEV;
    if (port != 1) return EINVAL;
    Guard g(*rt);
    auto* a = reinterpret_cast<ibv_port_attr*>(out);
    *a = ibv_port_attr{};
    const unsigned mtu = rt->ctx().impl().port().mtu();
    const ibv_mtu m = mtu >= 4096 + 96 ? IBV_MTU_4096 : mtu >= 2048 + 96 ? IBV_MTU_2048 : mtu >= 1024 + 96 ? IBV_MTU_1024 : IBV_MTU_512;
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = m;
    a->active_mtu = m;
    a->gid_tbl_len = 1;
    a->max_msg_sz = 0x7fffffff;
    a->pkey_tbl_len = 1;
    a->active_width = 1;  // 1X
    a->active_speed = 1;
    a->phys_state = 5;    // LinkUp
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

int ibv_query_gid(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || context == nullptr || port != 1 || index != 0) {
        errno = EINVAL;
        return -1;
    }
    Guard g(*rt);
    *gid = ibv_gid{};
    const MacAddress& mac = rt->ctx().impl().port().mac();
    std::memcpy(gid->raw, mac.data(), mac.size());  // as siw: the MAC in the first six bytes
    return 0;
}

int _ibv_query_gid_ex(ibv_context* context, std::uint32_t port, std::uint32_t index, ibv_gid_entry* entry,
                      std::uint32_t flags, std::size_t entry_size) {
    if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
    ibv_gid gid{};
    if (port > 255 || ibv_query_gid(context, static_cast<std::uint8_t>(port), static_cast<int>(index), &gid) != 0) return EINVAL;
    *entry = ibv_gid_entry{};
    entry->gid = gid;
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = IBV_GID_TYPE_IB;
    return 0;
}

// Private ABI (IBVERBS_PRIVATE_34) that ibv_devinfo imports.
int ibv_query_gid_type(ibv_context*, std::uint8_t, unsigned int, int* type) {
    *type = 0;  // IBV_GID_TYPE_SYSFS_IB_ROCE_V1: what an iWARP device reports
    return 0;
}

int ibv_read_sysfs_file(const char*, const char*, char*, std::size_t) { return -1; }  // no sysfs device

int ibv_query_pkey(ibv_context*, std::uint8_t port, int index, __be16* pkey) {
    if (port != 1 || index != 0) return EINVAL;
    *pkey = htons(0xffff);
    return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* context) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || context == nullptr) return nullptr;
    Guard g(*rt);
    auto p = std::make_unique<Pd>();
    try {
        p->h = rt->ctx().alloc_pd();
    } catch (const std::exception&) {
        errno = ENOMEM;
        return nullptr;
    }
    p->pd.context = context;
    p->pd.handle = p->h->handle();
    return &p.release()->pd;
}

// A PD may go before its MRs and QPs: they keep its number (softrdma's lifetimes; libibverbs would say EBUSY).
int ibv_dealloc_pd(ibv_pd* pd) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    delete of(pd);
    return 0;
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, unsigned int access) {
    if (iova != reinterpret_cast<std::uintptr_t>(addr)) {
        errno = EOPNOTSUPP;  // STags address by virtual address here: no separate I/O virtual address
        return nullptr;
    }
    constexpr unsigned supported = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING;
    if ((access & ~supported & ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE)) != 0) {
        errno = EOPNOTSUPP;  // memory windows, zero-based, on-demand paging, ...
        return nullptr;
    }
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return nullptr;
    Guard g(*rt);
    std::uint32_t acc = 0;
    if ((access & IBV_ACCESS_LOCAL_WRITE) != 0) acc |= verbs::access::local_write;
    if ((access & IBV_ACCESS_REMOTE_WRITE) != 0) acc |= verbs::access::remote_write;
    if ((access & IBV_ACCESS_REMOTE_READ) != 0) acc |= verbs::access::remote_read;
    if ((access & IBV_ACCESS_REMOTE_ATOMIC) != 0) acc |= verbs::access::remote_atomic;
    auto m = std::make_unique<Mr>();
    try {
        m->h = of(pd)->h->reg_mr({static_cast<std::byte*>(addr), length}, acc);
    } catch (const std::exception&) {
        errno = EINVAL;  // rights that need local write, or the MR table full
        return nullptr;
    }
    ibv_mr& o = m->mr;
    o.context = pd->context;
    o.pd = pd;
    o.addr = addr;
    o.length = length;
    o.handle = m->h->lkey();
    o.lkey = m->h->lkey();
    o.rkey = m->h->rkey();
    return &m.release()->mr;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, std::size_t length, int access) {
    return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), static_cast<unsigned>(access));
}

int ibv_dereg_mr(ibv_mr* mr) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    delete reinterpret_cast<Mr*>(mr);  // work still naming it fails (loc_prot_err), nothing touches the memory
    return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
    const int fd = ::eventfd(0, EFD_CLOEXEC);
    if (fd < 0) return nullptr;
    auto* c = new Channel;
    c->ch.context = context;
    c->ch.fd = fd;
    c->ch.refcnt = 0;
    return &c->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    auto* c = reinterpret_cast<Channel*>(channel);
    if (!c->cqs.empty()) return EBUSY;
    ::close(c->ch.fd);
    c->destroyed = true;
    if (c->waiters == 0) delete c;  // else the last thread waiting in ibv_get_cq_event frees it
    return 0;
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || context == nullptr) return nullptr;
    if (cqe <= 0 || cqe > (1 << 20)) {
        errno = EINVAL;
        return nullptr;
    }
    Guard g(*rt);
    auto c = std::make_unique<Cq>();
    try {
        c->h = rt->ctx().create_cq(static_cast<std::uint32_t>(cqe));
    } catch (const std::exception&) {
        errno = ENOMEM;
        return nullptr;
    }
    ibv_cq& o = c->cq;
    o.context = context;
    o.channel = channel;
    o.cq_context = cq_context;
    o.cqe = cqe;
    pthread_mutex_init(&o.mutex, nullptr);
    pthread_cond_init(&o.cond, nullptr);
    if (channel != nullptr) {
        c->ch = reinterpret_cast<Channel*>(channel);
        c->ch->cqs.push_back(c.get());
        ++channel->refcnt;
    }
    return &c.release()->cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    Cq* c = of(cq);
    std::erase(g_armed, c);
    std::erase_if(g_pending, [c](const PendingEvent& p) { return p.cq == c; });
    if (c->ch != nullptr) {
        std::erase(c->ch->cqs, c);
        --c->ch->ch.refcnt;
        refresh(c->ch);
    }
    delete c;  // QPs still using it keep its ring (softrdma's lifetimes)
    return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return -1;
    auto* ch = reinterpret_cast<Channel*>(channel);
    bool nonblocking = false;
    {
        Guard g(*rt);
        const int flags = ch->destroyed ? -1 : ::fcntl(ch->ch.fd, F_GETFL);
        if (flags < 0) {
            errno = EBADF;
            return -1;
        }
        nonblocking = (flags & O_NONBLOCK) != 0;
        ++ch->waiters;
    }
    // On the way out (every path below): the last waiter frees a channel destroyed meanwhile.
    struct Leave {
        Runtime& rt;
        Channel* ch;
        ~Leave() {
            Guard g(rt);
            if (--ch->waiters == 0 && ch->destroyed) delete ch;
        }
    } leave{*rt, ch};
    Cq* got = nullptr;
    bool destroyed = false;
    auto take = [&] {
        if (ch->destroyed) return destroyed = true;
        auto it = std::find_if(g_pending.begin(), g_pending.end(), [ch](const PendingEvent& p) { return p.cq->ch == ch; });
        if (it == g_pending.end()) return false;
        got = it->cq;
        if (--it->n == 0) g_pending.erase(it);
        refresh(ch);
        return true;
    };
    if (const Wait w = wait_for(*rt, nonblocking ? 0 : -1, take); w != Wait::done) {
        errno = w == Wait::interrupted ? EINTR : EAGAIN;  // EINTR: as the kernel's read() on the channel
        return -1;
    }
    if (destroyed) {
        errno = EBADF;  // destroyed while this thread waited
        return -1;
    }
    *cq = &got->cq;
    *cq_context = got->cq.cq_context;
    return 0;
}

void ibv_ack_cq_events(ibv_cq*, unsigned int) {}  // events need no acknowledgement here

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || pd == nullptr) return nullptr;
    Guard g(*rt);
    Qp* q = make_qp(g, pd, attr);
    return q != nullptr ? &q->qp : nullptr;
}

int ibv_destroy_qp(ibv_qp* qp) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    if (Qp* q = of(qp); q->cm_id != nullptr) q->cm_id->qp = nullptr;
    delete of(qp);  // a connected QP's connection is reset
    return 0;
}

// iWARP: the connection manager takes a QP through RTR and RTS (rdma_connect / rdma_accept); here the
// application may only ask for what it may do itself: INIT, ERR, and RESET after ERR.
int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    Qp* q = of(qp);
    int rc = 0;
    if ((mask & IBV_QP_STATE) != 0) {
        const verbs::QpState cur = q->h->state();
        switch (attr->qp_state) {
        case IBV_QPS_RESET:
            if (cur != verbs::QpState::reset && cur != verbs::QpState::init && !q->h->modify_state(verbs::QpState::reset))
                rc = EBUSY;
            break;
        case IBV_QPS_INIT:
            if (cur != verbs::QpState::init && !q->h->modify_state(verbs::QpState::init)) rc = EINVAL;
            break;
        case IBV_QPS_RTR:
        case IBV_QPS_RTS:
            if (cur != verbs::QpState::rtr && cur != verbs::QpState::rts) rc = EINVAL;  // the CM's
            break;
        case IBV_QPS_ERR:
            if (!q->h->modify_state(verbs::QpState::err)) rc = EINVAL;
            break;
        default: rc = EOPNOTSUPP;
        }
    }
    sync_qp_state(q);
    return rc;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    Qp* q = of(qp);
    sync_qp_state(q);
    const verbs::QpCap& c = q->h->cap();
    *attr = ibv_qp_attr{};
    attr->qp_state = qp->state;
    attr->cur_qp_state = qp->state;
    attr->path_mtu = IBV_MTU_1024;
    attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    attr->cap = {c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge, c.max_inline_data};
    attr->port_num = 1;
    if (init != nullptr) {
        *init = ibv_qp_init_attr{};
        init->qp_context = qp->qp_context;
        init->send_cq = qp->send_cq;
        init->recv_cq = qp->recv_cq;
        init->srq = qp->srq;
        init->cap = attr->cap;
        init->qp_type = IBV_QPT_RC;
    }
    return 0;
}

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* a) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || pd == nullptr) return nullptr;
    Guard g(*rt);
    auto s = std::make_unique<Srq>();
    try {
        s->h = of(pd)->h->create_srq({.max_wr = std::max<std::uint32_t>(a->attr.max_wr, 1),
                                      .max_sge = std::max<std::uint32_t>(a->attr.max_sge, 1),
                                      .srq_limit = a->attr.srq_limit});
    } catch (const std::exception&) {
        errno = EINVAL;
        return nullptr;
    }
    ibv_srq& o = s->srq;
    o.context = pd->context;
    o.srq_context = a->srq_context;
    o.pd = pd;
    pthread_mutex_init(&o.mutex, nullptr);
    pthread_cond_init(&o.cond, nullptr);
    return &s.release()->srq;
}

int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    if ((mask & IBV_SRQ_MAX_WR) != 0) return EOPNOTSUPP;  // sized at creation
    if ((mask & IBV_SRQ_LIMIT) != 0) of(srq)->h->arm_limit(attr->srq_limit);
    return 0;
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    attr->srq_limit = of(srq)->h->limit();
    attr->max_wr = static_cast<std::uint32_t>(of(srq)->h->posted());
    attr->max_sge = verbs::kMaxSge;
    return 0;
}

int ibv_destroy_srq(ibv_srq* srq) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return ENODEV;
    Guard g(*rt);
    delete of(srq);
    return 0;
}

// Not on iWARP: address handles (UD) and multicast; no extended QP.
ibv_ah* ibv_create_ah(ibv_pd*, ibv_ah_attr*) {
    errno = EOPNOTSUPP;
    return nullptr;
}
ibv_ah* ibv_create_ah_from_wc(ibv_pd*, ibv_wc*, ibv_grh*, std::uint8_t) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int ibv_destroy_ah(ibv_ah*) { return EOPNOTSUPP; }
int ibv_attach_mcast(ibv_qp*, const ibv_gid*, std::uint16_t) { return EOPNOTSUPP; }
int ibv_detach_mcast(ibv_qp*, const ibv_gid*, std::uint16_t) { return EOPNOTSUPP; }
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp*) {
    errno = EOPNOTSUPP;
    return nullptr;
}

const char* ibv_wc_status_str(ibv_wc_status status) {
    switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_FATAL_ERR: return "fatal error";
    default: return "unknown";
    }
}

}  // extern "C"
