#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""softrdma against the raw memif link and Linux kernel TCP, on this machine, in one run (scripts/compare).

Measures one system at a time (this machine has two cores; each measured system uses both):
  1. floor     bench/compare/memif_floor: io/ only, two processes bouncing / streaming raw frames over memif
  2. kernel    bench/compare/kernel_tcp: Linux TCP between two network namespaces on a veth pair made here
  3. softrdma  bench/rdma_perf (SEND ping-pong, READ latency, WRITE bandwidth, SEND message rate) over memif
then prints a table and writes compare.md, compare.json, compare.png and the raw JSON of every program to
the output directory. Every program runs under a time limit; the namespaces are removed on every exit path
(normal end, failure, Ctrl-C, SIGTERM), and ones left by a killed earlier run are removed at start.

The module is importable (tests/compare/check_compare.py uses parse_rdma_perf and the row builders).
"""
import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

NS_PREFIX = "srcmp"           # namespaces srcmpa<pid>, srcmpb<pid>; veth ends with the same names
KERNEL_ADDR = ("198.18.77.1", "198.18.77.2")  # RFC 2544 benchmark range, only inside our namespaces
KERNEL_PORT = 5201


class MeasureError(Exception):
    """A part could not be measured; the message says why (shown in the table)."""


# ---- running programs under time limits -----------------------------------------------------------------

def descendants(pid):
    """Every process below pid (children, grandchildren...), from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc):
    """Ends proc and everything it started (SIGTERM, then SIGKILL after 2 s)."""
    if proc.poll() is not None:
        return
    pids = [proc.pid] + descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=2)
            pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
            if not pids:
                return
        except subprocess.TimeoutExpired:
            pass
    proc.wait()


def run(cmd, timeout, log):
    """Runs cmd with a time limit; stdout+stderr go to log (and stdout is returned). Raises MeasureError."""
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            text = proc.stdout.read() if proc.stdout else ""
            out.write(text)
            raise MeasureError(f"{os.path.basename(cmd[0])} took longer than {timeout} s (log: {log})")
        except BaseException:
            kill_tree(proc)
            raise
        out.write(text)
    if proc.returncode != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise MeasureError(f"{os.path.basename(cmd[0])} failed (exit {proc.returncode}): {tail} (log: {log})")
    return text


# ---- 1. floor -------------------------------------------------------------------------------------------

def measure_floor(a, out):
    """Two memif_floor runs: MTU 1500 for sizes up to 1500, MTU 9000 above (each frame size on the smallest
    MTU that carries it, as softrdma's own runs would be)."""
    exe = os.path.join(a.build, "bench/compare/memif_floor")
    if not os.access(exe, os.X_OK):
        raise MeasureError(f"{exe} is not built (ninja -C {a.build} bench/compare/memif_floor)")
    q = a.quick
    common = ["--iters", "2000" if q else "20000", "--warmup", "1000" if q else "5000",
              "--stream-ms", "100" if q else "400", "--stream-reps", "3" if q else "5",
              "--timeout", "60" if q else "150"]
    small = ["64", "256", "1024", "1500"] if q else ["64", "128", "256", "512", "1024", "1500"]
    merged = {"tool": "memif_floor", "lat": [], "bw": []}
    runs = [("1500", small, ["64", "1500"] if q else ["64", "256", "1024", "1500"])]
    if not q or a.mtu == 9000:
        runs.append(("9000", ["4096", "9000"] if q else ["2048", "4096", "8192", "9000"],
                     ["9000"] if q else ["4096", "9000"]))
    for mtu, sizes, stream in runs:
        path = os.path.join(out, "raw", f"floor-mtu{mtu}.json")
        cmd = [exe, "--mtu", mtu, "--sizes", ",".join(sizes), "--stream-sizes", ",".join(stream), "--json", path]
        log = os.path.join(out, "raw", f"floor-mtu{mtu}.log")
        try:
            run(cmd + common, 90 if q else 240, log)
        except MeasureError as e:  # once more after a failed start (seen once in many runs); logs of both kept
            if "longer than" in str(e):
                raise
            os.replace(log, log + ".failed")
            merged.setdefault("retried", []).append(f"MTU {mtu}: {e}")
            run(cmd + common, 90 if q else 240, log)
        with open(path) as f:
            d = json.load(f)
        for e in d["lat"] + d["bw"]:
            e["mtu"] = int(mtu)
        merged["lat"] += d["lat"]
        merged["bw"] += d["bw"]
    return merged


# ---- 2. kernel TCP between two namespaces -------------------------------------------------------------

def ip(*args, check=True):
    r = subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)
    if check and r.returncode != 0:
        raise MeasureError(f"ip {' '.join(args)}: {r.stdout.strip()}")
    return r.stdout


def remove_stale_namespaces():
    """Namespaces of an earlier run that was killed (SIGKILL leaves no chance to clean up)."""
    try:
        listing = ip("netns", "list", check=False)
    except (OSError, subprocess.SubprocessError):
        return
    for line in listing.splitlines():
        m = re.match(rf"^({NS_PREFIX}[ab](\d+))\b", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            ip("netns", "del", m.group(1), check=False)


class Namespaces:
    """Two namespaces joined by a veth pair with an address each; removed by close() (always called)."""

    def __init__(self, mtu):
        tag = str(os.getpid())
        self.a, self.b = NS_PREFIX + "a" + tag, NS_PREFIX + "b" + tag
        self.made = []
        try:
            for ns in (self.a, self.b):
                ip("netns", "add", ns)
                self.made.append(ns)
            ip("link", "add", self.a, "netns", self.a, "type", "veth", "peer", "name", self.b, "netns", self.b)
            for ns, addr in ((self.a, KERNEL_ADDR[0]), (self.b, KERNEL_ADDR[1])):
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "addr", "add", addr + "/24", "dev", ns)
                ip("-n", ns, "link", "set", ns, "mtu", str(mtu), "up")
        except BaseException:
            self.close()
            raise

    def close(self):
        for ns in self.made:  # deleting a namespace deletes its veth end, and with it the pair
            ip("netns", "del", ns, check=False)
        self.made = []


# The busy-polling ping-pong's sizes: issue 15 compares half round trips from 4 KiB to 1 MiB (size_rows).
SPIN_SIZES = "64,256,1024,4096,16384,32768,65536,131072,262144,1048576"


@contextlib.contextmanager
def kernel_tcp(build, mtu, server_log, server_timeout):
    """Kernel TCP between two namespaces at `mtu`: kernel_tcp's server in one (core 0), and a function that runs
    its client in the other (core 1) with the given arguments: client(args, limit, log). On leaving normally the
    server is asked to quit; whatever happened, it is then killed and the namespaces removed."""
    exe = os.path.join(build, "bench/compare/kernel_tcp")
    if not os.access(exe, os.X_OK):
        raise MeasureError(f"{exe} is not built (ninja -C {build} bench/compare/kernel_tcp)")
    ns = Namespaces(mtu)
    server = None
    to = ["--host", KERNEL_ADDR[0], "--port", str(KERNEL_PORT)]
    try:
        with open(server_log, "w") as slog:
            server = subprocess.Popen(["ip", "netns", "exec", ns.a, exe, "server", "--port", str(KERNEL_PORT),
                                       "--cpu", "0", "--timeout", str(server_timeout)],
                                      stdout=slog, stderr=subprocess.STDOUT, start_new_session=True)

        def client(args, limit, log):
            run(["ip", "netns", "exec", ns.b, exe, "client"] + to + ["--cpu", "1", "--timeout", str(limit)] + args,
                limit + 5, log)

        yield client
        subprocess.run(["ip", "netns", "exec", ns.b, exe, "quit"] + to + ["--timeout", "5"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if server is not None:
            kill_tree(server)
        ns.close()


def measure_kernel(a, out):
    q = a.quick
    limit = 60 if q else 240
    raw = os.path.join(out, "raw")
    with kernel_tcp(a.build, a.mtu, os.path.join(raw, "kernel-server.log"), limit + 10) as client:
        path = os.path.join(raw, "kernel.json")
        sizes = "64,256,1024,1500" if q else "64,128,256,512,1024,1500,2048,4096,8192,9000,16384,65536"
        stream = "64,65536" if q else "64,256,1024,4096,16384,65536,262144,1048576"
        client(["--sizes", sizes, "--stream-sizes", stream, "--iters", "2000" if q else "20000",
                "--warmup", "200" if q else "2000", "--stream-ms", "100" if q else "400",
                "--stream-reps", "3" if q else "5", "--json", path],
               limit, os.path.join(raw, "kernel-client.log"))
        # The same ping-pong with both ends busy-polling recv(MSG_DONTWAIT), as softrdma polls: how much of the
        # gap is the sleep/wake-up of blocking sockets.
        spin_path = os.path.join(raw, "kernel-spin.json")
        client(["--spin", "--sizes", "64" if q else SPIN_SIZES, "--stream-sizes", "",
                "--iters", "2000" if q else "20000", "--warmup", "200" if q else "2000", "--json", spin_path],
               limit, os.path.join(raw, "kernel-spin-client.log"))
    with open(path) as f:
        d = json.load(f)
    with open(spin_path) as f:
        d["lat_spin"] = json.load(f)["lat"]
    d["mtu"] = a.mtu
    return d


# ---- 3. softrdma via rdma_perf ---------------------------------------------------------------------------

def parse_rdma_perf(path):
    """Reads one rdma_perf --json file; returns (test, kind, {bytes: result}) after checking the fields the
    table uses. Raises MeasureError on anything else."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise MeasureError(f"rdma_perf wrote no readable JSON in {path}: {e}")
    if d.get("tool") != "rdma_perf" or d.get("kind") not in ("lat", "bw") or not isinstance(d.get("results"), list):
        raise MeasureError(f"{path}: not rdma_perf's JSON (tool/kind/results)")
    need = ("t_typical_us", "p99_us") if d["kind"] == "lat" else ("bw_avg_mib_s", "msg_rate_mpps")
    by_size = {}
    for r in d["results"]:
        if not isinstance(r, dict) or not isinstance(r.get("bytes"), int) or \
                not all(isinstance(r.get(k), (int, float)) for k in need):
            raise MeasureError(f"{path}: a result lacks bytes or {'/'.join(need)}: {r}")
        by_size[r["bytes"]] = r
    if not by_size:
        raise MeasureError(f"{path}: no results")
    rtt = d.get("core_rtt_ns")
    return d.get("test"), d["kind"], by_size, rtt if isinstance(rtt, (int, float)) else None


def find_rdma_perf(a):
    if a.rdma_perf:
        return a.rdma_perf
    exe = os.path.join(a.build, "bench/rdma_perf")
    if os.access(exe, os.X_OK):
        return exe
    src = os.path.join(a.source, "bench/rdma_perf.cpp")
    if not os.path.exists(src):
        raise MeasureError("not measured: bench/rdma_perf does not exist yet")
    raise MeasureError(f"not measured: {exe} is not built")


def measure_softrdma(a, out):
    exe = find_rdma_perf(a)
    q = a.quick
    n = "1000" if q else "10000"
    # (name, arguments): one rdma_perf run each, one after the other. The full run sweeps sizes (-a, with
    # rdma_perf's own iteration counts, scaled down for large messages) for the plot; the rows take 64 B /
    # 64 KiB from those sweeps.
    plan = [
        ("send-lat", ["--test", "send", "--lat"] + (["-s", "64", "-n", n] if q else ["-a"])),
        ("read-lat", ["--test", "read", "--lat", "-s", "64", "-n", n]),
        ("write-bw", ["--test", "write", "--bw"] + (["-s", "65536", "-n", "2000"] if q else ["-a"])),
        ("send-bw", ["--test", "send", "--bw", "-s", "64", "-n", "100000" if q else "1000000"]),
    ]
    # rdma_perf's own limits: --timeout (no progress) and --deadline (its processes killed); ours a bit later.
    deadline = 30 if q else 400
    res, errors = {}, []
    hung = False
    for name, args in plan:
        if hung:  # a run that failed only at a time limit: the next would most likely wait as long
            errors.append(f"{name}: not run (the run before it hung until a time limit)")
            continue
        path = os.path.join(out, "raw", f"softrdma-{name}.json")
        t0 = time.monotonic()
        try:
            run([exe] + args + ["--mtu", str(a.mtu), "--threading", a.threading, "--json", path,
                                "--timeout", "10", "--deadline", str(deadline)] +
                ([] if a.large_segments else ["--mtu-segments"]) + ["--memif-zc" if a.memif_zc else "--memif-copy"] +
                ([] if a.memif_own_server_path else ["--memif-driver"]),
                deadline + 15, os.path.join(out, "raw", f"softrdma-{name}.log"))
            test, kind, by_size, rtt = parse_rdma_perf(path)
            res[name] = {"test": test, "kind": kind, "results": by_size, "core_rtt_ns": rtt}
        except MeasureError as e:
            errors.append(f"{name}: {e}")
            hung = time.monotonic() - t0 > min(20, deadline - 5)
    if not res:
        raise MeasureError("; ".join(errors))
    return {"runs": res, "errors": errors, "mtu": a.mtu, "threading": a.threading}


# ---- 4. stock perftest through the drop-in libraries ---------------------------------------------------


def parse_perftest(kind, text, log):
    """The results line under perftest's header: lat -> t_typical (5th column) and p99 (8th); bw -> BW average
    (MiB/s, 4th) and message rate (Mpps, 5th)."""
    m = re.search(r"#bytes[^\n]*\n\s*(\d+(?:\s+[\d.]+)+)", text)
    if not m:
        raise MeasureError(f"no results line in the perftest output (log: {log})")
    v = [float(x) for x in m.group(1).split()]
    if kind == "lat":
        if len(v) < 8:
            raise MeasureError(f"short latency line {m.group(1)!r} (log: {log})")
        return {"bytes": int(v[0]), "t_typical_us": v[4], "p99_us": v[7]}
    if len(v) < 5:
        raise MeasureError(f"short bandwidth line {m.group(1)!r} (log: {log})")
    return {"bytes": int(v[0]), "bw_avg_mib_s": v[3], "msg_rate_mpps": v[4]}


def measure_perftest(a, out):
    """Debian's perftest binaries, unmodified, under softrdma-run: two processes over memif (server on core
    0, client on core 1, as rdma_perf --local), rdma_cm (-R). The same rows as rdma_perf's."""
    launcher = os.path.join(a.build, "verbs/dropin/softrdma-run")
    if not os.access(launcher, os.X_OK):
        raise MeasureError(f"not measured: {launcher} is not built")
    missing = [t for t in ("ib_send_lat", "ib_read_lat", "ib_write_bw", "ib_send_bw") if shutil.which(t) is None]
    if missing:
        raise MeasureError("not measured: perftest is not installed (scripts/setup installs it): " + ", ".join(missing))
    q = a.quick
    n_lat = "1000" if q else "10000"
    plan = [
        ("send-lat", "lat", ["ib_send_lat", "-R", "-s", "64", "-n", n_lat]),
        ("read-lat", "lat", ["ib_read_lat", "-R", "-s", "64", "-n", n_lat]),
        ("write-bw", "bw", ["ib_write_bw", "-R", "-s", "65536", "-n", "2000" if q else "20000"]),
        ("send-bw", "bw", ["ib_send_bw", "-R", "-s", "64", "-n", "100000" if q else "1000000"]),
    ]
    threading_mode = "rx_thread" if a.threading == "rx-thread" else "run_to_completion"
    res, errors = {}, []
    for name, kind, prog in plan:
        sock = os.path.join(out, "raw", f"perftest-{name}.sock")
        common = ["--memif", sock, "--mtu", str(a.mtu), "--threading", threading_mode]
        slog = os.path.join(out, "raw", f"perftest-{name}.server.log")
        clog = os.path.join(out, "raw", f"perftest-{name}.log")
        with open(slog, "w") as sl:
            server = subprocess.Popen([launcher] + common + ["--memif-role", "server", "--ip", "198.18.0.1",
                                                             "--lcores", "0"] + prog,
                                      stdout=sl, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(0.5)
            text = run([launcher] + common + ["--memif-role", "client", "--ip", "198.18.0.2", "--lcores", "1"] +
                       prog + ["198.18.0.1"], 120 if q else 400, clog)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            r = parse_perftest(kind, text, clog)
            res[name] = {"test": prog[0], "kind": kind, "results": {r["bytes"]: r}}
        except MeasureError as e:
            errors.append(f"{name}: {e}")
        finally:
            kill_tree(server)
            try:
                os.unlink(sock)
            except OSError:
                pass
    if not res:
        raise MeasureError("; ".join(errors))
    return {"runs": res, "errors": errors, "mtu": a.mtu, "threading": a.threading}


# ---- the table ----------------------------------------------------------------------------------------

def pick(entries, size, key, mtu=None):
    for e in entries or []:
        if e.get("bytes") == size and (mtu is None or e.get("mtu", mtu) == mtu) and \
                isinstance(e.get(key), (int, float)):
            return float(e[key])
    return None


def mib_s_to_gb_s(v):
    return None if v is None else v * 1048576 / 1e9


def soft(s, run_name, size, key):
    if not s:
        return None
    r = s["runs"].get(run_name)
    if not r or size not in r["results"]:
        return None
    v = r["results"][size].get(key)
    return float(v) if isinstance(v, (int, float)) else None


def build_rows(floor, kernel, softrdma, mtu, perftest=None):
    """The table rows: (key, label, unit, better, floor, kernel, softrdma, perftest). better: 'lower' or
    'higher'. perftest: stock perftest through the drop-in libraries, same rows."""
    fl_lat = floor["lat"] if floor else None
    fl_bw = floor["bw"] if floor else None
    k_lat = kernel["lat"] if kernel else None
    k_bw = kernel["bw"] if kernel else None
    frame = 1500 if mtu == 1500 else 9000
    return [
        ("half_rtt_64", "64 B half round trip, median (SEND ping-pong)", "us", "lower",
         pick(fl_lat, 64, "half_rtt_median_us"), pick(k_lat, 64, "half_rtt_median_us"),
         soft(softrdma, "send-lat", 64, "t_typical_us"),
         soft(perftest, "send-lat", 64, "t_typical_us")),
        ("half_rtt_64_kspin", "64 B half round trip, median, kernel TCP busy-polling", "us", "lower",
         pick(fl_lat, 64, "half_rtt_median_us"), pick((kernel or {}).get("lat_spin"), 64, "half_rtt_median_us"),
         soft(softrdma, "send-lat", 64, "t_typical_us"),
         soft(perftest, "send-lat", 64, "t_typical_us")),
        ("half_rtt_64_p99", "64 B half round trip, p99", "us", "lower",
         pick(fl_lat, 64, "half_rtt_p99_us"), pick(k_lat, 64, "half_rtt_p99_us"),
         soft(softrdma, "send-lat", 64, "p99_us"), soft(perftest, "send-lat", 64, "p99_us")),
        ("read_lat_64", "64 B READ latency, median (full round trip)", "us", "lower",
         pick(fl_lat, 64, "rtt_median_us"), pick(k_lat, 64, "rtt_median_us"),
         soft(softrdma, "read-lat", 64, "t_typical_us"), soft(perftest, "read-lat", 64, "t_typical_us")),
        ("bw_64k", f"64 KiB bandwidth (WRITE; floor: {frame} B frames)", "GB/s", "higher",
         pick(fl_bw, frame, "gb_s"), pick(k_bw, 65536, "gb_s"),
         mib_s_to_gb_s(soft(softrdma, "write-bw", 65536, "bw_avg_mib_s")),
         mib_s_to_gb_s(soft(perftest, "write-bw", 65536, "bw_avg_mib_s"))),
        ("msg_rate_64", "64 B message rate (SEND; floor: 64 B frames)", "M msg/s", "higher",
         pick(fl_bw, 64, "mpps"), pick(k_bw, 64, "mmsg_s"),
         soft(softrdma, "send-bw", 64, "msg_rate_mpps"), soft(perftest, "send-bw", 64, "msg_rate_mpps")),
    ]


def size_rows(kernel, softrdma):
    """Half round trip by size, kernel TCP busy-polling against softrdma's SEND ping-pong, for every size both
    measured: [(bytes, kernel us, softrdma us, softrdma / kernel)]."""
    spin = {e["bytes"]: e["half_rtt_median_us"] for e in (kernel or {}).get("lat_spin", [])}
    runs = (softrdma or {}).get("runs", {})
    soft_lat = {b: r["t_typical_us"] for b, r in runs.get("send-lat", {}).get("results", {}).items()}
    return [(b, spin[b], soft_lat[b], ratio(soft_lat[b], spin[b])) for b in sorted(set(spin) & set(soft_lat))]


def render_sizes(srows):
    """The by-size table as markdown lines (empty without rows)."""
    if not srows:
        return []
    md = ["| half round trip, median | kernel TCP busy-polling (us) | softrdma (us) | softrdma / kernel |",
          "| --- | --- | --- | --- |"]
    md += [f"| {b} B | {fmt(k)} | {fmt(s)} | {r:.2f} |" for b, k, s, r in srows]
    return md


def ratio(num, den):
    return num / den if num is not None and den not in (None, 0) else None


def versus(s, k, better):
    """softrdma against kernel TCP in words: '3.1x better' / '1.2x worse'."""
    if s is None or k is None or s <= 0 or k <= 0:
        return "-"
    f = k / s if better == "lower" else s / k
    return f"{f:.2f}x better" if f >= 1 else f"{1 / f:.2f}x worse"


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def render(rows, status, meta):
    head = ["", "unit", "raw memif floor", "kernel TCP (veth)",
            "softrdma" if meta.get("large_segments", True) else "softrdma (MTU-sized segments)", "softrdma / floor",
            "softrdma vs kernel TCP", "stock perftest on softrdma"]
    body = []
    for _key, label, unit, better, f, k, s, pt in rows:
        r = ratio(s, f)
        body.append([label, unit, fmt(f), fmt(k), fmt(s), f"{r:.2f}" if r is not None else "-", versus(s, k, better),
                     fmt(pt)])
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    text = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in [head] + body)
    md = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    md += ["| " + " | ".join(line) + " |" for line in body]
    notes = [f"- {name}: {msg}" for name, msg in status.items() if msg != "ok"]
    notes.append(f"- {meta['when']}, commit {meta['commit'] or 'unknown'}, {meta['host']}, {meta['cpus']} CPUs, "
                 f"load average at start {meta['load_start']:.2f} (end {meta['load_end']:.2f}); "
                 f"{'--quick (short runs)' if meta['quick'] else 'full run'}, MTU {meta['mtu']}" +
                 ("" if meta.get("large_segments", True) else ", softrdma with --mtu-segments (stock perftest without)") +
                 (", softrdma's client in memif zero-copy mode where hugepages allow" if meta.get("memif_zc") else
                  ", softrdma's client copying through memif's ring (--memif-copy)") +
                 ("" if meta.get("memif_own_server_path", True) else
                  ", softrdma's server moving frames through DPDK's memif driver (--memif-driver)"))
    if meta["load_start"] > 1.0 or meta["load_end"] > 1.0:
        notes.append("- other work was running on this 2-core machine during the run: figures are noisy")
    if meta.get("core_rtt_ns"):
        lo, hi = min(meta["core_rtt_ns"]), max(meta["core_rtt_ns"])
        notes.append(f"- cache line round trip between the two cores (rdma_perf's calibration before each of its "
                     f"runs): {lo:.0f}" + (f"-{hi:.0f}" if round(hi) != round(lo) else "") + " ns; every payload "
                     "byte crosses between the cores in both stacks, so runs are comparable only at similar figures "
                     "(this VM: ~0.65 us in the spells when everything ran 3-5x lower)")
    notes.append("- medians from this run; latency lower is better, bandwidth and message rate higher is better; "
                 "the floor is io/ alone (no stack); kernel TCP is TCP_NODELAY sockets between two namespaces on a "
                 "veth pair, blocking in recv() except in the busy-polling row (recv(MSG_DONTWAIT) at both ends); "
                 "softrdma busy-polls (rdma_perf); the last column is Debian's perftest (ib_send_lat, "
                 "ib_read_lat, ib_write_bw, ib_send_bw -R), unmodified, through softrdma's drop-in "
                 "libibverbs/librdmacm (softrdma-run), on the same memif path")
    return text, "\n".join(md), notes


# ---- the plot -------------------------------------------------------------------------------------------

def series(floor, kernel, softrdma):
    """Per system: latency points (bytes, half-RTT median us) and bandwidth points (bytes, GB/s)."""
    out = {}
    if floor:
        out["raw memif floor"] = (sorted((e["bytes"], e["half_rtt_median_us"]) for e in floor["lat"]),
                                  sorted((e["bytes"], e["gb_s"]) for e in floor["bw"]))
    if kernel:
        out["kernel TCP"] = (sorted((e["bytes"], e["half_rtt_median_us"]) for e in kernel["lat"]),
                             sorted((e["bytes"], e["gb_s"]) for e in kernel["bw"]))
        spin = kernel.get("lat_spin", [])
        out["kernel TCP, busy-polling"] = (sorted((e["bytes"], e["half_rtt_median_us"]) for e in spin), [])
    if softrdma:
        runs = softrdma["runs"]
        lat = sorted((b, r["t_typical_us"]) for b, r in runs.get("send-lat", {}).get("results", {}).items())
        bw = sorted((b, mib_s_to_gb_s(r["bw_avg_mib_s"]))
                    for b, r in runs.get("write-bw", {}).get("results", {}).items())
        out["softrdma"] = (lat, bw)
    return out


def plot(data, out, title):
    """compare.png: latency vs size and bandwidth vs size, one line per system. Returns a problem or None."""
    gp = shutil.which("gnuplot")
    if gp is None:
        return "gnuplot not found (scripts/setup installs gnuplot-nox): no plot"
    cmds = ["set terminal pngcairo size 1400,560 font ',10'", f"set output '{os.path.join(out, 'compare.png')}'",
            "set multiplot layout 1,2 title " + json.dumps(title), "set logscale x 2", "set grid",
            "set key top left", "set xlabel 'message / frame payload bytes'",
            "set xtics (" + ", ".join(f'"{n}" {v}' for n, v in (
                ("2", 2), ("8", 8), ("64", 64), ("256", 256), ("1K", 1024), ("4K", 4096), ("16K", 16384),
                ("64K", 65536), ("256K", 262144), ("1M", 1 << 20), ("4M", 4 << 20), ("16M", 16 << 20))) + ")"]
    for panel, ylabel, log in ((0, "half round trip, median (us)", True), (1, "bandwidth (GB/s, 10^9 B/s)", False)):
        plots = []
        for name, pts in data.items():
            p = [(b, v) for b, v in pts[panel] if v is not None and v > 0]
            if not p:
                continue
            fname = os.path.join(out, "raw", f"plot-{panel}-{re.sub(r'[^a-z]+', '_', name.lower())}.dat")
            with open(fname, "w") as f:
                f.writelines(f"{b} {v}\n" for b, v in p)
            plots.append(f"'{fname}' using 1:2 with linespoints title {json.dumps(name)}")
        xs = [b for pts in data.values() for b, v in pts[panel] if v is not None and v > 0]
        # Points at the ends stay inside the frame (a one-size series is a single point).
        cmds.append(f"set xrange [{min(xs) / 1.5}:{max(xs) * 1.5}]" if xs else "set xrange [64:65536]")
        cmds.append("set ylabel " + json.dumps(ylabel))
        cmds.append("set logscale y 10" if log else "unset logscale y")
        cmds.append("set title " + json.dumps("latency vs size" if panel == 0 else "bandwidth vs size (one way)"))
        if plots:
            cmds.append("plot " + ", ".join(plots))
        else:  # an empty panel that still renders
            cmds += ["set label 1 'no data' at graph 0.5,0.5 center", "set yrange [0:1]", "unset logscale y",
                     "plot 2 notitle", "unset label 1", "set autoscale y"]
    cmds.append("unset multiplot")
    r = subprocess.run([gp], input="\n".join(cmds) + "\n", text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=30)
    if r.returncode != 0:
        return "gnuplot failed: " + r.stdout.strip()[-300:]
    return None


# ---- main -----------------------------------------------------------------------------------------------

def source_revision(top):
    """The commit measured, with '+changes' when the work tree differs from it (None outside git)."""
    try:
        rev = subprocess.run(["git", "-C", top, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", top, "status", "--porcelain", "--untracked-files=no"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=20)
        return rev.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    top = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    p = argparse.ArgumentParser(prog="scripts/compare", description=__doc__.splitlines()[0],
                                epilog="scripts/compare builds what it runs first; --no-build uses the build "
                                       "directory as it is. Output: compare.md, compare.json, compare.png, raw/.")
    p.add_argument("--quick", action="store_true", help="short runs, a few sizes (smoke test, ~1 minute)")
    p.add_argument("--out", help="output directory (default results/compare-<date>-<time>/)")
    p.add_argument("--build", default=os.environ.get("SOFTRDMA_BUILD", "build"), help="meson build directory")
    p.add_argument("--source", default=top, help=argparse.SUPPRESS)
    p.add_argument("--skip", action="append", default=[], choices=["floor", "kernel", "softrdma", "perftest"],
                   help="leave a system out (repeatable)")
    p.add_argument("--mtu", type=int, default=1500, choices=[1500, 9000], help="MTU of the veth pair and of rdma_perf")
    p.add_argument("--threading", default="rtc", choices=["rtc", "rx-thread"], help="rdma_perf --threading")
    p.add_argument("--rdma-perf", help="rdma_perf executable (default BUILD/bench/rdma_perf)")
    p.add_argument("--mtu-segments", dest="large_segments", action="store_false",
                   help="rdma_perf --mtu-segments: MTU-sized TCP segments instead of large ones (up to 64 KiB on "
                        "memif, ContextConfig::large_segments, the default)")
    p.add_argument("--memif-zc", action="store_true", default=True,
                   help="rdma_perf --memif-zc: its client process in memif's zero-copy mode (PortConfig::memif_zero_copy; "
                        "needs hugepages; the default)")
    p.add_argument("--memif-copy", dest="memif_zc", action="store_false",
                   help="rdma_perf --memif-copy: its client process copying into and out of memif's ring instead")
    p.add_argument("--memif-driver", dest="memif_own_server_path", action="store_false",
                   help="rdma_perf --memif-driver: its server process moving frames through DPDK's memif driver "
                        "instead of its own copies (PortConfig::memif_own_server_path off)")
    a = p.parse_args(argv)
    a.build = os.path.realpath(os.path.join(top, a.build) if not os.path.isabs(a.build) else a.build)
    if "kernel" not in a.skip and os.geteuid() != 0:
        print("scripts/compare: the kernel TCP part creates network namespaces, which needs root: run as root "
              "(sudo scripts/compare) or leave it out with --skip kernel", file=sys.stderr)
        return 2
    if "kernel" not in a.skip and shutil.which("ip") is None:
        print("scripts/compare: the kernel TCP part needs iproute2's ip (scripts/setup installs it)", file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.timezone.utc)
    out = os.path.realpath(a.out or os.path.join(top, "results", "compare-" + now.strftime("%Y%m%d-%H%M%S")))
    os.makedirs(os.path.join(out, "raw"), exist_ok=True)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    meta = {"when": now.strftime("%Y-%m-%d %H:%M UTC"), "host": os.uname().nodename, "cpus": os.cpu_count(),
            "commit": source_revision(a.source),
            "load_start": os.getloadavg()[0], "quick": a.quick, "mtu": a.mtu, "threading": a.threading,
            "large_segments": a.large_segments, "memif_zc": a.memif_zc,
            "memif_own_server_path": a.memif_own_server_path}
    results, status = {"floor": None, "kernel": None, "softrdma": None, "perftest": None}, {}
    parts = [("floor", measure_floor), ("kernel", measure_kernel), ("softrdma", measure_softrdma),
             ("perftest", measure_perftest)]
    try:
        remove_stale_namespaces() if "kernel" not in a.skip else None
        for name, fn in parts:  # one system at a time: each one uses both cores
            if name in a.skip:
                status[name] = "skipped (--skip)"
                continue
            print(f"compare: measuring {name} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                results[name] = fn(a, out)
                status[name] = "ok"
                if name == "floor" and results[name].get("retried"):
                    status[name] = "ok after one retry: " + "; ".join(results[name]["retried"])
                if name in ("softrdma", "perftest") and results[name]["errors"]:
                    status[name] = "partly measured: " + "; ".join(results[name]["errors"])
            except MeasureError as e:
                status[name] = str(e)
            print(f"compare: {name}: {status[name]} ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
    except KeyboardInterrupt as e:
        print(f"compare: interrupted ({e or 'Ctrl-C'}); namespaces and processes removed", file=sys.stderr)
        return 130
    meta["load_end"] = os.getloadavg()[0]
    if results["softrdma"]:
        meta["core_rtt_ns"] = [r["core_rtt_ns"] for r in results["softrdma"]["runs"].values()
                               if r.get("core_rtt_ns") is not None]

    rows = build_rows(results["floor"], results["kernel"], results["softrdma"], a.mtu, results["perftest"])
    text, md, notes = render(rows, status, meta)
    srows = size_rows(results["kernel"], results["softrdma"])
    smd = render_sizes(srows)
    if smd:
        md += "\n\n" + "\n".join(smd)
        text += "\n\n" + "\n".join(smd)
    title = f"softrdma vs raw memif floor vs kernel TCP ({meta['when']}{', quick' if a.quick else ''})"
    problem = plot(series(results["floor"], results["kernel"], results["softrdma"]), out, title)
    if problem:
        notes.append("- plot: " + problem)
    print(text)
    print("\n".join(notes))
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(f"# {title}\n\n{md}\n\n" + "\n".join(notes) + "\n" + ("" if problem else "\n![plot](compare.png)\n"))
    doc = {"meta": meta, "status": status,
           "rows": [{"key": key, "label": l, "unit": u, "better": b, "floor": fl, "kernel_tcp": k, "softrdma": s,
                     "softrdma_over_floor": ratio(s, fl), "softrdma_over_kernel_tcp": ratio(s, k),
                     "stock_perftest_on_softrdma": pt}
                    for key, l, u, b, fl, k, s, pt in rows],
           "half_rtt_by_size": [{"bytes": b, "kernel_tcp_spin_us": k, "softrdma_us": s, "softrdma_over_kernel_tcp": r}
                                for b, k, s, r in srows],
           "raw": results}
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"compare: wrote {out}/compare.md, compare.json" + ("" if problem else ", compare.png"), file=sys.stderr)
    failed = [n for n, s in status.items() if not s.startswith(("ok", "skipped", "not measured", "partly"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
