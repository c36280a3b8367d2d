#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A listener that leaves a connection attempt's SYNs unanswered for 3.2 s, then refuses it (RST): prints when
each SYN came (seconds after the first), for the SYN retransmission check in hostile_test.cpp.

    synpeer.py IFACE MY_IP PEER_IP PORT     (prints "raw syn: at=0.000,T2,... same=yes|no")
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rawtcp import ACK, MASK, RST, SYN, Link, Tcp  # noqa: E402

WATCH = 3.2  # seconds of SYNs recorded after the first, unanswered


def main():
    iface, my_ip, peer_ip, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    link = Link(iface, my_ip, peer_ip)  # answers the peer's ARP requests as it polls
    syns = []  # (time, source port, sequence number) of each SYN to PORT
    deadline = time.time() + 30
    while time.time() < deadline and (not syns or time.time() < syns[0][0] + WATCH):
        for sport, dport, seq, _ack, flags, _win, _opts, _payload in link.poll(0.05):
            if dport == port and flags & SYN and not flags & ACK:
                syns.append((time.time(), sport, seq))
    if not syns:
        print("raw syn: no SYN in 30 s", flush=True)
        return 1
    t0, sport, seq = syns[0]
    tcp = Tcp(link, sport, port)
    tcp.rcv_nxt = (seq + 1) & MASK
    tcp.send(0, RST | ACK)
    same = all((p, s) == (sport, seq) for _, p, s in syns)
    print("raw syn: at=%s same=%s" % (",".join("%.3f" % (t - t0) for t, _, _ in syns), "yes" if same else "no"),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
