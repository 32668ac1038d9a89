"""Asynchronous LSGD/EASGD (coordinator mode) against their synchronous versions over a real,
rate-limited network (needs root).

Runs each pair on the network-namespace test bed (scripts/testbed.py: one gloo process per node,
tc tbf on every link) with the MNIST-1D MLP (15,210 parameters, 60.8 KB per model). The
synchronous versions run on n nodes; the asynchronous ones on n + 1, the coordinator on node 0
with a link of the same rate, which then carries every report and every model. Worker 0 is slow
for real (the `slow` straggler model, slept). Prints wall seconds per step between the first and
last evaluation (a step is n gradients in every variant), the ratio to the synchronous version,
each worker's local steps, and MB sent.

    sudo python benchmarks/async_testbed.py [--workers 3] [--mbps 10] [--steps 40] [--compute-s 0.03]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [("easgd:period=4", "easgd:async=true,period=4"),
         ("lsgd:pull=0.5,period=2", "lsgd:async=true,pull=0.5,period=2")]


def nodes_of(alg: str, a) -> int:
    """One node (process) per worker, one more for the asynchronous variants' server."""
    return RunConfig(workers=a.workers).processes("async=true" in alg)


def run(alg: str, a, out: Path) -> dict:
    nodes = nodes_of(alg, a)
    cmd = [sys.executable, str(ROOT / "scripts" / "testbed.py"), "--nodes", str(nodes), "--mbps", str(a.mbps),
           "--timeout-s", "400", "--", "run", "--task", "mnist1d-mlp", "--steps", str(a.steps), "--eval-every",
           str(a.steps), "--algorithm", alg, "--stragglers", f"slow:count=1,slowdown={a.slowdown},"
           f"compute_s={a.compute_s}", "--lr", "0.05", "--momentum", "0.9", "--out", str(out),
           "--data-dir", a.data_dir]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    if p.returncode:
        raise SystemExit(f"{alg} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    local = summary.get("local_steps") or {str(w): a.steps for w in range(a.workers)}
    return {"per_step": (rows[-1]["wall_time_s"] - rows[0]["wall_time_s"]) / a.steps,
            "local": "/".join(str(local[str(w)]) for w in range(a.workers)), "mb": summary["bytes_sent"] / 1e6,
            "acc": summary["final"]["test_acc"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(ap, only=("workers", "steps", "data_dir"),
                  defaults={"workers": 3, "steps": 40, "data_dir": str(ROOT / "data-cache")})
    ap.add_argument("--mbps", type=float, default=10)
    ap.add_argument("--compute-s", type=float, default=0.03)
    ap.add_argument("--slowdown", type=float, default=4)
    a, _ = parse_run_args(ap)
    if os.geteuid() != 0:
        sys.exit("async_testbed.py: the test bed needs root (network namespaces and tc)")
    print(f"{a.workers} workers at {a.mbps:g} Mbit/s per link, MNIST-1D MLP, {a.steps} steps, worker 0 "
          f"{a.slowdown:g} x {a.compute_s} s/step, the others {a.compute_s} s/step\n")
    print("| algorithm | nodes | wall s/step | vs sync | local steps | MB sent | test acc |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in PAIRS:
            base = None
            for alg in pair:
                r = run(alg, a, Path(tmp) / alg.replace(":", "_").replace(",", "_").replace("=", ""))
                base = base or r["per_step"]
                nodes = nodes_of(alg, a)
                print(f"| `{alg}` | {nodes} | {r['per_step']:.3f} | {r['per_step'] / base:.2f} | {r['local']} | "
                      f"{r['mb']:.2f} | {r['acc']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
