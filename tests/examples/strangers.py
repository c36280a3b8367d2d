#!/usr/bin/env python3
"""Peers the pingpong server does not expect, played with the kernel's TCP from a network namespace
(tests/examples/check_examples.sh 'strangers' runs it against `pingpong --server --af-packet`):

  1. an MPA request with no private data (what stock ucmatose, rping and perftest send): the server must
     answer with an MPA reject whose private data says what it expected, then close with a FIN, not a reset;
  2. a valid request followed at once by a reset: the server must keep waiting for the next client;
  3. a real pingpong session spoken here (MPA revision 2, FPDUs with SEND messages, CRC off), during which
     4. a second client asks to connect: it must get an MPA reject saying the server is busy, and the
        running session must go on;
  then an orderly close of the session (the server checks every message came back and exits 0).

With --rping, against `rping -s -P` instead: a client that sends its advertisement and then, while the server
waits for its READ to complete, a second SEND out of rping's order. The server must end that session with an
orderly close (not crash, as it once did with an exception inside a noexcept loop) and serve the next client.

Usage: strangers.py SERVER_IP PORT [--rping]
"""
import socket
import struct
import sys
import time

REQ_KEY = b"MPA ID Req Frame"
REP_KEY = b"MPA ID Rep Frame"
FLAG_REJECT = 0x20
FLAG_ENHANCED = 0x10
PING_MAGIC = 0x50494E47  # "PING", pingpong's hello


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def request(app_pd=b""):
    """An MPA revision 2 request with IRD/ORD 1/1 and `app_pd` after them."""
    pd = struct.pack(">HH", 1, 1) + app_pd
    return REQ_KEY + bytes([FLAG_ENHANCED, 2]) + struct.pack(">H", len(pd)) + pd


def hello(size, count):
    return struct.pack(">IIQ", PING_MAGIC, size, count)


def connect(ip, port):
    deadline = time.time() + 20
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(10)
        try:
            s.connect((ip, port))
            return s
        except OSError:
            s.close()
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            fail("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def read_reply(s):
    hdr = read_exact(s, 20)
    if hdr[:16] != REP_KEY:
        fail("not an MPA reply: %r" % hdr)
    flags, rev, pd_len = hdr[16], hdr[17], struct.unpack(">H", hdr[18:20])[0]
    pd = read_exact(s, pd_len)
    if flags & FLAG_ENHANCED:
        pd = pd[4:]  # IRD/ORD
    return flags, rev, pd


def closed_in_order(s):
    """True if the peer closes with a FIN (recv returns b''), False on a reset."""
    try:
        while True:
            if not s.recv(4096):
                return True
    except ConnectionResetError:
        return False


def fpdu_send(msn, payload):
    ulpdu = struct.pack(">HIIII", 0x4143, 0, 0, msn, 0) + payload  # SEND, last, QN 0, MSN, MO 0
    body = struct.pack(">H", len(ulpdu)) + ulpdu
    body += b"\0" * (-len(body) % 4)
    return body + b"\0\0\0\0"  # CRC field: 0 when CRC is off


class FpduReader:
    def __init__(self, s):
        self.s, self.buf = s, b""

    def message(self):
        """The payload of the next SEND message (assembled from its segments)."""
        payload = b""
        while True:
            while len(self.buf) < 2:
                self.fill()
            ulen = struct.unpack(">H", self.buf[:2])[0]
            total = 2 + ulen + (-(2 + ulen) % 4) + 4
            while len(self.buf) < total:
                self.fill()
            fp, self.buf = self.buf[:total], self.buf[total:]
            ctrl = struct.unpack(">H", fp[2:4])[0]
            if ctrl & 0x000F != 3:
                fail("expected a SEND, got opcode %d" % (ctrl & 0xF))
            payload += fp[20:2 + ulen]
            if ctrl & 0x4000:
                return payload

    def fill(self):
        chunk = self.s.recv(65536)
        if not chunk:
            fail("connection closed inside an FPDU")
        self.buf += chunk


def rping_out_of_order(ip, port):
    s = connect(ip, port)
    s.sendall(request())
    flags, rev, pd = read_reply(s)
    if flags & FLAG_REJECT:
        fail("rping server rejected us")
    adv = struct.pack(">QII", 0x10000, 0x1234, 64)  # rping_rdma_info: a source the server will try to READ
    s.sendall(fpdu_send(1, adv))
    time.sleep(0.1)
    s.sendall(fpdu_send(2, adv))  # out of order: rping's server is waiting for its READ, not for a message
    s.settimeout(10)
    if not closed_in_order(s):
        fail("the rping server reset the connection instead of closing it")
    s.close()
    print("1. out-of-order SEND: the rping server closed the session in order")
    # The server lives on (-P) and takes the next client.
    s = connect(ip, port)
    s.sendall(request())
    flags, rev, pd = read_reply(s)
    print("2. next client -> reply flags 0x%02x rev %d" % (flags, rev))
    if flags & FLAG_REJECT:
        fail("the next client was rejected")
    s.shutdown(socket.SHUT_WR)
    closed_in_order(s)
    s.close()
    print("ok: rping strangers")


def main():
    ip, port = sys.argv[1], int(sys.argv[2])
    if "--rping" in sys.argv[3:]:
        return rping_out_of_order(ip, port)

    # 1. No private data: an MPA reject with the reason, then a FIN.
    s = connect(ip, port)
    s.sendall(request())
    flags, rev, pd = read_reply(s)
    text = pd.decode(errors="replace").rstrip("\0")
    print("1. no private data -> reply flags 0x%02x rev %d: %r" % (flags, rev, text))
    if not flags & FLAG_REJECT:
        fail("the request without private data was accepted")
    if "expected 16 bytes of private data" not in text:
        fail("the reject does not say what was expected")
    if not closed_in_order(s):
        fail("the server reset the refused connection instead of closing it")
    s.close()

    # 2. A valid request, then a reset at once: the server waits for the next client.
    s = connect(ip, port)
    s.sendall(request(hello(64, 3)))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # RST
    print("2. valid request, then a reset")
    time.sleep(0.3)

    # 3. A real session: 3 pings of 64 bytes, each echoed.
    s = connect(ip, port)
    s.sendall(request(hello(64, 3)))
    flags, rev, pd = read_reply(s)
    print("3. session -> reply flags 0x%02x rev %d, %d bytes of private data" % (flags, rev, len(pd)))
    if flags & FLAG_REJECT:
        fail("the session's request was rejected: %r" % pd)
    reader = FpduReader(s)
    for i in range(3):
        ping = bytes([(i * 7 + k) & 0xFF for k in range(64)])
        s.sendall(fpdu_send(i + 1, ping))
        if i == 1:
            # 4. A second client during the session: rejected as busy; the session goes on.
            t = connect(ip, port)
            t.sendall(request(hello(64, 3)))
            f2, _, pd2 = read_reply(t)
            busy = pd2.decode(errors="replace").rstrip("\0")
            print("4. second client -> reply flags 0x%02x: %r" % (f2, busy))
            if not f2 & FLAG_REJECT or "busy" not in busy:
                fail("the second client was not refused as busy")
            if not closed_in_order(t):
                fail("the server reset the second client instead of closing it")
            t.close()
        echo = reader.message()
        if echo != ping:
            fail("echo %d differs" % i)
    print("3. three pings echoed")
    s.shutdown(socket.SHUT_WR)  # orderly close: a FIN
    if not closed_in_order(s):
        fail("the server answered our FIN with a reset")
    s.close()
    print("ok: strangers")


if __name__ == "__main__":
    main()
