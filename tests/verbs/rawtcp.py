#!/usr/bin/env python3
"""A raw TCP peer for tests/verbs/rawtcp_test.cpp: TCP written by hand over an AF_PACKET socket, from an address
the kernel does not own (so the kernel's TCP stays out of it), to send what a kernel socket never would:
segments out of order, overlapping, repeated with other bytes, floods far past a hole, and a receive window
that stays shut while it keeps answering. One connection per case to a softrdma listener: SYN with MSS 1460 and
window scale 7, MPA revision 2 (no CRC, no Markers, private data "HOSTILE:CASE", tests/verbs/hostile.py's
encoders), then the case.

Usage: rawtcp.py IFACE MY_IP SERVER_IP PORT CASE...      (CASE "all": every case, then "quit")
Prints per case "raw CASE: <outcome> [S s]"; the message cases first print "expect CASE: H,H,..." (FNV-1a 32 of
each SEND's payload, in order), the WRITE flood "expect CASE: write=H" (of the area it writes).

Cases:
  reorder         32 SENDs, one FPDU per segment, the segments sent in a shuffled order
  overlap         the same stream cut into overlapping segments (each byte in two or three), shuffled, repeated
  stale-conflict  half the stream in order, then that half sent again with other bytes (and one segment
                  straddling the next expected byte: stale bytes then new ones); TCP must keep the first copy
  ooseq-flood     1 MiB of WRITEs (1000-byte FPDUs) sent past a one-segment hole as fast as we can, plus 200
                  segments beyond the receive window, then the hole and the rest (go-back-N on the ACKs)
  zero-window     a 64 KiB READ request into a 4 KiB window (no scaling) that its response fills; held at 0 for
                  2.5 s while we flood pure ACKs (window 0) and answer the zero-window probes, then opened: the
                  READ response must arrive whole and correct
  zero-window-forever  the same, the window never opens: softrdma must give up (user timeout) and reset
  rst-in-window   half of 32 SENDs, then a RST inside the server's receive window but not at its next byte
                  (RFC 5961 section 3: a challenge ACK, the connection stays), a RST far outside the window
                  (dropped), then the rest: every SEND must arrive
  syn-in-window   the same with a SYN on the established connection (RFC 5961 section 4: a challenge ACK)
  ack-unsent      the same with an ACK for bytes the server never sent (RFC 5961 section 5: dropped, an ACK back)
  ip-shapes       32 SENDs in segments whose IPv4 headers take every shape the receive path must tell apart:
                  ahead of each segment the same bytes flipped, in frames that must be dropped (bad header
                  checksum, a fragment by MF or by offset, a total length past the frame, a header length below
                  20, version 6), then the segment itself in turns plain, with IP options, with Ethernet padding
                  past the IP total length, and to the broadcast MAC; every SEND must arrive as sent
  window-shrink   a 64 KiB READ into a 16 KiB window (no scaling) whose right edge we move back to 1 KiB past
                  the next byte once 8 KiB came (a shrink, RFC 9293 section 3.8.6: what was sent past it is
                  dropped), held 0.3 s, then opened: the READ response must arrive whole and correct (what was
                  dropped comes again at the server's retransmission timeout)
"""
import itertools
import os
import random
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402  (the MPA/DDP/RDMAP encoders)

ETH_P_ALL, ETH_P_IP, ETH_P_ARP = 0x0003, 0x0800, 0x0806
PACKET_OUTGOING = 4
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
MSS = 1460
WSCALE = 7  # ours
MASK = 0xFFFFFFFF
REGION_PATTERN = lambda i: (i * 131 + 7) & 0xFF  # noqa: E731  the server's READ source (rawtcp_test.cpp)
READ_LEN = 65536
WRITE_AREA = 65536  # offset of the server's write area in its region
FLOOD_FPDUS, FLOOD_PAYLOAD = 1024, 1000


def fnv(data):
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & MASK
    return h


def csum(data):
    if len(data) & 1:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def seq_diff(a, b):
    """a - b in sequence space, signed."""
    d = (a - b) & MASK
    return d - (1 << 32) if d & 0x80000000 else d


# IPv4 headers ip_send can write. The server must take these (IP options: lwIP accepts them; Ethernet padding
# past the IP total length is cut; a broadcast destination MAC with our IP is still ours)...
GOOD_SHAPES = ["plain", "options", "padded", "broadcast-mac"]
# ...and drop these: a bad header checksum, a fragment (no reassembly: TCP never sends one), an IP total length
# past the frame, a header length below 20 bytes, not version 4.
BAD_SHAPES = ["bad-csum", "more-fragments", "offset", "long", "short-ihl", "version"]


class Link:
    """Ethernet + ARP + IPv4 on an AF_PACKET socket; hands TCP segments from the server up."""

    def __init__(self, iface, my_ip, srv_ip):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self.sock.bind((iface, 0))
        self.sock.setblocking(False)
        with open("/sys/class/net/%s/address" % iface) as f:
            self.mac = bytes.fromhex(f.read().strip().replace(":", ""))
        self.ip, self.srv_ip = socket.inet_aton(my_ip), socket.inet_aton(srv_ip)
        self.srv_mac = None
        self.ident = 0
        self.shapes = None  # an iterator of GOOD_SHAPES names ip_send takes in turn (None: always plain)

    def frame(self, dst, etype, payload):
        self.sock.send(dst + self.mac + struct.pack("!H", etype) + payload)

    def arp(self, op, tha, tpa, dst):
        self.frame(dst, ETH_P_ARP, struct.pack("!HHBBH", 1, ETH_P_IP, 6, 4, op) + self.mac + self.ip + tha + tpa)

    def resolve(self, deadline):
        while self.srv_mac is None:
            if time.time() > deadline:
                raise RuntimeError("no ARP answer from the server")
            self.arp(1, b"\0" * 6, self.srv_ip, b"\xff" * 6)
            self.poll(0.2)

    def ip_send(self, payload, shape=None):
        """shape: one of GOOD_SHAPES or BAD_SHAPES (None: the next of self.shapes, or plain)."""
        if shape is None:
            shape = next(self.shapes) if self.shapes is not None else "plain"
        self.ident = (self.ident + 1) & 0xFFFF
        opts = b"\x01\x01\x01\x00" if shape == "options" else b""  # NOP NOP NOP, end of options
        ver_ihl = {"short-ihl": 0x44, "version": 0x65}.get(shape, 0x40 | (20 + len(opts)) // 4)
        frag = {"more-fragments": 0x2000, "offset": 0x0001}.get(shape, 0x4000)  # else DF
        total = 20 + len(opts) + len(payload) + (100 if shape == "long" else 0)
        hdr = struct.pack("!BBHHHBBH4s4s", ver_ihl, 0, total, self.ident, frag, 64, 6, 0, self.ip,
                          self.srv_ip) + opts
        hdr = hdr[:10] + struct.pack("!H", (csum(hdr) + (1 if shape == "bad-csum" else 0)) & 0xFFFF) + hdr[12:]
        pad = b"\xee" * 24 if shape == "padded" else b""
        self.frame(b"\xff" * 6 if shape == "broadcast-mac" else self.srv_mac, ETH_P_IP, hdr + payload + pad)

    def poll(self, timeout):
        """TCP segments from the server that arrive within `timeout` (returns once some came and the socket is
        drained): (sport, dport, seq, ack, flags, win, options, payload)."""
        out = []
        end = time.time() + timeout
        while True:
            try:
                data, addr = self.sock.recvfrom(65536)
            except BlockingIOError:
                if out:
                    return out
                left = end - time.time()
                if left <= 0:
                    return out
                select.select([self.sock], [], [], left)
                continue
            if addr[2] == PACKET_OUTGOING or len(data) < 14:
                continue
            etype = struct.unpack("!H", data[12:14])[0]
            if etype == ETH_P_ARP and len(data) >= 42:
                op, sha, spa, tpa = struct.unpack("!H", data[20:22])[0], data[22:28], data[28:32], data[38:42]
                if spa == self.srv_ip:
                    self.srv_mac = sha
                if op == 1 and tpa == self.ip:
                    self.arp(2, sha, spa, sha)
            elif etype == ETH_P_IP and len(data) >= 34 and data[23] == 6 and data[26:30] == self.srv_ip \
                    and data[30:34] == self.ip:
                ihl = (data[14] & 0xF) * 4
                total = struct.unpack("!H", data[16:18])[0]
                t = data[14 + ihl:14 + total]
                sport, dport, seq, ack, off, flags, win = struct.unpack("!HHIIBBH", t[:16])
                hl = (off >> 4) * 4
                out.append((sport, dport, seq, ack, flags, win, t[20:hl], t[hl:]))


class Tcp:
    """One connection, by hand. Our stream: offsets from our ISS + 1; the server's stream lands in `rx`."""

    def __init__(self, link, srv_port, lport, window=None):
        """window: a fixed receive window of that many bytes (no window scaling, so every edge is exact): its
        right edge stays where the handshake put it until `edge` is moved or dropped (None: 1 MiB, scaled,
        always open)."""
        self.link, self.srv_port, self.lport = link, srv_port, lport
        self.scale = WSCALE if window is None else 0
        self.window = window
        self.edge = None  # the fixed right edge of our receive window (sequence number), when window is set
        self.iss = random.getrandbits(32)
        self.base = (self.iss + 1) & MASK
        self.una = 0  # our stream offset the server acknowledged
        self.rcv_nxt = None
        self.rx = bytearray()
        self.ooo = {}
        self.adv = (1 << 20) if window is None else window  # the window we advertise, bytes (edge unset)
        self.peer_wnd, self.peer_scale = 0, 0
        self.reset = self.fin = False
        self.probes_while_shut = 0
        self.sent_to = 0  # the end of what deliver() sent (stream offset)
        self.resent = 0  # segments deliver() sent again (go-back-N after 0.2 s without progress)
        self.pure_acks = 0  # segments from the server with ACK and no payload (challenge ACKs, window updates)
        self.shrink_at = None  # (bytes received, room): then move the right edge back to rcv_nxt + room

    def room(self):
        """The receive window we advertise now: what is left before the fixed edge, or the open window."""
        if self.edge is None or self.rcv_nxt is None:
            return self.adv
        return max(0, seq_diff(self.edge, self.rcv_nxt))

    def send(self, seq, flags, payload=b"", opts=b"", shape=None):
        win = min(self.room() >> (0 if flags & SYN else self.scale), 0xFFFF)
        hl = 20 + len(opts)
        ack = self.rcv_nxt if self.rcv_nxt is not None else 0
        t = struct.pack("!HHIIBBHHH", self.lport, self.srv_port, seq & MASK, ack & MASK, (hl // 4) << 4, flags, win,
                        0, 0) + opts
        pseudo = self.link.ip + self.link.srv_ip + struct.pack("!BBH", 0, 6, len(t) + len(payload))
        t = t[:16] + struct.pack("!H", csum(pseudo + t + payload)) + t[18:]
        self.link.ip_send(t + payload, shape)

    def send_at(self, off, data, shape=None):
        self.send(self.base + off, ACK | PSH, data, shape=shape)

    def ack(self):
        self.send(self.base + self.una, ACK)  # seq: the oldest byte the server has not acknowledged (in its window)

    def handle(self, seg):
        sport, dport, seq, ack, flags, win, opts, payload = seg
        if sport != self.srv_port or dport != self.lport:
            return
        if flags & RST:
            self.reset = True
            return
        if flags & ACK:
            off = seq_diff(ack, self.base)
            if off > self.una:
                self.una = off
            self.peer_wnd = win << self.peer_scale
            if not payload and not flags & (SYN | FIN):
                self.pure_acks += 1
        must_ack = False
        if payload:
            must_ack = True
            if self.room() == 0:
                self.probes_while_shut += 1  # a zero-window probe: not taken, answered with the same ACK
            else:
                if self.edge is not None:  # nothing past the edge is taken
                    payload = payload[:max(0, seq_diff(self.edge, seq))]
                d = seq_diff(seq, self.rcv_nxt)
                if d <= 0:
                    if len(payload) > -d:
                        self.rx += payload[-d:]
                        self.rcv_nxt = (self.rcv_nxt + len(payload) + d) & MASK
                else:
                    self.ooo[seq] = payload
                while True:  # what we held out of order
                    hit = [s for s in self.ooo if seq_diff(s, self.rcv_nxt) <= 0]
                    if not hit:
                        break
                    for s in hit:
                        p = self.ooo.pop(s)
                        d = seq_diff(s, self.rcv_nxt)
                        if len(p) > -d:
                            self.rx += p[-d:]
                            self.rcv_nxt = (self.rcv_nxt + len(p) + d) & MASK
                if self.shrink_at is not None and len(self.rx) >= self.shrink_at[0]:
                    self.edge = (self.rcv_nxt + self.shrink_at[1]) & MASK  # back from where it was: a shrink
                    self.shrink_at = None
        if flags & FIN and seq_diff((seq + len(payload)) & MASK, self.rcv_nxt) == 0:
            self.rcv_nxt = (self.rcv_nxt + 1) & MASK
            self.fin = must_ack = True
        if must_ack:
            self.ack()

    def pump(self, timeout):
        for seg in self.link.poll(timeout):
            self.handle(seg)

    def connect(self, deadline):
        opts = struct.pack("!BBH", 2, 4, MSS) + (bytes([1, 3, 3, WSCALE]) if self.scale else b"")
        next_syn = 0
        while self.rcv_nxt is None:
            if time.time() > deadline:
                raise RuntimeError("no SYN-ACK")
            if time.time() >= next_syn:
                self.send(self.iss, SYN, opts=opts)
                next_syn = time.time() + 1.0
            for sport, dport, seq, ack, flags, win, o, _ in self.link.poll(0.1):
                if sport == self.srv_port and dport == self.lport and flags & (SYN | ACK) == SYN | ACK \
                        and ack == self.base:
                    self.rcv_nxt = (seq + 1) & MASK
                    i = 0
                    while i < len(o):  # the server's window scale
                        if o[i] == 0:
                            break
                        if o[i] == 1:
                            i += 1
                            continue
                        if o[i] == 3 and i + 2 < len(o):
                            self.peer_scale = o[i + 2]
                        i += max(2, o[i + 1]) if i + 1 < len(o) else len(o)
                    self.peer_wnd = win
        if self.window is not None:
            self.edge = (self.rcv_nxt + self.window) & MASK
        self.ack()

    def deliver(self, stream, deadline, start=0, seg=MSS):
        """Go-back-N until the server acknowledged all of `stream` (offsets from `start`), in segments of up to
        `seg` bytes."""
        end = start + len(stream)
        last_una, quiet_since = -1, time.time()
        while self.una < end:
            if self.reset:
                raise RuntimeError("reset by the server")
            if time.time() > deadline:
                raise RuntimeError("server acknowledged %d of %d bytes" % (self.una - start, len(stream)))
            if self.una != last_una or time.time() - quiet_since > 0.2:
                last_una, quiet_since = self.una, time.time()
                off = max(self.una, start)
                limit = min(end, off + max(self.peer_wnd, seg), off + (256 << 10))
                while off < limit:
                    n = min(seg, limit - off)
                    self.resent += 1 if off < self.sent_to else 0
                    self.sent_to = max(self.sent_to, off + n)
                    self.send_at(off, stream[off - start:off - start + n])
                    off += n
            self.pump(0.02)

    def wait_rx(self, n, deadline):
        while len(self.rx) < n:
            if self.reset or self.fin or time.time() > deadline:
                return False
            self.pump(0.05)
        return True


def established(link, port, lport, case, deadline, window=None):
    c = Tcp(link, port, lport, window)
    c.connect(deadline)
    req = hostile.mpa_request(case)
    c.deliver(req, deadline)
    if not c.wait_rx(20, deadline):
        raise RuntimeError("no MPA reply")
    pd_len = struct.unpack(">H", bytes(c.rx[18:20]))[0]
    if not c.wait_rx(20 + pd_len, deadline) or bytes(c.rx[:16]) != hostile.REP_KEY or c.rx[16] & 0x20:
        raise RuntimeError("no MPA reply (or a reject)")
    addr, stag, length = struct.unpack("<QII", bytes(c.rx[24:40]))  # after IRD/ORD: the server's RemoteRegion
    del c.rx[:20 + pd_len]
    return c, len(req), addr, stag


def sends(case, n=32, size=1000):
    payloads = [bytes(random.getrandbits(8) for _ in range(size)) for _ in range(n)]
    print("expect %s: %s" % (case, ",".join("%08x" % fnv(p) for p in payloads)), flush=True)
    return b"".join(hostile.fpdu(hostile.untagged(hostile.SEND, 0, i + 1, 0, p)) for i, p in enumerate(payloads))


def read_fpdus(c, deadline, want):
    """Tagged READ Response payloads from the server's stream until `want` bytes or the Last flag."""
    got = bytearray()
    while True:
        while len(c.rx) >= 2:
            n = struct.unpack(">H", bytes(c.rx[:2]))[0]
            total = 2 + n + ((-(n + 2)) & 3) + 4
            if len(c.rx) < total:
                break
            ulpdu = bytes(c.rx[2:2 + n])
            del c.rx[:total]
            ctl = struct.unpack(">H", ulpdu[:2])[0]
            if ctl & 0x8000 and ctl & 0xF == hostile.READ_RESP:
                got += ulpdu[14:]
                if ctl & 0x4000:
                    return bytes(got)
            else:
                return bytes(got)
        if len(got) >= want or c.reset or c.fin or time.time() > deadline:
            return bytes(got)
        c.pump(0.05)


def run(link, port, lport, case):
    deadline = time.time() + 30
    random.seed(case)
    if case == "quit":
        c = Tcp(link, port, lport)
        c.connect(deadline)
        c.deliver(hostile.mpa_request(case), deadline)
        c.wait_rx(20, time.time() + 2)
        c.send(c.base + c.una, RST | ACK)
        return "got " + ("mpa-reject" if len(c.rx) >= 20 and c.rx[16] & 0x20 else "something else")
    # The zero-window cases: a 4 KiB window the READ response fills, so it closes the way a receiver's does
    # (its right edge never moves back; a window cut from 1 MiB to 0 would be a shrink, which lwIP ignores).
    window = 4096 if case.startswith("zero-window") else 16384 if case == "window-shrink" else None
    c, off0, addr, stag = established(link, port, lport, case, deadline, window)
    try:
        return play(c, case, off0, addr, stag, deadline)
    finally:
        if not c.reset:
            c.send(c.base + c.una, RST | ACK)  # each case ends with an abortive close


def play(c, case, off0, addr, stag, deadline):
    if case in ("reorder", "overlap", "stale-conflict"):
        stream = sends(case)
        if case == "reorder":
            cuts = []
            pos = 0
            while pos < len(stream):
                n = 2 + struct.unpack(">H", stream[pos:pos + 2])[0]
                n += ((-n) & 3) + 4
                cuts.append((pos, stream[pos:pos + n]))
                pos += n
            random.shuffle(cuts)
            for pos, data in cuts:
                c.send_at(off0 + pos, data)
        elif case == "overlap":
            cuts = [(p, stream[p:p + 1400]) for p in range(0, len(stream), 700)]
            cuts += [(p, stream[p:p + random.randint(1, MSS)]) for p in
                     (random.randrange(len(stream)) for _ in range(40))]
            random.shuffle(cuts)
            for pos, data in cuts + cuts[:10]:
                c.send_at(off0 + pos, data)
        else:
            half = len(stream) // 2
            c.deliver(stream[:half], deadline, off0)
            flipped = bytes(b ^ 0x5A for b in stream[:half])
            for p in range(0, half, MSS):
                c.send_at(off0 + p, flipped[p:p + MSS])
            c.send_at(off0 + half - 500, flipped[half - 500:half] + stream[half:half + 500])
        c.deliver(stream, deadline, off0)
        c.pump(0.2)
        return "got all acknowledged" + (" then reset" if c.reset else "")
    if case == "ip-shapes":
        # Ahead of each segment, its bytes flipped at the same place in every shape that must be dropped: one
        # taken would be in the stream (its TCP checksum is right); then the segment itself, shapes in turn.
        # Segments of 1000 bytes: IP options and padding still fit the MTU.
        stream = sends(case)
        flipped = bytes(b ^ 0x5A for b in stream)
        c.link.shapes = itertools.cycle(GOOD_SHAPES)
        try:
            for p in range(0, len(stream), 1000):
                for shape in BAD_SHAPES:
                    c.send_at(off0 + p, flipped[p:p + 1000], shape)
                c.deliver(stream[:p + 1000], deadline, off0, 1000)
        finally:
            c.link.shapes = None
        c.pump(0.2)
        # resent: a segment of a good shape dropped (a padded frame whose padding was taken as payload fails
        # its TCP checksum) is sent again after 0.2 s; none is lost on the veth otherwise.
        return "got all acknowledged resent=%d%s" % (c.resent, " then reset" if c.reset else "")
    if case == "ooseq-flood":
        payload = bytes(REGION_PATTERN(i + 3) for i in range(FLOOD_FPDUS * FLOOD_PAYLOAD))
        print("expect %s: write=%08x" % (case, fnv(payload)), flush=True)
        stream = b"".join(hostile.fpdu(hostile.tagged(hostile.WRITE, stag, addr + WRITE_AREA + i * FLOOD_PAYLOAD,
                                                      payload[i * FLOOD_PAYLOAD:(i + 1) * FLOOD_PAYLOAD]))
                          for i in range(FLOOD_FPDUS))
        hole = 1024  # the first FPDU (1024 bytes on the wire)
        t0 = time.time()
        for p in range(hole, len(stream), 1024):
            c.send_at(off0 + p, stream[p:p + 1024])
        for p in range(200):  # beyond any window
            c.send_at(off0 + len(stream) + (4 << 20) + p * MSS, b"\xee" * MSS)
        flood_s = time.time() - t0
        c.pump(0.1)
        c.deliver(stream, deadline, off0)
        c.pump(0.2)
        return "got all acknowledged (flood %.2f s)%s" % (flood_s, " then reset" if c.reset else "")
    if case in ("zero-window", "zero-window-forever"):
        c.deliver(hostile.fpdu(hostile.read_request(1, 0x1234, 0, READ_LEN, stag, addr)), deadline, off0)
        while c.room() > 0 and time.time() < deadline and not c.reset:  # the READ response fills the window
            c.pump(0.01)
        if c.room() > 0:
            raise RuntimeError("the window never filled")
        t0 = time.time()
        flood = 0
        shut_for = 2.5 if case == "zero-window" else 20.0
        while time.time() - t0 < shut_for and not c.reset:
            for _ in range(50):
                c.ack()
                flood += 1
            c.pump(0.005)
        if case == "zero-window-forever":
            return "got %s after %.1f s probes=%d" % ("reset" if c.reset else "nothing", time.time() - t0,
                                                      c.probes_while_shut)
        c.edge, c.adv = None, 60000  # open (and kept open as the bytes are taken)
        c.ack()
        data = read_fpdus(c, deadline, READ_LEN)
        want = bytes(REGION_PATTERN(i) for i in range(READ_LEN))
        ok = "ok" if data == want else "wrong (%d bytes)" % len(data)
        return "got read-response %s probes=%d flood=%d" % (ok, c.probes_while_shut, flood)
    if case in ("rst-in-window", "syn-in-window", "ack-unsent"):
        stream = sends(case)
        half = len(stream) // 2
        c.deliver(stream[:half], deadline, off0)
        c.pump(0.2)  # the server's ACKs of that half are in
        nxt = (c.base + c.una) & MASK  # the server's next expected byte: all we sent is acknowledged
        before = c.pure_acks
        if case == "rst-in-window":
            c.send(nxt + 1000, RST)  # in the 1 MiB window, not at its left edge
        elif case == "syn-in-window":
            c.send(nxt + 1000, SYN, opts=struct.pack("!BBH", 2, 4, MSS))
        else:
            # A pure ACK at our next byte acknowledging 64 KiB the server never sent (send() acks rcv_nxt).
            rcv_nxt = c.rcv_nxt
            c.rcv_nxt = (rcv_nxt + 65536) & MASK
            c.send(nxt, ACK)
            c.rcv_nxt = rcv_nxt
        c.pump(0.3)
        answered = c.pure_acks - before
        if case == "rst-in-window":
            c.send(nxt + (512 << 20), RST)  # far outside the window: dropped without a word
            c.pump(0.2)
        c.deliver(stream, deadline, off0)
        c.pump(0.2)
        return "got all acknowledged answered=%d%s" % (answered, " then reset" if c.reset else "")
    if case == "fin-after-gap":
        # The last segment, carrying the FIN, arrives before the one ahead of it: the FIN must be taken after
        # that segment's payload, not where the payload starts. Then, as a TCP would, what is not acknowledged
        # is sent again every 0.25 s (the FIN on the last piece) until the FIN is.
        stream = sends(case)
        end = off0 + len(stream)
        a, b = len(stream) - 1400, len(stream) - 700
        c.deliver(stream[:a], deadline, off0)
        c.send(c.base + off0 + b, ACK | PSH | FIN, stream[b:])
        c.pump(0.1)
        c.send_at(off0 + a, stream[a:b])
        t0, resends = time.time(), 0
        while c.una < end + 1 and time.time() < deadline and not c.reset:
            c.pump(0.05)
            if c.una < end + 1 and time.time() - t0 > 0.25 * (resends + 1):
                resends += 1
                off = max(c.una, off0)
                while True:
                    n = min(MSS, end - off)
                    last = off + n >= end
                    c.send(c.base + off, ACK | PSH | (FIN if last else 0), stream[off - off0:off - off0 + n])
                    off += n
                    if last:
                        break
        if c.una < end + 1:
            return "got fin-unacked at %d of %d resends=%d" % (c.una - off0, len(stream) + 1, resends)
        return "got fin-acked after %.2f s resends=%d" % (time.time() - t0, resends)
    if case == "window-shrink":
        c.shrink_at = (8192, 1024)
        c.deliver(hostile.fpdu(hostile.read_request(1, 0x1234, 0, READ_LEN, stag, addr)), deadline, off0)
        while c.shrink_at is not None and time.time() < deadline and not c.reset:
            c.pump(0.01)
        got_before = len(c.rx)
        t0 = time.time()
        while time.time() - t0 < 0.3 and not c.reset:
            c.pump(0.01)
        held = len(c.rx)
        c.edge, c.adv = None, 60000
        c.ack()
        t1 = time.time()
        data = read_fpdus(c, deadline, READ_LEN)
        want = bytes(REGION_PATTERN(i) for i in range(READ_LEN))
        ok = "ok" if data == want else "wrong (%d bytes)" % len(data)
        return "got read-response %s shrunk-at=%d held=%d then %.2f s" % (ok, got_before, held, time.time() - t1)
    raise RuntimeError("unknown case " + case)


ALL = ["reorder", "overlap", "stale-conflict", "ooseq-flood", "zero-window", "zero-window-forever",
       "rst-in-window", "syn-in-window", "ack-unsent", "window-shrink", "fin-after-gap", "ip-shapes"]


def main():
    iface, my_ip, srv_ip, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cases = sys.argv[5:]
    if cases == ["all"]:
        cases = ALL + ["quit"]
    link = Link(iface, my_ip, srv_ip)
    link.resolve(time.time() + 10)
    rc = 0
    for i, case in enumerate(cases):
        t0 = time.time()
        try:
            out = run(link, port, 40000 + i, case)
        except Exception as e:  # noqa: BLE001  reported, the next case still runs
            out = "error %s" % e
            rc = 1
        print("raw %s: %s [%.1f s]" % (case, out, time.time() - t0), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
