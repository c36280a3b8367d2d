#!/usr/bin/env python3
"""A hostile iWARP peer for tests/verbs/hostile_test.cpp: a kernel TCP socket that plays one scripted
misbehaviour against a softrdma listener and reports what softrdma answered.

Usage: hostile.py SERVER_IP PORT CASE...   (CASE "all" runs every case in order, then "quit", then the
reply cases: softrdma connects to us on PORT+1 and we answer its MPA request badly)
Prints one line per case, ending with the seconds it took:
  hostile CASE: got terminate layer=L etype=T ecode=C end=close|reset|open mdr=MDR [S s]
  hostile CASE: got mpa-reject | mpa-reply | close | reset | nothing [S s]
The MPA request carries "HOSTILE:CASE" as private data (revision 2, IRD/ORD 2/2, no CRC, no Markers), so the
server can say which case a connection is. FPDUs (RFC 5044): be16 ULPDU length, ULPDU (DDP/RDMAP header and
payload), pad to 4, a 4-byte CRC field sent as zero unless the case negotiates CRC. Cases named crc-* ask
for CRC (C flag; the server follows); markers-* and rfc7306-* connections are accepted by the server with
Markers on what it receives (on its second listener, PORT + 2) and with RFC 7306 (it tells them by the name in
the private data).
"""
import random
import socket
import struct
import sys
import time

REQ_KEY = b"MPA ID Req Frame"
REP_KEY = b"MPA ID Rep Frame"
ANSWER_WAIT = 2.0
DEBUG = False  # seconds to wait for softrdma's answer

# RDMAP opcodes (RFC 5040 section 4.3)
WRITE, READ_REQ, READ_RESP, SEND, TERMINATE = 0, 1, 2, 3, 7
IMM, ATOMIC_REQ, ATOMIC_RESP = 8, 10, 11  # RFC 7306 section 8


class Closed(Exception):
    pass


def mpa_request(case, key=REQ_KEY, rev=2, pd_len=None, flags=0, ird=2, ord_=2, extra=b""):
    pd = struct.pack(">HH", ird, ord_) + b"HOSTILE:" + case.encode() + extra
    enhanced = 0x10 if rev == 2 else 0
    if rev != 2:
        pd = b"HOSTILE:" + case.encode() + extra
    n = len(pd) if pd_len is None else pd_len
    return key + bytes([flags | enhanced, rev]) + struct.pack(">H", n) + pd


def crc32c(data):
    """CRC32c (Castagnoli, reflected 0x82F63B78), bitwise: independent of softrdma's table/SSE4.2 versions."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF


def fpdu(ulpdu, crc=False, crc_xor=0):
    """An FPDU; with crc the CRC field holds CRC32c of the rest (least significant byte first, as siw), xored
    with crc_xor (a corruption), else zero."""
    pad = (-(len(ulpdu) + 2)) & 3
    body = struct.pack(">H", len(ulpdu)) + ulpdu + b"\0" * pad
    return body + struct.pack("<I", (crc32c(body) ^ crc_xor) if crc else 0)


def with_markers(fpdus, pointer_xor=None):
    """The FPDU stream of `fpdus` with an MPA Marker every 512 octets from its start (RFC 5044 section 5; the
    first at offset 0): 16 reserved bits, then FPDUPTR, the distance back to the start of the FPDU the Marker
    falls in (0 when it begins the FPDU). pointer_xor {n: x}: the n-th Marker's pointer xored with x."""
    out = bytearray()
    n = 0
    for f in fpdus:
        start = len(out)
        for b in f:
            if len(out) % 512 == 0:
                ptr = (len(out) - start) ^ (pointer_xor or {}).get(n, 0)
                out += struct.pack(">HH", 0, ptr)
                n += 1
            out.append(b)
    return bytes(out)


def ctrl(opcode, tagged=False, last=True, dv=1, rv=1):
    return (0x8000 if tagged else 0) | (0x4000 if last else 0) | dv << 8 | rv << 6 | opcode


def untagged(opcode, qn, msn, mo=0, payload=b"", last=True, dv=1, rv=1, rsvd=0):
    return struct.pack(">HIIII", ctrl(opcode, False, last, dv, rv), rsvd, qn, msn, mo) + payload


def tagged(opcode, stag, to, payload=b"", last=True):
    return struct.pack(">HIQ", ctrl(opcode, True, last), stag, to) + payload


def read_request(msn, sink_stag, sink_to, size, src_stag, src_to):
    return untagged(READ_REQ, 1, msn, 0, struct.pack(">IQIIQ", sink_stag, sink_to, size, src_stag, src_to))


def atomic_request(msn, req_id, stag, to, op=0, add=0):
    """RFC 7306 section 5.2.1 on QN 1 (shared with READ requests): op 0 Fetch-and-Add, 1 Compare-and-Swap."""
    return untagged(ATOMIC_REQ, 1, msn, 0, struct.pack(">IIIQQQQQ", op, req_id, stag, to, add, 0, 0, 0))


def recv_exact(s, n, deadline):
    out = b""
    while len(out) < n:
        s.settimeout(max(0.01, deadline - time.time()))
        try:
            b = s.recv(n - len(out))
        except socket.timeout:
            raise TimeoutError
        if not b:
            raise Closed
        out += b
    return out


def connect(ip, port, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(5)
    s.connect((ip, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def mpa_answer(s, wait=ANSWER_WAIT):
    """Reads the MPA reply: ("reply", private data, flags) / ("reject", pd, flags) / ("close"|"reset"|"nothing",
    None, 0)."""
    deadline = time.time() + wait
    try:
        hdr = recv_exact(s, 20, deadline)
        if hdr[:16] != REP_KEY:
            return "bad-reply", None, 0
        pd = recv_exact(s, struct.unpack(">H", hdr[18:20])[0], deadline)
        if hdr[17] == 2 and hdr[16] & 0x10:
            pd = pd[4:]
        return ("mpa-reject" if hdr[16] & 0x20 else "mpa-reply"), pd, hdr[16]
    except Closed:
        return "close", None, 0
    except TimeoutError:
        return "nothing", None, 0
    except ConnectionResetError:
        return "reset", None, 0


def fpdu_answer(s, wait=ANSWER_WAIT, crc=False):
    """Reads FPDUs until a TERMINATE, the end of the stream or the time limit. Returns the line's tail; with crc
    it ends with "crc=ok" when every FPDU softrdma sent carried a good CRC, else "crc=bad"; each Atomic Response
    adds its original value ("atomic=V,V")."""
    deadline = time.time() + wait
    term = None
    others = 0
    crc_bad = 0
    atomic = []
    end = "open"
    buf = b""
    try:
        while time.time() < deadline:
            s.settimeout(max(0.01, deadline - time.time()))
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                end = "close"
                break
            buf += b
            while len(buf) >= 2:
                n = struct.unpack(">H", buf[:2])[0]
                total = 2 + n + ((-(n + 2)) & 3) + 4
                if len(buf) < total:
                    break
                whole, ulpdu, buf = buf[:total], buf[2:2 + n], buf[total:]
                if crc and crc32c(whole[:-4]) != struct.unpack("<I", whole[-4:])[0]:
                    crc_bad += 1
                c = struct.unpack(">H", ulpdu[:2])[0] if n >= 2 else 0
                if not c & 0x8000 and c & 0xF == ATOMIC_RESP and n >= 30:
                    atomic.append(struct.unpack(">Q", ulpdu[22:30])[0])
                if not c & 0x8000 and c & 0xF == TERMINATE and n >= 22 and term is None:
                    w = struct.unpack(">I", ulpdu[18:22])[0]
                    term = (w >> 28, (w >> 24) & 0xF, (w >> 16) & 0xFF)
                    flags = "%d%d%d" % (w >> 15 & 1, w >> 14 & 1, w >> 13 & 1)  # M D R (RFC 5040 section 4.8)
                else:
                    others += 1
                    if DEBUG:
                        print("fpdu ctrl %04x len %d" % (c, n), file=sys.stderr)
            if term is not None:
                deadline = min(deadline, time.time() + 0.5)  # then wait a little for the close
    except ConnectionResetError:
        end = "reset"
    tail = (" atomic=" + ",".join(map(str, atomic)) if atomic else "") + \
           ((" crc=bad" if crc_bad else " crc=ok") if crc else "")
    if term is not None:
        return "got terminate layer=%d etype=%d ecode=%d end=%s mdr=%s%s" % (term + (end, flags, tail))
    if end != "open":
        return "got %s%s%s" % (end, " after %d fpdus" % others if others else "", tail)
    return "got nothing%s%s" % (" after %d fpdus" % others if others else "", tail)


def established(ip, port, case, rcvbuf=None, flags=0, want_flags=0):
    """An RDMA-mode connection for `case` (MPA request with `flags`); the reply must carry `want_flags`."""
    s = connect(ip, port, rcvbuf)
    s.sendall(mpa_request(case, flags=flags))
    what, pd, got = mpa_answer(s)
    if what != "mpa-reply":
        raise RuntimeError("%s: no MPA reply (%s)" % (case, what))
    if got & want_flags != want_flags:
        raise RuntimeError("%s: MPA reply flags %#x lack %#x" % (case, got, want_flags))
    addr, stag, length = struct.unpack("<QII", pd[:16])  # the server's RemoteRegion (host order, x86)
    return s, addr, stag, length


def mpa_case(ip, port, case, data, half_close=False, wait=ANSWER_WAIT):
    s = connect(ip, port)
    s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    what = mpa_answer(s, wait)[0]
    s.close()
    return "got " + what


def run(ip, port, case):
    if case == "bad-key":
        return mpa_case(ip, port, case, mpa_request(case, key=b"MPA ID Bad Frame"))
    if case == "bad-revision":
        return mpa_case(ip, port, case, mpa_request(case, rev=7))
    if case == "pd-too-long":  # claims 600 bytes (> 512), sends them all
        return mpa_case(ip, port, case, mpa_request(case, pd_len=600, extra=b"x" * (600 - 4 - 8 - len(case))))
    if case == "pd-beyond-sent":  # claims 500 bytes, sends 20, waits for the request time limit (5 s)
        return mpa_case(ip, port, case, mpa_request(case, pd_len=500), wait=7.0)
    if case == "truncated-request":  # half a request, then FIN
        return mpa_case(ip, port, case, mpa_request(case)[:11], half_close=True)
    if case == "reply-key":  # a reply where a request belongs
        return mpa_case(ip, port, case, mpa_request(case, key=REP_KEY))
    if case == "pd-512":  # the largest private data RFC 5044 allows: accepted, then a plain close
        s = connect(ip, port)
        s.sendall(mpa_request(case, extra=b"\0" * (512 - 4 - 8 - len(case))))
        what = mpa_answer(s)[0]
        s.close()
        return "got " + what
    if case == "quit":
        return mpa_case(ip, port, case, mpa_request(case))

    rcvbuf = 4096 if case == "zero-window" else None
    crc = case.startswith("crc-")
    flags = 0x40 if crc else 0  # C: CRC, which the server follows
    want = 0x40 if crc else 0x80 if case.startswith("markers-") else 0  # M: the server wants Markers
    # markers-* cases go to the server's second listener (PORT + 2), which asks for Markers
    s, addr, stag, length = established(ip, port + 2 if want == 0x80 else port, case, rcvbuf, flags, want)
    wait = ANSWER_WAIT
    hello = fpdu(untagged(SEND, 0, 1, 0, b"hello"))
    if case == "short-ulpdu":  # ULPDU length 6: less than the 18-byte untagged header
        s.sendall(struct.pack(">H", 6) + untagged(SEND, 0, 1)[:6] + b"\0\0\0\0")
    elif case == "ulpdu-1":  # ULPDU length 1: not even the DDP control word
        s.sendall(struct.pack(">H", 1) + b"\x41\0\0\0\0\0")
    elif case == "over-mulpdu":  # one 2018-byte ULPDU (MULPDU 1442 at MSS 1460) into a 2048-byte receive
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"A" * 2000)))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    elif case == "fpdu-truncated-close":  # an FPDU that claims 1000 bytes, 100 sent, then FIN
        s.sendall(struct.pack(">H", 1000) + untagged(SEND, 0, 1, 0, b"B" * 82))
        time.sleep(0.3)
        s.shutdown(socket.SHUT_WR)
    elif case == "garbage":  # 4 KiB of (seeded) random bytes where FPDUs belong
        s.sendall(random.Random(14).randbytes(4096))
    elif case == "length-then-close":  # claims 60000 bytes (too long for a 2048-byte receive), 3000 sent, FIN
        s.sendall(struct.pack(">H", 60000) + untagged(SEND, 0, 1, 0, b"B" * 2982))
        time.sleep(0.3)
        s.shutdown(socket.SHUT_WR)
    elif case == "opcode-13":
        s.sendall(fpdu(untagged(13, 0, 1, 0, b"x" * 8)))
    elif case == "ddp-version-0":
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"x" * 8, dv=0)))
    elif case == "ddp-version-2-tagged":
        s.sendall(fpdu(struct.pack(">HIQ", 0x8000 | 0x4000 | 2 << 8 | 1 << 6 | WRITE, stag, addr) + b"x" * 8))
    elif case == "rdmap-version-2":
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"x" * 8, rv=2)))
    elif case == "bad-qn":
        s.sendall(fpdu(untagged(SEND, 7, 1, 0, b"x" * 8)))
    elif case == "msn-out-of-window":  # four receives posted: MSN 1000 is far beyond them
        s.sendall(fpdu(untagged(SEND, 0, 1000, 0, b"x" * 8)))
    elif case == "msn-zero":
        s.sendall(fpdu(untagged(SEND, 0, 0, 0, b"x" * 8)))
    elif case == "mo-past-buffer":  # 2048-byte receive, MO 1 MB
        s.sendall(fpdu(untagged(SEND, 0, 1, 1 << 20, b"x" * 8)))
    elif case == "send-too-long":  # two segments: 1100 + 1100 bytes into a 2048-byte receive
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"x" * 1100, last=False)) + fpdu(untagged(SEND, 0, 1, 1100, b"x" * 1100)))
    elif case == "write-bogus-stag":
        s.sendall(fpdu(tagged(WRITE, stag ^ 0x5a5a5a00, addr, b"x" * 8)))
    elif case == "write-past-region":
        s.sendall(fpdu(tagged(WRITE, stag, addr + length - 4, b"x" * 8)))
    elif case == "write-to-wrap":  # TO + length wraps past 2^64
        s.sendall(fpdu(tagged(WRITE, stag, (1 << 64) - 4, b"x" * 8)))
    elif case == "read-beyond-ird":  # IRD 2 agreed: six READ requests in one segment
        s.sendall(b"".join(fpdu(read_request(1 + i, 0x1000 + i, 0, 65536, stag, addr)) for i in range(6)))
    elif case == "read-src-wrap":  # READ request whose source TO + size wraps past 2^64
        s.sendall(fpdu(read_request(1, 0x1000, 0, 64, stag, (1 << 64) - 16)))
    elif case == "send-inv-mr":  # SEND with Invalidate naming the server's MR (only MWs granted may be)
        s.sendall(fpdu(untagged(4, 0, 1, 0, b"x" * 8, rsvd=stag)))
    elif case == "atomic-unnegotiated":  # an RFC 7306 Atomic Request on a connection that did not agree to 7306
        s.sendall(fpdu(untagged(10, 1, 1, 0, struct.pack(">IIIQQQQQ", 0, 1, stag, addr, 1, 0, 0, 0))))
    elif case == "imm-unnegotiated":  # RFC 7306 Immediate Data, likewise
        s.sendall(fpdu(untagged(8, 0, 1, 0, struct.pack(">Q", 42))))
    elif case == "write-stag-switch":  # a WRITE's continuation segment names another STag
        s.sendall(fpdu(tagged(WRITE, stag, addr, b"x" * 8, last=False)) + fpdu(tagged(WRITE, stag ^ 0x100, addr + 8, b"y" * 8)))
    elif case == "terminate-long":  # a TERMINATE with 1500 bytes of junk where the offending headers go
        s.sendall(fpdu(untagged(TERMINATE, 2, 1, 0, struct.pack(">I", 0x1206E000) + b"j" * 1500)))
    elif case == "read-huge":  # a READ of 4 GiB - 1 from the start of the region
        s.sendall(fpdu(read_request(1, 0x1000, 0, 0xFFFFFFFF, stag, addr)))
    elif case == "dribble":  # a SEND and a READ request, one byte per TCP segment
        for b in fpdu(untagged(SEND, 0, 1, 0, b"hello")) + fpdu(read_request(1, 0x1000, 0, 64, stag, addr)):
            s.send(bytes([b]))
            time.sleep(0.002)
    elif case == "zero-write-flood":  # 20000 zero-length WRITEs (no STag checked, nothing placed), then a SEND
        s.sendall(fpdu(tagged(WRITE, 1, 0)) * 20000 + fpdu(untagged(SEND, 0, 1, 0, b"still here")))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    elif case == "silent":  # MPA done, then nothing (the responder waits for our first FPDU), then a reset
        pass
    elif case == "read-response-unasked":
        s.sendall(fpdu(tagged(READ_RESP, 0x1234, 0, b"x" * 8)))
    elif case == "terminate-first":
        s.sendall(fpdu(untagged(TERMINATE, 2, 1, 0, struct.pack(">I", 0x12000000))))
    elif case == "terminate-after-send":  # a good SEND, then a TERMINATE with a bogus code
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"hello")) + fpdu(untagged(TERMINATE, 2, 1, 0, struct.pack(">I", 0xFFFF0000))))
    elif case == "terminate-short":  # a TERMINATE too short for its header
        s.sendall(fpdu(untagged(TERMINATE, 2, 1, 0, b"")))
    elif case == "send-flood":  # 2000 SENDs into four receives, never reading
        s.sendall(b"".join(fpdu(untagged(SEND, 0, 1 + i, 0, b"f" * 32)) for i in range(2000)))
    elif case == "zero-window":  # READs of the whole region into a tiny window we never read, then RST
        s.sendall(b"".join(fpdu(read_request(1 + i, 0x2000 + i, 0, length, stag, addr)) for i in range(2)))
        time.sleep(2.0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        return "got nothing (closed with unread data)"
    # CRC negotiated (RFC 5044 section 4.4): a good one is taken; a bad or missing one ends the stream.
    elif case == "crc-good":
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"hello"), crc=True))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    elif case == "crc-bad":  # one bit of the CRC flipped
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"hello"), crc=True, crc_xor=1))
    elif case == "crc-zero":  # CRC agreed, the field sent as zero (as if not)
        s.sendall(hello)
    # Markers on what the server receives (RFC 5044 section 5): right ones are taken, a wrong one ends it.
    elif case == "markers-good":  # a small SEND, then one of 1000 bytes spanning the Markers at 512 and 1024
        s.sendall(with_markers([hello, fpdu(untagged(SEND, 0, 2, 0, b"m" * 1000))]))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    elif case == "markers-bad-pointer":  # the first Marker points 256 bytes away from its FPDU
        s.sendall(with_markers([hello], pointer_xor={0: 0x100}))
    elif case == "markers-second-bad":  # a good SEND, then the Marker at 512 is 4 bytes off
        s.sendall(with_markers([hello, fpdu(untagged(SEND, 0, 2, 0, b"m" * 1000))], pointer_xor={1: 4}))
    elif case == "markers-missing":  # Markers agreed, none sent
        s.sendall(hello)
    # RFC 7306 agreed on the connection: Atomic Requests and Immediate Data, right and wrong.
    elif case == "rfc7306-atomic-good":  # two Fetch-and-Adds of 5 on the (zeroed) word at region + 8
        s.sendall(fpdu(atomic_request(1, 1, stag, addr + 8, add=5)) + fpdu(atomic_request(2, 2, stag, addr + 8, add=5)))
        time.sleep(0.3)
        s.shutdown(socket.SHUT_WR)
    elif case == "rfc7306-atomic-unaligned":
        s.sendall(fpdu(atomic_request(1, 1, stag, addr + 4, add=1)))
    elif case == "rfc7306-atomic-bad-op":  # Atomic Operation 7: not defined
        s.sendall(fpdu(atomic_request(1, 1, stag, addr, op=7)))
    elif case == "rfc7306-atomic-bogus-stag":
        s.sendall(fpdu(atomic_request(1, 1, stag ^ 0x5a5a5a00, addr, add=1)))
    elif case == "rfc7306-atomic-past-region":  # the first aligned word after the region
        s.sendall(fpdu(atomic_request(1, 1, stag, addr + length, add=1)))
    elif case == "rfc7306-atomic-beyond-ird":  # IRD 2 agreed: four Atomic Requests in one segment
        s.sendall(b"".join(fpdu(atomic_request(1 + i, 1 + i, stag, addr + 16, add=1)) for i in range(4)))
    elif case == "rfc7306-atomic-short":  # an Atomic Request cut after its Remote STag
        s.sendall(fpdu(atomic_request(1, 1, stag, addr, add=1)[:30]))
    elif case == "rfc7306-atomic-response-unasked":
        s.sendall(fpdu(untagged(ATOMIC_RESP, 3, 1, 0, struct.pack(">IQ", 1, 0))))
    elif case == "rfc7306-imm-good":  # Immediate Data alone: takes a receive
        s.sendall(fpdu(untagged(IMM, 0, 1, 0, struct.pack(">Q", 42))))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    elif case == "rfc7306-imm-short":  # Immediate Data with 4 bytes instead of 8
        s.sendall(fpdu(untagged(IMM, 0, 1, 0, b"1234")))
    elif case == "rfc7306-imm-flood":  # six Immediate Data messages into four receives
        s.sendall(b"".join(fpdu(untagged(IMM, 0, 1 + i, 0, struct.pack(">Q", i))) for i in range(6)))
    # The server's receives in a shared receive queue (four, its own): the same rules as a QP's own receives.
    elif case == "srq-good":
        s.sendall(hello)
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    elif case == "srq-flood":  # six SENDs into the SRQ's four receives
        s.sendall(b"".join(fpdu(untagged(SEND, 0, 1 + i, 0, b"f" * 32)) for i in range(6)))
    elif case == "srq-send-too-long":  # 1100 + 1100 bytes into a 2048-byte receive
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"x" * 1100, last=False)) + fpdu(untagged(SEND, 0, 1, 1100, b"x" * 1100)))
    elif case == "srq-msn-out-of-window":
        s.sendall(fpdu(untagged(SEND, 0, 1000, 0, b"x" * 8)))
    elif case == "srq-mo-past-buffer":
        s.sendall(fpdu(untagged(SEND, 0, 1, 1 << 20, b"x" * 8)))
    elif case == "good-send":  # control: a well-formed SEND, then an orderly close
        s.sendall(fpdu(untagged(SEND, 0, 1, 0, b"hello")))
        time.sleep(0.2)
        s.shutdown(socket.SHUT_WR)
    else:
        raise RuntimeError("unknown case " + case)
    out = fpdu_answer(s, wait, crc)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    return out


def mpa_reply(case, key=REP_KEY, rev=2, flags=0, ird=2, ord_=2, pd=b"", pd_len=None):
    body = (struct.pack(">HH", ird, ord_) if rev == 2 else b"") + pd
    n = len(body) if pd_len is None else pd_len
    return key + bytes([flags | (0x10 if rev == 2 else 0), rev]) + struct.pack(">H", n) + body


REPLY_CASES = ["reply-bad-key", "reply-bad-revision", "reply-pd-too-long", "reply-truncated", "reply-reject",
               "reply-markers", "reply-ord-too-high", "reply-then-garbage", "reply-read-good", "reply-read-wrong-stag",
               "reply-read-wrong-to", "reply-read-too-long", "reply-read-short"]


def read_request_from(s):
    """Reads FPDUs until softrdma's RDMA Read Request; returns (sink STag, sink TO, size)."""
    deadline = time.time() + 5
    while True:
        n = struct.unpack(">H", recv_exact(s, 2, deadline))[0]
        rest = recv_exact(s, n + ((-(n + 2)) & 3) + 4, deadline)
        c = struct.unpack(">H", rest[:2])[0]
        if not c & 0x8000 and c & 0xF == READ_REQ:
            return struct.unpack(">IQI", rest[18:34])


def reply_case(listener, case):
    """softrdma connects (its request names the case); we answer as the case says and report what follows."""
    listener.settimeout(15)
    s, _ = listener.accept()
    deadline = time.time() + 5
    hdr = recv_exact(s, 20, deadline)
    pd = recv_exact(s, struct.unpack(">H", hdr[18:20])[0], deadline)
    name = pd[4:].decode(errors="replace") if hdr[16] & 0x10 else pd.decode(errors="replace")
    if name != "HOSTILE:" + case:
        raise RuntimeError("request for %r, expected %s" % (name, case))
    if case == "reply-bad-key":
        s.sendall(mpa_reply(case, key=REQ_KEY))
    elif case == "reply-bad-revision":
        s.sendall(mpa_reply(case, rev=7))
    elif case == "reply-pd-too-long":
        s.sendall(mpa_reply(case, pd=b"x" * 600))
    elif case == "reply-truncated":
        s.sendall(mpa_reply(case)[:13])
        s.shutdown(socket.SHUT_WR)
    elif case == "reply-reject":
        s.sendall(mpa_reply(case, flags=0x20, pd=b"go away"))
    elif case == "reply-markers":  # asks for Markers on what we receive: softrdma does not send them
        s.sendall(mpa_reply(case, flags=0x80))
    elif case == "reply-ord-too-high":  # our ORD 300 > the initiator's IRD (2, may grow to 128)
        s.sendall(mpa_reply(case, ord_=300))
    elif case == "reply-then-garbage":  # a good reply and, in the same segment, an FPDU with a bad opcode
        s.sendall(mpa_reply(case) + fpdu(untagged(13, 0, 1, 0, b"x" * 8)))
    elif case.startswith("reply-read-"):  # softrdma READs from us; the response does not match the request
        s.sendall(mpa_reply(case))
        stag, to, size = read_request_from(s)
        if case == "reply-read-wrong-stag":
            stag ^= 0x100
        elif case == "reply-read-wrong-to":
            to += 8
        elif case == "reply-read-too-long":
            size += 8
        elif case == "reply-read-short":
            size -= 8
        s.sendall(fpdu(tagged(READ_RESP, stag, to, b"r" * size)))
        if case == "reply-read-good":
            time.sleep(0.2)
            s.shutdown(socket.SHUT_WR)
    out = fpdu_answer(s)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    return out


ALL = ["bad-key", "bad-revision", "pd-too-long", "pd-beyond-sent", "truncated-request", "reply-key", "pd-512",
       "short-ulpdu", "ulpdu-1", "over-mulpdu", "fpdu-truncated-close", "length-then-close", "garbage", "opcode-13", "ddp-version-0",
       "ddp-version-2-tagged", "rdmap-version-2", "bad-qn", "msn-out-of-window", "msn-zero", "mo-past-buffer",
       "send-too-long", "write-bogus-stag", "write-past-region", "write-to-wrap", "read-beyond-ird",
       "read-src-wrap", "read-huge", "dribble", "zero-write-flood", "silent", "send-inv-mr", "atomic-unnegotiated", "imm-unnegotiated", "write-stag-switch",
       "read-response-unasked", "terminate-long", "terminate-first", "terminate-after-send", "terminate-short",
       "send-flood", "zero-window", "crc-good", "crc-bad", "crc-zero", "markers-good", "markers-bad-pointer",
       "markers-second-bad", "markers-missing", "rfc7306-atomic-good", "rfc7306-atomic-unaligned",
       "rfc7306-atomic-bad-op", "rfc7306-atomic-bogus-stag", "rfc7306-atomic-past-region",
       "rfc7306-atomic-beyond-ird", "rfc7306-atomic-short", "rfc7306-atomic-response-unasked", "rfc7306-imm-good",
       "rfc7306-imm-short", "rfc7306-imm-flood", "srq-good", "srq-flood", "srq-send-too-long",
       "srq-msn-out-of-window", "srq-mo-past-buffer", "good-send"]


def main():
    ip, port = sys.argv[1], int(sys.argv[2])
    cases = sys.argv[3:]
    if cases == ["all"]:
        cases = ALL + ["quit"] + REPLY_CASES
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port + 1))
    listener.listen(8)
    rc = 0
    for c in cases:
        t0 = time.time()
        try:
            line = reply_case(listener, c) if c in REPLY_CASES else run(ip, port, c)
        except Exception as e:  # a case that could not be played is a failure of the test, not of softrdma
            line = "error %s" % e
            rc = 1
        print("hostile %s: %s [%.2f s]" % (c, line, time.time() - t0), flush=True)
        time.sleep(0.02)
    return rc


if __name__ == "__main__":
    sys.exit(main())
