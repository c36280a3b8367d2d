#!/usr/bin/env bash
# Runs one example the way a user would and checks what it prints (meson suite 'examples').
#   check_examples.sh pingpong|rdma_lat|rping|split|errors EXECUTABLE
# Every run: --no-huge (hugepages are shared by everyone on this machine), small counts, a time limit
# (--timeout for the example's own waits, `timeout` around the process).
set -uo pipefail
what=$1
exe=$2
fail() { echo "FAIL: $*"; exit 1; }

# Runs the example; its output goes to $out (and the test log); fails on a non-zero exit code.
run() {
  echo "\$ $(basename "$exe") $*"
  out=$(timeout 120 "$exe" "$@" 2>&1)
  local rc=$?
  echo "$out"
  [ $rc -eq 0 ] || fail "exit code $rc"
}

# Checks one block of latency lines after the title line matching $1: iterations = $2, then min, p50, p90,
# p99, p99.9, max in that order, each a number in µs, none smaller than the one before, min > 0.
check_percentiles() {
  local title=$1 iters=$2
  awk -v title="$title" -v iters="$iters" '
    index($0, title) == 1 { inblock = 1; row = 0; found = 1; next }
    inblock && row == 0 {
      if ($1 != "iterations" || $2 != iters) { print "iterations line: " $0; bad = 1 }
      row = 1; next
    }
    inblock && row >= 1 && row <= 6 {
      split("min p50 p90 p99 p99.9 max", names, " ")
      if ($1 != names[row] || $3 != "us" || $2 !~ /^[0-9]+\.[0-9]+$/) { print "bad line for " names[row] ": " $0; bad = 1 }
      if (row == 1 && $2 + 0 <= 0) { print "min not positive"; bad = 1 }
      if (row > 1 && $2 + 0 < prev) { print names[row] " " $2 " below the previous " prev; bad = 1 }
      prev = $2 + 0; row++
      if (row == 7) inblock = 0
      next
    }
    END {
      if (!found) { print "no block titled: " title; exit 1 }
      if (inblock) { print "block ended early"; exit 1 }
      exit bad
    }' <<<"$out" || fail "latency block '$title'"
}

case $what in
pingpong)
  run --local --no-huge --iters 300 --warmup 30 --size 64 --timeout 20
  check_percentiles "pingpong: SEND/RECV 64 bytes, half round trip" 300
  run --local --no-huge --iters 50 --warmup 5 --size 70000 --timeout 20   # messages of many FPDUs
  check_percentiles "pingpong: SEND/RECV 70000 bytes, half round trip" 50
  run --local --no-huge --threading rx-thread --iters 200 --warmup 20 --timeout 20   # a dedicated RX thread
  check_percentiles "pingpong: SEND/RECV 64 bytes, half round trip (20 warmup rounds not counted, RX thread)" 200
  ;;
rdma_lat)
  run --local --no-huge --iters 300 --warmup 30 --size 64 --timeout 20
  check_percentiles "rdma_lat: RDMA WRITE 64 bytes, half round trip" 300
  check_percentiles "rdma_lat: RDMA READ 64 bytes, full round trip" 300
  run --local --no-huge --op read --iters 40 --warmup 4 --size 100000 --timeout 20
  check_percentiles "rdma_lat: RDMA READ 100000 bytes, full round trip" 40
  grep -q "RDMA WRITE" <<<"$out" && fail "--op read also ran WRITE"
  ;;
rping)
  run --local --no-huge -v -C 20 -S 100 --timeout 20
  grep -qx "rping: 20 pings of 100 bytes: data verified (READ by the server, WRITTEN back, compared)" <<<"$out" ||
    fail "no verification line"
  # rping's text, ping by ping, seen by the server after its READ and by the client after the WRITE back.
  client=$(grep '^ping data: ' <<<"$out" | sed 's/^ping data: //')
  server=$(grep '^server ping data: ' <<<"$out" | sed 's/^server ping data: //')
  [ "$(wc -l <<<"$client")" -eq 20 ] || fail "client printed $(wc -l <<<"$client") pings, not 20"
  [ "$client" = "$server" ] || fail "client and server saw different ping data"
  # Ping 0: "rdma-ping-0: " then letters from 'A' (99 characters before the NUL of a 100-byte buffer).
  first=$(head -1 <<<"$client")
  expect="rdma-ping-0: $(python3 -c 'print("".join(chr(65 + i % 58) for i in range(99 - 13)))')"
  [ "$first" = "$expect" ] || fail "ping 0 text: $first"
  ;;
split)
  # --server and --client as two commands (what two machines would run), on a socket of our own.
  sock=/tmp/softrdma-split-$$.sock
  timeout 60 "$exe" --server --memif "$sock" --no-huge --lcores 0 --timeout 20 >/tmp/softrdma-split-$$.server 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null; rm -f "$sock" /tmp/softrdma-split-$$.server' EXIT
  sleep 0.3
  run --client --memif "$sock" --no-huge --lcores 1 --iters 200 --warmup 10 --size 512 --timeout 20
  wait $server; src=$?
  cat /tmp/softrdma-split-$$.server
  [ $src -eq 0 ] || fail "server exit code $src"
  check_percentiles "pingpong: SEND/RECV 512 bytes, half round trip" 200
  ;;
errors)
  # A bad flag: usage and exit code 2. A client with nobody to talk to: a clear error, exit code 1, in time.
  timeout 10 "$exe" --no-such-flag >/dev/null 2>&1; rc=$?
  [ $rc -eq 2 ] || fail "bad flag: exit code $rc, expected 2"
  start=$(date +%s)
  out=$(timeout 60 "$exe" --client --memif /tmp/softrdma-nobody-$$.sock --no-huge --timeout 3 2>&1); rc=$?
  echo "$out" | tail -2
  [ $rc -eq 1 ] || fail "lonely client: exit code $rc, expected 1"
  grep -q "is the server process running" <<<"$out" || fail "lonely client: no clear message"
  [ $(( $(date +%s) - start )) -le 20 ] || fail "lonely client took too long"
  ;;
nohuge)
  # No hugepages (hugetlbfs unmounted in a private mount namespace): one note, then the run works without.
  if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null; then echo "skipped: needs root and unshare"; exit 77; fi
  echo "\$ unshare -m: umount hugetlbfs; $(basename "$exe") --local --iters 100 --warmup 10"
  out=$(timeout 120 unshare -m --propagation private sh -c \
    'for m in $(awk "\$3 == \"hugetlbfs\" {print \$2}" /proc/mounts); do umount "$m" || exit 9; done; exec "$0" "$@"' \
    "$exe" --local --iters 100 --warmup 10 --timeout 20 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || fail "exit code $rc"
  [ "$(grep -c 'no free hugepages' <<<"$out")" -eq 1 ] || fail "the no-hugepages note is not there exactly once"
  check_percentiles "pingpong: SEND/RECV 64 bytes, half round trip" 100
  ;;
afpacket)
  # --af-packet: server and client in two network namespaces this test creates (and removes), joined by a veth
  # pair; the kernel's veth carries the frames.
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then echo "skipped: needs root and iproute2"; exit 77; fi
  a=sr-exa$$; b=sr-exb$$
  trap 'kill $server 2>/dev/null; ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; rm -f /tmp/softrdma-af-$$.server' EXIT
  server=
  ip netns add $a && ip netns add $b && ip link add va$$ type veth peer name vb$$ &&
    ip link set va$$ netns $a && ip link set vb$$ netns $b && ip -n $a link set va$$ up && ip -n $b link set vb$$ up ||
    fail "cannot make the namespaces"
  ip netns exec $a timeout 60 "$exe" --server --af-packet va$$ --ip 10.77.0.1 --no-huge --lcores 0 --timeout 20 \
    >/tmp/softrdma-af-$$.server 2>&1 &
  server=$!
  sleep 0.5
  echo "\$ ip netns exec $b $(basename "$exe") --client --af-packet vb$$ ..."
  out=$(ip netns exec $b timeout 60 "$exe" --client --af-packet vb$$ --ip 10.77.0.2 --peer-ip 10.77.0.1 --no-huge \
    --lcores 1 --iters 200 --warmup 20 --size 1000 --timeout 20 2>&1); rc=$?
  echo "$out"
  wait $server; src=$?
  cat /tmp/softrdma-af-$$.server
  [ $rc -eq 0 ] || fail "client exit code $rc"
  [ $src -eq 0 ] || fail "server exit code $src"
  check_percentiles "pingpong: SEND/RECV 1000 bytes, half round trip" 200
  ;;
strangers)
  # Peers pingpong does not expect (tests/examples/strangers.py, kernel TCP in a second namespace): a request
  # without private data gets an MPA reject with the reason and a FIN; a client that resets right after its
  # request leaves the server waiting for the next; a second client during a session is refused as busy; the
  # session itself completes and the server exits 0.
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v ethtool >/dev/null; then
    echo "skipped: needs root, iproute2 and ethtool"; exit 77
  fi
  a=sr-sta$$; b=sr-stb$$
  trap 'kill $server 2>/dev/null; ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; rm -f /tmp/softrdma-st-$$.server' EXIT
  server=
  ip netns add $a && ip netns add $b && ip link add va$$ type veth peer name vb$$ &&
    ip link set va$$ netns $a && ip link set vb$$ netns $b && ip -n $a link set va$$ up && ip -n $b link set vb$$ up &&
    ip -n $b addr add 10.78.0.2/24 dev vb$$ || fail "cannot make the namespaces"
  # The kernel end must put real checksums in its frames (veth offloads them otherwise; DPDK checks them).
  ip netns exec $b ethtool -K vb$$ tx off >/dev/null || fail "ethtool"
  ip netns exec $a timeout 60 "$exe" --server --af-packet va$$ --ip 10.78.0.1 --no-huge --lcores 0 --timeout 20 \
    >/tmp/softrdma-st-$$.server 2>&1 &
  server=$!
  echo "\$ ip netns exec $b strangers.py 10.78.0.1 7471"
  out=$(ip netns exec $b timeout 60 python3 "$(dirname "$0")/strangers.py" 10.78.0.1 7471 2>&1); rc=$?
  echo "$out"
  wait $server; src=$?
  cat /tmp/softrdma-st-$$.server
  [ $rc -eq 0 ] || fail "strangers.py exit code $rc"
  [ $src -eq 0 ] || fail "server exit code $src"
  grep -q "refused a connection from 10.78.0.2:[0-9]*: expected 16 bytes of private data" /tmp/softrdma-st-$$.server ||
    fail "the server did not say whom it refused and why"
  grep -q "busy" /tmp/softrdma-st-$$.server || fail "the server did not say it refused a second client"
  # rping's server (-P) against a client that breaks rping's order: an orderly end of that session, then the next.
  rping_exe=$(dirname "$exe")/rping
  ip netns exec $a timeout 60 "$rping_exe" -s -P -a 10.78.0.1 --af-packet va$$ --no-huge --lcores 0 --timeout 5 \
    >/tmp/softrdma-st-$$.server 2>&1 &
  server=$!
  echo "\$ ip netns exec $b strangers.py 10.78.0.1 7174 --rping"
  out=$(ip netns exec $b timeout 60 python3 "$(dirname "$0")/strangers.py" 10.78.0.1 7174 --rping 2>&1); rc=$?
  echo "$out"
  wait $server; src=$?
  cat /tmp/softrdma-st-$$.server
  [ $rc -eq 0 ] || fail "strangers.py --rping exit code $rc"
  [ $src -le 1 ] || fail "rping server ended with $src (a crash?)"
  grep -q "session with 10.78.0.2:[0-9]* failed: unexpected message" /tmp/softrdma-st-$$.server ||
    fail "the rping server did not say what went wrong"
  ;;
*) fail "unknown check $what" ;;
esac
echo "ok: $what"
