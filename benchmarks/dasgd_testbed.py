"""DaSGD's overlap on real processes over a real, rate-limited network (needs root).

Runs local SGD and DaSGD on the network-namespace test bed (scripts/testbed.py: N nodes, one gloo
process each, tc tbf on every link), MNIST-1D MLP (15,210 parameters, 60.8 KB per dense exchange),
with each step's compute made a near-constant `compute_s` by the straggler model (slept for
real). Prints wall seconds per step, the seconds spent blocked in collectives (`comm_time_s`) and
the pure-compute floor, side by side.

    sudo python benchmarks/dasgd_testbed.py [--nodes 2] [--mbps 4] [--steps 40] [--compute-s 0.06]
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

ROOT = Path(__file__).resolve().parents[1]


def run(alg: str, a, out: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "testbed.py"), "--nodes", str(a.nodes), "--mbps", str(a.mbps),
           "--timeout-s", "300", "--", "run", "--task", "mnist1d-mlp", "--steps", str(a.steps), "--eval-every",
           str(a.steps), "--algorithm", alg, "--stragglers", f"lognormal:sigma=0.01,compute_s={a.compute_s}",
           "--lr", "0.05", "--out", str(out), "--data-dir", a.data_dir]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=400)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return {"per_step": (rows[-1]["wall_time_s"] - rows[0]["wall_time_s"]) / a.steps,
            "blocked": summary["comm_time_s"], "mb": rows[-1]["bytes_sent"] / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--mbps", type=float, default=4)
    add_run_flags(ap, only=("steps", "data_dir"), defaults={"steps": 40, "data_dir": str(ROOT / "data-cache")})
    ap.add_argument("--compute-s", type=float, default=0.06)
    a, _ = parse_run_args(ap)
    if os.geteuid() != 0:
        sys.exit("dasgd_testbed.py: the test bed needs root (network namespaces and tc)")
    variants = ["local:period=4", "dasgd:period=4,delay=2", "dasgd:period=4,delay=4"]
    with tempfile.TemporaryDirectory() as tmp:
        res = {v: run(v, a, Path(tmp) / v.replace(":", "_")) for v in variants}
    print(f"{a.nodes} nodes at {a.mbps:g} Mbit/s, MNIST-1D MLP, {a.steps} steps, compute {a.compute_s} s/step\n")
    print("| algorithm | wall s/step | blocked in collectives (s, total) | compute floor s/step | MB sent |")
    print("|---|---|---|---|---|")
    for v, r in res.items():
        print(f"| {v} | {r['per_step']:.3f} | {r['blocked']:.2f} | {a.compute_s:.3f} | {r['mb']:.2f} |")


if __name__ == "__main__":
    main()
