#!/usr/bin/env bash
# Out-of-tree consumer test: builds softrdma from the source tree into a private build configured with
# --prefix=<temp dir>, installs it there, then compiles tests/examples/consumer/consumer.cpp with nothing but
# `pkg-config --cflags/--libs softrdma` (PKG_CONFIG_PATH pointing into the temp prefix) under
# -std=c++20 -Wall -Wextra -Werror, linked with an rpath as verbs/README.md tells, and runs it: two processes
# exchanging a SEND over memif without hugepages. Also: every installed header compiles on its own, none
# brings in DPDK, lwIP, Boost, spdlog or an internal header, and a --destdir install of the same build is
# found through its relocatable softrdma.pc. Everything is removed afterwards.
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
case " $cflags " in *dpdk*|*" -include "*|*-march*) echo "cflags carry DPDK's flags: $cflags"; exit 1 ;; esac

step "every installed header on its own, and what each pulls in"
inc=$(pkg-config --variable=includedir softrdma)
n=0
for h in "$inc"/softrdma/*.hpp; do
  rel=softrdma/$(basename "$h")
  # shellcheck disable=SC2086
  deps=$(echo "#include <$rel>" | c++ -std=c++20 -Wall -Wextra -Werror $cflags -x c++ - -fsyntax-only -H 2>&1 >/dev/null) ||
    { echo "$rel does not compile on its own:"; echo "$deps"; exit 1; }
  # -H lists every header opened: only the C++ standard library's and ours may appear.
  foreign=$(grep -E '^\.+ ' <<<"$deps" | awk '{print $2}' | grep -vE "^/usr/(include/c\+\+|include/x86_64-linux-gnu/c\+\+|lib/gcc)|^/usr/include/[a-z_0-9-]+\.h$|^/usr/include/(x86_64-linux-gnu/)?(bits|sys|gnu|asm|asm-generic|linux)/|^$inc/softrdma/" || true)
  [ -z "$foreign" ] || { echo "$rel brings in headers that are not the API's:"; echo "$foreign"; exit 1; }
  n=$((n + 1))
done
echo "$n headers: each compiles alone, standard library and <softrdma/...> only"

step "compile the consumer out of tree with -Werror"
mkdir "$tmp/consumer"
cp "$src/tests/examples/consumer/consumer.cpp" "$tmp/consumer/"
# shellcheck disable=SC2086  # word splitting of the flags is intended
libdir=$(pkg-config --variable=libdir softrdma)
c++ -std=c++20 -Wall -Wextra -Werror $cflags "$tmp/consumer/consumer.cpp" -o "$tmp/consumer/consumer" $libs \
  -Wl,-rpath,"$libdir"
step "run it (found through its rpath, no LD_LIBRARY_PATH)"
timeout 60 "$tmp/consumer/consumer" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; echo "consumer failed"; exit 1; }
cat "$tmp/out" "$tmp/err"
grep -q '^consumer: echo received: "hello from an installed softrdma"' "$tmp/out" || { echo "no echo line"; exit 1; }
# The library's log goes to stderr; standard output is the program's alone.
! grep -q "softrdma\]" "$tmp/out" || { echo "softrdma logged to standard output"; exit 1; }
grep -q "^\[softrdma\] \[info\] port " "$tmp/err" || { echo "no log line on stderr"; exit 1; }
ldd "$tmp/consumer/consumer" | grep -q "libsoftrdma.* => $tmp/prefix/" ||
  { echo "the consumer did not load the installed libsoftrdma"; exit 1; }

step "a --destdir install of the same build (staged, as packagers do)"
DESTDIR="$tmp/stage" meson install -C "$tmp/build" --no-rebuild --quiet >"$tmp/stage.log" 2>&1 || { cat "$tmp/stage.log"; exit 1; }
spc=$(find "$tmp/stage" -name softrdma.pc | head -1)
case "$spc" in */lib/*-linux-gnu/pkgconfig/*|*/lib/pkgconfig/*|*/lib64/pkgconfig/*) ;; *) echo "softrdma.pc at $spc"; exit 1 ;; esac
sinc=$(PKG_CONFIG_PATH=$(dirname "$spc") pkg-config --variable=includedir softrdma)
[ -f "$sinc/softrdma/verbs.hpp" ] || { echo "the staged softrdma.pc points at $sinc, which has no softrdma/verbs.hpp"; exit 1; }
# shellcheck disable=SC2046
c++ -std=c++20 -Wall -Wextra -Werror $(PKG_CONFIG_PATH=$(dirname "$spc") pkg-config --cflags softrdma) \
  "$tmp/consumer/consumer.cpp" -o "$tmp/consumer/staged" $(PKG_CONFIG_PATH=$(dirname "$spc") pkg-config --libs softrdma) ||
  { echo "the consumer does not build against the staged install"; exit 1; }
echo "staged softrdma.pc ($spc) points into the stage: $sinc"
echo "consumer test: ok"
