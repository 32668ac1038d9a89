"""DIANA against quantized GD without memory (DQGD): the table in docs/results.md.

L2+L1-regularised logistic regression on 4 heterogeneous workers, full local gradients, float64,
the same p-norm quantizer for both (the set-up tests/algorithms/test_diana.py asserts on). Prints the
suboptimality f(x) - f* every 100 steps.

    python benchmarks/diana_vs_dqgd.py [--steps 1000] [--data-dir data-cache]
"""

from __future__ import annotations

import argparse
import tempfile

from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.config import RunConfig
from gradwire.reproduce.diana_exact import TASK
from gradwire.run.loop import Run


def curve(algorithm: str, steps: int, data_dir: str, out: str) -> list[float]:
    r = Run(RunConfig(task=TASK, workers=4, algorithm=algorithm, compressor="pquant:p=inf,block=10",
                      batch_size="full", dtype="float64", lr=0.5, steps=steps, seed=0, out=out, data_dir=data_dir))
    subs = []
    for k in range(steps):
        r.train_step()
        if (k + 1) % 100 == 0:
            subs.append(r.evaluate()["suboptimality"])
    return subs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(ap, only=("steps", "data_dir"), defaults={"steps": 1000})
    a, _ = parse_run_args(ap)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {alg: curve(alg, a.steps, a.data_dir, tmp) for alg in ("diana", "dqgd")}
    steps = list(range(100, a.steps + 1, 100))
    print(f"{TASK}, 4 workers, float64, lr 0.5, pquant:p=inf,block=10\n")
    print("| steps | " + " | ".join(map(str, steps)) + " |")
    print("|---|" + "---|" * len(steps))
    for alg, subs in rows.items():
        print(f"| {alg} | " + " | ".join(f"{s:.1e}" for s in subs) + " |")


if __name__ == "__main__":
    main()
