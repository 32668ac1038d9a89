"""Simulator overhead: simulated worker-steps per second against a plain training loop.

For 8 and 64 workers on the MNIST-1D MLP, runs `sync` on the simulated cluster (gradient of every
worker, allreduce accounting, update) and, in the same process, a plain single-process loop that
takes the same number of gradient steps (forward, backward, optimizer step on an nn.Module with
the same batch size). Prints worker-steps/s of both, the overhead ratio (target <= 1.5) and peak
RSS of each measurement, which runs in its own subprocess so the figures do not mix.

    python benchmarks/simulator.py [--steps 40] [--workers 8 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from gradwire.cli.flags import add_run_flags, parse_run_args


def measure(kind: str, workers: int, steps: int, threads: int, batch: int) -> dict:
    import torch

    from gradwire.config import RunConfig
    from gradwire.run.loop import Run

    torch.set_num_threads(threads)
    run = Run(RunConfig(task="mnist1d-mlp", workers=workers, steps=steps, batch_size=batch, threads=threads,
                        partition="iid", out="runs/bench-sim"))
    worker_steps = workers * steps
    if kind == "sim":
        run.train_step()  # warm-up
        start = time.perf_counter()
        for _ in range(steps):
            run.train_step()
    else:  # the plain loop: same model, data and batch size, one process, one worker
        model = run.model.module
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = run.oracle.workers[0]
        x, y = data.next_batch()
        start = time.perf_counter()
        for _ in range(worker_steps):
            x, y = data.next_batch()
            opt.zero_grad(set_to_none=True)
            run.task.loss_fn(model(x), y).backward()
            opt.step()
    elapsed = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "workers": workers, "worker_steps": worker_steps, "seconds": elapsed,
            "per_s": worker_steps / elapsed, "peak_rss_mb": peak_mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(ap, only=("steps", "workers", "threads", "batch_size"),
                  defaults={"steps": 40, "workers": [8, 64]}, sweep=("workers",),
                  helps={"steps": "simulated steps per measurement"})
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a, _ = parse_run_args(ap)
    if a.child:
        print(json.dumps(measure(a.child[0], int(a.child[1]), a.steps, a.threads, a.batch_size)))
        return
    rows = []
    for w in a.workers:
        res = {}
        for kind in ("plain", "sim"):
            out = subprocess.run([sys.executable, __file__, "--child", kind, str(w), "--steps", str(a.steps),
                                  "--threads", str(a.threads), "--batch-size", str(a.batch_size)],
                                 capture_output=True, text=True, check=True, timeout=900)
            res[kind] = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = res["plain"]["per_s"] / res["sim"]["per_s"]
        rows.append((w, res, ratio))
    print(f"MNIST-1D MLP, batch {a.batch_size}, {a.threads} thread(s), {a.steps} simulated steps\n")
    print("| workers | worker-steps | plain loop (steps/s) | simulator (worker-steps/s) | overhead (plain/sim) "
          "| peak RSS plain (MB) | peak RSS sim (MB) |")
    print("|---|---|---|---|---|---|---|")
    for w, res, ratio in rows:
        print(f"| {w} | {res['sim']['worker_steps']} | {res['plain']['per_s']:.0f} | {res['sim']['per_s']:.0f} "
              f"| {ratio:.2f}x | {res['plain']['peak_rss_mb']:.0f} | {res['sim']['peak_rss_mb']:.0f} |")
    print("\ntarget: overhead <= 1.50x")


if __name__ == "__main__":
    main()
