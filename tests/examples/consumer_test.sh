#!/usr/bin/env bash
# Out-of-tree consumer test: builds softrdma from the source tree into a private build configured with
# --prefix=<temp dir>, installs it there, then compiles tests/examples/consumer/consumer.cpp with nothing but
# `pkg-config --cflags/--libs softrdma` (PKG_CONFIG_PATH pointing into the temp prefix) under
# -std=c++20 -Wall -Wextra -Werror (DPDK's headers must not break a consumer's -Werror), and runs it: two
# processes exchanging a SEND over memif without hugepages. Everything is removed afterwards.
#   consumer_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/softrdma-consumer.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM  # meson's timeout: still clean up
step() { echo "== $*"; }

step "configure $tmp/build (--prefix=$tmp/prefix)"
# buildtype plain: no optimisation, the quickest build; this test is about the installed package.
meson setup "$tmp/build" "$src" --prefix="$tmp/prefix" --buildtype=plain >"$tmp/setup.log" 2>&1 ||
  { cat "$tmp/setup.log"; exit 1; }
step "build the library and install it"
# Only what is installed (the shared and static library; headers and softrdma.pc need no build), not the
# tests and benchmarks.
mapfile -t targets < <(meson introspect "$tmp/build" --targets | python3 -c '
import json, os, sys
for t in json.load(sys.stdin):
    if t["installed"]:
        for f in t["filename"]:
            print(os.path.relpath(f, sys.argv[1]))' "$tmp/build")
[ ${#targets[@]} -gt 0 ] || { echo "no installed targets"; exit 1; }
ninja -C "$tmp/build" "${targets[@]}" >"$tmp/build.log" 2>&1 || { tail -50 "$tmp/build.log"; exit 1; }
meson install -C "$tmp/build" --no-rebuild --quiet >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }

pc=$(find "$tmp/prefix" -name softrdma.pc | head -1)
[ -n "$pc" ] || { echo "softrdma.pc not installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
step "pkg-config: $(pkg-config --modversion softrdma)"
cflags=$(pkg-config --cflags softrdma)
libs=$(pkg-config --libs softrdma)
echo "cflags: $cflags"
case " $cflags " in *" -I$src"*) echo "cflags point into the source tree"; exit 1 ;; esac

step "compile the consumer out of tree with -Werror"
mkdir "$tmp/consumer"
cp "$src/tests/examples/consumer/consumer.cpp" "$tmp/consumer/"
# shellcheck disable=SC2086  # word splitting of the flags is intended
c++ -std=c++20 -Wall -Wextra -Werror $cflags "$tmp/consumer/consumer.cpp" -o "$tmp/consumer/consumer" $libs
step "run it"
out=$(LD_LIBRARY_PATH=$(pkg-config --variable=libdir softrdma) timeout 60 "$tmp/consumer/consumer" 2>&1) || {
  echo "$out"; echo "consumer failed"; exit 1; }
echo "$out"
grep -q '^consumer: echo received: "hello from an installed softrdma"' <<<"$out" || { echo "no echo line"; exit 1; }
LD_LIBRARY_PATH=$(pkg-config --variable=libdir softrdma) ldd "$tmp/consumer/consumer" | grep -q "libsoftrdma.* => $tmp/prefix/" ||
  { echo "the consumer did not load the installed libsoftrdma"; exit 1; }
echo "consumer test: ok"
