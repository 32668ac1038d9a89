"""Defaults that learn (docs/defaults.md): the sweeps and the table of every algorithm on its
defaults, on the default task (mnist1d-mlp, 8 workers, batch 32, 500 steps).

    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --algorithms sync,local --lrs 0.2,0.4,0.8,1.6
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --algorithms sync --lrs 0.05,0.1,0.2 --momentum 0.9
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --spec easgd:period=2 --spec easgd:beta=0.5 --seeds 3
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --task mnist1d-cnn --algorithms sync --lrs 0.8,1.6
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py table --seeds 0,1,2
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --spec signsgd:down=vote,momentum=0.9 --lrs 0.006 \
        --workers 1 --batch-size 256 --seeds 3,4

The tuning sweeps run on held-out seeds (3, 4) that the table does not use. ``--spec`` takes one
algorithm spec with its keys (repeatable: a spec's own commas cannot share ``--algorithms``'s).
Runs go one after the other (the machine is shared), into a temporary folder; each prints one
line: the settings, the final test accuracy and the CPU seconds of the run. ``table`` ends with the
markdown table of docs/defaults.md (each seed, the mean, and the fraction of learning-rate-tuned
sync SGD, ``--reference``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args


def one(tmp: Path, **kw) -> tuple[float, float]:
    """One run: (final test accuracy, megabytes sent); a run that diverges is recorded, as accuracy
    NaN and its step, and the sweep goes on (every trial is reported, failures included)."""
    from gradwire.config import RunConfig
    from gradwire.errors import DivergenceError
    from gradwire.run.loop import run

    started = time.process_time()
    try:
        summary = run(RunConfig(out=str(tmp / "run"), overwrite=True, curves=False, **kw), progress=False)
    except DivergenceError as e:
        print(f"{kw}: diverged at step {e.step} ({e}) ({time.process_time() - started:.1f} s CPU)", flush=True)
        return math.nan, math.nan
    acc, mb = summary["final"]["test_acc"], summary["bytes_sent"] / 1e6
    print(f"{kw}: test_acc={acc:.3f}, {mb:.2f} MB sent ({time.process_time() - started:.1f} s CPU)", flush=True)
    return acc, mb


def table(tmp: Path, algorithms: list[str], seeds: list[int], reference: float, **extra) -> None:
    from gradwire.config import RunConfig
    from gradwire.run.combination import resolved

    rows = []
    for a in algorithms:
        runs = [one(tmp, algorithm=a, seed=seed, **extra) for seed in seeds]
        accs = [acc for acc, _ in runs]
        mean = statistics.mean(accs)
        lr = resolved(RunConfig(algorithm=a, **extra)).lr
        rows.append(f"| {a} | {lr:g} | " + " | ".join(f"{x:.3f}" for x in accs)
                    + f" | {mean:.3f} | {100 * mean / reference:.1f}% | {runs[0][1]:.1f} |")
    print("| algorithm | --lr | " + " | ".join(f"seed {s}" for s in seeds)
          + f" | mean | of tuned sync ({reference:g}) | MB sent |")
    print("|---|---|" + "---|" * len(seeds) + "---|---|---|")
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("sweep", "table"))
    parser.add_argument("--algorithms", default="", help="comma-separated algorithm names (default: all)")
    parser.add_argument("--spec", action="append", default=[], help="an algorithm spec with keys (repeatable)")
    parser.add_argument("--lrs", default="0.2,0.4,0.8,1.6", help="sweep: comma-separated --lr values; "
                        "'default': the algorithm's own")
    add_run_flags(parser, only=("momentum", "seed", "task", "lr_schedule", "compressor", "weight_decay", "workers",
                                "batch_size", "optimizer"),
                  defaults={"seed": [0]}, sweep=("seed",),
                  helps={"momentum": "sweep: --momentum (left out: the algorithm's own)",
                         "task": "the task (another for the CNN check of docs/defaults.md)"})
    parser.add_argument("--reference", type=float, default=0.707, help="tuned sync SGD's mean test accuracy")
    ns, _ = parse_run_args(parser)
    from gradwire.algorithms import ALGORITHMS

    algorithms = (ns.algorithms.split(",") if ns.algorithms else []) + ns.spec
    algorithms = algorithms or ALGORITHMS.names()
    seeds = ns.seeds
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"task": ns.task, "lr_schedule": ns.lr_schedule, "compressor": ns.compressor,
                 "weight_decay": ns.weight_decay, "workers": ns.workers, "batch_size": ns.batch_size,
                 "optimizer": ns.optimizer}
        if ns.what == "table":
            table(Path(tmp), algorithms, seeds, ns.reference, **extra)
            return
        if ns.momentum is not None:
            extra["momentum"] = float(ns.momentum)
        lrs = [None] if ns.lrs == "default" else [float(x) for x in ns.lrs.split(",")]
        for a in algorithms:
            for lr in lrs:
                for seed in seeds:
                    one(Path(tmp), algorithm=a, seed=seed, **({"lr": lr} if lr is not None else {}), **extra)


if __name__ == "__main__":
    main()
