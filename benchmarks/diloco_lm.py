"""DiLoCo and Streaming DiLoCo against synchronous and local SGD on the communication-bound
language model (``stdlib-lm``), on the simulated cluster.

    python benchmarks/diloco_lm.py                      # 4 workers, 100 Mbit/s ring, 200 steps
    python benchmarks/diloco_lm.py --steps 60 --target 3.3   # quicker

Every variant trains the same model from the same seed on the same data; the simulated clock
charges ``--compute-s`` per step (about what one step of batch 8 takes on one core of the machine
this was written on, so compute and communication are in proportion) and the network model's
time for every collective. The table gives, per variant, the simulated time and the bytes sent
until the validation loss (``test_loss``, measured every ``--eval-every`` steps) first reaches
``--target``, and the final validation loss. Each run's folder (metrics.jsonl, ...) stays under
``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.run.loop import run  # noqa: E402

# (label, algorithm, lr, momentum, compressor): SGD baselines at the largest lr that did not diverge in
# a short probe (0.1 did, on one worker), AdamW inside DiLoCo at 1e-3.
VARIANTS = [
    ("sync SGD (momentum 0.9)", "sync", 0.05, 0.9, "none"),
    ("local SGD, τ=20", "local:period=20", 0.05, 0.9, "none"),
    ("AdamW inside, averaged every step", "diloco:inner_steps=1,outer_lr=1,outer_momentum=0", 1e-3, 0.0, "none"),
    ("DiLoCo, H=20", "diloco:inner_steps=20", 1e-3, 0.0, "none"),
    ("Streaming DiLoCo, H=20, P=4, τ=2, fp16", "streaming-diloco:inner_steps=20,fragments=4,overlap=2,alpha=0.5",
     1e-3, 0.0, "fp16"),
]


def first_reaching(records: list[dict], target: float) -> dict | None:
    return next((r for r in records if r["test_loss"] <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_flags(parser, only=("task", "workers", "steps", "batch_size", "eval_every", "network", "out", "data_dir"),
                  defaults={"task": "stdlib-lm", "workers": 4, "steps": 200, "batch_size": 8, "eval_every": 20,
                            "network": "ring:mbps=100,latency_ms=1", "out": "runs/diloco_lm"})
    parser.add_argument("--compute-s", type=float, default=0.2)
    parser.add_argument("--target", type=float, default=3.0)
    args, common = parse_run_args(parser)  # common: the run flags' config, shared by every variant
    rows = []
    for label, algorithm, lr, momentum, compressor in VARIANTS:
        cfg = common.replace(algorithm=algorithm, lr=lr, momentum=momentum, compressor=compressor,
                             stragglers=f"none:compute_s={args.compute_s}", overwrite=True, name=label,
                             out=str(Path(args.out) / algorithm.replace(":", "_").replace(",", "_")))
        summary = run(cfg, progress=False)
        records = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
        hit = first_reaching(records, args.target)
        rows.append((label, algorithm, compressor, lr, hit, summary))
        reached = f"{hit['sim_time_s']:.1f} s, {hit['bytes_sent'] / 1e6:.0f} MB" if hit else "not reached"
        print(f"{label}: final test_loss {summary['final']['test_loss']:.3f}, {reached}", file=sys.stderr, flush=True)
    print(f"{args.task}, {args.workers} workers, batch {args.batch_size}, {args.steps} steps, `{args.network}`, "
          f"{args.compute_s} s compute per step (simulated)\n")
    print(f"| variant | algorithm | lr | time to val. loss {args.target} (s) | MB sent to it | "
          "final val. loss | total time (s) | total MB |")
    print("|---|---|---|---|---|---|---|---|")
    for label, algorithm, compressor, lr, hit, summary in rows:
        spec = algorithm + (f" + {compressor}" if compressor != "none" else "")
        time_to = f"{hit['sim_time_s']:.1f}" if hit else "not reached"
        bytes_to = f"{hit['bytes_sent'] / 1e6:.0f}" if hit else "-"
        print(f"| {label} | `{spec}` | {lr:g} | {time_to} | {bytes_to} | {summary['final']['test_loss']:.3f} | "
              f"{summary['sim_time_s']:.1f} | {summary['bytes_sent'] / 1e6:.0f} |")


if __name__ == "__main__":
    main()
