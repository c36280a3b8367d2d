#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs one libFuzzer target: replays its regression inputs, writes fresh seeds, fuzzes for --time seconds
# (one process, one job) over the kept corpus plus the seeds, and prints one line
#   <target>: N inputs in S s, corpus C, crashes K
# Exit status 0 only when the regressions pass and the run found nothing. Used by meson test --suite fuzz
# (tests/fuzz/meson.build) and by scripts/fuzz.
import argparse
import os
import re
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument('--target', required=True)
ap.add_argument('--seeds', required=True, help='the fuzz_seeds executable')
ap.add_argument('--captures', default='')
ap.add_argument('--regressions', required=True)
ap.add_argument('--work', required=True, help='directory for seeds, corpus and crash artifacts')
ap.add_argument('--corpus', default='', help='corpus directory kept between runs (default: WORK/corpus/TARGET)')
ap.add_argument('--time', type=int, default=20)
a = ap.parse_args()

name = os.path.basename(a.target)
env = dict(os.environ)
env.setdefault('ASAN_OPTIONS', 'detect_leaks=1:abort_on_error=1')
env.setdefault('UBSAN_OPTIONS', 'halt_on_error=1:print_stacktrace=1')

failed = False
# 1. Regressions: every input that ever crashed this target, run once each.
regs = sorted(os.path.join(a.regressions, f) for f in os.listdir(a.regressions)) \
    if os.path.isdir(a.regressions) else []
regs = [r for r in regs if os.path.isfile(r) and not r.endswith('.md')]
if regs:
    r = subprocess.run([a.target, *regs], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        print(f'{name}: a regression input fails')
        failed = True
    else:
        print(f'{name}: {len(regs)} regression inputs pass')

# 2. Seeds: written fresh each run.
seeds_root = os.path.join(a.work, 'seeds-' + name)
cmd = [a.seeds, seeds_root] + ([a.captures] if a.captures else [])
r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
sys.stdout.write(r.stdout)
if r.returncode != 0:
    print(f'{name}: seed generator failed')
    sys.exit(1)
seeds = os.path.join(seeds_root, name)
os.makedirs(seeds, exist_ok=True)

# 3. Fuzz.
corpus = a.corpus or os.path.join(a.work, 'corpus', name)
artifacts = os.path.join(a.work, 'artifacts', name)
os.makedirs(corpus, exist_ok=True)
os.makedirs(artifacts, exist_ok=True)
before = set(os.listdir(artifacts))
start = time.monotonic()
r = subprocess.run([a.target, corpus, seeds, f'-max_total_time={a.time}', '-max_len=8192', '-timeout=10',
                    '-rss_limit_mb=2048', '-print_final_stats=1',
                    f'-artifact_prefix={artifacts}/'],
                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
elapsed = time.monotonic() - start
out = r.stdout
m = re.search(r'stat::number_of_executed_units:\s*(\d+)', out)
runs = int(m.group(1)) if m else 0
new = sorted(set(os.listdir(artifacts)) - before)
crashes = len(new) if new else (1 if r.returncode != 0 else 0)
corpus_size = len(os.listdir(corpus))
if r.returncode != 0 or new:
    sys.stdout.write(out[-8000:])
    for f in new:
        print(f'{name}: artifact {os.path.join(artifacts, f)}')
    failed = True
print(f'{name}: {runs} inputs in {elapsed:.0f} s, corpus {corpus_size}, crashes {crashes}')
sys.exit(1 if failed else 0)
