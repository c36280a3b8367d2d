#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Smoke test of bench/rdma_perf (suite 'bench'): tiny latency and bandwidth runs of every test over memif
(two processes on this machine), checking perftest's column headers, the rows, the exit codes and the JSON
file the comparison script reads. Usage: check_rdma_perf.py PATH/TO/rdma_perf"""
import json
import os
import re
import subprocess
import sys
import tempfile

LAT_HEADER = ("#bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] t_stdev[usec] "
              "99% percentile[usec] 99.9% percentile[usec]")
BW_HEADER = "#bytes #iterations BW peak[MiB/sec] BW average[MiB/sec] MsgRate[Mpps]"
LAT_KEYS = ["bytes", "iterations", "t_min_us", "t_max_us", "t_typical_us", "t_avg_us", "t_stdev_us", "p99_us",
            "p999_us"]
BW_KEYS = ["bytes", "iterations", "bw_peak_mib_s", "bw_avg_mib_s", "msg_rate_mpps", "warmup_in_flight"]
TOP_KEYS = ["tool", "test", "kind", "threading", "mtu", "core_rtt_ns", "results"]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def run(exe, args, timeout=25):
    p = subprocess.run([exe] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def rows_after(header, out):
    lines = out.splitlines()
    if header not in lines:
        return None
    i = lines.index(header)
    return [l.split() for l in lines[i + 1:] if l and not l.startswith("#")]


def case(exe, tmp, test, kind, args, sizes, iters):
    name = f"{test} {kind} {' '.join(args)}"
    path = os.path.join(tmp, f"{test}-{kind}.json")
    rc, out, err = run(exe, ["--test", test, f"--{kind}", "--json", path, "--timeout", "5", "--deadline", "20"] + args)
    print(f"== {name}: exit {rc}\n{out}{err}", end="")
    if not check(rc == 0, f"{name}: exit code {rc}"):
        return
    # The calibration (--local, cores 0,1): measured whenever this process may run on both cores.
    both = {0, 1} <= os.sched_getaffinity(0)
    m = re.search(r"^# cache line round trip between the two cores \(0,1\): (\d+) ns$", out, re.M)
    check(m is not None or not both, f"{name}: no cache line round trip in the banner")
    if "--memif-copy" in args:
        check("| memif copying |" in out, f"{name}: the banner does not say the client copies")
    header = LAT_HEADER if kind == "lat" else BW_HEADER
    rows = rows_after(header, out)
    if not check(rows is not None, f"{name}: header line missing or different"):
        return
    ncol = 9 if kind == "lat" else 5
    check(len(rows) == len(sizes), f"{name}: {len(rows)} rows, expected {len(sizes)}")
    for r, size in zip(rows, sizes):
        check(len(r) == ncol, f"{name}: row {r} has {len(r)} columns, expected {ncol}")
        try:
            vals = [float(x) for x in r]
        except ValueError:
            check(False, f"{name}: row {r} is not all numbers")
            continue
        check(int(vals[0]) == size and int(vals[1]) == iters, f"{name}: row {r} bytes/iterations")
        if kind == "lat":
            tmin, tmax, typ, avg, sd, p99, p999 = vals[2:]
            check(0 < tmin <= typ <= tmax and tmin <= avg <= tmax and sd >= 0 and typ <= p99 <= p999 <= tmax,
                  f"{name}: latency figures out of order: {r}")
        else:
            peak, avg, rate = vals[2:]
            check(0 < avg <= peak * 1.0001 and rate > 0, f"{name}: bandwidth figures: {r}")
            # BW is printed with 2 decimals: allow that rounding plus 1 %
            check(abs(avg * 1048576 / size / 1e6 - rate) <= 0.01 * rate + 0.005 * 1048576 / size / 1e6,
                  f"{name}: MsgRate != BW/size: {r}")
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        check(False, f"{name}: JSON: {e}")
        return
    check(list(d.keys()) == TOP_KEYS, f"{name}: JSON keys {list(d.keys())}")
    check(d.get("tool") == "rdma_perf" and d.get("test") == test and d.get("kind") == kind and
          d.get("threading") == "rtc" and d.get("mtu") == 1500, f"{name}: JSON header fields {d}")
    rtt = d.get("core_rtt_ns")
    check(rtt is None and not both or isinstance(rtt, float) and 1 < rtt < 1e6 and
          (m is None or abs(rtt - int(m.group(1))) <= 0.5), f"{name}: JSON core_rtt_ns {rtt!r} (banner {m and m.group(1)})")
    res = d.get("results", [])
    check(len(res) == len(sizes), f"{name}: JSON has {len(res)} results")
    keys = LAT_KEYS if kind == "lat" else BW_KEYS
    for r, size in zip(res, sizes):
        check(list(r.keys()) == keys, f"{name}: JSON result keys {list(r.keys())}")
        check(r.get("bytes") == size and r.get("iterations") == iters, f"{name}: JSON result {r}")
        check(all(isinstance(r.get(k), (int, float)) for k in keys), f"{name}: JSON non-numbers {r}")
        if kind == "bw" and all(isinstance(r.get(k), (int, float)) for k in keys):
            rate = r["msg_rate_mpps"]
            check(abs(r["bw_avg_mib_s"] * 1048576 / size / 1e6 - rate) <= 0.01 * rate + 1e-5,
                  f"{name}: JSON msg_rate_mpps != bw_avg_mib_s / size: {r}")
            # The clock starts after the warmup has completed (else it timed part of the warmup too).
            check(r["warmup_in_flight"] == 0, f"{name}: warmup messages still in flight at the start: {r}")


def layer_tables(out):
    """The '# <who> cycles per ... by layer:' tables in the output, in order: [(who, {row: cycles/msg})]."""
    tables = []
    for line in out.splitlines():
        m = re.match(r"# (client|server) cycles per (message|iteration) by layer:$", line)
        if m:
            tables.append((m.group(1), {}))
            continue
        m = re.match(r"#\s+(io|lwip|mpa\+crc|ddp/rdmap|verbs|total|rx io|rx place|rx forward|rx total)\s+(\d+)\s", line)
        if m and tables:
            tables[-1][1][m.group(1)] = int(m.group(2))
    return tables


def layers(exe):
    """--layers in RX-thread mode: the client's table by layer, then its RX thread's rows (driver, forwarding:
    a WRITE stream's client receives only ACKs, so nothing to place), each with cycles per message; then the
    server's table, which the server sends in the control message after the phase (its main thread's layers).
    Run to completion, a SEND ping-pong: both tables, the server placing what it receives."""
    args = ["--test", "write", "--bw", "-s", "65536", "-n", "200", "--threading", "rx-thread", "--layers",
            "--timeout", "10", "--deadline", "50"]
    rc, out, err = run(exe, args, timeout=60)  # four busy threads on two cores, under TSan too
    check(rc == 0, f"--layers rx-thread: exit {rc}: {err.strip()[-300:]}")
    tables = layer_tables(out)
    check([w for w, _ in tables] == ["client", "server"], f"--layers rx-thread: tables {[w for w, _ in tables]}")
    rows = tables[0][1] if tables else {}
    for k in ("io", "lwip", "total", "rx io", "rx forward", "rx total"):
        check(rows.get(k, 0) > 0, f"--layers rx-thread: row '{k}' missing or zero: {rows}")
    check(rows.get("rx total", 0) >= rows.get("rx io", 0) + rows.get("rx forward", 0) - 2,
          f"--layers rx-thread: rx rows do not add up: {rows}")
    srv = tables[1][1] if len(tables) > 1 else {}
    for k in ("io", "lwip", "total"):
        check(srv.get(k, 0) > 0, f"--layers rx-thread: server row '{k}' missing or zero: {srv}")
    check("rx io" not in srv, f"--layers rx-thread: the server's RX thread rows are not carried: {srv}")

    args = ["--test", "send", "--lat", "-s", "16384", "-n", "300", "--layers", "--timeout", "10", "--deadline", "50"]
    rc, out, err = run(exe, args, timeout=60)
    check(rc == 0, f"--layers send lat: exit {rc}: {err.strip()[-300:]}")
    tables = layer_tables(out)
    check([w for w, _ in tables] == ["client", "server"], f"--layers send lat: tables {[w for w, _ in tables]}")
    for who, t in tables:
        for k in ("io", "lwip", "ddp/rdmap", "total"):
            check(t.get(k, 0) > 0, f"--layers send lat: {who} row '{k}' missing or zero: {t}")
        check(abs(sum(t.get(k, 0) for k in ("io", "lwip", "mpa+crc", "ddp/rdmap", "verbs")) - t.get("total", 0)) <= 3,
              f"--layers send lat: {who} rows do not add up: {t}")


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        case(exe, tmp, "send", "lat", ["-s", "64", "-n", "300"], [64], 300)
        case(exe, tmp, "write", "lat", ["-s", "4096", "-n", "200"], [4096], 200)
        case(exe, tmp, "read", "lat", ["-s", "64", "-n", "200"], [64], 200)
        case(exe, tmp, "atomic", "bw", ["-n", "2000", "-t", "32"], [8], 2000)
        case(exe, tmp, "send", "bw", ["-s", "64", "-n", "20000", "-t", "64", "-c", "16"], [64], 20000)
        case(exe, tmp, "write", "bw", ["-s", "65536", "-n", "500"], [65536], 500)
        # The client copying through memif's ring (zero-copy, the default, ran above where hugepages allow):
        # WRITE out of it, READ into it.
        case(exe, tmp, "write", "bw", ["-s", "262144", "-n", "200", "--memif-copy"], [262144], 200)
        case(exe, tmp, "read", "bw", ["-s", "262144", "-n", "200", "--memif-copy"], [262144], 200)
        layers(exe)
        # The flags a script relies on being refused, not ignored.
        rc, out, err = run(exe, ["--test", "atomic", "-s", "64"])
        check(rc == 2 and "atomic" in err, f"atomic with -s 64: exit {rc}, {err.strip()}")
        rc, out, err = run(exe, ["--test", "nope"])
        check(rc == 2, f"--test nope: exit {rc}")
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("rdma_perf smoke: all good")
    return 0


if __name__ == "__main__":
    sys.exit(main())
