"""How much of the averaging DaSGD hides behind computation, beside local SGD and sync SGD.

    python benchmarks/dasgd_overlap.py                 # simulated cluster: MNIST-1D CNN, 8 workers
    python benchmarks/dasgd_overlap.py --steps 100     # quicker
    python benchmarks/dasgd_overlap.py --torch 4       # also 4 gloo processes, stragglers slept for real

Simulated cluster. Each variant runs twice with the same seed: on the given network, and on a free
one (infinite bandwidth, no latency), which leaves only the compute schedule. ``exposed`` is the
difference of the two simulated times: the communication that workers waited for. ``comm`` is the
time all collectives took (``transport.comm_time_s``), so ``hidden = 1 - exposed / comm`` is the share
of it that ran behind computation. DaSGD starts the allreduce and waits for it only d steps later
(``transports/sim.py`` documents the clock of a non-blocking collective).

torch backend (``--torch N``): the same two local-update variants on N processes started by
``gradwire launch``, with the straggler model's compute times slept for real; the wall-clock time
per step of DaSGD against local SGD is what the background allreduce (``async_op``) saves. On one
machine over loopback the allreduce of this small model takes well under a millisecond, so expect
little difference there: the overlap pays off on a real network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.config import RunConfig  # noqa: E402
from gradwire.reproduce.dasgd import FREE_NETWORK as FREE  # noqa: E402
from gradwire.reproduce.dasgd import hidden_share  # noqa: E402
from gradwire.run.loop import Run  # noqa: E402

VARIANTS = ["sync", "local:period=4", "dasgd:period=4,delay=1", "dasgd:period=4,delay=2", "dasgd:period=4,delay=4"]
STRAGGLERS = ["none:compute_s=0.02", "tail:p=0.05,slowdown=10,compute_s=0.02"]


def simulate(cfg: RunConfig) -> tuple[float, float, int]:
    r = Run(cfg)
    for _ in range(cfg.steps):
        r.train_step()
    return r.clock.now, r.transport.comm_time_s, r.transport.bytes_sent


def sim_table(args, common: RunConfig) -> str:
    """``common``: the run flags' config (task, workers, steps, network, data_dir)."""
    lines = [f"Simulated: {args.task}, {args.workers} workers, {args.steps} steps, network {args.network}", "",
             "| stragglers | algorithm | time/step (ms) | comm (s) | exposed (s) | hidden | MB sent |",
             "|---|---|---|---|---|---|---|"]
    for stragglers in STRAGGLERS:
        for spec in VARIANTS:
            base = common.replace(algorithm=spec, lr=0.05, momentum=0.9, stragglers=stragglers)
            total, comm, sent = simulate(base)
            compute_only, _, _ = simulate(base.replace(network=FREE))
            exposed = total - compute_only
            lines.append(f"| `{stragglers}` | `{spec}` | {1e3 * total / args.steps:.1f} | {comm:.2f} | "
                         f"{exposed:.2f} | {hidden_share(total, compute_only, comm):.0%} | {sent / 1e6:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def torch_table(args) -> str:
    lines = [f"torch backend: {args.torch} gloo processes, {args.task}, {args.steps} steps, stragglers slept", "",
             "| stragglers | algorithm | wall time/step (ms) |", "|---|---|---|"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for stragglers in STRAGGLERS:
        for spec in ("local:period=4", "dasgd:period=4,delay=2"):
            with tempfile.TemporaryDirectory() as out:
                cmd = [sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", str(args.torch), "--", "run",
                       "--task", args.task, "--steps", str(args.steps), "--eval-every", str(args.steps),
                       "--algorithm", spec, "--stragglers", stragglers, "--out", out, "--data-dir", args.data_dir]
                subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=1800)
                summary = json.loads((Path(out) / "summary.json").read_text())
            lines.append(f"| `{stragglers}` | `{spec}` | {1e3 * summary['sim_time_s'] / args.steps:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_flags(ap, only=("task", "workers", "steps", "network", "data_dir"),
                  defaults={"task": "mnist1d-cnn", "workers": 8, "steps": 200})
    ap.add_argument("--torch", type=int, default=0, metavar="N", help="also run on N gloo processes")
    args, common = parse_run_args(ap, argv)
    print(sim_table(args, common))
    if args.torch:
        print()
        print(torch_table(args))


if __name__ == "__main__":
    main()
