#!/usr/bin/env bash
# Out-of-tree consumer test: installs the build the suite runs in with --destdir into a temp dir (staged, as
# packagers do; softrdma.pc finds its prefix from where it lies, so the staged tree is a working install), then
# compiles tests/examples/consumer/consumer.cpp with nothing but `pkg-config --cflags/--libs softrdma`
# (PKG_CONFIG_PATH pointing into the stage) under -std=c++20 -Wall -Wextra -Werror, linked with an rpath as
# verbs/README.md tells, and runs it: two processes exchanging a SEND over memif without hugepages. Also: every
# installed header compiles on its own, none brings in DPDK, lwIP, Boost, spdlog or an internal header. A
# --prefix install holds the same files elsewhere; where they lie is what the relocatable softrdma.pc is checked
# for. Everything is removed afterwards.
#   consumer_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# meson test points LD_LIBRARY_PATH into the build for a test that depends on shared libraries: a user's
# program has none of that.
unset LD_LIBRARY_PATH
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/softrdma-consumer.XXXXXX)
# meson install rewrites the build's meson-logs/install-log.txt, which `ninja uninstall` reads: a real install
# made from this build before must still be the one it names afterwards.
log=$build/meson-logs/install-log.txt
if [ -f "$log" ]; then cp -p "$log" "$tmp/install-log.saved"; fi
cleanup() {
  if [ -f "$tmp/install-log.saved" ]; then cp -p "$tmp/install-log.saved" "$log"; else rm -f "$log"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # meson's timeout: still clean up
step() { echo "== $*"; }

step "install $build staged into $tmp/stage (--destdir)"
# --no-rebuild: meson test has built everything; only what is installed is copied (the shared and static
# library, the drop-in libraries and softrdma-run, headers, softrdma.pc).
meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/stage" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }

pc=$(find "$tmp/stage" -name softrdma.pc | head -1)
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
# ldd's output kept whole: shown on failure (and no `ldd | grep -q` pipe, which pipefail would fail whenever grep
# exits before ldd has written its last line).
libs_loaded=$(ldd "$tmp/consumer/consumer")
grep -q "libsoftrdma.* => $tmp/stage/" <<<"$libs_loaded" ||
  { echo "the consumer did not load the installed libsoftrdma:"; echo "$libs_loaded"; exit 1; }

step "the staged softrdma.pc points into the stage"
case "$pc" in */lib/*-linux-gnu/pkgconfig/*|*/lib/pkgconfig/*|*/lib64/pkgconfig/*) ;; *) echo "softrdma.pc at $pc"; exit 1 ;; esac
for d in "$inc" "$libdir"; do
  case "$d/" in "$tmp/stage/"*) ;; *) echo "the staged softrdma.pc points at $d, outside the stage"; exit 1 ;; esac
done
[ -f "$inc/softrdma/verbs.hpp" ] || { echo "$inc has no softrdma/verbs.hpp"; exit 1; }
echo "$pc: includedir $inc, libdir $libdir"
echo "consumer test: ok"
