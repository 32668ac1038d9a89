"""Where the compressed mean's scatter route loses quality (docs/compressors.md): the same run by
all-gather, by chunk owners, and with one piece of the route substituted at a time.

    .venv/bin/python benchmarks/scatter_mean_ablation.py --workers 16 --seeds 3,4 --steps 300
    .venv/bin/python benchmarks/scatter_mean_ablation.py --workers 4 \
        --variants gather,scatter,exact-owner,chunked-gather

Variants (MuLoCo at H = 3 by default, its own outer step; ``--algorithm`` another):

* ``gather``: the messages all-gathered, each worker's whole vector one scaled-sign message;
* ``scatter``: ``--compressed-mean scatter``, as shipped;
* ``exact-owner``: the scatter route with each owner's mean sent exactly (``--owner-compressor none``:
  float32, so its second exchange carries 32 bits a parameter);
* ``chunked-gather``: the all-gather with each worker's message cut in n chunks, a scale each (the
  scatter route's first half, its second taken exactly);
* ``owner=SPEC``: the scatter route with the owners' messages in another codec
  (``--owner-compressor SPEC``, its bytes carried), e.g. ``owner=pquant:p=inf,block=32``.

``exact-owner`` and ``chunked-gather`` compute the same mean in the same order, so their runs are equal
(tests/averaging/test_scatter_mean.py checks it). Prints, per variant and seed, the final train loss,
test accuracy and the bytes the run put on the wire.
"""

from __future__ import annotations

import argparse
import sys

from gradwire.averaging.compressed import ChunkSlots
from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.compress import ErrorFeedback
from gradwire.config import RunConfig
from gradwire.run.loop import Run

VARIANTS = ("gather", "scatter", "exact-owner", "chunked-gather")


def run(variant: str, *, task: str, algorithm: str, workers: int, steps: int, seed: int, data_dir: str,
        out: str) -> Run:
    """The run of ``variant`` after ``steps`` steps."""
    scatter = variant == "scatter" or variant == "exact-owner" or variant.startswith("owner=")
    owner = "none" if variant == "exact-owner" else variant.removeprefix("owner=") if variant != "scatter" else ""
    r = Run(RunConfig(task=task, workers=workers, algorithm=algorithm, seed=seed, steps=steps, eval_every=steps,
                      compressed_mean="scatter" if scatter else "gather", owner_compressor=owner if scatter else "",
                      network="ring:mbps=10,latency_ms=1", out=out, overwrite=True, curves=False, data_dir=data_dir))
    averager = r.algorithm.averager
    if variant == "chunked-gather":
        chunked = ChunkSlots(averager.compressor, workers)
        scaled = next(iter(averager.ef.values())).scaled
        averager.compressor = averager.sent = chunked
        averager.ef = {rank: ErrorFeedback(chunked, scaled=scaled) for rank in averager.ef}
    for _ in range(steps):
        r.train_step()
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="gather,scatter,exact-owner,chunked-gather,owner=pquant:p=inf,block=32",
                   help="comma-separated, an owner=SPEC last (its SPEC may hold commas)")
    add_run_flags(p, only=("task", "algorithm", "workers", "steps", "seed", "data_dir", "out"),
                  defaults={"task": "mnist1d-mlp", "algorithm": "muloco:inner_steps=3", "workers": 16, "steps": 300,
                            "seed": [3, 4], "out": "runs/scatter-mean-ablation"},
                  sweep=("seed",), helps={"seed": "held-out seeds, as docs/defaults.md's", "out": "scratch run folder"})
    args, _ = parse_run_args(p, argv)
    head, _, owner = args.variants.partition("owner=")
    variants = [v for v in head.split(",") if v] + ([f"owner={owner}"] if owner else [])
    bad = [v for v in variants if v not in VARIANTS and not v.startswith("owner=")]
    if bad:
        p.error(f"--variants: {', '.join(bad)}; valid: {', '.join(VARIANTS)}, owner=SPEC (last)")
    print("| variant | seed | train loss | test accuracy | bytes |\n|---|---|---|---|---|")
    for variant in variants:
        for seed in args.seeds:
            r = run(variant, task=args.task, algorithm=args.algorithm, workers=args.workers, steps=args.steps,
                    seed=seed, data_dir=args.data_dir, out=args.out)
            ev = r.evaluate()
            print(f"| {variant} | {seed} | {ev['train_loss']:.4f} | {ev['test_acc']:.3f} | {r.transport.bytes_sent} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
