"""Defaults that learn (docs/defaults.md): the learning-rate sweep and the table of every
algorithm on its defaults, on the default task (mnist1d-mlp, 8 workers, batch 32, 500 steps).

    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --algorithms sync,local --lrs 0.2,0.4,0.8,1.6
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py sweep --algorithms sync --lrs 0.05,0.1,0.2 --momentum 0.9
    OMP_NUM_THREADS=1 python benchmarks/defaults_sweep.py table --seeds 0,1,2

Runs go one after the other (the machine is shared), into a temporary folder; each prints one
line: the settings, the final test accuracy and the CPU seconds of the run. ``table`` ends with the
markdown table of docs/defaults.md (mean and range over the seeds, and the fraction of
learning-rate-tuned sync SGD, ``--reference``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args


def one(tmp: Path, **kw) -> float:
    from gradwire.config import RunConfig
    from gradwire.run.loop import run

    started = time.process_time()
    summary = run(RunConfig(out=str(tmp / "run"), overwrite=True, **kw), progress=False, curves=False)
    acc = summary["final"]["test_acc"]
    print(f"{kw}: test_acc={acc:.3f} ({time.process_time() - started:.1f} s CPU)", flush=True)
    return acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("sweep", "table"))
    parser.add_argument("--algorithms", default="")
    parser.add_argument("--lrs", default="0.2,0.4,0.8,1.6")
    add_run_flags(parser, only=("momentum", "seed"), defaults={"momentum": 0.0, "seed": [0]}, sweep=("seed",))
    parser.add_argument("--reference", type=float, default=0.707, help="tuned sync SGD's mean test accuracy")
    ns, _ = parse_run_args(parser)
    from gradwire.algorithms import ALGORITHMS

    algorithms = ns.algorithms.split(",") if ns.algorithms else ALGORITHMS.names()
    seeds = ns.seeds
    with tempfile.TemporaryDirectory() as tmp:
        if ns.what == "sweep":
            for a in algorithms:
                for lr in (float(x) for x in ns.lrs.split(",")):
                    for seed in seeds:
                        one(Path(tmp), algorithm=a, lr=lr, momentum=ns.momentum, seed=seed)
            return
        rows = []
        for a in algorithms:
            accs = [one(Path(tmp), algorithm=a, seed=seed) for seed in seeds]
            default = ALGORITHMS.build(a)
            mean = statistics.mean(accs)
            rows.append(f"| {a} | {default.default_lr:g} | {default.default_momentum:g} | {mean:.3f} | "
                        f"{min(accs):.3f}-{max(accs):.3f} | {100 * mean / ns.reference:.0f}% |")
    print("| algorithm | --lr | --momentum | test acc. (mean) | range | of tuned sync |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
