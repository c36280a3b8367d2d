#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The 'compare' suite: scripts/compare's parsing and table on hand-made rdma_perf JSON (the sample_*.json
files here are test inputs, not results), then a real `scripts/compare --quick` run whose JSON must hold
sane figures, then an interrupted run that must leave no network namespace behind.

    check_compare.py SOURCE_DIR BUILD_DIR

Exit 0 = pass, 1 = fail, 77 = skipped (not root: the kernel TCP part needs network namespaces).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

src, build = sys.argv[1], sys.argv[2]
here = os.path.join(src, "tests", "compare")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(src, "bench", "compare"))
import compare  # noqa: E402  (bench/compare/compare.py)

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


# ---- 1. rdma_perf JSON parsing and the table, on sample files -----------------------------------------
test, kind, lat, rtt = compare.parse_rdma_perf(os.path.join(here, "sample_rdma_perf_lat.json"))
check((test, kind, sorted(lat), rtt) == ("send", "lat", [64, 4096], None),
      "sample lat file: test, kind and sizes read; no core calibration in it (an older rdma_perf's file)")
check(lat[64]["t_typical_us"] == 5.25 and lat[64]["p99_us"] == 9.5, "sample lat file: typical and p99 read")
test, kind, bw, rtt = compare.parse_rdma_perf(os.path.join(here, "sample_rdma_perf_bw.json"))
check((test, kind, sorted(bw), rtt) == ("write", "bw", [4096, 65536], 612.5),
      "sample bw file: test, kind, sizes and the core calibration read")

bad = os.path.join(build, "compare-test-bad.json")
for text in ('{"tool":"other","kind":"lat","results":[]}', '{"tool":"rdma_perf","kind":"lat","results":[{"bytes":64}]}',
             "not json"):
    with open(bad, "w") as f:
        f.write(text)
    try:
        compare.parse_rdma_perf(bad)
        check(False, f"bad rdma_perf JSON rejected: {text}")
    except compare.MeasureError:
        check(True, f"bad rdma_perf JSON rejected: {text[:40]}")
os.remove(bad)

soft = {"runs": {"send-lat": {"results": lat}, "write-bw": {"results": bw},
                 "read-lat": {"results": {64: dict(lat[64], t_typical_us=11.0)}},
                 "send-bw": {"results": {64: {"bytes": 64, "bw_avg_mib_s": 50.0, "msg_rate_mpps": 0.5,
                                              "bw_peak_mib_s": 60.0}}}}}
floor = {"lat": [{"bytes": 64, "half_rtt_median_us": 1.05, "half_rtt_p99_us": 2.0, "rtt_median_us": 2.1, "mtu": 1500}],
         "bw": [{"bytes": 1500, "gb_s": 1.6, "mpps": 1.0, "mtu": 1500},
                {"bytes": 64, "gb_s": 0.3, "mpps": 5.0, "mtu": 1500}]}
kernel = {"lat": [{"bytes": 64, "half_rtt_median_us": 21.0, "half_rtt_p99_us": 40.0, "rtt_median_us": 42.0}],
          "lat_spin": [{"bytes": 64, "half_rtt_median_us": 6.5, "half_rtt_p99_us": 9.0, "rtt_median_us": 13.0}],
          "bw": [{"bytes": 65536, "gb_s": 0.4, "mmsg_s": 0.006}, {"bytes": 64, "gb_s": 0.016, "mmsg_s": 0.25}]}
rows = compare.build_rows(floor, kernel, soft, 1500)
by = {r[0]: r[1:] for r in rows}
r = by["half_rtt_64"]
check(r[3:6] == (1.05, 21.0, 5.25) and r[6] is None, "64 B half-RTT row takes floor/kernel medians and rdma_perf t_typical")
check(abs(compare.ratio(r[5], r[3]) - 5.0) < 1e-9 and compare.versus(r[5], r[4], r[2]) == "4.00x better",
      "latency ratios: softrdma/floor 5.00, 4.00x better than kernel TCP")
check(by["half_rtt_64_p99"][3:6] == (2.0, 40.0, 9.5), "p99 row takes the p99 figures")
check(by["half_rtt_64_kspin"][3:6] == (1.05, 6.5, 5.25), "busy-polling row takes the kernel's spinning ping-pong")
check(compare.build_rows(floor, {"lat": kernel["lat"], "bw": kernel["bw"]}, None, 1500)[1][5] is None,
      "a kernel result without the busy-polling run leaves that cell empty")
spin2 = dict(kernel, lat_spin=kernel["lat_spin"] + [{"bytes": 65536, "half_rtt_median_us": 9.0}])
soft2 = {"runs": {"send-lat": {"results": {**soft["runs"]["send-lat"]["results"],
                                            65536: {"t_typical_us": 4.5}, 4096: {"t_typical_us": 1.0}}}}}
check(compare.size_rows(spin2, soft2) == [(64, 6.5, 5.25, 5.25 / 6.5), (65536, 9.0, 4.5, 0.5)],
      "half round trip by size: the sizes both measured, kernel busy-polling against softrdma, ratio")
check(compare.size_rows(None, soft2) == [] and compare.render_sizes([]) == [],
      "no kernel run: no by-size table")
r = by["bw_64k"]
check(abs(r[5] - 0.8) < 1e-9 and r[3] == 1.6 and compare.versus(r[5], r[4], r[2]) == "2.00x better",
      "64 KiB bandwidth row: MiB/s -> GB/s (762.94 MiB/s = 0.8 GB/s), floor at 1500 B frames, 2.00x better")
r = by["read_lat_64"]
check(r[3:6] == (2.1, 42.0, 11.0), "READ row compares full round trips")
r = by["msg_rate_64"]
check(r[3:6] == (5.0, 0.25, 0.5), "message-rate row: floor Mpps, kernel M msg/s, rdma_perf msg_rate_mpps")
# Stock perftest's output (as Debian's ib_send_lat / ib_write_bw print it) and its column.
lat_out = """ #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      1000          1.18           828.82       1.33     	       1.74        	2.31   		11.10   		17.67  
"""
bw_out = """ #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      2000             927.85             762.94 		   0.012207
"""
check(compare.parse_perftest("lat", lat_out, "-") == {"bytes": 64, "t_typical_us": 1.33, "p99_us": 11.10},
      "perftest latency line: t_typical and 99 % percentile")
check(compare.parse_perftest("bw", bw_out, "-") == {"bytes": 65536, "bw_avg_mib_s": 762.94, "msg_rate_mpps": 0.012207},
      "perftest bandwidth line: BW average and message rate")
try:
    compare.parse_perftest("lat", "Couldn't connect to 198.18.0.1:18515\n", "-")
    check(False, "perftest output without results rejected")
except compare.MeasureError:
    check(True, "perftest output without results rejected")
pt = {"runs": {"send-lat": {"results": {64: compare.parse_perftest("lat", lat_out, "-")}},
               "write-bw": {"results": {65536: compare.parse_perftest("bw", bw_out, "-")}}}}
by_pt = {r[0]: r[1:] for r in compare.build_rows(floor, kernel, soft, 1500, pt)}
check(by_pt["half_rtt_64"][6] == 1.33 and by_pt["half_rtt_64_p99"][6] == 11.10 and
      abs(by_pt["bw_64k"][6] - 0.8) < 1e-4 and by_pt["read_lat_64"][6] is None,
      "perftest column: t_typical, p99, BW average in GB/s; a program not run leaves its cell empty")
check(compare.versus(2.0, 1.0, "lower") == "2.00x worse" and compare.versus(None, 1.0, "lower") == "-",
      "versus() words 'worse' and missing values")

# scripts/compare --targets: verdicts on hand-made rounds (ratios within a round, the median over rounds).
import targets  # noqa: E402  (bench/compare/targets.py)


def fake_round(write64k, write8m, kernel_bw, rtt_128k, kspin_128k, small, sp=("fast", "fast")):
    """sp: the spells the kernel's and softrdma's half round trip runs were in (this round, every size)."""
    bw = {op: {65536: 9.0, **{s: 9.0 for s in targets.LARGE}} for op in targets.OPS}
    bw["write"] = {65536: write64k, **{s: write64k for s in targets.LARGE}}
    bw["write"][8 * targets.MiB] = write8m
    sizes = {s: {"kernel_us": 4.0, "softrdma_us": 1.0, "kernel_spell": sp[0], "softrdma_spell": sp[1],
                 "probes_ns": [150, 150, 150]} for s in targets.RTT_SIZES}
    sizes[128 * 1024]["softrdma_us"] = rtt_128k
    if kspin_128k is None:
        del sizes[128 * 1024]["kernel_us"]
        sizes[128 * 1024]["kernel_spell"] = None
    else:
        sizes[128 * 1024]["kernel_us"] = kspin_128k
    sizes[64] = {"softrdma_us": small, "softrdma_spell": sp[1], "probes_ns": [150, 150]}
    return {1500: {"kernel": {"bw64k_gb_s": kernel_bw},
                   "softrdma": {"bw": bw, "bw_spell": {op: {sz: sp[1] for sz in bw[op]} for op in targets.OPS},
                                "crc64k": kernel_bw * 0.9, "rx_thread64k": 2.0,
                                "msg_rate_mpps": 6.0},
                   "rtt": {"sizes": sizes, "errors": []}}}


# Three rounds; in the second the machine was slower for both systems (1.8x at 128 KiB, within a spell: the ratio
# holds), in the third the kernel's 128 KiB ping-pong is missing (that round does not count for that row).
rounds = [fake_round(10.0, 8.0, 4.0, 5.0, 10.0, 0.9), fake_round(3.0, 2.1, 1.0, 12.0, 18.0, 1.5),
          fake_round(10.0, 9.5, 5.0, 6.0, None, 0.8)]
rows = {(r[0], r[1]): r for r in targets.verdicts(rounds, [1500])}
w = rows[("64 KiB WRITE vs kernel TCP", "MTU 1500: softrdma / kernel 64 KiB stream")]
check(w[2]["median"] == 2.5 and (w[2]["min"], w[2]["max"], w[2]["n"]) == (2.0, 3.0, 3) and w[5] is True,
      "targets: 64 KiB WRITE / kernel per round (2.5, 3.0, 2.0): median 2.5 meets >= 1.5")
c = rows[("64 KiB WRITE with CRC vs kernel TCP", "MTU 1500: softrdma (CRC on) / kernel")]
check(abs(c[2]["median"] - 0.9) < 1e-9 and c[5] is False, "targets: CRC at 0.9x kernel misses 'still ahead'")
e = rows[("1-8 MiB at 90 % of 64 KiB", "MTU 1500: WRITE 8 MiB / 64 KiB, fast spell")]
check(abs(e[2]["median"] - 0.8) < 1e-9 and e[5] is False,
      "targets: 8 MiB / 64 KiB per round (0.8, 0.7, 0.95): median 0.8 misses 0.9")
RT = "half round trip at most half of kernel TCP busy-polling"
h = rows[(RT, "MTU 1500: 128 KiB, fast spell")]
check(h[2]["n"] == 2 and h[5] is False and abs(h[2]["median"] - (0.5 + 2 / 3) / 2) < 1e-9,
      "targets: a round without the kernel's figure is left out of that row; 128 KiB at 0.58 misses <= 0.5")
check((RT, "MTU 1500: 128 KiB, slow spell") not in rows and (RT, "MTU 1500: 128 KiB, shared spell") not in rows,
      "targets: a spell no run was in gets no row")
s = rows[("64 B SEND half round trip at most 1.0 us", "MTU 1500: us, fast spell")]
check(s[2]["median"] == 0.9 and s[5] is True, "targets: 64 B half round trip median 0.9 us meets <= 1.0")
nothing = targets.verdicts([{1500: {}}], [1500])
check(all(r[5] is None for r in nothing) and (RT, "MTU 1500: 128 KiB") in {(r[0], r[1]) for r in nothing},
      "targets: a round that measured nothing gives one 'not measured' row per target, not a verdict")

# Spells: a ratio is kept only when both runs of a size were in the same spell, and each spell has its row.
check(targets.spell(140, 150) == "fast" and targets.spell(600, 620) == "slow" and targets.spell(60, 70) == "shared"
      and targets.spell(140, 620) is None and targets.spell(65, 140) is None and targets.spell(None, 150) is None,
      "targets: spell() needs both probes in one band (shared < 100 ns, fast < 350, slow)")
mixed = [fake_round(10.0, 8.0, 4.0, 2.0, 10.0, 0.9, ("fast", "fast")),      # 128 KiB 0.2, fast
         fake_round(10.0, 8.0, 4.0, 8.0, 10.0, 1.7, ("slow", "slow")),      # 128 KiB 0.8, slow
         fake_round(10.0, 8.0, 4.0, 3.0, 10.0, 0.9, ("fast", "slow")),      # left out: fast kernel, slow softrdma
         fake_round(10.0, 8.0, 4.0, 7.0, 10.0, 1.5, ("slow", None))]        # left out: softrdma's spell changed
mrows = {(r[0], r[1]): r for r in targets.verdicts(mixed, [1500])}
f, sl = mrows[(RT, "MTU 1500: 128 KiB, fast spell")], mrows[(RT, "MTU 1500: 128 KiB, slow spell")]
check(f[2]["n"] == 1 and abs(f[2]["median"] - 0.2) < 1e-9 and f[5] is True and
      sl[2]["n"] == 1 and abs(sl[2]["median"] - 0.8) < 1e-9 and sl[5] is False,
      "targets: fast and slow pairs each in their own row; pairs across spells or across a change left out")
s_slow = mrows[("64 B SEND half round trip at most 1.0 us", "MTU 1500: us, slow spell")]
check(s_slow[2]["n"] == 2 and abs(s_slow[2]["median"] - 1.3) < 1e-9 and s_slow[5] is False,
      "targets: 64 B (an absolute target) judged per softrdma's own spell: slow runs 1.7 and 0.9 us, the run "
      "whose spell changed left out")
L = "1-8 MiB at 90 % of 64 KiB"
lf, ls = mrows[(L, "MTU 1500: WRITE 8 MiB / 64 KiB, fast spell")], mrows[(L, "MTU 1500: WRITE 8 MiB / 64 KiB, slow spell")]
check(lf[2]["n"] == 1 and ls[2]["n"] == 2 and abs(lf[2]["median"] - 0.8) < 1e-9,
      "targets: 8 MiB / 64 KiB kept per softrdma's spell (fast 1 round, slow 2; the round whose spell changed out)")
shifted = fake_round(10.0, 5.0, 4.0, 5.0, 10.0, 0.9)
shifted[1500]["softrdma"]["bw_spell"]["write"][8 * targets.MiB] = "slow"  # the 64 KiB run fast, the 8 MiB slow
srows = {(r[0], r[1]): r for r in targets.verdicts([shifted], [1500])}
check(srows[(L, "MTU 1500: WRITE 8 MiB / 64 KiB")][5] is None and
      (L, "MTU 1500: WRITE 8 MiB / 64 KiB, fast spell") not in srows and
      srows[(L, "MTU 1500: WRITE 4 MiB / 64 KiB, fast spell")][5] is True,
      "targets: an 8 MiB run in another spell than its 64 KiB run gives no ratio (0.5 would have missed)")
# Kernel TCP's slow mode: a round whose kernel figure is above KERNEL_SLOW_MODE x the sitting's best for that
# MTU, size and spell is left out of the ratio (0.2 here would have met), and counted; the same size in another
# spell is judged against its own spell's best (slow 30 us against fast 10: not a slow mode).
moded = [fake_round(10.0, 8.0, 4.0, 6.0, 10.0, 0.9), fake_round(10.0, 8.0, 4.0, 8.0, 40.0, 0.9),
         fake_round(10.0, 8.0, 4.0, 6.6, 11.0, 0.9), fake_round(10.0, 8.0, 4.0, 15.0, 30.0, 1.5, ("slow", "slow"))]
dmrows = {(r[0], r[1]): r for r in targets.verdicts(moded, [1500])}
mf, ms = dmrows[(RT, "MTU 1500: 128 KiB, fast spell")], dmrows[(RT, "MTU 1500: 128 KiB, slow spell")]
check(mf[2]["n"] == 2 and abs(mf[2]["max"] - 0.6) < 1e-9 and mf[5] is False and
      ms[2]["n"] == 1 and abs(ms[2]["median"] - 0.5) < 1e-9,
      "targets: a round where kernel TCP drew its slow mode (40 us against 10-11) is left out of the ratio; "
      "another spell has its own best")
left = dict(targets.figures(moded, [1500]))[
    f"MTU 1500: half round trip sizes left out for kernel TCP's slow mode (above {targets.KERNEL_SLOW_MODE}x its "
    "best in the sitting, same spell), per round"]
check(left["max"] == 1 and left["n"] == 4 and left["median"] == 0,
      "targets: the sizes left out for the kernel's slow mode are counted per round")
unpaired = dict(targets.figures(mixed, [1500]))[
    "MTU 1500: half round trip sizes left unpaired (spells differed or changed), per round"]
check(unpaired["median"] == (0 + len(targets.RTT_SIZES)) / 2 and unpaired["max"] == len(targets.RTT_SIZES),
      "targets: the sizes left unpaired are counted per round")

# The two-copy floor: a figure per size and spell, kept only when the floor's run and the kernel's were in one
# spell; rounds without it (the hand-made ones above) give no figure.
floored = [fake_round(10.0, 8.0, 4.0, 5.0, 10.0, 0.9, ("slow", "slow")) for _ in range(3)]
for r, (fus, fsp) in zip(floored, ((2.0, "slow"), (3.0, "slow"), (1.0, "fast"))):
    r[1500]["rtt"]["sizes"][32 * 1024].update(floor_us=fus, floor_spell=fsp)
figs = dict(targets.figures(floored, [1500]))
FL = "MTU 1500: two-copy floor / kernel TCP, {} half round trip, {} spell (bench/copy_alias --publish)"
fl = figs.get(FL.format("32 KiB", "slow"))
check(fl is not None and fl["n"] == 2 and abs(fl["median"] - 0.625) < 1e-9,
      f"targets: floor / kernel per round in its spell (2/4, 3/4 slow; the fast floor against a slow kernel out): {fl}")
check(FL.format("32 KiB", "fast") not in figs and FL.format("64 KiB", "slow") not in figs
      and not any("floor" in k for k in dict(targets.figures(mixed, [1500]))),
      "targets: no floor figure across spells, for a size without one, or for rounds without it")
with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
    f.write("$ copy_alias --size 32768\n# 32768 bytes in 8936-byte pieces\nmode copy_us_p50 half_rtt_us_p50\n"
            "memcpy 1.30 2.40\ncopy_out 1.25 2.25\n")
check(targets.copy_alias_half_rtt(f.name) == 2.25, "targets: copy_alias's lowest half round trip read from its log")
os.unlink(f.name)

# ---- 2. the real thing, quick --------------------------------------------------------------------------
if os.geteuid() != 0:
    print("SKIP: the kernel TCP part needs root (network namespaces); run the suite as root")
    sys.exit(1 if failures else 77)

out = os.path.join(build, "compare-test-out")
shutil.rmtree(out, ignore_errors=True)
t0 = time.monotonic()
p = subprocess.run([os.path.join(src, "scripts", "compare"), "--quick", "--no-build", "--build", build, "--out", out],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=260)
print(p.stdout)
check(p.returncode == 0, f"scripts/compare --quick exits 0 (took {time.monotonic() - t0:.1f} s)")
try:
    with open(os.path.join(out, "compare.json")) as f:
        doc = json.load(f)
except (OSError, ValueError) as e:
    check(False, f"compare.json readable: {e}")
    sys.exit(1)
st = doc["status"]
check(st.get("floor", "").startswith("ok") and st.get("kernel") == "ok", f"floor and kernel TCP measured: {st}")
have_rdma_perf = os.access(os.path.join(build, "bench", "rdma_perf"), os.X_OK)
if have_rdma_perf:
    check(st.get("softrdma") == "ok", f"softrdma measured with {build}/bench/rdma_perf: {st.get('softrdma')}")
else:
    check(st.get("softrdma", "").startswith("not measured"), "without rdma_perf the softrdma column says so")
    check("not measured" in p.stdout, "the printed table notes say softrdma was not measured")
rows = {r["key"]: r for r in doc["rows"]}
for label, r in rows.items():
    for col in ("floor", "kernel_tcp") + (("softrdma",) if st.get("softrdma") == "ok" else ()):
        v = r[col]
        check(isinstance(v, (int, float)) and v > 0 and v < 1e6, f"{label}: {col} = {v} is a positive figure")
if shutil.which("ib_send_lat") and os.access(os.path.join(build, "verbs", "dropin", "softrdma-run"), os.X_OK):
    check(st.get("perftest") == "ok", f"stock perftest measured through the drop-in: {st.get('perftest')}")
    for key in ("half_rtt_64", "read_lat_64", "bw_64k", "msg_rate_64"):
        v = rows[key]["stock_perftest_on_softrdma"]
        check(isinstance(v, (int, float)) and 0 < v < 1e6, f"{key}: stock perftest figure {v}")
lat, rd = rows["half_rtt_64"], rows["read_lat_64"]
check(lat["floor"] < lat["kernel_tcp"], f"floor 64 B half-RTT {lat['floor']} us < kernel TCP {lat['kernel_tcp']} us")
check(rd["floor"] < rd["kernel_tcp"], f"floor 64 B round trip {rd['floor']} us < kernel TCP {rd['kernel_tcp']} us")
check(lat["floor"] < 100, f"floor 64 B half-RTT {lat['floor']} us below 100 us (memif, no stack)")
if st.get("softrdma") == "ok":
    load = max(doc["meta"]["load_start"], doc["meta"]["load_end"])
    # A READ is answered inside the responder's poll loop, as the floor's reflector answers: the two round trips
    # differ by the stack's work only, which a loaded machine's noise exceeds (CI, load 5.6: READ 1.342 us,
    # floor 1.41 us). Compared on a quiet machine only, the READ with 10 % slack.
    if load < 2.5:
        check(lat["softrdma"] > lat["floor"], f"softrdma half-RTT {lat['softrdma']} us above the floor {lat['floor']} us")
        check(rd["softrdma"] > 0.9 * rd["floor"],
              f"softrdma READ {rd['softrdma']} us not below the floor round trip {rd['floor']} us (-10 % noise)")
    else:
        print(f"note  softrdma latency vs floor not compared: load average {load:.1f} on this machine")
    bwr = rows["bw_64k"]
    # Not a ceiling: the floor moves 1500 B frames through DPDK's memif driver, softrdma 64 KiB frames (large
    # segments) through its own memif paths, so softrdma may pass it: 0.94-1.56x the floor in four quick runs
    # (2026-11-30; the floor's short stream swings with the host's spells). Three times the floor still
    # catches a unit slip (MiB/s read as GB/s, bytes as bits).
    if load < 2.5:
        check(bwr["softrdma"] < 3 * bwr["floor"],
              f"softrdma 64 KiB {bwr['softrdma']} GB/s below 3x the 1500 B frame floor {bwr['floor']} GB/s")
    else:  # busy pollers descheduled by other work make short stream figures swing several-fold
        print(f"note  softrdma bandwidth vs floor not compared: load average {load:.1f} on this machine")
    check(abs(bwr["softrdma_over_floor"] - bwr["softrdma"] / bwr["floor"]) < 1e-9, "ratio column = softrdma / floor")
with open(os.path.join(out, "compare.png"), "rb") as f:
    check(f.read(8) == b"\x89PNG\r\n\x1a\n", "compare.png is a PNG")
with open(os.path.join(out, "compare.md")) as f:
    md = f.read()
check("| raw memif floor | kernel TCP (veth) | softrdma |" in md and "64 B half round trip" in md,
      "compare.md has the table")
if st.get("softrdma") == "ok":
    by_size = {e["bytes"]: e for e in doc["half_rtt_by_size"]}
    check(64 in by_size and by_size[64]["softrdma_us"] == lat["softrdma"] and
          by_size[64]["kernel_tcp_spin_us"] == rows["half_rtt_64_kspin"]["kernel_tcp"],
          f"the by-size table's 64 B row matches the main table: {by_size.get(64)}")
    check("| half round trip, median | kernel TCP busy-polling (us) |" in md, "compare.md has the by-size table")
    rtts = doc["meta"].get("core_rtt_ns") or []
    runs = [f for f in os.listdir(os.path.join(out, "raw")) if f.startswith("softrdma-") and f.endswith(".json")]
    check(len(rtts) == len(runs) > 0 and all(1 < x < 1e6 for x in rtts),
          f"every rdma_perf run's core calibration reached compare.json: {rtts}")
    check(any(l.startswith("- cache line round trip between the two cores") for l in md.splitlines()),
          "compare.md's notes give the core calibration")

# The spell probe --targets brackets every half round trip run with (rdma_perf --core-rtt).
perf_exe = os.path.join(build, "bench", "rdma_perf")
ns = targets.probe(perf_exe, out, "check")
check(ns is not None and 20 < ns < 100000, f"targets.probe: rdma_perf --core-rtt gives a cache line round trip ({ns} ns)")
check(targets.probe(os.path.join(out, "no-such-rdma_perf"), out, "missing") is None,
      "targets.probe: a probe that cannot run gives None (its run is then left unpaired), not an exception")
r = subprocess.run([perf_exe, "--core-rtt", "--cpu", "0,0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True, timeout=30)
check(r.returncode != 0 and "could not be measured" in r.stderr,
      f"rdma_perf --core-rtt on one core refuses with a reason (exit {r.returncode}: {r.stderr.strip()})")


def our_namespaces(pid):
    r = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True, timeout=10)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.startswith(compare.NS_PREFIX)]
    return [n for n in names if n.endswith(str(pid))]


# ---- 3. an interrupted run leaves nothing behind ------------------------------------------------------
out2 = out + "-interrupted"
py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else "python3"
proc = subprocess.Popen([py, os.path.join(src, "bench", "compare", "compare.py"), "--quick", "--build", build,
                         "--out", out2, "--skip", "floor", "--skip", "softrdma"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
seen = False
deadline = time.monotonic() + 20
while time.monotonic() < deadline and proc.poll() is None:  # wait for its namespaces, then interrupt
    if our_namespaces(proc.pid):
        seen = True
        time.sleep(0.3)  # inside the measurement
        proc.send_signal(signal.SIGINT)
        break
    time.sleep(0.02)
try:
    text, _ = proc.communicate(timeout=30)
except subprocess.TimeoutExpired:
    proc.kill()
    text, _ = proc.communicate()
check(seen, "the interrupted run had created its namespaces")
check(proc.returncode == 130, f"an interrupted run exits 130 (got {proc.returncode})")
check(not our_namespaces(proc.pid), "an interrupted run removes its namespaces")
left = subprocess.run(["pgrep", "-f", f"kernel_tcp.*--port {compare.KERNEL_PORT}"], stdout=subprocess.PIPE, text=True)
check(left.stdout.strip() == "", "no kernel_tcp process left behind")
shutil.rmtree(out2, ignore_errors=True)

# ---- 4. without root the kernel part refuses at once, saying why ------------------------------------------
if shutil.which("su") and subprocess.run(["id", "nobody"], stdout=subprocess.DEVNULL).returncode == 0:
    r = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c",
                        f"{py} {os.path.join(src, 'bench', 'compare', 'compare.py')} --quick --build {build} "
                        f"--out /nonexistent/compare"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=30)
    check(r.returncode == 2 and "needs root" in r.stdout and "--skip kernel" in r.stdout,
          f"not root: exit 2 with a clear message ({r.returncode}: {r.stdout.strip()[:90]})")

print(f"{len(failures)} failure(s)" if failures else "all checks passed")
sys.exit(1 if failures else 0)
