// SPDX-License-Identifier: MIT
// The drop-in librdmacm.so.1: rdma_cm (Debian 12's <rdma/rdma_cma.h>, symbol versions as librdmacm.map) over
// softrdma's connection manager. IPv4 and RDMA_PS_TCP (reliable connected) only. Address and route
// resolution complete at once (the TCP connect resolves the peer's MAC); connect, accept, reject and
// disconnect map one to one; the Context's CM events are sorted onto each id's event channel after every
// engine turn, and rdma_get_cm_event polls the engine while it waits.
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "base/log.hpp"
#include "verbs/dropin/objects.hpp"

namespace softrdma::dropin {
namespace {

struct Event {
    rdma_cm_event ev{};
    std::vector<std::byte> private_data;
};

// The fd is readable exactly while events are queued: written once when the queue stops being empty, read
// (reset) when it empties again. The application may make it non-blocking (O_NONBLOCK: rdma_get_cm_event
// then returns EAGAIN instead of waiting), so our own read never relies on it blocking or not.
struct EvChannel {
    rdma_event_channel ch{};
    std::deque<Event*> queue;
    bool readable{false};
    // Destroyed: its fd closed, its events and queue freed; the struct itself is kept (in g_destroyed_channels:
    // ~100 bytes per channel ever destroyed), because a thread may still be on its way into rdma_get_cm_event
    // (see there).
    bool destroyed{false};
    void update() noexcept {
        if (queue.empty() == !readable) return;
        readable = !queue.empty();
        std::uint64_t v = 1;
        [[maybe_unused]] const auto r = readable ? ::write(ch.fd, &v, sizeof v) : ::read(ch.fd, &v, sizeof v);
    }
};

struct Id {
    rdma_cm_id id{};
    std::unique_ptr<verbs::CmId> cm;
    std::unique_ptr<verbs::CmListener> listener;
    Ipv4 dst{};
    std::uint16_t dst_port{0};
    std::uint16_t src_port{0};
    bool bound{false};      // by rdma_bind_addr: src_port held (in g_port_owners) until the id is destroyed
    bool any_addr{false};   // bound to INADDR_ANY (else to the device's address)
    bool reuseaddr{false};  // RDMA_OPTION_ID_REUSEADDR
    // Synchronous (created without a channel, by rdma_create_ep, or a request taken by rdma_get_request): the id
    // has a channel of its own, and each call that produces an event waits for it and keeps it in id.event
    // until the next such call or the id's end, as librdmacm's ucma_complete does.
    bool sync{false};
    std::unique_ptr<ibv_qp_init_attr> ep_attr;  // rdma_create_ep's QP attributes for a passive endpoint's requests
    bool own_cqs{false};  // rdma_create_qp made id.send_cq / recv_cq and their channels: rdma_destroy_qp ends them
};

// Channels destroyed, kept for threads still on their way into rdma_get_cm_event (under the lock). Never
// freed, not even at exit (such a thread may still be there): the list itself is never destroyed either, so
// they stay reachable to the end (a leak checker running after the static destructors sees them).
std::vector<EvChannel*>& g_destroyed_channels = *new std::vector<EvChannel*>;

// Which id a softrdma CM handle belongs to (control path, under the lock).
std::map<const verbs::CmId*, Id*> g_by_cm;
std::map<const verbs::CmListener*, Id*> g_by_listener;

// The ids holding each port through rdma_bind_addr (control path, under the lock). As with the kernel's
// rdma_cm (cma_check_port): a port one id holds is refused to another until it is destroyed, EADDRNOTAVAIL when
// either is bound to the wildcard address and EADDRINUSE when both name the device's, unless both set
// RDMA_OPTION_ID_REUSEADDR (a second listener still fails, at rdma_listen); binding port 0 takes a free ephemeral
// port at once (qperf's server reads it with rdma_get_src_port and sends it to its client before
// rdma_listen). The range stays below lwIP's own ephemeral ports (TCP_LOCAL_PORT_RANGE_START, 0xc000), which
// outgoing connections take.
std::map<std::uint16_t, std::vector<const Id*>> g_port_owners;

// 0, or the errno binding `id` to `port` meets (the kernel's cma_check_port).
int port_conflict(const Id* id, std::uint16_t port) {
    const auto it = g_port_owners.find(port);
    if (it == g_port_owners.end()) return 0;
    for (const Id* o : it->second) {
        if (o == id || (id->reuseaddr && o->reuseaddr)) continue;
        return id->any_addr || o->any_addr ? EADDRNOTAVAIL : EADDRINUSE;
    }
    return 0;
}

void release_port(const Id* id) {
    if (!id->bound) return;
    const auto it = g_port_owners.find(id->src_port);
    if (it == g_port_owners.end()) return;
    std::erase(it->second, id);
    if (it->second.empty()) g_port_owners.erase(it);
}
constexpr std::uint16_t kPickFirst = 32768, kPickEnd = 49152;

// A port some id listens on (bound explicitly or picked): not picked again.
bool listened_on(std::uint16_t port) {
    return std::any_of(g_by_listener.begin(), g_by_listener.end(),
                       [port](const auto& l) { return l.second->src_port == port; });
}

std::uint16_t pick_port() {
    static std::uint16_t next = static_cast<std::uint16_t>(kPickFirst + ::getpid() % (kPickEnd - kPickFirst));
    for (unsigned n = 0; n < kPickEnd - kPickFirst; ++n) {
        const std::uint16_t p = next;
        next = next + 1 == kPickEnd ? kPickFirst : static_cast<std::uint16_t>(next + 1);
        if (g_port_owners.count(p) == 0 && !listened_on(p)) return p;
    }
    return 0;
}

// Binds `id` (not bound yet) to `port` of the wildcard or the device's address; port 0 takes a free one. 0, or
// the errno (the kernel's rdma_bind_addr). Under the lock.
int bind_port(Id* id, bool any_addr, std::uint16_t port) {
    id->any_addr = any_addr;
    if (port == 0) {
        port = pick_port();
        if (port == 0) return EADDRNOTAVAIL;  // none free (the kernel's cma_alloc_any_port)
    } else if (const int e = port_conflict(id, port); e != 0) {
        return e;
    }
    id->src_port = port;
    g_port_owners[port].push_back(id);
    id->bound = true;
    return 0;
}

EvChannel* chan(rdma_event_channel* c) { return reinterpret_cast<EvChannel*>(c); }
Id* of_id(rdma_cm_id* i) { return reinterpret_cast<Id*>(i); }

void queue_event(Id* id, rdma_cm_event_type type, int status, Id* listen = nullptr, const PrivateData* pd = nullptr,
                 std::uint16_t ird = 0, std::uint16_t ord = 0) {
    auto* e = new Event;
    e->ev.id = &id->id;
    e->ev.listen_id = listen != nullptr ? &listen->id : nullptr;
    e->ev.event = type;
    e->ev.status = status;
    if (pd != nullptr && pd->size != 0) {
        e->private_data.assign(pd->bytes.begin(), pd->bytes.begin() + pd->size);
        e->ev.param.conn.private_data = e->private_data.data();
        e->ev.param.conn.private_data_len = static_cast<std::uint8_t>(std::min<std::size_t>(pd->size, 255));
    }
    e->ev.param.conn.responder_resources = static_cast<std::uint8_t>(std::min<std::uint16_t>(ird, 255));
    e->ev.param.conn.initiator_depth = static_cast<std::uint8_t>(std::min<std::uint16_t>(ord, 255));
    EvChannel* c = chan(id->id.channel);
    c->queue.push_back(e);
    c->update();
}

void fill_addr(Id* id, Runtime& rt) {
    sockaddr_in& s = id->id.route.addr.src_sin;
    s.sin_family = AF_INET;
    s.sin_addr.s_addr = rt.settings().context.ip.address.be;
    s.sin_port = htons(id->src_port);
    if (id->dst.be != 0) {
        sockaddr_in& d = id->id.route.addr.dst_sin;
        d.sin_family = AF_INET;
        d.sin_addr.s_addr = id->dst.be;
        d.sin_port = htons(id->dst_port);
    }
}

// After every engine turn: the Context's CM events onto the channels of the ids they name.
void after_turn() noexcept {
    Runtime* rt = Runtime::get();
    if (rt == nullptr || !rt->ctx().has_cm_event()) return;
    while (auto ev = rt->ctx().get_cm_event()) {
        try {
            if (ev->type == verbs::CmEventType::connect_request) {
                const auto l = g_by_listener.find(ev->listener);
                if (l == g_by_listener.end() || !ev->request) continue;  // its listener went: the request is refused
                Id* parent = l->second;
                auto* child = new Id;
                child->id.verbs = parent->id.verbs;
                child->id.pd = parent->id.pd;
                child->id.channel = parent->id.channel;
                child->id.context = parent->id.context;
                child->id.ps = parent->id.ps;
                child->id.qp_type = IBV_QPT_RC;
                child->id.port_num = 1;
                child->cm = std::move(ev->request);
                child->src_port = parent->src_port;
                child->dst = child->cm->peer_address();  // the initiator's address and TCP port
                child->dst_port = child->cm->peer_port();
                g_by_cm[child->cm.get()] = child;
                fill_addr(child, *rt);
                queue_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, parent, &ev->private_data, ev->ird, ev->ord);
                continue;
            }
            const auto it = g_by_cm.find(ev->id);
            if (it == g_by_cm.end()) continue;
            Id* id = it->second;
            if (id->id.qp != nullptr) sync_qp_state(of(id->id.qp));
            switch (ev->type) {
            case verbs::CmEventType::established:
                queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, nullptr, &ev->private_data, ev->ird, ev->ord);
                break;
            case verbs::CmEventType::rejected:
                queue_event(id, RDMA_CM_EVENT_REJECTED, -ECONNREFUSED, nullptr, &ev->private_data);
                break;
            case verbs::CmEventType::unreachable: queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT); break;
            case verbs::CmEventType::disconnected: queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0); break;
            case verbs::CmEventType::error: queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET); break;
            case verbs::CmEventType::connect_request: break;
            }
        } catch (const std::exception&) {
            // out of memory for an event: it is lost, as a full event queue loses it
        }
    }
}

Runtime* runtime() {
    Runtime* rt = Runtime::get();
    if (rt != nullptr && device_context() != nullptr) {
        rt->add_after_turn(&after_turn);
        return rt;
    }
    if (errno == 0) errno = ENODEV;
    return nullptr;
}

verbs::ConnParam conn_param(const Runtime& rt, const rdma_conn_param* p) {
    verbs::ConnParam cp;
    cp.peer_to_peer = rt.settings().peer_to_peer;
    cp.crc = rt.settings().crc;
    cp.rfc7306 = rt.settings().rfc7306;
    cp.connect_retry = rt.settings().connect_retry;
    cp.liveness = rt.settings().liveness;
    if (p != nullptr) {
        cp.private_data = {static_cast<const std::byte*>(p->private_data), p->private_data_len};
        cp.responder_resources = p->responder_resources;
        cp.initiator_depth = p->initiator_depth;
    }
    return cp;
}

// The events on `c` that belong to `id`: its own, and for a listener its requests not yet taken (event id a
// child whose listen_id is `id`) with whatever followed for those children. Removed from the queue, in order.
// Under the lock.
std::vector<Event*> take_events(EvChannel* c, const rdma_cm_id* id, std::vector<rdma_cm_id*>* children = nullptr) {
    std::vector<Event*> out;
    std::vector<rdma_cm_id*> kids;
    std::erase_if(c->queue, [&](Event* e) {
        if (e->ev.listen_id == id && e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST) kids.push_back(e->ev.id);
        if (e->ev.id != id && std::find(kids.begin(), kids.end(), e->ev.id) == kids.end()) return false;
        out.push_back(e);
        return true;
    });
    c->update();
    if (children != nullptr) *children = std::move(kids);
    return out;
}

// A synchronous id's own channel, at its end: no thread but the id's own caller waits on it (complete()), so it
// is freed at once (an application's channels are kept: see g_destroyed_channels). Under the lock.
void free_private_channel(rdma_event_channel* channel) {
    EvChannel* c = chan(channel);
    for (Event* e : c->queue) delete e;
    ::close(c->ch.fd);
    delete c;
}

// The PD an id names once it has the device (librdmacm's per-device PD: rdma_reg_msgs registers with id->pd
// before any QP exists). One for the process, never freed. Called without the lock (ibv_alloc_pd takes it).
ibv_pd* default_pd() {
    static ibv_pd* pd = nullptr;
    static std::mutex once;
    const std::lock_guard<std::mutex> lock(once);
    if (pd == nullptr) pd = ibv_alloc_pd(device_context());
    return pd;
}

// The CQs and completion channels rdma_create_qp made for `id` (none given by the caller), ended. Without the
// lock (ibv_destroy_cq takes it).
void drop_own_cqs(rdma_cm_id* id) {
    Id* i = of_id(id);
    if (!i->own_cqs) return;
    if (id->recv_cq != nullptr) ibv_destroy_cq(id->recv_cq);
    if (id->send_cq != nullptr) ibv_destroy_cq(id->send_cq);
    if (id->recv_cq_channel != nullptr) ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel != nullptr) ibv_destroy_comp_channel(id->send_cq_channel);
    id->recv_cq = id->send_cq = nullptr;
    id->recv_cq_channel = id->send_cq_channel = nullptr;
    i->own_cqs = false;
}

// A synchronous id's wait for the event of the call just made (librdmacm's ucma_complete): the event stays
// in id.event (the previous one acked); -1 with errno from its status when it failed.
int complete(Id* i) {
    if (!i->sync) return 0;
    if (i->id.event != nullptr) {
        rdma_ack_cm_event(i->id.event);
        i->id.event = nullptr;
    }
    if (rdma_get_cm_event(i->id.channel, &i->id.event) != 0) return -1;
    const rdma_cm_event& e = *i->id.event;
    if (e.status == 0) return 0;
    errno = e.event == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED : (e.status < 0 ? -e.status : e.status);
    return -1;
}

}  // namespace
}  // namespace softrdma::dropin

using namespace softrdma;
using namespace softrdma::dropin;

extern "C" {

rdma_event_channel* rdma_create_event_channel() {
    const int fd = ::eventfd(0, EFD_CLOEXEC);
    if (fd < 0) return nullptr;
    auto* c = new EvChannel;
    c->ch.fd = fd;
    return &c->ch;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
    EvChannel* c = chan(channel);
    Runtime* rt = Runtime::get();
    std::unique_ptr<Guard> g = rt != nullptr ? std::make_unique<Guard>(*rt) : nullptr;
    for (Event* e : c->queue) delete e;
    std::deque<Event*>().swap(c->queue);  // the queue's own memory too
    ::close(c->ch.fd);
    c->destroyed = true;
    g_destroyed_channels.push_back(c);  // ownership: the list's, until the process ends (see EvChannel::destroyed)
}

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
    if (ps != RDMA_PS_TCP) {
        errno = EINVAL;  // iWARP: reliable connected only
        return -1;
    }
    const bool sync = channel == nullptr;  // a synchronous id: a channel of its own
    if (sync && (channel = rdma_create_event_channel()) == nullptr) return -1;
    auto* i = new Id;
    i->sync = sync;
    i->id.channel = channel;
    i->id.context = context;
    i->id.ps = ps;
    i->id.qp_type = IBV_QPT_RC;
    i->id.port_num = 1;
    *id = &i->id;
    return 0;
}

// Its queued events go with it. Under the lock: the engine's turns (any thread's) queue events on the same
// channel.
int rdma_destroy_id(rdma_cm_id* id) {
    Id* i = of_id(id);
    // Its queued events go, and a listener's requests not yet taken with their ids (reset, as the kernel's
    // rdma_cm does when a listener is destroyed): nothing is left to name a freed id or a freed channel.
    auto forget = [&] {
        std::vector<rdma_cm_id*> children;
        for (Event* e : take_events(chan(id->channel), id, &children)) delete e;
        for (rdma_cm_id* child : children) {
            Id* k = of_id(child);
            if (k->cm) g_by_cm.erase(k->cm.get());
            delete k;  // its CmId aborts the connection
        }
    };
    if (Runtime* rt = Runtime::get(); rt != nullptr && id->verbs != nullptr) {
        Guard g(*rt);
        if (id->qp != nullptr) of(id->qp)->cm_id = nullptr;  // the QP stays the application's
        if (i->cm) g_by_cm.erase(i->cm.get());
        if (i->listener) g_by_listener.erase(i->listener.get());
        release_port(i);
        i->cm.reset();  // a connection still in use is reset
        i->listener.reset();
        forget();
    } else {
        forget();  // never bound to the device: no turn can queue for it
    }
    if (id->event != nullptr) rdma_ack_cm_event(id->event);  // a synchronous id's last event
    if (i->sync) {
        Runtime* rt = Runtime::get();
        std::unique_ptr<Guard> g = rt != nullptr ? std::make_unique<Guard>(*rt) : nullptr;
        free_private_channel(id->channel);
    }
    delete i;
    return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    Id* i = of_id(id);
    const bool sync = channel == nullptr;  // to a channel of its own (librdmacm: a synchronous id)
    if (sync && i->sync) {
        errno = EINVAL;
        return -1;
    }
    if (sync && (channel = rdma_create_event_channel()) == nullptr) return -1;
    rdma_event_channel* old = id->channel;
    const bool was_sync = i->sync;
    {
        Guard g(*rt);
        EvChannel* from = chan(id->channel);
        EvChannel* to = chan(channel);
        std::vector<rdma_cm_id*> children;
        for (Event* e : take_events(from, id, &children)) to->queue.push_back(e);
        to->update();
        id->channel = channel;
        for (rdma_cm_id* child : children) child->channel = channel;  // requests not yet taken follow
        i->sync = sync;
        if (was_sync) free_private_channel(old);  // its own channel goes
    }
    if (was_sync && id->event != nullptr) {  // and the event it kept
        rdma_ack_cm_event(id->event);
        id->event = nullptr;
    }
    return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
    if (addr == nullptr || addr->sa_family != AF_INET) {
        errno = EAFNOSUPPORT;
        return -1;
    }
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    const auto* sin = reinterpret_cast<const sockaddr_in*>(addr);
    if (sin->sin_addr.s_addr != INADDR_ANY && sin->sin_addr.s_addr != rt->settings().context.ip.address.be) {
        errno = EADDRNOTAVAIL;
        return -1;
    }
    ibv_pd* pd = default_pd();  // before the lock (ibv_alloc_pd takes it)
    Guard g(*rt);
    Id* i = of_id(id);
    if (i->bound || i->listener || i->cm) {
        errno = EINVAL;  // bound or in use already: the kernel's rdma_cm binds an id once, while it is idle
        return -1;
    }
    if (const int e = bind_port(i, sin->sin_addr.s_addr == INADDR_ANY, ntohs(sin->sin_port)); e != 0) {
        errno = e;
        return -1;
    }
    id->verbs = device_context();
    if (id->pd == nullptr) id->pd = pd;
    fill_addr(i, *rt);
    return 0;
}

int rdma_listen(rdma_cm_id* id, int) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    Guard g(*rt);
    Id* i = of_id(id);
    if (i->src_port == 0) {
        errno = EINVAL;  // bind a port first
        return -1;
    }
    try {
        i->listener = rt->ctx().listen(i->src_port);
    } catch (const std::exception& e) {
        log::warn("rdma_listen: {}", e.what());
        errno = EADDRINUSE;
        return -1;
    }
    g_by_listener[i->listener.get()] = i;
    return 0;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int) {
    if (dst == nullptr || dst->sa_family != AF_INET || (src != nullptr && src->sa_family != AF_INET)) {
        errno = EAFNOSUPPORT;
        return -1;
    }
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    // A source address must be this device's (or the wildcard), as the kernel's rdma_cm binds the id to it.
    const auto* s = reinterpret_cast<const sockaddr_in*>(src);
    if (s != nullptr && s->sin_addr.s_addr != INADDR_ANY && s->sin_addr.s_addr != rt->settings().context.ip.address.be) {
        errno = EADDRNOTAVAIL;
        return -1;
    }
    ibv_pd* pd = default_pd();
    Id* i = of_id(id);
    {
        Guard g(*rt);
        if (i->cm || i->listener) {
            errno = EINVAL;  // connected, connecting or listening: not an id to resolve
            return -1;
        }
        // An id not bound yet is bound now, to the source's port or a free one (the kernel's cma_bind_addr): its
        // connection leaves from that TCP port, which rdma_get_src_port shows from here on.
        if (!i->bound) {
            if (const int e = bind_port(i, s == nullptr || s->sin_addr.s_addr == INADDR_ANY, s != nullptr ? ntohs(s->sin_port) : 0);
                e != 0) {
                errno = e;
                return -1;
            }
        }
        const auto* d = reinterpret_cast<const sockaddr_in*>(dst);
        i->dst.be = d->sin_addr.s_addr;
        i->dst_port = ntohs(d->sin_port);
        id->verbs = device_context();
        if (id->pd == nullptr) id->pd = pd;
        fill_addr(i, *rt);
        queue_event(i, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    }
    return complete(i);
}

int rdma_resolve_route(rdma_cm_id* id, int) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    {
        Guard g(*rt);
        queue_event(of_id(id), RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    }
    return complete(of_id(id));
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    if (attr == nullptr || id->qp != nullptr || id->verbs == nullptr) {
        errno = EINVAL;  // (no device: bind or resolve first)
        return -1;
    }
    if (pd == nullptr) pd = id->pd != nullptr ? id->pd : default_pd();
    if (pd == nullptr) return -1;
    Id* i = of_id(id);
    // CQs the caller did not give: one each way with a completion channel, the id as their context, as
    // librdmacm makes them (rdma_get_send_comp / rdma_get_recv_comp wait on them); rdma_destroy_qp ends them.
    const auto drop_cqs = [&] { drop_own_cqs(id); };
    const auto make_cq = [&](ibv_cq*& cq, ibv_comp_channel*& channel, std::uint32_t size) {
        i->own_cqs = true;
        channel = ibv_create_comp_channel(id->verbs);
        if (channel != nullptr) cq = ibv_create_cq(id->verbs, static_cast<int>(std::max<std::uint32_t>(size, 1)), id, channel, 0);
        return cq != nullptr;
    };
    if ((attr->recv_cq == nullptr && id->recv_cq == nullptr && !make_cq(id->recv_cq, id->recv_cq_channel, attr->cap.max_recv_wr)) ||
        (attr->send_cq == nullptr && id->send_cq == nullptr && !make_cq(id->send_cq, id->send_cq_channel, attr->cap.max_send_wr))) {
        const int e = errno;
        drop_cqs();
        errno = e;
        return -1;
    }
    if (attr->recv_cq == nullptr) attr->recv_cq = id->recv_cq;
    if (attr->send_cq == nullptr) attr->send_cq = id->send_cq;
    {
        Guard g(*rt);
        if (Qp* q = make_qp(g, pd, attr); q != nullptr) {
            q->cm_id = id;
            id->qp = &q->qp;
            id->pd = pd;
            return 0;
        }
    }
    const int e = errno;
    drop_cqs();
    errno = e;
    return -1;
}

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* a) {
    if ((a->comp_mask & ~static_cast<std::uint32_t>(IBV_QP_INIT_ATTR_PD)) != 0) {
        errno = EOPNOTSUPP;  // extended QP attributes (send ops flags, TSO, ...)
        return -1;
    }
    ibv_qp_init_attr attr{};
    attr.qp_context = a->qp_context;
    attr.send_cq = a->send_cq;
    attr.recv_cq = a->recv_cq;
    attr.srq = a->srq;
    attr.cap = a->cap;
    attr.qp_type = a->qp_type;
    attr.sq_sig_all = a->sq_sig_all;
    const int rc = rdma_create_qp(id, (a->comp_mask & IBV_QP_INIT_ATTR_PD) != 0 ? a->pd : nullptr, &attr);
    a->cap = attr.cap;
    a->send_cq = attr.send_cq;  // the ones it made, if any
    a->recv_cq = attr.recv_cq;
    return rc;
}

void rdma_destroy_qp(rdma_cm_id* id) {
    Runtime* rt = Runtime::get();
    if (rt == nullptr) return;
    if (id->qp != nullptr) {
        Guard g(*rt);
        delete of(id->qp);
        id->qp = nullptr;
    }
    drop_own_cqs(id);
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* param) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    Guard g(*rt);
    Id* i = of_id(id);
    if (id->qp == nullptr || i->dst.be == 0) {
        log::warn("rdma_connect: {}",
                  id->qp == nullptr ? "no QP (rdma_create_qp first)" : "no address (rdma_resolve_addr first)");
        errno = EINVAL;
        return -1;
    }
    try {
        verbs::ConnParam cp = conn_param(*rt, param);
        cp.local_port = i->src_port;  // bound by rdma_bind_addr or rdma_resolve_addr
        i->cm = rt->ctx().connect(i->dst, i->dst_port, *of(id->qp)->h, cp);
    } catch (const std::exception& e) {
        log::warn("rdma_connect: {}", e.what());  // the program sees errno only
        errno = EINVAL;
        return -1;
    }
    g_by_cm[i->cm.get()] = i;
    sync_qp_state(of(id->qp));
    g.unlock();
    return complete(i);
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* param) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    Guard g(*rt);
    Id* i = of_id(id);
    if (!i->cm || id->qp == nullptr || !i->cm->accept(*of(id->qp)->h, conn_param(*rt, param))) {
        errno = EINVAL;
        return -1;
    }
    sync_qp_state(of(id->qp));
    g.unlock();
    return complete(i);
}

int rdma_reject(rdma_cm_id* id, const void* private_data, std::uint8_t len) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    Guard g(*rt);
    Id* i = of_id(id);
    if (!i->cm || !i->cm->reject({static_cast<const std::byte*>(private_data), len})) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

int rdma_disconnect(rdma_cm_id* id) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    Guard g(*rt);
    Id* i = of_id(id);
    if (!i->cm) {
        errno = EINVAL;
        return -1;
    }
    // A synchronous id waits for the DISCONNECTED this brings, or the one already queued. A connection that had
    // ended with its event taken (a failed connect, a second disconnect) brings none: EINVAL at once (librdmacm
    // fails there too, moving an errored QP to SQD).
    const bool was_connected = i->cm->connected();
    i->cm->disconnect();
    rt->turn();
    if (!i->sync) return 0;
    const auto& q = chan(id->channel)->queue;
    if (!was_connected && std::none_of(q.begin(), q.end(), [id](const Event* e) { return e->ev.id == id; })) {
        errno = EINVAL;
        return -1;
    }
    g.unlock();
    return complete(i);
}

int rdma_establish(rdma_cm_id*) { return 0; }  // iWARP: the connection is established by accept/connect

int rdma_init_qp_attr(rdma_cm_id*, ibv_qp_attr*, int*) {
    errno = ENOSYS;  // iWARP QPs are moved by the CM, not by the application
    return -1;
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
    Runtime* rt = runtime();
    if (rt == nullptr) return -1;
    EvChannel* c = chan(channel);
    bool nonblocking = false;
    bool destroyed = false;
    {
        Guard g(*rt);
        destroyed = c->destroyed;
        const int flags = destroyed ? 0 : ::fcntl(c->ch.fd, F_GETFL);
        if (flags < 0) return -1;  // errno: EBADF
        nonblocking = (flags & O_NONBLOCK) != 0;
    }
    Event* got = nullptr;
    const Wait w = destroyed ? Wait::done : wait_for(*rt, nonblocking ? 0 : -1, [&] {
        if (c->destroyed) return destroyed = true;
        if (c->queue.empty()) return false;
        got = c->queue.front();
        c->queue.pop_front();
        c->update();
        return true;
    });
    if (destroyed) {
        // The channel was destroyed before or while this thread waited on it (rping 44's CM thread, while main
        // ends the program). The kernel's librdmacm thread would sit in read() until the process ends: so does
        // this one, touching nothing.
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    if (w != Wait::done) {
        errno = w == Wait::interrupted ? EINTR : EAGAIN;  // EINTR: as the kernel's read() on the channel
        return -1;
    }
    *event = &got->ev;
    return 0;
}

// Ownership: an Event belongs to its channel's queue until rdma_get_cm_event hands it out, then to the
// application until it acks it here (or to rdma_destroy_id / rdma_destroy_event_channel, which free the
// events still queued).
int rdma_ack_cm_event(rdma_cm_event* event) {
    delete reinterpret_cast<Event*>(event);
    return 0;
}

const char* rdma_event_str(rdma_cm_event_type e) {
    switch (e) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
    }
    return "UNKNOWN EVENT";
}

int rdma_set_option(rdma_cm_id* id, int level, int name, void* value, std::size_t len) {
    if (level != RDMA_OPTION_ID) {
        errno = ENOSYS;
        return -1;
    }
    if (name != RDMA_OPTION_ID_REUSEADDR) return 0;  // TOS, AF-only, timeouts: nothing to change here
    if (value == nullptr || len != sizeof(int)) {
        errno = EINVAL;
        return -1;
    }
    int reuse = 0;
    std::memcpy(&reuse, value, sizeof reuse);
    Runtime* rt = Runtime::get();
    std::unique_lock<std::mutex> lock;
    if (rt != nullptr) lock = std::unique_lock<std::mutex>(rt->lock());
    Id* i = of_id(id);
    // The kernel's rdma_set_reuseaddr: on an idle id, or turned on while not listening.
    if (i->bound && !(reuse != 0 && !i->listener)) {
        errno = EINVAL;
        return -1;
    }
    i->reuseaddr = reuse != 0;
    return 0;
}

__be16 rdma_get_src_port(rdma_cm_id* id) { return htons(of_id(id)->src_port); }
__be16 rdma_get_dst_port(rdma_cm_id* id) { return htons(of_id(id)->dst_port); }

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
    addrinfo h{};
    h.ai_family = AF_INET;
    h.ai_socktype = SOCK_STREAM;
    const bool passive = hints != nullptr && (hints->ai_flags & RAI_PASSIVE) != 0;
    if (passive) h.ai_flags |= AI_PASSIVE;
    if (hints != nullptr && (hints->ai_flags & RAI_NUMERICHOST) != 0) h.ai_flags |= AI_NUMERICHOST;
    if (hints != nullptr && hints->ai_family != AF_UNSPEC && hints->ai_family != AF_INET) {
        errno = EAFNOSUPPORT;
        return -1;
    }
    addrinfo* ai = nullptr;
    if (const int rc = ::getaddrinfo(node, service, &h, &ai); rc != 0 || ai == nullptr) {
        errno = ENOENT;
        return -1;
    }
    auto* r = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
    auto* sa = static_cast<sockaddr_in*>(std::calloc(1, sizeof(sockaddr_in)));
    if (r == nullptr || sa == nullptr) {
        std::free(r);
        std::free(sa);
        ::freeaddrinfo(ai);
        errno = ENOMEM;
        return -1;
    }
    std::memcpy(sa, ai->ai_addr, sizeof(sockaddr_in));
    ::freeaddrinfo(ai);
    r->ai_flags = hints != nullptr ? hints->ai_flags : 0;
    r->ai_family = AF_INET;
    r->ai_qp_type = IBV_QPT_RC;
    r->ai_port_space = RDMA_PS_TCP;
    if (passive) {
        r->ai_src_len = sizeof(sockaddr_in);
        r->ai_src_addr = reinterpret_cast<sockaddr*>(sa);
    } else {
        r->ai_dst_len = sizeof(sockaddr_in);
        r->ai_dst_addr = reinterpret_cast<sockaddr*>(sa);
    }
    *res = r;
    return 0;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
    while (res != nullptr) {
        rdma_addrinfo* next = res->ai_next;
        std::free(res->ai_src_addr);
        std::free(res->ai_dst_addr);
        std::free(res);
        res = next;
    }
}

// Synchronous endpoints, as librdmacm's: a passive one is bound and keeps the QP attributes for the requests
// rdma_get_request hands out; an active one has its address and route resolved and its QP (and CQs) made.
int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
    if (id == nullptr || res == nullptr) {
        errno = EINVAL;
        return -1;
    }
    rdma_cm_id* cm_id = nullptr;
    if (rdma_create_id(nullptr, &cm_id, nullptr, static_cast<rdma_port_space>(res->ai_port_space)) != 0) return -1;
    int rc = 0;
    if ((res->ai_flags & RAI_PASSIVE) != 0) {
        rc = rdma_bind_addr(cm_id, res->ai_src_addr);
        if (rc == 0) {
            if (pd != nullptr) cm_id->pd = pd;
            if (qp_init_attr != nullptr) {
                of_id(cm_id)->ep_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
                of_id(cm_id)->ep_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
            }
        }
    } else {
        rc = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
        if (rc == 0) rc = rdma_resolve_route(cm_id, 2000);
        if (rc == 0 && qp_init_attr != nullptr) {
            qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
            rc = rdma_create_qp(cm_id, pd, qp_init_attr);
        }
    }
    if (rc != 0) {
        const int e = errno;
        rdma_destroy_ep(cm_id);
        errno = e;
        return -1;
    }
    *id = cm_id;
    return 0;
}

void rdma_destroy_ep(rdma_cm_id* id) {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    of_id(id)->ep_attr.reset();
    rdma_destroy_id(id);
}

// The next connection request on a synchronous listener, as a synchronous id of its own (its QP made from the
// endpoint's attributes, if any); the request event stays in its id.event until its next call.
int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
    Id* l = of_id(listen);
    if (!l->sync || id == nullptr) {
        errno = EINVAL;
        return -1;
    }
    if (listen->event != nullptr) {
        rdma_ack_cm_event(listen->event);
        listen->event = nullptr;
    }
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(listen->channel, &event) != 0) return -1;
    if (event->status != 0 || event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        errno = event->status != 0 ? (event->status < 0 ? -event->status : event->status) : EINVAL;
        listen->event = event;
        return -1;
    }
    rdma_cm_id* child = event->id;
    ibv_qp_init_attr attr{};
    if (l->ep_attr != nullptr) attr = *l->ep_attr;
    if (rdma_migrate_id(child, nullptr) != 0 || (l->ep_attr != nullptr && rdma_create_qp(child, listen->pd, &attr) != 0)) {
        const int e = errno;  // the request is refused: its id goes (its connection reset)
        rdma_ack_cm_event(event);
        rdma_destroy_ep(child);
        errno = e;
        return -1;
    }
    child->event = event;
    *id = child;
    return 0;
}

}  // extern "C"
