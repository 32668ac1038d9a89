"""Time from a SIGKILL to full participation again, by phase, on 3 torchft replicas (gloo, loopback).

    .venv/bin/python benchmarks/ft_recovery.py [--task synthetic-logreg] [--kill-step 6] [--steps 150]

Replica 2 kills itself (SIGKILL) after committing --kill-step and is restarted at once. Printed:
the survivors' steps until they went on without it and their step rate meanwhile (a tail:p=0
straggler model paces every step at --compute-s), the restarted process's import of Python + torch
+ gradwire, its time from then to its first committed step (quorum, state transfer, install), the
transfer's size and rate beside loopback's own rate for a buffer of that size. Timings are wall
clock on a shared machine: read them as orders of magnitude.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.fault.harness import ReplicaSet


def loopback_rate(nbytes: int) -> float:
    """Bytes per second of one TCP stream over loopback carrying ``nbytes`` (at least 8 MB)."""
    nbytes = max(nbytes, 8 << 20)
    server = socket.create_server(("127.0.0.1", 0))
    got = []

    def sink():
        conn, _ = server.accept()
        n = 0
        while (chunk := conn.recv(1 << 20)):
            n += len(chunk)
        got.append(n)
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    c = socket.create_connection(server.getsockname())
    start = time.perf_counter()
    c.sendall(bytes(nbytes))
    c.close()
    t.join(timeout=60)
    server.close()
    return got[0] / (time.perf_counter() - start)


def import_seconds() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, gradwire.run.loop, torchft"], check=True, timeout=120)
    return time.perf_counter() - start


PHASES = [  # (from, to, what): the restarted process's marks (fault/replica.py, ft.startup)
    ("line", "driver", "run set-up (task, data, model, algorithm, transport)"),
    ("driver", "manager", "torchft Manager (its server, the Lighthouse connection)"),
    ("manager", "first_step", "run folder, timeline, step-0 evaluation"),
    ("first_step", "first_quorum_call", "snapshot of the step's state"),
    ("first_quorum_call", "quorum_call", "quorum calls before the one it joined (waiting for the others)"),
    ("quorum_call", "quorum", "the quorum call it joined in: quorum, group rebuild, state transfer, install"),
    ("quorum", "computed", "its first step's compute and collectives"),
    ("computed", "committed", "the commit vote"),
]


def phases(line_at: float, ft: dict, committed_seen: float) -> None:
    """The restarted replica's time from its start line to its first committed step, by phase."""
    marks = dict(ft["startup"], line=line_at)
    healed = ft["healed"]
    print("from its start line to its first committed step, by phase:")
    for a, b, what in PHASES:
        if a in marks and b in marks:
            print(f"  {marks[b] - marks[a]:7.3f} s  {what}")
    print(f"  (in the joining quorum call: state transfer {healed['transfer_s']:.3f} s, install "
          f"{healed['install_s']:.3f} s; total to the commit {marks['committed'] - line_at:.3f} s, "
          f"seen in steps.jsonl {committed_seen - line_at:.3f} s after the line)")


def main() -> None:
    ap = argparse.ArgumentParser()
    add_run_flags(ap, only=("task", "algorithm", "steps"), defaults={"task": "synthetic-logreg", "steps": 150})
    ap.add_argument("--kill-step", type=int, default=6)
    ap.add_argument("--compute-s", type=float, default=0.08)
    ap.add_argument("--extra", default="", help="more run flags, e.g. '--lr 0.001'")
    ap.add_argument("--ft-timeout-s", type=float, default=10.0, help="the replicas' timeout_s")
    ap.add_argument("--lighthouse-restart", type=float, default=None, metavar="DOWN_S",
                    help="instead of a kill: stop the Lighthouse after --kill-step for DOWN_S s and start a new one")
    ns, _ = parse_run_args(ap)
    out = Path(tempfile.mkdtemp(prefix="ft-recovery-"))
    if ns.lighthouse_restart is not None:
        return lighthouse_restart(ns, out)
    args = ["--task", ns.task, "--algorithm", ns.algorithm, "--steps", str(ns.steps), "--eval-every", str(ns.steps),
            "--batch-size", "8", "--stragglers", f"tail:p=0,compute_s={ns.compute_s}", *ns.extra.split()]
    # the last step waits for every replica: a restart slower than the survivors' run still rejoins
    rs = ReplicaSet(out, args, replicas=3, min_replicas=2, env={"GRADWIRE_FT_FULL_AT": str(ns.steps)})
    try:
        rs.start_all({2: {"GRADWIRE_KILL_AT": f"2:{ns.kill_step}"}})
        assert rs.wait(2, 300) == -signal.SIGKILL
        killed = time.time()
        log2 = rs.out / "replica-2.log"
        logged = log2.stat().st_size if log2.exists() else 0
        rs.start(2)
        steps2 = rs.folder(2) / "steps.jsonl"
        first, lines = None, []  # lines: (time, text) of what the restarted process logs before it is back
        while first is None and time.time() - killed < 300:
            text = steps2.read_text() if steps2.exists() else ""
            if '"healed"' in text.split("\n", 1)[0]:  # the restarted process's first committed step
                first = time.time()
            new = log2.read_bytes()[logged:].decode(errors="replace").splitlines()
            lines += [(time.time(), line) for line in new[len(lines):] if line.strip()]
            time.sleep(0.01)
        codes = [rs.wait(k, 300) for k in range(3)]
        assert codes == [0, 0, 0], codes
    finally:
        rs.close()
    rec = {k: [json.loads(x) for x in (rs.folder(k) / "steps.jsonl").read_text().splitlines()] for k in range(3)}
    survivor = rec[0]
    alone = [r for r in survivor if r["ft"]["participants"] == [0, 1]]
    back = next(r for r in survivor if r["step"] > alone[0]["step"] and len(r["ft"]["participants"]) == 3)
    before = next(r for r in survivor if r["step"] == ns.kill_step)
    healed = next(r for r in rec[2] if "healed" in r["ft"])["ft"]["healed"]
    rate = len(alone) / (alone[-1]["sim_time_s"] - before["sim_time_s"])
    full = [r for r in survivor if len(r["ft"]["participants"]) == 3 and r["step"] > back["step"]]
    full_rate = len(full) / (full[-1]["sim_time_s"] - full[0]["sim_time_s"] + 1e-9) if len(full) > 1 else float("nan")
    imports = import_seconds()
    loop = loopback_rate(healed["bytes"])
    print(f"kill after step {ns.kill_step}; survivors' first step without it: {alone[0]['step']} "
          f"({alone[0]['step'] - ns.kill_step} step(s) later, {alone[0]['ft']['attempts']} attempt(s), "
          f"{alone[0]['sim_time_s'] - before['sim_time_s']:.2f} s after step {ns.kill_step})")
    print(f"survivors' rate without it: {rate:.2f} steps/s over {len(alone)} steps; with all 3 afterwards: "
          f"{full_rate:.2f} steps/s")
    print(f"restarted replica: import of python+torch+gradwire+torchft alone {imports:.2f} s; spawn -> first "
          f"committed step {first - rs.started[2]:.2f} s; back in the quorum at step {back['step']}")
    own = [(t, line) for t, line in lines if line.startswith("gradwire")]  # its own lines, not library noise
    if own:
        t0, line = own[0]
        print(f"restarted replica's first gradwire log line {t0 - rs.started[2]:.2f} s after spawn ({line[:80]!r}); "
              f"from it to its first committed step (back in the quorum): {first - t0:.2f} s")
        phases(t0, next(r for r in rec[2] if "healed" in r["ft"])["ft"], first)
    else:
        print(f"restarted replica logged no gradwire line before it was back ({len(lines)} other lines)")
    print(f"state transfer: {healed['bytes']} bytes in {healed['transfer_s'] * 1e3:.1f} ms "
          f"({healed['bytes'] / max(healed['transfer_s'], 1e-9) / 1e6:.1f} MB/s; loopback TCP {loop / 1e6:.0f} MB/s): "
          f"waiting for the source to serialise {healed['wait_source_s'] * 1e3:.1f} ms, on the wire "
          f"{healed['wire_s'] * 1e3:.1f} ms ({healed['bytes'] / max(healed['wire_s'], 1e-9) / 1e6:.1f} MB/s), "
          f"torch.load {healed['load_s'] * 1e3:.1f} ms; install {healed['install_s'] * 1e3:.1f} ms")
    print(f"folders: {out}")


def lighthouse_restart(ns, out: Path) -> None:
    """The Lighthouse stopped after --kill-step and a new one started on its port DOWN_S s later:
    the time from the new one's start to the first step committed after it, and what happened."""
    args = ["--task", ns.task, "--algorithm", ns.algorithm, "--steps", str(ns.steps), "--eval-every", str(ns.steps),
            "--batch-size", "8", "--stragglers", f"tail:p=0,compute_s={ns.compute_s}", *ns.extra.split()]
    rs = ReplicaSet(out, args, replicas=3, min_replicas=2, timeout_s=ns.ft_timeout_s,
                    env={"GRADWIRE_FT_FULL_AT": str(ns.steps)})
    steps0 = rs.folder(0) / "steps.jsonl"
    try:
        rs.start_all()
        rs.wait_for_step(0, ns.kill_step, 300)
        stopped = time.time()
        rs.restart_lighthouse(down_s=ns.lighthouse_restart)
        up = time.time()
        done = steps0.read_text().count("\n")  # (a step under way at the stop may still commit)
        first = None
        while first is None and time.time() - up < 300:
            if steps0.read_text().count("\n") > done:
                first = time.time()
            time.sleep(0.01)
        codes = [rs.wait(k, 300) for k in range(3)]
        assert codes == [0, 0, 0], codes
    finally:
        rs.close()
    rec = [json.loads(x) for x in steps0.read_text().splitlines()]
    after = rec[done]
    print(f"timeout_s={ns.ft_timeout_s:g}: Lighthouse stopped after step {ns.kill_step}, a new one up "
          f"{up - stopped:.2f} s later; first step committed after that: {after['step']}, {first - up:.2f} s after "
          f"the new Lighthouse started ({first - stopped:.2f} s after the stop; {after['ft']['attempts']} "
          f"attempt(s), participants {after['ft']['participants']})")
    for e in after["ft"].get("failures", []):
        print(f"  failed attempt: {e}")
    retried = [r["step"] for r in rec if r["ft"].get("failures") and r is not after]
    print(f"other steps with failed attempts: {retried or 'none'}; every replica finished step {ns.steps}")
    print(f"folders: {out}")


if __name__ == "__main__":
    main()
