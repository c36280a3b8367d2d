#!/usr/bin/env python3
"""Connection flood for tests/verbs/flood_test.cpp: from several source addresses, opens many TCP connections to
a softrdma listener as fast as the kernel allows, sends nothing (no MPA request), holds them, then closes them.

Usage: flood.py SERVER_IP PORT COUNT HOLD_SECONDS SOURCE_IP...
Prints one line: "flood: N attempted, E established, R reset by the server, T still open at the end".
"""
import errno
import resource
import select
import socket
import sys
import time


def main():
    ip, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    sources = sys.argv[5:]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want,
                                                    hard))
    socks = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((sources[i % len(sources)], 0))
        try:
            s.connect((ip, port))
        except BlockingIOError:
            pass
        socks.append(s)
    established = reset = 0
    by_fd = {s.fileno(): s for s in socks}
    poller = select.poll()  # select() cannot take descriptors above 1023
    for fd in by_fd:
        poller.register(fd, select.POLLOUT)
    pending = set(by_fd)
    up = set()
    deadline = time.time() + 10
    while pending and time.time() < deadline:
        for fd, ev in poller.poll(200):
            if fd not in pending:
                continue
            pending.discard(fd)
            poller.unregister(fd)
            if by_fd[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                established += 1
                up.add(fd)
            else:
                reset += 1
    # Hold: connections the server resets show up as readable with ECONNRESET (or EOF).
    alive = set(up)
    for fd in alive:
        poller.register(fd, select.POLLIN)
    end = time.time() + hold
    while time.time() < end:
        for fd, ev in poller.poll(200):
            if fd not in alive:
                continue
            try:
                if by_fd[fd].recv(1):
                    continue
            except OSError as e:
                if e.errno not in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
                    continue
            reset += 1
            alive.discard(fd)
            poller.unregister(fd)
    print("flood: %d attempted, %d established, %d reset or closed by the server, %d still open at the end"
          % (count, established, reset, len(alive)), flush=True)
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
