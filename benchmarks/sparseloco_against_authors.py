"""Once-off comparison of gradwire's ``sparseloco`` with the SparseLoCo authors' compression code
(tplr-ai/templar, ``src/tplr/compress.py``: their ``ChunkingTransformer`` and ``TopKCompressor``,
and the error-feedback and outer-step lines of their ``prepare_gradient_dict`` and ``outer_step``,
``src/tplr/neurons.py``, restated here), on the same initial model, the same workers' batches and
the same inner AdamW. Their code is not part of gradwire: put their ``compress.py`` in a folder of
your own as ``tplr_compress.py``, beside a one-line ``tplr.py`` that gives it a ``logger``, with
``einops`` on the path (e.g. ``pip install --target FOLDER/site einops``), then

    python benchmarks/sparseloco_against_authors.py FOLDER [--rounds 60] [--workers 4] [--inner-steps 10]

It first checks that the hand-written DiLoCo loop used for their side is gradwire's loop (dense
outer gradients, outer SGD at rate 1: the final parameters agree to float32 rounding), then prints
one table: kept values, bits per parameter per round and the final test loss of both
(docs/low_communication.md has the one we ran).

Their round, per parameter tensor W with pseudo-gradient Δ = θ - x (their ``p.grad``):
    e <- β e + α Δ;   (idx, v) = TopK(chunks of e), v quantised to ``quantization_bins`` levels
    e <- e - decode(idx, v)
    θ <- θ - α · scatter-mean over the workers of their decoded values, each worker's values first
         clipped to the median of the workers' norms (``batch_decompress(..., clip_norm=True)``)
with their chunks 2-D tiles of (about) ``target_chunk`` × ``target_chunk`` of each matrix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.config import RunConfig  # noqa: E402
from gradwire.run.loop import Run  # noqa: E402
from gradwire.seeding import hash_seed  # noqa: E402
from gradwire.tasks.evaluate import evaluate  # noqa: E402
from gradwire.tasks.oracle import WorkerData  # noqa: E402

BETAS, EPS, WEIGHT_DECAY = (0.9, 0.95), 1e-8, 0.1  # gradwire's sparseloco/diloco inner AdamW defaults
RULES = {"mean": "aggregate=mean,clip=none", "authors": "aggregate=senders_mean,clip=median_norm",
         "senders_mean": "aggregate=senders_mean,clip=none", "median_norm": "aggregate=mean,clip=median_norm"}
RING = "ring:mbps=100,latency_ms=1"  # the ledger's ring all-gather: (n - 1) times the sum of the n messages


def ours(args, algorithm: str, label: str) -> tuple[Run, dict, float]:
    """gradwire's run: the final evaluation and bits per parameter per round of one message (ledger)."""
    cfg = RunConfig(task=args.task, workers=args.workers, steps=args.rounds * args.inner_steps, batch_size=16,
                    lr=args.lr, algorithm=algorithm, seed=args.seed, data_dir=args.data_dir, network=RING,
                    eval_every=args.rounds * args.inner_steps, out=str(Path(args.out) / label))
    r = Run(cfg)
    for _ in range(cfg.steps):
        r.train_step()
    ev = r.evaluate()
    n, params = args.workers, r.model.flatten().numel()
    ledger = r.transport.bytes_sent if hasattr(r.transport, "bytes_sent") else None
    bits = None
    if ledger is not None:  # ring all-gather: (n - 1) times the sum of the n messages
        bits = 8 * ledger / ((n - 1) * n) / args.rounds / params
    return r, ev, bits


def theirs(args, r: Run, compress, *, topk: int | None, alpha: float, decay: float, plain_mean: bool = False):
    """The DiLoCo loop on the same initial model and batches as ``r``; with ``topk`` their SparseLoCo
    round (see the module's docstring), without it dense outer gradients averaged (the check)."""
    task = r.task
    module = task.model_fn(torch.Generator().manual_seed(hash_seed(args.seed, "model")))
    names = [n for n, _ in module.named_parameters()]
    theta = {n: p.detach().clone() for n, p in module.named_parameters()}
    replicas = [task.model_fn(torch.Generator().manual_seed(hash_seed(args.seed, "model")))
                for _ in range(args.workers)]
    opts = [torch.optim.AdamW(m.parameters(), lr=args.lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
            for m in replicas]
    data = [WorkerData(w.x, w.y, batch_size=16, seed=args.seed, rank=rank) for rank, w in r.oracle.workers.items()]
    transformer = compressor = None
    if topk is not None:
        transformer = compress.ChunkingTransformer(module, target_chunk=args.their_chunk)
        compressor = compress.TopKCompressor(use_quantization=True, quantization_bins=args.their_bins,
                                             quantization_range=args.their_range)
    errors = [{n: torch.zeros_like(t) for n, t in theta.items()} for _ in replicas]
    kept, message_bytes = 0, 0
    for _ in range(args.rounds):
        messages = []
        for w, (m, opt) in enumerate(zip(replicas, opts)):
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(theta[n])
            for _ in range(args.inner_steps):
                x, y = data[w].next_batch()
                opt.zero_grad()
                task.loss_fn(m(x), y).backward()
                opt.step()
            msg = {}
            for n, p in m.named_parameters():
                delta = theta[n] - p.detach()
                if topk is None:
                    msg[n] = delta
                    continue
                e = errors[w][n]
                e.mul_(decay).add_(delta, alpha=alpha)
                idx, val, xshape, totalk, qp = compressor.compress(transformer.encode(e), topk)
                e.sub_(transformer.decode(compressor.decompress(p, idx, val, xshape, totalk, qp)))
                msg[n] = (idx, val, xshape, totalk, qp)
                if w == 0:  # the bytes as their code holds them: 12-bit positions, uint8 values, the lookup table
                    kept += val.numel()
                    message_bytes += idx.numel() + val.numel() + 4 * qp[3].numel() + 4 + 4
            messages.append(msg)
        with torch.no_grad():
            for n in names:
                if topk is None:
                    theta[n] -= sum(msg[n] for msg in messages) / len(messages)
                    continue
                vals = compressor.maybe_dequantize_values([msg[n][1] for msg in messages],
                                                          [msg[n][4] for msg in messages], theta[n].device)
                if plain_mean:  # not their code's rule: Algorithm 1's (1/R) Σ of each worker's decoded message
                    theta[n] -= alpha * sum(
                        transformer.decode(compressor.decompress(theta[n], msg[n][0], v, msg[n][2], msg[n][3]))
                        for msg, v in zip(messages, vals)) / len(messages)
                    continue
                norms = torch.stack([torch.norm(v, p=2) for v in vals])
                xshape, totalk = messages[0][n][2], messages[0][n][3]
                agg = compressor.batch_decompress(theta[n], [msg[n][0] for msg in messages], vals, xshape, totalk,
                                                  quantize_params=None, block_norms=norms, normalise=False,
                                                  clip_norm=True)
                theta[n] -= alpha * transformer.decode(agg)  # their outer SGD(lr=α) step
    flat = torch.cat([theta[n].reshape(-1) for n in names])
    return flat, kept / args.rounds, message_bytes / args.rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="holds their compress.py as tplr_compress.py, a tplr.py, einops")
    add_run_flags(parser, only=("task", "workers", "lr", "seed", "data_dir", "out"),
                  defaults={"task": "digits-mlp", "workers": 4, "lr": 0.003, "seed": 0,
                            "out": "runs/sparseloco_against_authors"},
                  helps={"lr": "the inner AdamW's rate (both)"})
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=1.0, help="outer rate α (both; theirs: outer_learning_rate)")
    parser.add_argument("--decay", type=float, default=0.95, help="error-feedback decay β (theirs: momentum_decay)")
    parser.add_argument("--their-topk", type=int, default=64, help="their topk_compression (per tile)")
    parser.add_argument("--their-chunk", type=int, default=64, help="their target_chunk")
    parser.add_argument("--their-bins", type=int, default=4, help="their quantization_bins (4: 2-bit values)")
    parser.add_argument("--their-range", type=int, default=6, help="their quantization_range (sigmas)")
    parser.add_argument("--our-k", type=int, nargs="+", default=[64], help="our k of every chunk of 4096")
    parser.add_argument("--our-values", nargs="+", default=["ternary"], choices=("ternary", "raw"),
                        help="our kept values: ternary (the default codec) or raw float32 (to isolate the quantiser)")
    parser.add_argument("--our-rules", nargs="+", default=list(RULES),
                        help=f"our sparseloco's receiving-end rules, of {', '.join(RULES)}: Algorithm 1's mean, the "
                             "authors' per-position mean over the senders with the median-norm clip, each alone")
    args, _ = parse_run_args(parser)
    folder = os.path.abspath(args.folder)
    sys.path[:0] = [folder, os.path.join(folder, "site")]
    import tplr_compress as compress  # their file, from the user's folder

    torch.set_num_threads(1)
    # the check: gradwire's DiLoCo with a plain averaging outer step against the hand loop, dense
    r, _, _ = ours(args, f"diloco:inner_steps={args.inner_steps},outer_lr=1.0,outer_momentum=0,outer_warmup=0",
                   "check_diloco")
    flat, _, _ = theirs(args, r, compress, topk=None, alpha=1.0, decay=0.0)
    gap = float((flat - r.algorithm.eval_params()).abs().max())
    print(f"check: hand loop vs gradwire diloco (outer SGD rate 1, dense): max |Δθ| {gap:.2e}")
    rows = []
    for k, values, rule in [(k, v, rule) for k in args.our_k for v in args.our_values for rule in args.our_rules]:
        spec = (f"sparseloco:inner_steps={args.inner_steps},k={k},chunk=4096,outer_lr={args.alpha},"
                f"decay={args.decay},values={values},{RULES[rule]}")
        r_k, ev, bits = ours(args, spec, f"ours_k{k}_{values}_{rule}")
        kept = sum(min(n, -(-k * n // 4096)) for n in
                   [4096] * (r_k.model.flatten().numel() // 4096) + [r_k.model.flatten().numel() % 4096] if n)
        rows.append((f"gradwire sparseloco k={k}/4096 ({values}, Golomb positions), {RULES[rule]}", kept, bits,
                     None, ev["test_loss"], ev["test_acc"]))
    flat, kept, nbytes = theirs(args, r, compress, topk=args.their_topk, alpha=args.alpha, decay=args.decay)
    ev = evaluate(r.task, r.model, flat)
    params = flat.numel()
    packed = nbytes - kept + kept * (max(1, (args.their_bins - 1).bit_length())) / 8  # values packed at their bits
    rows.append((f"tplr-ai templar compress.py topk={args.their_topk}/tile {args.their_chunk}, {args.their_bins} bins",
                 kept, 8 * nbytes / params, 8 * packed / params, ev["test_loss"], ev["test_acc"]))
    # the same, but each worker's decoded message averaged over all R workers (Algorithm 1's mean), without their
    # scatter-mean over the senders of an index and the median-norm clip: which of the two makes the difference
    flat, _, _ = theirs(args, r, compress, topk=args.their_topk, alpha=args.alpha, decay=args.decay, plain_mean=True)
    ev = evaluate(r.task, r.model, flat)
    rows.append(("  the same, aggregated as (1/R) Σ of the decoded messages (not their code's rule)", kept,
                 8 * nbytes / params, 8 * packed / params, ev["test_loss"], ev["test_acc"]))
    print(f"{args.task}, {args.workers} workers, {args.rounds} rounds of H={args.inner_steps}, batch 16, inner AdamW "
          f"lr {args.lr}, α {args.alpha}, β {args.decay}, seed {args.seed}")
    print("| method | kept values per worker per round | bits/param/round (as sent) | bits/param/round "
          "(values bit-packed) | test loss | test acc |")
    print("|---|---|---|---|---|---|")
    for name, kept, bits, packed_bits, loss, acc in rows:
        pb = f"{packed_bits:.3f}" if packed_bits is not None else "(same)"
        b = f"{bits:.3f}" if bits is not None else "-"
        print(f"| {name} | {kept:.0f} | {b} | {pb} | {loss:.4f} | {acc:.4f} |")
    print(json.dumps({"check_max_abs": gap}))


if __name__ == "__main__":
    main()
