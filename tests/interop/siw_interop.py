#!/usr/bin/env python3
"""Live interop with Linux soft-iWARP (siw 6.1) and stock rdma-core tools, run by the test suite.

Boots the siw VMs of ../shared/siw-vm (QEMU; building their image first when it is missing) on a bridge inside
a network namespace of its own, runs softrdma against them over af_packet, captures the bridge, and checks:
  - our rping as client against stock `rping -s` (64 B, 4 KiB, 64 KiB; -V) on the stock, crc and p2p siw builds;
    requiring CRC; peer-to-peer with each RTR type (siw answers WRITE or READ; SEND gets "no matching RTR",
    which must end cleanly without crashing the guest);
  - 30 connect/disconnect cycles as initiator, plain and peer-to-peer, against an idle guest with our first FPDU
    sent at once (the accept-window case: FirstFpduGuard nudges); a few connects with the guard off are shown,
    not asserted;
  - our rping as server against stock `rping -c -V` at the three sizes; stock ucmatose against our pingpong
    server (which must refuse it with an MPA reject that says why);
  - an immediate-data post refused at post time on a connection to siw (iwarp_probe);
  - the drop-in libraries: stock rping -V, rdma_server/rdma_client and all six perftest programs (ib_{send,write,read}_{lat,bw} -R)
    under softrdma-run against the same stock programs on siw, both roles (siw serving, then siw's clients
    of our servers, whose results are read from the guest's console);
  - from the capture: no malformed frame, every MPA CRC good when on, no TERMINATE and no RST on orderly closes,
    and the guests' kernel logs free of errors.
Tears everything down after itself, even when a case fails or it is interrupted. Exit 77 (meson: skipped) with
one line saying why when QEMU, root, network namespaces or ../shared/siw-vm are not available.

Usage: siw_interop.py --rping PATH --pingpong PATH --probe PATH --softrdma-run PATH [--siw-vm DIR]
                      [--keep-logs DIR] [--only dropin]   (dropin: only the drop-in cases, ~3 min)
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

OUR_IP = "10.99.0.10"
VM1 = ("vm1", "10.99.0.2", "siwtap1")
VM2 = ("vm2", "10.99.0.3", "siwtap2")
KERNEL_ERRORS = re.compile(r"BUG|WARNING:|Oops|Call Trace|general protection|invalid opcode|Kernel panic")


def skip(why):
    print("SKIP: " + why, flush=True)
    sys.exit(77)


def log(msg):
    print("[interop %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def apt_versions(package):
    """The versions of a binary package the apt lists offer (apt-cache madison; its source lines left out)."""
    r = subprocess.run(["apt-cache", "madison", package], capture_output=True, text=True)
    return {f[1].strip() for f in (l.split("|") for l in r.stdout.splitlines())
            if len(f) >= 3 and f[0].strip() == package and f[2].strip().endswith("Packages")}


def consistent_kernel():
    """The newest linux-image-6.1.0-N-amd64 whose version (the first `apt-cache show` lists, as ../shared/siw-vm's
    build.sh takes it) comes with linux-source-6.1, linux-kbuild-6.1 and both of its headers packages at that same
    version, which build.sh needs to compile siw.ko; None when there is none."""
    r = subprocess.run(["apt-cache", "pkgnames", "linux-image-6.1.0-"], capture_output=True, text=True)
    abis = sorted((int(m.group(1)) for m in (re.fullmatch(r"linux-image-6\.1\.0-(\d+)-amd64", l.strip())
                                             for l in r.stdout.splitlines()) if m), reverse=True)
    for n in abis:
        image = "linux-image-6.1.0-%d-amd64" % n
        show = subprocess.run(["apt-cache", "show", image], capture_output=True, text=True).stdout
        m = re.search(r"^Version: (\S+)", show, re.M)
        if m is None:
            continue
        need = ("linux-source-6.1", "linux-kbuild-6.1", "linux-headers-6.1.0-%d-amd64" % n,
                "linux-headers-6.1.0-%d-common" % n)
        if all(m.group(1) in apt_versions(p) for p in need):
            return image
    return None


class Lab:
    """The namespace, the VMs, the capture and our processes; down() removes all of it."""

    def __init__(self, siwvm, workdir):
        self.siwvm = siwvm
        self.ns = "srdma-iop%d" % os.getpid()
        self.workdir = workdir
        # The VMs, the scripts and tshark run without meson's LD_LIBRARY_PATH: it names our drop-in libibverbs,
        # which QEMU (linked against libibverbs) would load, and in a sanitizer build that aborts it ("ASan
        # runtime does not come first"). Our stock tools get the drop-in from softrdma-run instead.
        base = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        # SIWVM_DEBUG: the guests' whole kernel log on their consoles (no "quiet"), so that the check of the
        # logs at the end sees warnings too (a NETDEV WATCHDOG, a soft lockup), not only what is logged as an error.
        self.env = dict(base, SIWVM_NETNS=self.ns, SIWVM_LOGDIR=os.path.join(workdir, "logs"),
                        SIWVM_CAPDIR=os.path.join(workdir, "captures"), SIWVM_DEBUG="1")
        os.makedirs(self.env["SIWVM_LOGDIR"], exist_ok=True)
        self.procs = []  # (Popen, name): VMs and tshark, killed by down()
        self.pcap = os.path.join(workdir, "bridge.pcapng")
        self.tshark = None
        self.netup = False

    def script(self, name, *args, **kw):
        return subprocess.run([os.path.join(self.siwvm, name), *args], env=self.env, **kw)

    def up(self):
        r = self.script("net-up.sh", capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("net-up.sh failed: " + r.stdout + r.stderr)
        self.netup = True
        out = open(os.path.join(self.workdir, "tshark.txt"), "w")
        self.tshark = subprocess.Popen(["ip", "netns", "exec", self.ns, "tshark", "-i", "siwbr0", "-w", self.pcap, "-q"],
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        for _ in range(100):
            if "Capturing on" in open(os.path.join(self.workdir, "tshark.txt")).read():
                break
            time.sleep(0.1)
        time.sleep(0.5)

    def vm(self, vm, cmd, variant="stock", timeout=240):
        """Boots a VM running `cmd`; returns once it is ready (its command has started)."""
        name, ip, tap = vm
        env = dict(self.env, SIWVM_VARIANT=variant, SIWVM_TIMEOUT=str(timeout))
        out = os.path.join(self.workdir, name + ".run.txt")
        p = subprocess.Popen([os.path.join(self.siwvm, "run-vm.sh"), name, ip, tap, cmd], env=env,
                             stdout=open(out, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((p, name))
        deadline = time.time() + 120
        while time.time() < deadline:
            text = open(out).read()
            if "ready after" in text:
                return p
            if p.poll() is not None:
                raise RuntimeError("VM %s ended before it was ready:\n%s" % (name, text[-2000:]))
            time.sleep(0.2)
        raise RuntimeError("VM %s not ready in 120 s" % name)

    def vm_output(self, name):
        path = os.path.join(self.workdir, name + ".run.txt")
        return open(path).read() if os.path.exists(path) else ""

    def guest_log(self, name):
        path = os.path.join(self.env["SIWVM_LOGDIR"], name + ".log")
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    def probe_guest(self, ip):
        """Whether a guest's network still answers: ARP and an ICMP echo from dpdk0 (free between our programs),
        for the detail of a failed case: a guest gone silent to these too has lost its network, not one
        connection."""
        try:
            r = subprocess.run(["ip", "netns", "exec", self.ns, "python3", os.path.join(self.siwvm, "l2probe.py"),
                                "dpdk0", ip], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return "probe of the guest after the failure: l2probe did not end in 30 s"
        return "probe of the guest after the failure: " + " | ".join((r.stdout + r.stderr).split("\n")).strip(" |")

    def stop_vm(self, p, wait_s=0):
        if wait_s:
            try:
                p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)  # run-vm.sh stops its qemu
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def ours(self, args, timeout):
        """Runs one of our programs in the namespace (one at a time: they share dpdk0). (rc, output)."""
        env = None
        if os.environ.get("SOFTRDMA_PRELOAD") and os.path.basename(args[0]) == "softrdma-run":
            # A stock program with the sanitizer runtime preloaded: no leak check of its own allocations.
            asan = os.environ.get("ASAN_OPTIONS", "")
            env = dict(os.environ, ASAN_OPTIONS=(asan + ":" if asan else "") + "detect_leaks=0")
        try:
            r = subprocess.run(["ip", "netns", "exec", self.ns, *args], capture_output=True, text=True,
                               timeout=timeout, start_new_session=True, env=env)
            return r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            return 124, out + "\n(killed at the time limit)"

    def down(self):
        for p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p, _ in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        if self.tshark and self.tshark.poll() is None:
            self.tshark.send_signal(signal.SIGINT)
            try:
                self.tshark.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.tshark.kill()
        if self.netup:
            # Whatever is still in the namespace (a DPDK process, a qemu) goes first: net-down refuses otherwise.
            pids = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            time.sleep(0.5)
            self.script("net-down.sh", capture_output=True)
            self.netup = False


class Cases:
    def __init__(self, lab, exe):
        self.lab, self.exe = lab, exe
        self.results = []   # (name, ok, detail)
        self.windows = []   # (name, t0, t1, clean_close_expected)

    def record(self, name, ok, detail, t0, clean=True):
        self.windows.append((name, t0 - 0.05, time.time() + 0.05, clean))
        self.results.append((name, ok, detail))
        log("%s: %s%s" % ("PASS" if ok else "FAIL", name, "" if ok else "\n" + detail[-3000:]))

    def client(self, name, extra, expect, clean=True, timeout=60, tries=8):
        """Our rping client against the VM server at 10.99.0.2; retried while the server is not listening yet."""
        t0 = time.time()
        args = [self.exe["rping"], "-c", "-a", VM1[1], "-I", OUR_IP, "--af-packet", "dpdk0", "-V", "--no-huge",
                "--timeout", "10", *extra]
        for _ in range(tries):
            rc, out = self.lab.ours(args, timeout)
            if "unreachable" not in out:
                break
            time.sleep(1)
        ok = expect(rc, out)
        self.record(name, ok, "rc=%d\n%s" % (rc, out), t0, clean)
        return rc, out


def verified(count, size, connects=1):
    line = "rping: %d pings of %d bytes: data verified" % (count, size)

    def check(rc, out):
        return rc == 0 and line in out and (connects == 1 or ("on each of %d connections" % connects) in out)
    return check


def server_cases(cases, lab, variant):
    """Our rping client against a stock `rping -s -P` on the `variant` siw build."""
    vm = lab.vm(VM1, "rping -s -a %s -V -P -S 65535" % VM1[1], variant=variant)
    v = variant
    for size in (64, 4096, 65535):
        cases.client("%s: rping client -S %d" % (v, size), ["-C", "3", "-S", str(size)], verified(3, size))
    cases.client("%s: rping client requiring CRC" % v, ["-C", "3", "-S", "65535", "--crc"], verified(3, 65535))
    for rtr in ("write", "read"):
        cases.client("%s: peer-to-peer, %s RTR" % (v, rtr), ["-C", "3", "-S", "4096", "--p2p", rtr], verified(3, 4096))
    if variant == "stock":
        # siw answers a SEND-only offer with WRITE: "no matching RTR". The RTR it waits for goes first, so the
        # guest's iw_cm sees an established connection end (checked in its kernel log below).
        cases.client("stock: peer-to-peer, SEND RTR only: clean 'no matching RTR'", ["-C", "1", "--p2p", "send"],
                     lambda rc, out: rc != 0 and "no matching RTR" in out, clean=False)
        cases.client("stock: 30 connect/disconnect cycles, plain", ["-C", "1", "--connects", "30"],
                     verified(1, 64, 30), timeout=180)
        cases.client("stock: 30 connect/disconnect cycles, peer-to-peer", ["-C", "1", "--connects", "30", "--p2p", "write"],
                     verified(1, 64, 30), timeout=180)
        t0 = time.time()
        rc, out = lab.ours([cases.exe["probe"], "--client", "--af-packet", "dpdk0", "--ip", OUR_IP, "--peer-ip", VM1[1],
                            "--no-huge", "--timeout", "10"], 60)
        cases.record("stock: immediate data and atomics refused at post time (RFC 7306 not agreed)",
                     rc == 0 and out.count("refused at post time") == 4, "rc=%d\n%s" % (rc, out), t0)
        # The window itself, for the record: the guard off, a short time limit (not asserted).
        stalled = 0
        t0 = time.time()
        for _ in range(5):
            rc, _ = lab.ours([cases.exe["rping"], "-c", "-a", VM1[1], "-I", OUR_IP, "--af-packet", "dpdk0", "-V",
                              "--no-huge", "-C", "1", "--timeout", "3", "--first-fpdu", "off"], 30)
            stalled += rc != 0
        cases.windows.append(("guard off (shown only)", t0, time.time(), False))
        log("shown, not asserted: with --first-fpdu off, %d of 5 connections stalled in siw's accept window" % stalled)
    lab.stop_vm(vm)
    return "vm1"


def client_cases(cases, lab):
    """Stock `rping -c -V` and ucmatose in a VM against our rping and pingpong servers."""
    sizes = (64, 4096, 65535)
    cmd = ("for s in %s; do retry 60 rping -c -a %s -V -C 3 -S $s || exit 1; done; "
           "i=0; while [ $i -lt 40 ]; do ucmatose -s %s -p 7471 -C 1 >/tmp/u 2>&1; "
           "if grep -q REJECTED /tmp/u; then echo UCMATOSE-REJECTED; break; fi; sleep 0.5; i=$((i+1)); done; cat /tmp/u"
           % (" ".join(map(str, sizes)), OUR_IP, OUR_IP))
    vm = lab.vm(VM2, cmd, timeout=200)
    for size in sizes:
        t0 = time.time()
        rc, out = lab.ours([cases.exe["rping"], "-s", "-a", OUR_IP, "--af-packet", "dpdk0", "-V", "--no-huge",
                            "--timeout", "40"], 90)
        cases.record("stock rping -c -V -S %d against our rping server" % size,
                     rc == 0 and "rping server: 3 pings served" in out, "rc=%d\n%s" % (rc, out), t0)
    t0 = time.time()
    rc, out = lab.ours([cases.exe["pingpong"], "--server", "--af-packet", "dpdk0", "--ip", OUR_IP, "--no-huge",
                        "--timeout", "12"], 60)
    lab.stop_vm(vm, wait_s=20)
    vm_out = lab.vm_output(VM2[0])
    refused = re.search(r"refused a connection from %s:\d+: expected 16 bytes of private data" % re.escape(VM2[1]), out)
    cases.record("stock ucmatose against our pingpong server: MPA reject with the reason",
                 refused is not None and "UCMATOSE-REJECTED" in vm_out,
                 "pingpong rc=%d\n%s\n--- vm2:\n%s" % (rc, out, vm_out[-3000:]), t0, clean=False)
    return "vm2"


# Stock programs on both ends: perftest and rping in the VM, the same Debian binaries here under softrdma-run.
PERFTESTS = ("ib_send_lat", "ib_write_lat", "ib_read_lat", "ib_send_bw", "ib_write_bw", "ib_read_bw")


def perftest_ok(rc, out):
    """A perftest run that ended well: exit 0 and a results line of 200 iterations under its header."""
    m = re.search(r"#bytes.*\n\s*(\d+)\s+(\d+)\s+([\d.]+)", out)
    return rc == 0 and m is not None and m.group(2) == "200" and float(m.group(3)) > 0


def dropin_cases(cases, lab):
    """Unmodified rping and perftest through the drop-in libraries against the same tools on siw, both roles."""
    run = [cases.exe["softrdma_run"], "--af-packet", "dpdk0", "--ip", OUR_IP, "--no-huge"]
    # Dead-peer detection given the emulated peer's room: the VMs run under TCG here (no usable KVM), beside our
    # busy-polling process and tshark on two cores, and one went wholly silent for over 6 s (no READ response,
    # not even an ACK to our keepalive probes) in the middle of ib_read_bw: the default liveness (3 s idle, 3
    # probes a second apart, 6 s user timeout) reset the connection, which perftest saw as a retry-exceeded
    # completion. 20 s of silence (10 s idle, 5 probes 2 s apart) and 30 s unacknowledged here.
    liveness = {"SOFTRDMA_KEEPALIVE_IDLE_MS": "10000", "SOFTRDMA_KEEPALIVE_INTERVAL_MS": "2000",
                "SOFTRDMA_KEEPALIVE_PROBES": "5", "SOFTRDMA_USER_TIMEOUT_MS": "30000"}
    saved = {k: os.environ.get(k) for k in liveness}
    os.environ.update(liveness)
    try:
        dropin_runs(cases, lab, run)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def dropin_runs(cases, lab, run):
    # A guest whose network stopped: twice under TCG here (2026-11-26) the VM's side of a connection went silent
    # mid-transfer (no data, no ACK to our keepalive probes; stock siw's perftest then saw our reset) and, the
    # second time, the guest sent nothing more at all (its next perftest client's rdma_connect failed with no
    # SYN on the bridge), failing every later pair. A program that failed once is run again, once, against a
    # freshly booted guest that serves (or connects to) the programs from that one on; the retry and its first
    # output are in the case's detail. Each VM's console log is kept across boots for the checks at the end.
    guest_logs = {"vm1": "", "vm2": ""}

    def reboot(vm, which, cmd):
        lab.stop_vm(vm, wait_s=1)
        guest_logs[which[0]] += lab.guest_log(which[0])
        return lab.vm(which, cmd, timeout=420)

    # siw serves, we connect: the VM serves each program once, in turn.
    def vm1_cmd(programs, with_rping):
        return (("rping -s -a %s -V -C 5; " % VM1[1]) if with_rping else "") + \
            "; ".join("%s -R -F -n 200" % t for t in programs) + "; rdma_server"
    vm = lab.vm(VM1, vm1_cmd(PERFTESTS, True), timeout=420)
    t0 = time.time()
    for _ in range(8):
        rc, out = lab.ours(run + ["rping", "-c", "-a", VM1[1], "-v", "-V", "-C", "5"], 60)
        if rc == 0 or "REJECTED" not in out and "UNREACHABLE" not in out:
            break
        time.sleep(1)
    cases.record("drop-in: stock rping -c -V under softrdma-run against stock rping -s on siw",
                 rc == 0 and out.count("ping data: rdma-ping-") == 5, "rc=%d\n%s" % (rc, out), t0)
    rebooted = False
    for i, t in enumerate(PERFTESTS):
        t0 = time.time()
        # A client that did not get as far as a connection is run again (at most twice): the VM's server is
        # still waiting for it. One that failed after connecting, or three times, gets one more run against a
        # new guest (once per run, see above). Each retry is named in the case's detail with its reason.
        notes = []
        for attempt in range(4):
            rc, out = lab.ours(run + [t, "-R", "-F", "-n", "200", VM1[1]], 120)
            if perftest_ok(rc, out):
                break
            if "remote address:" in out or attempt == 2:
                if rebooted:
                    break
                rebooted = True
                notes.append("failed after connecting or three times (rc=%d), run again against a new guest:\n%s\n%s"
                             % (rc, out[-1500:], lab.probe_guest(VM1[1])))
                log("%s -R client: %s" % (t, notes[-1][:200]))
                vm = reboot(vm, VM1, vm1_cmd(PERFTESTS[i:], False))
                continue
            why = [l for l in out.splitlines() if "rdma_connect" in l or "CM event" in l or "[softrdma]" in l]
            notes.append("attempt %d failed before connecting (rc=%d): %s" % (attempt + 1, rc, " | ".join(why[-4:])))
            log("%s -R client: %s" % (t, notes[-1]))
            time.sleep(1)
        # perftest ends by destroying its connected ids, which iWARP stacks answer with a reset: not checked.
        ok = perftest_ok(rc, out)
        cases.record("drop-in: stock %s -R client under softrdma-run against siw" % t, ok,
                     "rc=%d\n%s%s%s" % (rc, "".join(n + "\n" for n in notes), out,
                                        "" if ok else "\n" + lab.probe_guest(VM1[1])), t0, clean=False)
    # librdmacm's synchronous endpoints: stock rdma_client here against rdma_server on siw (a message each way;
    # "end 0" only when every call and completion succeeded), retried while the VM's server is not up yet.
    t0 = time.time()
    for _ in range(20):
        rc, out = lab.ours(run + ["rdma_client", "-s", VM1[1]], 60)
        if rc == 0 or "rdma_connect" not in out and "rdma_create_ep" not in out:
            break
        time.sleep(1)
    cases.record("drop-in: stock rdma_client under softrdma-run against stock rdma_server on siw",
                 rc == 0 and "rdma_client: end 0" in out, "rc=%d\n%s" % (rc, out), t0)
    lab.stop_vm(vm, wait_s=20)
    guest_logs["vm1"] += lab.guest_log("vm1")
    cases.results.append(("drop-in: siw's rdma_server against our rdma_client ends 0",
                          "rdma_server: end 0" in guest_logs["vm1"], guest_logs["vm1"][-2000:]))
    # We serve, siw connects (retrying until each of our servers listens). A perftest client is run again only
    # while it could not connect: one that connected and then failed (under TCG siw can flush its own last
    # SEND with LOC_QP_OP_ERR when our server's close comes in right after the reply) must not be retried, or
    # the retry connects to our next server, a different program, and every later pair fails with it.
    served = PERFTESTS
    connect_retry = ('connect_retry() { n=$1; shift; i=1; while :; do out=$("$@" 2>&1); rc=$?; '
                     'printf "%s\\n" "$out"; [ $rc -eq 0 ] && return 0; '
                     'case "$out" in *"remote address:"*) return $rc ;; esac; '
                     '[ $i -ge $n ] && return $rc; i=$((i+1)); sleep 0.5; done; }; ')

    def vm2_cmd(programs, with_rping):
        return (connect_retry + (("retry 60 rping -c -a %s -V -C 5; " % OUR_IP) if with_rping else "") +
                "; ".join("sleep 2; connect_retry 30 %s -R -F -n 200 %s" % (t, OUR_IP) for t in programs) +
                "; sleep 2; retry 60 rdma_client -s %s" % OUR_IP)
    vm = lab.vm(VM2, vm2_cmd(served, True), timeout=420)
    t0 = time.time()
    rc, out = lab.ours(run + ["rping", "-s", "-a", OUR_IP, "-v", "-V", "-C", "5"], 90)
    cases.record("drop-in: stock rping -s -V under softrdma-run against stock rping -c on siw",
                 rc == 0 and out.count("server ping data: rdma-ping-") == 5, "rc=%d\n%s" % (rc, out), t0)
    rebooted = False
    for i, t in enumerate(served):
        t0 = time.time()
        note = ""
        rc, out = lab.ours(run + [t, "-R", "-F", "-n", "200"], 120)
        if not (rc == 0 and "remote address:" in out) and not rebooted:
            rebooted = True
            note = "failed (rc=%d), run again against a new guest:\n%s\n%s\n" % (rc, out[-1500:],
                                                                               lab.probe_guest(VM2[1]))
            log("%s -R server: %s" % (t, note[:200]))
            vm = reboot(vm, VM2, vm2_cmd(served[i:], False))
            rc, out = lab.ours(run + [t, "-R", "-F", "-n", "200"], 120)
        ok = rc == 0 and "remote address:" in out
        cases.record("drop-in: stock %s -R server under softrdma-run against siw" % t, ok,
                     "rc=%d\n%s%s%s" % (rc, note, out, "" if ok else "\n" + lab.probe_guest(VM2[1])), t0,
                     clean=False)
    t0 = time.time()
    rc, out = lab.ours(run + ["rdma_server"], 90)
    cases.record("drop-in: stock rdma_server under softrdma-run against stock rdma_client on siw",
                 rc == 0 and "rdma_server: end 0" in out, "rc=%d\n%s" % (rc, out), t0)
    lab.stop_vm(vm, wait_s=30)
    guest_logs["vm2"] += lab.guest_log("vm2")
    cases.results.append(("drop-in: siw's rdma_client against our rdma_server ends 0",
                          "rdma_client: end 0" in guest_logs["vm2"], guest_logs["vm2"][-2000:]))
    # What the siw clients measured (the guest's console logs): a results line of 200 iterations for each
    # program we served.
    vm_out = guest_logs["vm2"]
    results = re.findall(r"#bytes[^\n]*\n\s*\d+\s+200\s+[\d.]+", vm_out)
    cases.results.append(("drop-in: the siw clients of our %s servers report results" % ", ".join(served),
                          len(results) >= len(served), vm_out[-3000:]))
    guest = guest_logs["vm1"] + guest_logs["vm2"]
    bad = [l for l in guest.splitlines() if KERNEL_ERRORS.search(l)]
    cases.results.append(("drop-in: guest kernel logs free of errors", not bad, "\n".join(bad[:40])))


MPA_KEYS = tuple(k.encode().hex() for k in ("MPA ID Req Frame", "MPA ID Rep Frame"))


def reused_port_mpa_frames(base):
    """Frame numbers tshark calls malformed only because a connection reused an earlier one's addresses and
    ports: every softrdma process starts lwIP's ephemeral ports at a random point, so two of the dozens of
    processes a run starts can pick the same port towards the same guest service, and tshark's MPA dissector,
    which keeps its state per address/port pair, then reads the new connection's MPA request and reply as
    FPDUs of the old one. Excused: frames that are exactly an MPA request or reply (their key first) in a TCP
    stream whose SYN tshark marks as reusing ports."""
    out = subprocess.run(base + ["-T", "fields", "-E", "separator=|", "-e", "frame.number", "-e", "tcp.stream",
                                 "-e", "tcp.analysis.reused_ports", "-e", "tcp.payload", "-Y",
                                 "tcp.analysis.reused_ports || _ws.malformed"],
                         capture_output=True, text=True).stdout
    reused, candidates = set(), []
    for line in out.splitlines():
        num, stream, reuse, payload = (line.split("|") + [""] * 4)[:4]
        if reuse:
            reused.add(stream)
        if payload.replace(":", "").startswith(MPA_KEYS):
            candidates.append((num, stream))
    return {num for num, stream in candidates if stream in reused}


def fin_crossed(frames):
    """A stream whose RSTs all came from the peer after its own FIN, where everything we sent with payload had
    left before that FIN: the peer closed (siw resets what reaches a closed socket) while bytes of ours were in
    flight. Our end's close was still orderly; any RST of ours, or payload we sent after the peer's FIN, is not
    this."""
    ours = [f for f in frames if f[1] == OUR_IP]
    peer = [f for f in frames if f[1] != OUR_IP]
    if any(f[2] for f in ours):
        return False
    peer_fin = min((f[0] for f in peer if f[3]), default=None)
    first_rst = min((f[0] for f in peer if f[2]), default=None)
    if peer_fin is None or first_rst is None or first_rst < peer_fin:
        return False
    return max((f[0] for f in ours if f[4] > 0), default=0.0) < peer_fin


def analyze(cases, lab, expect_crc=True):
    """The capture: per TCP stream, flags and RDMAP opcodes; malformed frames; CRCs."""
    # rpcordma, smb_direct: they claim iWARP payloads. ecatf: EtherCAT over TCP/UDP port 34980, which is in Linux's
    # ephemeral range: a guest's perftest out-of-band connection from that port was read as a malformed EtherCAT
    # mailbox (2026-11-28).
    base = ["tshark", "-n", "-r", lab.pcap, "--disable-protocol", "rpcordma", "--disable-protocol", "smb_direct",
            "--disable-protocol", "ecatf"]
    problems = []
    malformed = subprocess.run(base + ["-Y", "_ws.malformed"], capture_output=True, text=True).stdout.strip()
    if malformed:
        malformed = "\n".join(l for l in malformed.splitlines() if l.split()[0] not in reused_port_mpa_frames(base))
    if malformed:
        problems.append("malformed frames:\n" + malformed[:3000])
    fields = subprocess.run(base + ["-T", "fields", "-E", "separator=|", "-e", "tcp.stream", "-e", "frame.time_epoch",
                                    "-e", "tcp.flags.reset", "-e", "iwarp_rdma.opcode", "-e", "iwarp_mpa.rev",
                                    "-e", "ip.src", "-e", "tcp.flags.fin", "-e", "tcp.len", "-Y", "tcp"],
                            capture_output=True, text=True).stdout
    streams = {}
    # tshark verifies the MPA CRC of every FPDU of a connection that negotiated it ("Good/Bad CRC32").
    crc_text = subprocess.run(base + ["-Y", "iwarp_mpa.crc_check", "-V"], capture_output=True, text=True).stdout
    crc_good, crc_bad = crc_text.count("(Good CRC32)"), crc_text.count("(Bad CRC32)")
    for line in fields.splitlines():
        stream, t, rst, ops, rev, src, fin, length = (line.split("|") + [""] * 8)[:8]
        if not stream:
            continue
        s = streams.setdefault(stream, {"t0": float(t), "rst": 0, "term": 0, "rdma": False, "frames": []})
        s["rdma"] = s["rdma"] or bool(ops.strip())
        s["rst"] += rst in ("1", "True")
        s["term"] += sum(1 for o in ops.split(",") if o.strip() in ("7", "0x07", "0x7"))
        s["frames"].append((float(t), src, rst in ("1", "True"), fin in ("1", "True"), int(length or 0)))
    if crc_bad or (expect_crc and crc_good == 0):  # the CRC cases put thousands of checked FPDUs on the wire
        problems.append("%d FPDUs with a bad CRC, %d good" % (crc_bad, crc_good))
    unclean, crossed = [], []
    for sid, s in streams.items():
        case = next((w for w in cases.windows if w[1] <= s["t0"] <= w[2]), None)
        # Only connections that reached RDMA mode have an orderly close to check. One that never got there is a
        # connect attempt refused: e.g. the VM's `retry rping -c` knocking while the previous server process is
        # on its way out (it serves one session), whose TCP stack resets the request it will not answer.
        if case is None or not case[3] or not s["rdma"]:
            continue
        if s["rst"] and not s["term"] and fin_crossed(s["frames"]):
            crossed.append(sid)  # the peer's close met bytes of ours already on their way: not our disorder
        elif s["rst"] or s["term"]:
            unclean.append("stream %s (%s): %d RST, %d TERMINATE" % (sid, case[0], s["rst"], s["term"]))
    if unclean:
        problems.append("orderly closes that were not:\n  " + "\n  ".join(unclean))
    if crossed:
        log("capture: the peer reset stream(s) %s after its own FIN, answering bytes of ours sent before that FIN "
            "(a TCP crossing: e.g. a first-FPDU nudge still in flight when a fast server closed)" % ", ".join(crossed))
    detail = "%d TCP streams, %d FPDUs with a CRC checked (%d bad); %s" % (
        len(streams), crc_good + crc_bad, crc_bad, "; ".join(problems) if problems else "no malformed frame")
    cases.results.append(("capture: no malformed frame, CRCs good, orderly closes are FINs only", not problems, detail))
    log("%s: capture: %s" % ("PASS" if not problems else "FAIL", detail))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rping", required=True)
    ap.add_argument("--pingpong", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--softrdma-run", required=True)
    # Sanitizer builds: the runtime to preload into the stock programs under softrdma-run (SOFTRDMA_PRELOAD),
    # as the drop-in suite does; their own leaks (perftest frees nothing) are not checked.
    ap.add_argument("--preload", default="")
    ap.add_argument("--siw-vm", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                     "shared", "siw-vm"))
    ap.add_argument("--keep-logs", default="")
    ap.add_argument("--only", choices=("all", "dropin"), default="all",
                    help="dropin: only the drop-in cases (stock programs on both ends)")
    a = ap.parse_args()
    siwvm = os.path.realpath(a.siw_vm)

    if os.geteuid() != 0:
        skip("needs root (network namespaces, tap devices, QEMU)")
    if not os.path.isfile(os.path.join(siwvm, "run-vm.sh")):
        skip("no siw VM scripts at %s (../shared/siw-vm beside the clone)" % siwvm)
    for tool in ("qemu-system-x86_64", "ip", "tshark"):
        if shutil.which(tool) is None:
            skip("%s is not installed" % tool)
    probe = "srdma-probe%d" % os.getpid()
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        skip("cannot create network namespaces here")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)

    cache = os.environ.get("SIWVM_CACHE", "/var/tmp/siw-vm")
    out = os.environ.get("SIWVM_OUT", os.path.join(cache, "out"))
    if not (os.path.exists(os.path.join(out, "vmlinuz")) and os.path.exists(os.path.join(out, "initramfs.cpio.gz"))):
        log("building the siw VM image (once; cached in %s)" % cache)
        r = subprocess.run([os.path.join(siwvm, "build.sh")], capture_output=True, text=True)
        alt = consistent_kernel() if r.returncode != 0 else None
        if alt is not None and alt != os.environ.get("SIWVM_KPKG"):
            # Between two kernel uploads the archive can hold the image linux-image-amd64 names without the
            # linux-kbuild or linux-source of its version (superseded by the next upload): build.sh cannot compile
            # siw.ko for it. Any 6.1 kernel serves as the siw peer: take the newest whose inputs are all there.
            log("the default kernel's build inputs are incomplete in the archive; building with %s instead" % alt)
            r = subprocess.run([os.path.join(siwvm, "build.sh")], capture_output=True, text=True,
                               env=dict(os.environ, SIWVM_KPKG=alt))
        if r.returncode != 0:
            print("FAIL: building the siw VM image failed:\n" + (r.stdout + r.stderr)[-4000:])
            return 1

    workdir = a.keep_logs or tempfile.mkdtemp(prefix="softrdma-interop-")
    if a.keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)  # this run's logs only
    os.makedirs(workdir, exist_ok=True)
    exe = {"rping": a.rping, "pingpong": a.pingpong, "probe": a.probe, "softrdma_run": a.softrdma_run}
    if a.preload:
        os.environ["SOFTRDMA_PRELOAD"] = a.preload
    lab = Lab(siwvm, workdir)
    cases = Cases(lab, exe)
    started = time.time()

    def interrupted(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, interrupted)
    vms = []
    try:
        lab.up()
        for variant in ("stock", "crc", "p2p") if a.only == "all" else ():
            vms.append((server_cases(cases, lab, variant), variant))
            guest = lab.guest_log("vm1")
            bad = [l for l in guest.splitlines() if KERNEL_ERRORS.search(l)]
            cases.results.append(("%s guest kernel log free of errors" % variant, not bad, "\n".join(bad[:40])))
            log("%s: %s guest kernel log%s" % ("PASS" if not bad else "FAIL", variant, "" if not bad else ":\n" + "\n".join(bad[:40])))
        if a.only == "all":
            client_cases(cases, lab)
            guest = lab.guest_log("vm2")
            bad = [l for l in guest.splitlines() if KERNEL_ERRORS.search(l)]
            cases.results.append(("client VM kernel log free of errors", not bad, "\n".join(bad[:40])))
        dropin_cases(cases, lab)
    except KeyboardInterrupt as e:
        cases.results.append(("interrupted", False, str(e)))
    except Exception as e:  # a harness failure is a test failure, after teardown
        cases.results.append(("harness", False, repr(e)))
    finally:
        lab.down()
    if os.path.exists(lab.pcap):
        analyze(cases, lab, expect_crc=a.only == "all")
    failed = [r for r in cases.results if not r[1]]
    print("\n== siw interop: %d checks, %d failed, %.0f s (logs and capture in %s)"
          % (len(cases.results), len(failed), time.time() - started, workdir))
    for name, ok, detail in cases.results:
        print("  %s  %s" % ("ok  " if ok else "FAIL", name))
    for name, _, detail in failed:
        print("\n--- %s\n%s" % (name, detail[-4000:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
