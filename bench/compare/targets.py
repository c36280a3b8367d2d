#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Issue 15's speed targets measured in one sitting (scripts/compare --targets).

Rounds (default 5), each measuring in turn, per MTU (1500 then 9000): Linux kernel TCP between two network
namespaces on a veth pair (64 KiB stream with blocking sockets), then softrdma's rdma_perf (run to completion
unless said: WRITE, READ and SEND streams of 64 KiB and 1, 2, 4, 8 MiB; 64 KiB WRITE with CRC; 64 KiB WRITE in
RX-thread mode; at MTU 1500 the 64 B SEND message rate, and bench/copy_ceiling: the copies alone, 8 MiB
against 64 KiB), then the half round trips size by size: kernel TCP busy-polling and softrdma's SEND ping-pong
back to back (kernel TCP 4 times, softrdma twice, the lowest median kept: kernel TCP's connections are bimodal
at 128-256 KiB, and a round whose 4 runs all drew the slow mode is left out of that size's ratios:
KERNEL_SLOW_MODE), between two probes of the host's spell; at MTU 1500 also the floor of a two-copy ping-pong
(bench/copy_alias --publish: two processes doing only the copies, handed over per 64 KiB) and its ratio to
kernel TCP: the best a design copying each byte twice could reach in that spell. Every ratio is taken within a
round, and the table gives the median over the rounds with its range, and whether the median meets the target.

Spells: this host (two vCPUs of an EPYC) has fast spells, when its two cores share a cache (a cache line round
trip between them ~140 ns), slow ones (~600 ns: another core complex), now and then a shared one (~65 ns: the
two vCPUs on one physical core's two threads, which then share its execution units and its copies' bandwidth),
and they can change within a minute. Each costs a cross-core hand-off and a copy differently, and not by the
same factor for kernel TCP and softrdma, so a ratio of a fast-spell kernel figure to a slow-spell softrdma one
means nothing. Each half round trip run is therefore bracketed by `rdma_perf --core-rtt` probes and called
shared, fast or slow (both probes in its band: SPELL_BANDS_NS) or changed; a ratio is kept only when both
runs of a size were in the same spell, and the round trip targets have a row per spell seen. So have the 1-8 MiB rows (each stream run between probes too, paired with its 64 KiB run: the
caches of a fast spell fall at 4-8 MiB, where a slow spell's crossing between the cores sets the pace at every
size). The ratios to kernel TCP's stream are far from their thresholds and are not paired.

Writes targets.md, targets.json and raw/ (every program's JSON and log) to results/targets-<date>-<time>/.
The module is importable: tests/compare/check_compare.py checks verdicts() on hand-made rounds.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
import compare as C  # noqa: E402  (bench/compare/compare.py: runners, namespaces, rdma_perf's JSON)

KiB, MiB = 1024, 1024 * 1024
LARGE = (1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB)
RTT_SIZES = (4 * KiB, 16 * KiB, 32 * KiB, 64 * KiB, 128 * KiB, 256 * KiB, 1 * MiB)
OPS = ("write", "read", "send")

# The targets (issue 15), as (key, words, threshold).
BW_VS_KERNEL = {1500: 1.5, 9000: 2.0}   # 64 KiB WRITE / kernel TCP's 64 KiB stream, same MTU
CRC_VS_KERNEL = 1.0                     # with CRC on, still ahead
LARGE_VS_64K = 0.90                     # 1..8 MiB WRITE, READ, SEND / their 64 KiB figure
RTT_VS_KERNEL = 0.5                     # half round trip 4 KiB..1 MiB / kernel TCP busy-polling, at most
SMALL_RTT_US = 1.0                      # 64 B SEND half round trip at MTU 1500, at most


# ---- measuring ----------------------------------------------------------------------------------------------

# A cache line round trip between the two cores under 100 ns: one physical core's two threads (shared); under
# 350 ns: one core complex (fast); else slow (see above).
SPELL_BANDS_NS = (("shared", 100), ("fast", 350), ("slow", float("inf")))
SPELLS = tuple(name for name, _ in SPELL_BANDS_NS)
# The two-copy floor (rtt_round, MTU 1500): bench/copy_alias's pipelined ping-pong, FPDU-sized pieces (rep movsb
# copies: smaller pieces into lines the peer holds are far slower in a slow spell), handed over per 64 KiB.
FLOOR_ARGS = ["--piece", "8936", "--offset", "64", "--publish", "65536", "--iters", "2000", "--rounds", "1"]
# Runs per half round trip size, the lowest median kept (see rtt_round): kernel TCP's connections are bimodal at
# 256 KiB (one in two or so at ~4x its best), softrdma's runs within a few % of each other. In the kernel's favour.
# The floor (MTU 1500) once: copy_alias's runs agree closely.
RTT_RUNS = {"kernel": 4, "softrdma": 2, "floor": 1}
# Even 4 runs sometimes all draw the kernel's slow mode (a 256 KiB round trip ~130 us against ~24-40), and a
# ratio to that flatters softrdma 3-4x. So a round's kernel figure above this many times the best one of the
# sitting for the same MTU, size and spell counts as that mode, and its ratios (softrdma's and the floor's) are
# left out (figures() counts them). The two modes are 3-4x apart; the host's drift within a spell is under 1.5x.
KERNEL_SLOW_MODE = 2.5


def kernel_round(a, raw, mtu, tag):
    """Kernel TCP's 64 KiB stream at one MTU: {'bw64k_gb_s': x}."""
    with C.kernel_tcp(a.build, mtu, os.path.join(raw, f"kernel-server-{tag}.log"), 200) as client:
        bw_path = os.path.join(raw, f"kernel-bw-{tag}.json")
        client(["--sizes", "64", "--iters", "2000", "--warmup", "200", "--stream-sizes", "65536",
                "--stream-ms", "400", "--stream-reps", "3", "--json", bw_path],
               90, os.path.join(raw, f"kernel-bw-{tag}.log"))
    with open(bw_path) as f:
        bw = C.pick(json.load(f)["bw"], 65536, "gb_s")
    if bw is None:
        raise C.MeasureError(f"no 64 KiB stream figure in {bw_path}")
    return {"bw64k_gb_s": bw}


def size_label(size):
    return f"{size // KiB} KiB" if size < MiB else f"{size // MiB} MiB"


def spell(before_ns, after_ns):
    """The spell both probes around a run fall in (SPELL_BANDS_NS), else None (it changed, or a probe failed)."""
    if before_ns is None or after_ns is None:
        return None
    band = [next(name for name, top in SPELL_BANDS_NS if ns < top) for ns in (before_ns, after_ns)]
    return band[0] if band[0] == band[1] else None


def probe(exe, raw, name):
    """The cache line round trip between cores 0 and 1 now (rdma_perf --core-rtt), or None if it failed."""
    path = os.path.join(raw, f"probe-{name}.json")
    try:
        C.run([exe, "--core-rtt", "--json", path], 20, os.path.join(raw, f"probe-{name}.log"))
        with open(path) as f:
            v = json.load(f)["core_rtt_ns"]
        return float(v) if isinstance(v, (int, float)) else None
    except (C.MeasureError, OSError, ValueError, KeyError):
        return None


def rtt_round(a, raw, mtu, tag, kernel_first):
    """Half round trips at one MTU, size by size, kernel TCP busy-polling and softrdma's SEND ping-pong back to
    back, each system RTT_RUNS[system] times between two spell probes: {'sizes': {bytes: {'kernel_us' (the lowest),
    'kernel_runs_us', 'kernel_spell', 'softrdma_us', 'softrdma_runs_us', 'softrdma_spell', 'probes_ns', at MTU
    1500 'floor_us', 'floor_spell'}}, 'errors': [..]} (64 B: softrdma only, for its absolute target)."""
    exe = C.find_rdma_perf(a)
    out = {"sizes": {}, "errors": []}
    with C.kernel_tcp(a.build, mtu, os.path.join(raw, f"kernel-server-rtt-{tag}.log"), 400) as client:
        def kernel(size, k):
            path = os.path.join(raw, f"kernel-spin-{size}-{tag}-{k}.json")
            client(["--spin", "--sizes", str(size), "--stream-sizes", "", "--iters", "2000", "--warmup", "200",
                    "--json", path], 90, os.path.join(raw, f"kernel-spin-{size}-{tag}-{k}.log"))
            with open(path) as f:
                return {e["bytes"]: e["half_rtt_median_us"] for e in json.load(f)["lat"]}[size]

        def softrdma(size, k):
            path = os.path.join(raw, f"softrdma-lat-{size}-{tag}-{k}.json")
            C.run([exe, "--test", "send", "--lat", "-s", str(size), "--mtu", str(mtu), "--json", path,
                   "--timeout", "10", "--deadline", "60"], 75, os.path.join(raw, f"softrdma-lat-{size}-{tag}-{k}.log"))
            return C.parse_rdma_perf(path)[2][size]["t_typical_us"]

        def floor(size, k):
            log = os.path.join(raw, f"floor-{size}-{tag}-{k}.log")
            C.run([os.path.join(a.build, "bench/copy_alias"), "--size", str(size)] + FLOOR_ARGS, 60, log)
            return copy_alias_half_rtt(log)

        for size in (64,) + RTT_SIZES:
            # (the order alternates between rounds, so neither system always runs first after a change)
            parts = [("softrdma", softrdma)] if size == 64 else \
                [("kernel", kernel), ("softrdma", softrdma)][::1 if kernel_first else -1]
            if mtu == 1500 and size != 64:
                parts.append(("floor", floor))
            entry = {"probes_ns": [probe(exe, raw, f"{size}-{tag}-0")]}
            for i, (part, fn) in enumerate(parts):
                # Each system RTT_RUNS times (a fresh connection each), the lowest median kept: kernel TCP's
                # connections are bimodal at some sizes (256 KiB busy-polling: ~37 or ~130 us per connection, at
                # random), and the target is to beat it at its best.
                got = []
                for k in range(RTT_RUNS[part]):
                    try:
                        got.append(fn(size, k))
                    except (C.MeasureError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
                        out["errors"].append(f"{part} half round trip {size} B: {type(e).__name__}: {e}")
                ok = bool(got)
                if ok:
                    entry[f"{part}_us"] = min(got)
                    entry[f"{part}_runs_us"] = got
                entry["probes_ns"].append(probe(exe, raw, f"{size}-{tag}-{i + 1}"))
                entry[f"{part}_spell"] = spell(entry["probes_ns"][i], entry["probes_ns"][i + 1]) if ok else None
            out["sizes"][size] = entry
    return out


def copy_alias_half_rtt(log):
    """The lowest half round trip (us) of the runs bench/copy_alias printed into `log`."""
    with open(log) as f:
        got = [float(w[2]) for w in (line.split() for line in f) if len(w) == 3 and w[0] in ("memcpy", "copy_out")]
    if not got:
        raise C.MeasureError(f"no copy_alias figures in {log}")
    return min(got)


def softrdma_round(a, raw, mtu, tag):
    """rdma_perf's streams at one MTU: {'bw': {'write': {bytes: GB/s}, ...}, 'bw_spell': {'write': {bytes:
    a spell of SPELLS or None}, ...}, 'crc64k', 'rx_thread64k', 'msg_rate_mpps' (MTU 1500)}."""
    exe = C.find_rdma_perf(a)
    plan = []
    for op in OPS:
        for size in (64 * KiB,) + LARGE:
            plan.append((f"{op}-{size}", ["--test", op, "--bw", "-s", str(size)]))
    plan.append(("write-crc", ["--test", "write", "--bw", "-s", "65536", "--crc"]))
    plan.append(("write-rx-thread", ["--test", "write", "--bw", "-s", "65536", "--threading", "rx-thread"]))
    if mtu == 1500:
        plan.append(("msg-rate", ["--test", "send", "--bw", "-s", "64", "-n", "1000000"]))
    out = {"bw": {op: {} for op in OPS}, "errors": []}
    if mtu == 1500:  # the copies alone, for the same round: what the caches allow 8 MiB against 64 KiB
        exe_c = os.path.join(a.build, "bench/copy_ceiling")
        path = os.path.join(raw, f"copy-ceiling-{tag}.json")
        try:
            if not os.access(exe_c, os.X_OK):
                raise C.MeasureError(f"{exe_c} is not built")
            C.run([exe_c, "--sizes", "65536,8388608", "--ms", "200", "--reps", "1", "--json", path], 60,
                  os.path.join(raw, f"copy-ceiling-{tag}.log"))
            with open(path) as f:
                out["copy_ceiling"] = {r["bytes"]: r for r in json.load(f)["results"]}
        except (C.MeasureError, OSError, ValueError, KeyError) as e:
            out["errors"].append(f"copy_ceiling: {e}")
    # Each run between two spell probes (one probe between two runs serves both): a large message's ratio to
    # 64 KiB is kept per spell, as the round trips' (a fast spell's caches fall at 4-8 MiB, a slow one's not).
    before = probe(exe, raw, f"bw-{tag}-0")
    out["bw_spell"] = {op: {} for op in OPS}
    for i, (name, args) in enumerate(plan):  # a run that fails is reported and leaves its figures out
        path = os.path.join(raw, f"softrdma-{name}-{tag}.json")
        try:
            C.run([exe] + args + ["--mtu", str(mtu), "--json", path, "--timeout", "10", "--deadline", "120"],
                  135, os.path.join(raw, f"softrdma-{name}-{tag}.log"))
            _, kind, by_size, _ = C.parse_rdma_perf(path)
        except C.MeasureError as e:
            out["errors"].append(f"{name}: {e}")
            before = probe(exe, raw, f"bw-{tag}-{i + 1}")
            continue
        after = probe(exe, raw, f"bw-{tag}-{i + 1}")
        run_spell, before = spell(before, after), after
        if name == "msg-rate":
            out["msg_rate_mpps"] = by_size[64]["msg_rate_mpps"]
        else:
            size = max(by_size)
            gb = C.mib_s_to_gb_s(by_size[size]["bw_avg_mib_s"])
            if name == "write-crc":
                out["crc64k"] = gb
            elif name == "write-rx-thread":
                out["rx_thread64k"] = gb
            else:
                out["bw"][name.split("-")[0]][size] = gb
                out["bw_spell"][name.split("-")[0]][size] = run_spell
    return out


# ---- verdicts -------------------------------------------------------------------------------------------

def per_round(rounds, fn):
    """fn(round) for every round where it can be computed (None where not)."""
    vals = []
    for r in rounds:
        try:
            v = fn(r)
        except (KeyError, TypeError, ZeroDivisionError, statistics.StatisticsError):
            v = None
        if v is not None:
            vals.append(v)
    return vals


def summary(vals):
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)} if vals else None


def kernel_slow_mode(rounds, r, m, size):
    """True when round r's kernel half round trip at `size` (MTU m) is above KERNEL_SLOW_MODE x the best of the
    sitting in the same spell: kernel TCP's slow mode in all its runs (see KERNEL_SLOW_MODE)."""
    def kernel(x):
        """(spell, us) of round x's kernel run at this size, or None when it has no spell or no figure."""
        e = x.get(m, {}).get("rtt", {}).get("sizes", {}).get(size, {})
        return (e["kernel_spell"], e["kernel_us"]) if e.get("kernel_spell") and "kernel_us" in e else None

    mine = kernel(r)
    if mine is None:
        return False
    best = min(k[1] for k in map(kernel, rounds) if k is not None and k[0] == mine[0])
    return mine[1] > KERNEL_SLOW_MODE * best


def large_ratio(soft, op, size, sp):
    """softrdma's `op` stream at `size` / at 64 KiB in one round, when both runs were in spell `sp` (else None)."""
    sp_of = soft["bw_spell"][op]
    if sp_of[size] != sp or sp_of[65536] != sp:
        return None
    return soft["bw"][op][size] / soft["bw"][op][65536]


def verdicts(rounds, mtus):
    """rounds: [{mtu: {'kernel': kernel_round(), 'softrdma': softrdma_round(), 'rtt': rtt_round()}}]. Returns rows
    (target, what, summary of the per-round values, threshold, 'min'|'max', met or None when not measured)."""
    rows = []

    def row(target, what, vals, threshold, kind):
        s = summary(vals)
        met = None if s is None else (s["median"] >= threshold if kind == "min" else s["median"] <= threshold)
        rows.append((target, what, s, threshold, kind, met))

    def spell_rows(target, what, fn, threshold, kind):
        """A row per spell with measurements (`fn(round, spell)`), or one 'not measured' row when none has."""
        measured = [(sp, vals) for sp in SPELLS if (vals := per_round(rounds, lambda r: fn(r, sp)))]
        for sp, vals in measured:
            row(target, f"{what}, {sp} spell", vals, threshold, kind)
        if not measured:
            row(target, what, [], threshold, kind)

    for m in mtus:
        row("64 KiB WRITE vs kernel TCP", f"MTU {m}: softrdma / kernel 64 KiB stream",
            per_round(rounds, lambda r: r[m]["softrdma"]["bw"]["write"][65536] / r[m]["kernel"]["bw64k_gb_s"]),
            BW_VS_KERNEL[m], "min")
        row("64 KiB WRITE with CRC vs kernel TCP", f"MTU {m}: softrdma (CRC on) / kernel",
            per_round(rounds, lambda r: r[m]["softrdma"]["crc64k"] / r[m]["kernel"]["bw64k_gb_s"]),
            CRC_VS_KERNEL, "min")
    for m in mtus:
        for op in OPS:
            for size in LARGE:
                spell_rows("1-8 MiB at 90 % of 64 KiB", f"MTU {m}: {op.upper()} {size // MiB} MiB / 64 KiB",
                           lambda r, sp: large_ratio(r[m]["softrdma"], op, size, sp), LARGE_VS_64K, "min")
    def paired(r, m, size, sp):
        """softrdma / kernel half round trip at `size` when both ran in spell `sp` (else None)."""
        e = r[m]["rtt"]["sizes"][size]
        if e["kernel_spell"] != sp or e["softrdma_spell"] != sp or kernel_slow_mode(rounds, r, m, size):
            return None
        return e["softrdma_us"] / e["kernel_us"]

    for m in mtus:
        for size in RTT_SIZES:
            spell_rows("half round trip at most half of kernel TCP busy-polling", f"MTU {m}: {size_label(size)}",
                       lambda r, sp: paired(r, m, size, sp), RTT_VS_KERNEL, "max")
    if 1500 in mtus:
        spell_rows("64 B SEND half round trip at most 1.0 us", "MTU 1500: us",
                   lambda r, sp: r[1500]["rtt"]["sizes"][64]["softrdma_us"]
                   if r[1500]["rtt"]["sizes"][64]["softrdma_spell"] == sp else None, SMALL_RTT_US, "max")
    return rows


def figures(rounds, mtus):
    """Figures reported without a target: (what, summary)."""
    out = []
    for m in mtus:
        out.append((f"MTU {m}: kernel TCP 64 KiB stream, GB/s",
                    summary(per_round(rounds, lambda r: r[m]["kernel"]["bw64k_gb_s"]))))
        for op in OPS:
            out.append((f"MTU {m}: softrdma 64 KiB {op.upper()}, GB/s",
                        summary(per_round(rounds, lambda r: r[m]["softrdma"]["bw"][op][65536]))))
        out.append((f"MTU {m}: softrdma 64 KiB WRITE, RX-thread mode, GB/s",
                    summary(per_round(rounds, lambda r: r[m]["softrdma"]["rx_thread64k"]))))
        out.append((f"MTU {m}: RX-thread mode / kernel TCP, 64 KiB",
                    summary(per_round(rounds, lambda r: r[m]["softrdma"]["rx_thread64k"] /
                                      r[m]["kernel"]["bw64k_gb_s"]))))
        out.append((f"MTU {m}: core cache line round trip, ns (every probe of the round trip runs)",
                    summary([x for r in rounds for e in r.get(m, {}).get("rtt", {}).get("sizes", {}).values()
                             for x in e["probes_ns"] if x is not None])))
        for size in RTT_SIZES if m == 1500 else ():
            for sp in SPELLS:
                def floor_ratio(r, m=m, size=size, sp=sp):
                    e = r[m]["rtt"]["sizes"][size]
                    if e["floor_spell"] != sp or e["kernel_spell"] != sp or kernel_slow_mode(rounds, r, m, size):
                        return None
                    return e["floor_us"] / e["kernel_us"]
                vals = per_round(rounds, floor_ratio)
                if vals:
                    out.append((f"MTU {m}: two-copy floor / kernel TCP, {size_label(size)} half round trip, {sp} "
                                "spell (bench/copy_alias --publish)", summary(vals)))
        out.append((f"MTU {m}: half round trip sizes left out for kernel TCP's slow mode (above {KERNEL_SLOW_MODE}x "
                    "its best in the sitting, same spell), per round",
                    summary(per_round(rounds, lambda r: sum(
                        1 for size in r[m]["rtt"]["sizes"]
                        if size in RTT_SIZES and kernel_slow_mode(rounds, r, m, size))))))
        out.append((f"MTU {m}: half round trip sizes left unpaired (spells differed or changed), per round",
                    summary(per_round(rounds, lambda r: sum(
                        1 for size, e in r[m]["rtt"]["sizes"].items() if size in RTT_SIZES and
                        (e["kernel_spell"] is None or e["kernel_spell"] != e["softrdma_spell"]))))))
    if 1500 in mtus:
        for kind, words in (("two_copies_gb_s", "two copies on two cores"), ("one_copy_gb_s", "one copy")):
            out.append((f"copy ceiling, {words}: 8 MiB / 64 KiB (bench/copy_ceiling)",
                        summary(per_round(rounds, lambda r: r[1500]["softrdma"]["copy_ceiling"][8 * MiB][kind] /
                                          r[1500]["softrdma"]["copy_ceiling"][65536][kind]))))
        out.append(("MTU 1500: 64 B SEND message rate, M msg/s",
                    summary(per_round(rounds, lambda r: r[1500]["softrdma"]["msg_rate_mpps"]))))
    return out


def fmt_summary(s, digits=2):
    if s is None:
        return "not measured"
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])} ({f.format(s['min'])}-{f.format(s['max'])}, {s['n']})"


def render(rows, figs, meta):
    md = [f"Rounds: {meta['rounds']}, {meta['when']}, commit {meta['commit']}; each value the median over the "
          "rounds (range, rounds), each ratio taken within a round.", "",
          "| target | measured | median (range, n) | target | met |", "| --- | --- | --- | --- | --- |"]
    for target, what, s, thr, kind, met in rows:
        md.append(f"| {target} | {what} | {fmt_summary(s)} | {'>=' if kind == 'min' else '<='} {thr} | "
                  f"{'-' if met is None else ('yes' if met else '**no**')} |")
    md += ["", "| figure | median (range, n) |", "| --- | --- |"]
    md += [f"| {what} | {fmt_summary(s)} |" for what, s in figs]
    met = [r for r in rows if r[5]]
    missed = [r for r in rows if r[5] is False]
    md += ["", f"{len(met)} of {len(rows)} target rows met, {len(missed)} missed, "
           f"{len(rows) - len(met) - len(missed)} not measured."]
    return "\n".join(md)


# ---- main -------------------------------------------------------------------------------------------------

def main(argv=None):
    top = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    p = argparse.ArgumentParser(prog="scripts/compare --targets", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    p.add_argument("--mtu", type=int, action="append", choices=[1500, 9000], help="only this MTU (repeatable)")
    p.add_argument("--out", help="output directory (default results/targets-<date>-<time>/)")
    p.add_argument("--build", default=os.environ.get("SOFTRDMA_BUILD", "build"), help="meson build directory")
    p.add_argument("--rdma-perf", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.source = top
    a.build = os.path.realpath(os.path.join(top, a.build) if not os.path.isabs(a.build) else a.build)
    mtus = a.mtu or [1500, 9000]
    if os.geteuid() != 0:
        print("scripts/compare --targets: kernel TCP runs in network namespaces, which needs root", file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.timezone.utc)
    out = os.path.realpath(a.out or os.path.join(top, "results", "targets-" + now.strftime("%Y%m%d-%H%M%S")))
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, C.on_signal)
    meta = {"when": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": C.source_revision(top), "rounds": a.rounds,
            "mtus": mtus, "load_start": os.getloadavg()[0]}
    rounds, errors = [], []
    try:
        C.remove_stale_namespaces()
        for i in range(a.rounds):
            t0 = time.monotonic()
            rnd = {}
            for m in mtus:
                tag = f"r{i + 1}-mtu{m}"
                rnd[m] = {}
                for part, fn in (("kernel", kernel_round), ("softrdma", softrdma_round),
                                 ("rtt", lambda a_, raw_, m_, tag_: rtt_round(a_, raw_, m_, tag_, i % 2 == 0))):
                    try:
                        rnd[m][part] = fn(a, raw, m, tag)
                        errors += [f"round {i + 1}, MTU {m}, {part}, {e}" for e in rnd[m][part].get("errors", [])]
                    except (C.MeasureError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
                        # (bad JSON, a program missing or a time limit: the part is left out of this round)
                        errors.append(f"round {i + 1}, MTU {m}, {part}: {type(e).__name__}: {e}")
            rounds.append(rnd)
            rtts = [x for m in mtus for e in rnd[m].get("rtt", {}).get("sizes", {}).values()
                    for x in e["probes_ns"] if x is not None]
            print(f"targets: round {i + 1}/{a.rounds} done in {time.monotonic() - t0:.0f} s"
                  + (f", core round trip {min(rtts):.0f}-{max(rtts):.0f} ns" if rtts else ""),
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt as e:
        print(f"targets: interrupted ({e or 'Ctrl-C'}); namespaces and processes removed", file=sys.stderr)
        return 130
    meta["load_end"] = os.getloadavg()[0]
    rows, figs = verdicts(rounds, mtus), figures(rounds, mtus)
    text = render(rows, figs, meta)
    if errors:
        text += "\n\nNot measured:\n" + "\n".join("- " + e for e in errors)
    print(text)
    with open(os.path.join(out, "targets.md"), "w") as f:
        f.write(f"# Issue 15's targets, {meta['when']}\n\n{text}\n")
    with open(os.path.join(out, "targets.json"), "w") as f:
        json.dump({"meta": meta, "errors": errors,
                   "rows": [{"target": t, "what": w, "summary": s, "threshold": thr, "kind": k, "met": met}
                            for t, w, s, thr, k, met in rows],
                   "figures": [{"what": w, "summary": s} for w, s in figs], "rounds": rounds}, f, indent=1)
    print(f"targets: wrote {out}/targets.md, targets.json", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
