"""Asynchronous LSGD and EASGD on real processes against their synchronous versions.

    python benchmarks/async_coordinator.py               # 3 workers, 120 steps, two straggler models
    python benchmarks/async_coordinator.py --steps 60    # quicker

Every variant runs through ``gradwire launch`` (gloo, one worker per process; the asynchronous
ones with one more process, the coordinator), with the straggler model's compute times slept for
real. ``ms/step`` is wall-clock time per step of the run loop between its first and last step (a
step is n gradient computations in every variant), ``vs sync`` the ratio to the synchronous version
of the same algorithm measured in this run. ``local steps`` are each worker's own step counts
(synchronous variants: every worker takes exactly ``steps``). Peak RSS is the largest of any
process of the run (``getrusage`` of the children of a fresh parent per run).
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

PAIRS = [("easgd:period=4", "easgd:async=true,period=4"),
         ("lsgd:pull=0.5,period=2", "lsgd:async=true,pull=0.5,period=2")]
# `none`: nothing is slept, so a step is the raw compute plus the protocol; `slow`: worker 0 sleeps
# 40 ms a step, the others 10 ms
STRAGGLERS = ["none:compute_s=0.01", "slow:count=1,slowdown=4,compute_s=0.01"]


def launch(spec: str, stragglers: str, args, out: Path) -> dict:
    asynchronous = "async=true" in spec
    nproc = RunConfig(workers=args.workers).processes(asynchronous)  # the server's process too
    cmd = [sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", str(nproc), "--", "run",
           "--task", args.task, "--algorithm", spec, "--stragglers", stragglers, "--steps", str(args.steps),
           "--eval-every", str(args.steps), "--lr", "0.05", "--momentum", "0.9", "--batch-size", "32",
           "--out", str(out), "--data-dir", args.data_dir, "--timeout-s", "120"]
    # a fresh parent per run, so that its children's peak RSS is this run's alone
    peak = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bounded import run_group

    # the run's own waits: 120 s each; a timeout ends the wrapper's children too
    p = run_group([sys.executable, "-c", peak, *cmd], 1800, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                  env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode:
        raise SystemExit(f"{spec} failed:\n{p.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    per_step = (steps[-1]["sim_time_s"] - steps[0]["sim_time_s"]) / (len(steps) - 1)
    local = summary.get("local_steps") or {str(w): args.steps for w in range(args.workers)}
    return {"ms": 1e3 * per_step, "local": [local[str(w)] for w in range(args.workers)],
            "mb": summary["bytes_sent"] / 1e6, "acc": summary["final"]["test_acc"],
            "rss": int(p.stdout.split()[-1]) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_flags(ap, only=("task", "workers", "steps", "data_dir"),
                  defaults={"workers": 3, "steps": 120,
                            "data_dir": str(Path(__file__).resolve().parents[1] / "data-cache")})
    args, _ = parse_run_args(ap)
    print(f"{args.task}, {args.workers} workers, {args.steps} steps, gloo on one machine\n")
    print("| stragglers | algorithm | ms/step | vs sync | local steps | MB sent | test acc | peak RSS (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for stragglers in STRAGGLERS:
            for pair in PAIRS:
                base = None
                for spec in pair:
                    r = launch(spec, stragglers, args, Path(tmp) / f"{len(os.listdir(tmp))}")
                    base = base or r["ms"]
                    print(f"| `{stragglers}` | `{spec}` | {r['ms']:.1f} | {r['ms'] / base:.2f} | "
                          f"{'/'.join(map(str, r['local']))} | {r['mb']:.2f} | {r['acc']:.3f} | {r['rss']:.0f} |",
                          flush=True)


if __name__ == "__main__":
    main()
