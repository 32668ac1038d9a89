"""Where the compressed mean's scatter route loses quality (docs/compressors.md): the same run by
all-gather, by chunk owners, and with one piece of the route substituted at a time.

    .venv/bin/python benchmarks/scatter_mean_ablation.py --workers 16 --seeds 3,4 --steps 300
    .venv/bin/python benchmarks/scatter_mean_ablation.py --workers 4 \
        --variants gather,scatter,exact-owner,chunked-gather

Variants (MuLoCo at H = 3 by default, its own outer step; ``--algorithm`` another):

* ``gather``: the messages all-gathered, each worker's whole vector one scaled-sign message;
* ``scatter``: ``--compressed-mean scatter``, as shipped;
* ``exact-owner``: the scatter route with each owner's second compression replaced by the exact mean of
  its chunk's messages (what the owners would send with no loss; the bytes are still the route's);
* ``chunked-gather``: the all-gather with each worker's message cut in n chunks, a scale each (the
  scatter route's first half, its second taken exactly);
* ``owner=SPEC``: the scatter route with each owner's message in another codec (its values only:
  the bytes carried are still the route's 1-bit slots), e.g. ``owner=pquant:p=inf,block=32``.

``exact-owner`` and ``chunked-gather`` compute the same mean in the same order, so their runs are equal
(tests/averaging/test_scatter_mean.py checks it). Prints, per variant and seed, the final train loss
and test accuracy.
"""

from __future__ import annotations

import argparse
import sys
import types

import torch

from gradwire.averaging.compressed import ChunkSlots, CompressedMean
from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.compress import ErrorFeedback, build
from gradwire.config import RunConfig
from gradwire.run.loop import Run

VARIANTS = ("gather", "scatter", "exact-owner", "chunked-gather")


def _owner_values(averager: CompressedMean, value) -> None:
    """The scatter route with each owner's chunk mean replaced by ``value(owner, key, mean)`` (its
    bytes unchanged): the run then averages with those values."""
    stash = {}
    reduce, assemble = averager.reduce_chunk, averager.assemble

    def reduce_chunk(self, rank, received, like, key):
        out = reduce(rank, received, like, key)
        a, b = self.chunks(like.numel())[sorted(received).index(rank)]
        framed = self.slot_size(like.numel(), like.dtype)[1]
        decoded = self.sent.decode_slots([received[r] for r in sorted(received)], b - a, like.dtype, framed)
        mean = decoded[0].clone()
        for d in decoded[1:]:
            mean += d
        stash[(rank, key)] = a, b, value(rank, key, mean.div_(len(decoded)))
        return out

    def assembled(self, owned, like, key):
        assemble(owned, like, key)  # the owners' residuals kept as the route keeps them
        out = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
        for r in sorted(owned):
            a, b, m = stash.pop((r, key))
            out[a:b] = m
        return out.view(like.shape)

    averager.reduce_chunk = types.MethodType(reduce_chunk, averager)
    averager.assemble = types.MethodType(assembled, averager)


def run(variant: str, *, task: str, algorithm: str, workers: int, steps: int, seed: int, data_dir: str,
        out: str) -> Run:
    """The run of ``variant`` after ``steps`` steps."""
    scatter = variant == "scatter" or variant == "exact-owner" or variant.startswith("owner=")
    r = Run(RunConfig(task=task, workers=workers, algorithm=algorithm, seed=seed, steps=steps, eval_every=steps,
                      compressed_mean="scatter" if scatter else "gather", network="ring:mbps=10,latency_ms=1",
                      out=out, overwrite=True, curves=False, data_dir=data_dir))
    averager = r.algorithm.averager
    if variant == "exact-owner":
        _owner_values(averager, lambda rank, key, mean: mean)
    elif variant.startswith("owner="):
        codec = build(variant.removeprefix("owner="))  # an unknown codec: one ConfigError naming it
        ef: dict[int, ErrorFeedback] = {}
        streams: dict[int, torch.Generator] = {}  # the owners' draws, a stream each (not the route's own)

        def recompressed(rank, key, mean):
            memory = ef.setdefault(rank, ErrorFeedback(codec, scaled=False))
            stream = streams.setdefault(rank, torch.Generator(device=mean.device).manual_seed(1000 * seed + rank))
            return codec.decode(memory.encode(mean, key=key, generator=stream))

        _owner_values(averager, recompressed)
    elif variant == "chunked-gather":
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
    print("| variant | seed | train loss | test accuracy |\n|---|---|---|---|")
    for variant in variants:
        for seed in args.seeds:
            r = run(variant, task=args.task, algorithm=args.algorithm, workers=args.workers, steps=args.steps,
                    seed=seed, data_dir=args.data_dir, out=args.out)
            ev = r.evaluate()
            print(f"| {variant} | {seed} | {ev['train_loss']:.4f} | {ev['test_acc']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
