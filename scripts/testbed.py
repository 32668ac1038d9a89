#!/usr/bin/env python3
"""A bandwidth-limited cluster on one machine: N network namespaces behind a rate-limited switch.

Each node is a network namespace with one interface, ``veth0``, wired to a Linux bridge in a
"switch" namespace. A token bucket (``tc tbf``) on BOTH ends of every wire limits each node's
upload (node-side egress) and download (switch-side egress) to ``--mbps``, as a switch with
``--mbps`` NICs would. ``gradwire launch`` runs in every node namespace, one process per node,
with gloo bound to ``veth0``; afterwards (and on error, Ctrl-C or SIGTERM) every process in the
namespaces is killed and the namespaces are deleted. Nothing is configured outside them: the
10.77.0.0/24 addresses exist only inside the namespaces, which have no route anywhere else.

                          switch namespace (<prefix>-sw)
                    ┌──────────────── br0 ────────────────┐
                    p0 [tbf]         p1 [tbf]   ...       pN-1 [tbf]    switch-side egress = download
                    │                │                    │
              veth0 [tbf]      veth0 [tbf]          veth0 [tbf]         node-side egress = upload
              <prefix>-h0      <prefix>-h1          <prefix>-hN-1
              10.77.0.10       10.77.0.11           10.77.0.(10+N-1)
              (rendezvous)

Docs: docs/testbed.md. Needs root (network namespaces), ``ip`` and ``tc`` (iproute2).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SUBNET = "10.77.0"  # private; exists only inside the namespaces this script creates
FIRST_HOST = 10  # node i is 10.77.0.(10+i): two digits, so sorting addresses as text sorts by node
MAX_NODES = 64
IFNAME = "veth0"  # the node's interface, the same name in every node namespace
RDZV_PORT = 29400  # fixed, but inside node 0's private namespace: it cannot collide with anything
PROBE_PORT = 5201

EPILOG = """examples:
  # prove the limit is real: build 2 nodes at 50 Mbit/s, time a 5 MB transfer, tear down
  sudo .venv/bin/python scripts/testbed.py --check --nodes 2 --mbps 50
  # 4 workers over 100 Mbit/s links (everything after -- is a `gradwire run` command line)
  sudo .venv/bin/python scripts/testbed.py --nodes 4 --mbps 100 -- run --task mnist1d-cnn \\
      --algorithm diana --compressor qsgd:levels=7,bucket=128 --lr 0.1 --momentum 0.9 --steps 600 --out runs/tb-diana
  # any torch.distributed script instead of gradwire run (here the plain-DDP baseline of
  # benchmarks/time_to_accuracy.py): torchrun runs it on every node with the same rendezvous
  sudo .venv/bin/python scripts/testbed.py --nodes 4 --mbps 100 -- torchrun benchmarks/ddp_train.py \
      --optimizer adamw --lr 1e-3 --steps 200 --out runs/tb-ddp
  # remove what a SIGKILLed testbed left behind (namespaces whose names start with the prefix)
  sudo .venv/bin/python scripts/testbed.py --cleanup gw-12345

How a run is wired: node i runs `gradwire launch --nnodes N --node-rank i --nproc-per-node 1
--rdzv-endpoint 10.77.0.10:29400 -- run ... --workers N --backend torch` inside its namespace with
GLOO_SOCKET_IFNAME=TP_SOCKET_IFNAME=veth0 (gloo binds there), PET_LOCAL_ADDR=<its address> (what
torchrun advertises, instead of the machine's host name, which the namespaces cannot reach) and
PET_RDZV_CONF=is_host=1 on node 0 only (node 0 serves the rendezvous store; torchrun cannot guess
it, as 10.77.0.10 is not the machine's host name). Every node gets the same --out: only global
rank 0 writes, and ranks follow node order. Node 0 prints to this terminal; the others log to
OUT/testbed/node<i>.log. OUT/testbed/testbed.json records the bed and every node's exit code.
With `-- torchrun SCRIPT.py ARGS` every node runs `python -m torch.distributed.run` with the same
rendezvous flags and environment on that script instead (OUT is the script's --out, if it has one).

Exit status: 0 when every node exited 0; 1 when one failed or timed out; 2 on bad usage or
without root. Latency (--latency-ms) needs the kernel's sch_netem; tbf alone adds none.
More, with measured figures: docs/testbed.md."""


@dataclass(frozen=True)
class BedConfig:
    nodes: int  # number of node namespaces (>= 2), one gradwire process each
    mbps: float  # rate of every link, each direction, in Mbit/s (tbf rate)
    latency_ms: float = 0.0  # added one-way node-to-node delay (netem; half on each egress)
    burst_kbit: float = 32.0  # tbf bucket: > one 1514-byte frame, small so the rate holds at ms scale
    queue_ms: float = 50.0  # tbf latency: longest a packet may queue before tbf drops it
    prefix: str = field(default_factory=lambda: f"gw-{os.getpid()}")  # namespace name prefix

    def validate(self) -> BedConfig:
        if not 2 <= self.nodes <= MAX_NODES:
            raise ValueError(f"--nodes {self.nodes} must be in 2..{MAX_NODES}")
        if not 0.01 <= self.mbps <= 10_000:
            raise ValueError(f"--mbps {self.mbps} must be in 0.01..10000")
        if self.latency_ms < 0:
            raise ValueError(f"--latency-ms {self.latency_ms} must be >= 0")
        if not self.prefix.replace("-", "").isalnum() or len(self.prefix) > 20:
            raise ValueError(f"--prefix {self.prefix!r}: letters, digits and '-', at most 20")
        return self

    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def host(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{FIRST_HOST + i}"


def sh(*argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    """Run one iproute2 command; on failure raise with its message (bounded by ``timeout``)."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"`{shlex.join(argv)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def namespaces_with(prefix: str) -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.strip() and line.split()[0].startswith(prefix + "-")]


def remove_namespaces(names: list[str]) -> list[str]:
    """Kill every process inside each namespace (all started by us: the namespaces are ours), then
    delete it, which deletes its veths. Returns the names that could not be deleted."""
    for ns in names:
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", ns, check=False)
    left = set(sh("ip", "netns", "list", check=False).stdout.split())
    return [ns for ns in names if ns in left]


def _link_qdiscs(ns: str, dev: str, cfg: BedConfig, delay_ms: float) -> None:
    """Rate limit (and delay) what ``dev`` sends. tbf: rate, bucket ``burst`` (it must hold a full
    frame, or tbf drops it; small, so that short bursts cannot exceed the rate), and a queue of
    ``latency`` worth of bytes. With a delay, netem is the root and tbf its child (the recipe of
    the netem documentation), so packets are delayed, then paced."""
    tbf = ["tbf", "rate", f"{cfg.mbps}mbit", "burst", f"{cfg.burst_kbit}kbit", "latency", f"{cfg.queue_ms}ms"]
    if delay_ms <= 0:
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)
        return
    p = sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms",
           "limit", "100000", check=False)
    if p.returncode != 0:
        raise RuntimeError(f"--latency-ms needs the netem qdisc, which this kernel refuses ({p.stderr.strip()}); "
                           "it needs CONFIG_NET_SCH_NETEM / module sch_netem. Run with --latency-ms 0.")
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)


class Testbed:
    """The namespaces, built on ``__enter__`` and deleted on ``__exit__`` (also after errors)."""

    def __init__(self, cfg: BedConfig):
        self.cfg = cfg
        self.created: list[str] = []

    def __enter__(self) -> Testbed:
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _add_ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.created.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        cfg, sw = self.cfg, self.cfg.switch()
        self._add_ns(sw)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for i in range(cfg.nodes):
            ns, port = cfg.host(i), f"p{i}"
            self._add_ns(ns)
            # Both ends are created inside our namespaces: nothing ever appears in the root namespace.
            sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
            sh("ip", "-n", sw, "link", "set", port, "master", "br0")
            sh("ip", "-n", ns, "addr", "add", f"{cfg.addr(i)}/24", "dev", IFNAME)
            _link_qdiscs(ns, IFNAME, cfg, cfg.latency_ms / 2)  # upload
            _link_qdiscs(sw, port, cfg, cfg.latency_ms / 2)  # download
            sh("ip", "-n", ns, "link", "set", IFNAME, "up")
            sh("ip", "-n", sw, "link", "set", port, "up")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # bridge ports forward at once (no STP); check, bounded
            links = sh("ip", "-n", sw, "-d", "link", "show", "master", "br0").stdout
            if links.count("state forwarding") >= cfg.nodes:
                return
            time.sleep(0.1)
        raise RuntimeError(f"bridge ports not forwarding after 10 s:\n{links}")

    def teardown(self) -> None:
        # A second Ctrl-C or SIGTERM must not cut the teardown short: it takes well under a second.
        saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            failed = remove_namespaces(list(reversed(self.created)))
            self.created = []
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        if failed:
            print(f"testbed: could not delete namespaces {failed}; run: ip netns del NAME", file=sys.stderr)

    def counters(self) -> list[dict]:
        """Per node: bytes its veth sent and received (frames as tbf counts them: payload + TCP/IP
        + Ethernet headers, rendezvous and retransmissions included) and packets its upload and
        download qdiscs dropped (a full tbf queue)."""
        def drops(ns: str, dev: str) -> int:
            qdiscs = json.loads(sh("tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev).stdout or "[]")
            return sum(q.get("drops", 0) for q in qdiscs if q.get("kind") == "tbf")

        out = []
        for i in range(self.cfg.nodes):
            ns = self.cfg.host(i)
            stats = json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", IFNAME).stdout)[0]["stats64"]
            out.append({"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                        "upload_drops": drops(ns, IFNAME), "download_drops": drops(self.cfg.switch(), f"p{i}")})
        return out

    def argv(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.cfg.host(i), *argv]

    def describe(self) -> str:
        cfg = self.cfg
        delay = f", +{cfg.latency_ms:g} ms one-way" if cfg.latency_ms else ""
        return (f"testbed {cfg.prefix}: {cfg.nodes} nodes {cfg.addr(0)}..{cfg.addr(cfg.nodes - 1)} on a bridge, "
                f"{cfg.mbps:g} Mbit/s up and down per node (tbf burst {cfg.burst_kbit:g} kbit, "
                f"queue {cfg.queue_ms:g} ms){delay}")


# -- --check: a tiny, bounded throughput probe run inside the namespaces ------------------------

def probe_recv(addr: str, port: int, senders: int, timeout_s: float) -> dict:
    """Accept ``senders`` connections and read each to its end. The rate counts the bytes after
    each connection's first read, over the time from the earliest first read to the last read, so
    connection set-up and TCP's first window are not in it."""
    deadline = time.monotonic() + timeout_s
    srv = socket.create_server((addr, port))
    srv.settimeout(timeout_s)
    sel = selectors.DefaultSelector()
    for _ in range(senders):
        conn, _ = srv.accept()
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ, {"bytes": 0, "first": 0})
    stats = [key.data for key in sel.get_map().values()]
    t_first = t_last = None
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
            data = key.fileobj.recv(1 << 16)
            now = time.perf_counter()
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                continue
            if key.data["bytes"] == 0:
                key.data["first"] = len(data)
                t_first = now if t_first is None else t_first
            key.data["bytes"] += len(data)
            t_last = now
    complete = not sel.get_map()
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    srv.close()
    timed = sum(s["bytes"] - s["first"] for s in stats)
    seconds = (t_last - t_first) if t_first is not None else 0.0
    return {"complete": complete, "bytes": [s["bytes"] for s in stats], "seconds": seconds,
            "mbps": timed * 8 / seconds / 1e6 if seconds > 0 else None}


def probe_send(addr: str, port: int, nbytes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for _ in range(200):  # the receiver may still be starting: retry, bounded in count and time
        try:
            s = socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    else:
        raise SystemExit(f"probe: could not connect to {addr}:{port}")
    s.settimeout(max(0.1, deadline - time.monotonic()))
    chunk, left = b"\0" * (1 << 16), nbytes
    while left > 0 and time.monotonic() < deadline:
        left -= s.send(chunk[: min(left, len(chunk))])
    s.shutdown(socket.SHUT_WR)
    s.close()


def measure(bed: Testbed, senders: list[int], receiver: int, nbytes: int, timeout_s: float = 60.0) -> dict:
    """Send ``nbytes`` from each of ``senders`` to ``receiver`` at once; the receiver's figures."""
    me, addr = str(Path(__file__).resolve()), bed.cfg.addr(receiver)
    recv = subprocess.Popen(bed.argv(receiver, [sys.executable, me, "_probe", "recv", addr, str(PROBE_PORT),
                                                str(len(senders)), str(timeout_s)]),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    sends = [subprocess.Popen(bed.argv(i, [sys.executable, me, "_probe", "send", addr, str(PROBE_PORT),
                                           str(nbytes), str(timeout_s)]), start_new_session=True)
             for i in senders]
    try:
        out, _ = recv.communicate(timeout=timeout_s + 10)
        codes = [p.wait(timeout=10) for p in sends]
    finally:
        for p in [recv, *sends]:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    result = json.loads(out.strip().splitlines()[-1])
    if not result["complete"] or any(codes) or any(b != nbytes for b in result["bytes"]):
        raise RuntimeError(f"probe incomplete: senders exited {codes}, receiver got {result}")
    return result


def check(bed: Testbed, nbytes: int) -> dict:
    cfg = bed.cfg
    pair = measure(bed, [0], 1, nbytes)
    report = {"mbps_limit": cfg.mbps, "bytes": nbytes, "pair": {"from": cfg.host(0), "to": cfg.host(1)} | pair}
    print(f"{cfg.host(0)} -> {cfg.host(1)}: {nbytes / 1e6:g} MB in {pair['seconds']:.3f} s = "
          f"{pair['mbps']:.1f} Mbit/s (limit {cfg.mbps:g}, {pair['mbps'] / cfg.mbps:.0%})", flush=True)
    if cfg.nodes >= 3:  # two uploads into one download: the receiver's link is the bottleneck
        fan = measure(bed, [1, 2], 0, nbytes)
        report["fan_in"] = {"from": [cfg.host(1), cfg.host(2)], "to": cfg.host(0)} | fan
        print(f"{cfg.host(1)} + {cfg.host(2)} -> {cfg.host(0)}: {2 * nbytes / 1e6:g} MB in {fan['seconds']:.3f} s = "
              f"{fan['mbps']:.1f} Mbit/s in total (one download link: limit {cfg.mbps:g})", flush=True)
    return report


# -- running gradwire across the nodes ------------------------------------------------------

def _flag(argv: list[str], name: str) -> str | None:
    for j, a in enumerate(argv):
        if a == name and j + 1 < len(argv):
            return argv[j + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def node_env(cfg: BedConfig, i: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "GLOO_SOCKET_IFNAME": IFNAME,  # gloo's pairs bind to veth0, not to the host name's address
        "TP_SOCKET_IFNAME": IFNAME,  # the same for TensorPipe (RPC), should a run use it
        "PET_LOCAL_ADDR": cfg.addr(i),  # torchrun --local-addr: the address other nodes dial
        "PET_RDZV_CONF": f"is_host={int(i == 0)}",  # torchrun --rdzv-conf: node 0 serves the store
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    })
    return env


def node_argv(cfg: BedConfig, i: int, mode: str, argv: list[str]) -> list[str]:
    """What node ``i`` runs: ``gradwire launch ... -- run ARGV`` (mode "run"), or torchrun itself
    with the same rendezvous on ``SCRIPT ARGS`` (mode "torchrun": any torch.distributed script,
    e.g. a plain DDP baseline; it reads RANK and WORLD_SIZE from the environment as usual)."""
    rdzv = ["--nnodes", str(cfg.nodes), "--nproc-per-node", "1", "--rdzv-endpoint", f"{cfg.addr(0)}:{RDZV_PORT}",
            "--rdzv-id", cfg.prefix]
    if mode == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *rdzv, "--rdzv-backend", "c10d",
                "--node-rank", str(i), *argv]
    return [sys.executable, "-m", "gradwire", "launch", *rdzv, "--node-rank", str(i), "--", "run", *argv]


def run_nodes(bed: Testbed, run_argv: list[str], timeout_s: float, grace_s: float = 30.0,
              mode: str = "run") -> dict:
    """Start ``gradwire launch`` (or, with mode "torchrun", torchrun on a script: ``run_argv`` is
    then ``SCRIPT ARGS``) on every node; wait for all, bounded by ``timeout_s`` (and by ``grace_s``
    once one node has failed); stop what is left. Returns exit codes and times."""
    cfg = bed.cfg
    out = Path(_flag(run_argv, "--out") or "runs/run").resolve()
    logs = out / "testbed"
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    started = time.monotonic()
    try:
        for i in range(cfg.nodes):
            argv = bed.argv(i, node_argv(cfg, i, mode, run_argv))
            sink = None if i == 0 else open(logs / f"node{i}.log", "w")  # noqa: SIM115 (closed below)
            files += [sink] if sink else []
            procs.append(subprocess.Popen(argv, env=node_env(cfg, i), stdout=sink, stderr=sink,
                                          start_new_session=True))
        deadline = started + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + grace_s)
            time.sleep(0.2)
    finally:
        stragglers = [i for i, p in enumerate(procs) if p.poll() is None]
        if stragglers:
            print(f"testbed: stopping nodes {stragglers} after {time.monotonic() - started:.0f} s", file=sys.stderr)
        for i in stragglers:  # SIGTERM the launcher's process group: torchrun stops its workers
            os.killpg(procs[i].pid, signal.SIGTERM)
        for i in stragglers:
            try:
                procs[i].wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(procs[i].pid, signal.SIGKILL)
                procs[i].wait(timeout=30)
        for f in files:
            f.close()
    codes = [p.returncode for p in procs]
    links = bed.counters()
    result = {"testbed": asdict(cfg), "addresses": [cfg.addr(i) for i in range(cfg.nodes)],
              "rendezvous": f"{cfg.addr(0)}:{RDZV_PORT}", "run_argv": run_argv, "exit_codes": codes,
              "timed_out": stragglers, "elapsed_s": time.monotonic() - started, "links": links}
    (logs / "testbed.json").write_text(json.dumps(result, indent=2) + "\n")
    for i, code in enumerate(codes):
        note = " (timed out, stopped)" if i in stragglers else ""
        log = "" if i == 0 else f"  log: {logs / f'node{i}.log'}"
        print(f"testbed: node {i} ({cfg.addr(i)}) exited {code}{note}, sent {links[i]['tx_bytes'] / 1e6:.2f} MB"
              f"{log}", file=sys.stderr)
    dropped = sum(x["upload_drops"] + x["download_drops"] for x in links)
    print(f"testbed: {sum(x['tx_bytes'] for x in links) / 1e6:.2f} MB on the wires (veth counters), "
          f"{dropped} packets dropped by tbf; record: {logs / 'testbed.json'}", file=sys.stderr)
    return result


# -- command line ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="testbed.py", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\nDocs:")[0])
    p.add_argument("--nodes", type=int, default=4, help="node namespaces, one worker process each (default 4)")
    p.add_argument("--mbps", type=float, default=100.0,
                   help="link rate in Mbit/s, each node's upload and download alike (default 100)")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="extra one-way node-to-node delay in ms, via netem (default 0: none)")
    p.add_argument("--burst-kbit", type=float, default=32.0,
                   help="tbf bucket in kbit (default 32): must hold one 1514-byte frame (12.1 kbit); a larger "
                   "bucket lets a message that fits in it pass at memory speed after an idle gap")
    p.add_argument("--queue-ms", type=float, default=50.0,
                   help="tbf latency: the queue holds this many ms of traffic, then drops (default 50)")
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="stop every node after this many seconds (default 900)")
    p.add_argument("--prefix", default=f"gw-{os.getpid()}",
                   help="namespace names start with this (default gw-<pid>, unique per invocation)")
    p.add_argument("--check", action="store_true",
                   help="only build the bed, time a transfer between two nodes, print Mbit/s, tear down")
    p.add_argument("--check-mb", type=float, default=5.0, help="MB per sender for --check (default 5)")
    p.add_argument("--json", action="store_true", help="--check: print the result as one JSON object")
    p.add_argument("--cleanup", metavar="PREFIX",
                   help="only delete namespaces named PREFIX-* (and kill their processes) left by a killed run")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="-- run [gradwire run flags], or -- torchrun SCRIPT.py [its flags]")
    return p


class Signalled(Exception):
    """SIGTERM or SIGHUP, raised so that it unwinds through ``with Testbed``: teardown runs."""


def _on_signal(signum, _frame):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt  # also when started in the background, where SIGINT comes ignored
    raise Signalled(signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_probe"]:  # internal: the probe's two ends, run inside the namespaces
        if argv[1] == "recv":
            a, port, senders, timeout = argv[2:6]
            print(json.dumps(probe_recv(a, int(port), int(senders), float(timeout))), flush=True)
        else:
            a, port, nbytes, timeout = argv[2:6]
            probe_send(a, int(port), int(nbytes), float(timeout))
        return 0
    ns = build_parser().parse_args(argv)
    rest = ns.rest[1:] if ns.rest[:1] == ["--"] else ns.rest
    if os.geteuid() != 0:
        print("testbed.py: error: needs root (creating network namespaces and qdiscs); run it with sudo, e.g. "
              "sudo .venv/bin/python scripts/testbed.py --check", file=sys.stderr)
        return 2
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        print(f"testbed.py: error: {' and '.join(missing)} not found (install iproute2)", file=sys.stderr)
        return 2
    if ns.cleanup:
        names = namespaces_with(ns.cleanup)
        failed = remove_namespaces(names)
        print(f"testbed: deleted {len(names) - len(failed)} namespaces named {ns.cleanup}-*"
              + (f"; could not delete {failed}" if failed else ""))
        return 1 if failed else 0
    if not ns.check:
        if rest[:1] == ["torchrun"]:
            if len(rest) < 2 or rest[1].startswith("-"):
                print("testbed.py: error: -- torchrun needs a script: -- torchrun SCRIPT.py [its flags]",
                      file=sys.stderr)
                return 2
        elif rest[:1] != ["run"]:
            print("testbed.py: error: give --check, --cleanup PREFIX, -- run [gradwire run flags] or "
                  "-- torchrun SCRIPT.py [its flags] (see --help)", file=sys.stderr)
            return 2
        workers, backend = _flag(rest, "--workers"), _flag(rest, "--backend")
        if rest[0] == "run" and (workers and int(workers) != ns.nodes) or (backend and backend != "torch"):
            print(f"testbed.py: error: the run has --nodes {ns.nodes} workers on the torch backend; leave "
                  "--workers and --backend out", file=sys.stderr)
            return 2
    try:
        cfg = BedConfig(ns.nodes, ns.mbps, ns.latency_ms, ns.burst_kbit, ns.queue_ms, ns.prefix).validate()
    except ValueError as e:
        print(f"testbed.py: error: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    try:
        with Testbed(cfg) as bed:
            print(bed.describe(), file=sys.stderr if ns.json else sys.stdout, flush=True)
            if ns.check:
                report = check(bed, int(ns.check_mb * 1e6))
                if ns.json:
                    print(json.dumps(report))
                return 0
            result = run_nodes(bed, rest[1:], ns.timeout_s, mode=rest[0])
            return 0 if all(c == 0 for c in result["exit_codes"]) else 1
    except KeyboardInterrupt:
        print("testbed: interrupted (SIGINT); every node stopped, namespaces deleted", file=sys.stderr)
        return 130
    except Signalled as e:
        print(f"testbed: {signal.Signals(e.args[0]).name}; every node stopped, namespaces deleted", file=sys.stderr)
        return 128 + e.args[0]
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"testbed.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
