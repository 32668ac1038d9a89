"""Step time of plain DDP against the gradwire.ddp hook and PyTorch's own hooks.

    python benchmarks/ddp_hook.py [--rounds 12] [--steps-per-round 10] [--batch 64] [--only fp16 ...]
    python benchmarks/ddp_hook.py --ratio      # none against allreduce_hook in CPU time, with an A/A row
    python benchmarks/ddp_hook.py --small      # does it still run? (tests/ddp/test_gpu_benchmarks_run.py)
    python benchmarks/ddp_hook.py --device cuda --model gpt2 [--dtype bfloat16]   # NCCL, a GPU per rank

CPU (default): 2 gloo processes, one thread each, and an MLP 512-1024-512-10 (1.05M float32
parameters, 4.2 MB of gradient; three buckets once DDP has rebuilt them). CUDA: one NCCL process
per visible GPU. ``--model gpt2`` is a GPT-2-small-sized decoder (12 layers, width 768, 12 heads,
vocabulary 50257, 124M parameters; ``--layers``/``--width``/``--vocab``/``--seq`` shrink it),
trained on random tokens. ``--dtype bfloat16`` or ``float16`` casts the model, so the gradients
the hook gets are 16-bit. One synthetic batch per rank, SGD. A step is forward, backward (where
the hook runs) and the update. On a GPU each step is timed with CUDA events.

Timing: one pair of processes (spawn, FileStore, one thread each) builds one DDP model per
configuration and runs them in interleaved rounds; the first round is warm-up (and crosses DDP's
bucket rebuild). Each round gives every configuration ``--steps-per-round`` steps in ``--blocks``
blocks, the order of the configurations rotated from one block to the next (A B C, B C A, C A B),
so that other load on the machine, and each place in the order, fall on every configuration alike.
Peak RSS: each configuration again in a fresh pair of processes (20 steps), so that it is its own.

CPU time: ``time.process_time`` of every training process (every thread of each: the main thread,
gloo's, and the hook's callbacks, which run on gloo's), summed over the ranks, per step and round.
It is what a hook costs, and it is far steadier than wall time on a shared machine, whose other
jobs stretch the wall time of a step without adding to its CPU time. A configuration's ratio to
another is taken per round (both measured in the same round) and the median over the rounds is
reported. ``--ratio`` measures the issue's check: ``none`` against ``allreduce_hook`` over 5 timed
rounds (the issue's 5 interleaved runs) of 60 steps each, in 6 blocks of 10 (two full rotations);
a second model with ``allreduce_hook`` is measured alike, and its ratio to the first (A/A) would be
1 without noise, so its spread is the method's noise floor; ``none`` is also compared with the mean
of both ``allreduce_hook`` models, so that neither model's memory layout decides the reference.

Columns of the full table: mean and median (p50) step time of rank 0 in ms over the timed steps,
the ratio of the mean to plain DDP's, the CPU time per step and process and its median ratio to
PyTorch's ``allreduce_hook``, bytes per step by the hook's rule (payload this rank contributed x
peers reached; for PyTorch's hooks and plain DDP, the gradient's bytes by the same rule), and the
larger of the two ranks' peak RSS (ru_maxrss).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402

# (label, gradwire spec or "torch:<hook>", error feedback). PyTorch's own Python hooks
# (torch.distributed.algorithms.ddp_comm_hooks.default_hooks) show what any Python hook costs
# against DDP's built-in C++ allreduce.
CONFIGS = [("plain DDP", None, False), ("torch allreduce_hook", "torch:allreduce_hook", False),
           ("torch fp16_compress_hook", "torch:fp16_compress_hook", False),
           ("torch powerSGD_hook rank 4", "torch:powerSGD_hook", False), ("none", "none", False),
           ("fp16", "fp16", False), ("qsgd:levels=4", "qsgd:levels=4", False),
           ("sign:scaled=true + EF", "sign:scaled=true", True), ("topk:ratio=0.01 + EF", "topk:ratio=0.01", True)]
# --ratio: the issue-35 check (none within 5 % of allreduce_hook's CPU time), and the same hook in a
# second model measured the same way (A/A), whose ratio shows how far the method itself scatters
RATIO_CONFIGS = [("torch allreduce_hook", "torch:allreduce_hook", False), ("none", "none", False),
                 ("torch allreduce_hook (A/A)", "torch:allreduce_hook", False)]
POWERSGD_RANK = 4


def make_model(args: dict):
    """The benchmark's model and a function drawing one batch (inputs, targets) for a rank."""
    if args["model"] == "mlp":
        h = args.get("hidden", 1024)
        model = nn.Sequential(nn.Linear(512, h), nn.ReLU(), nn.Linear(h, 512), nn.ReLU(), nn.Linear(512, 10))
        return model, lambda g: (torch.randn(args["batch"], 512, generator=g),
                                 torch.randint(0, 10, (args["batch"],), generator=g))
    width, vocab, seq = args["width"], args["vocab"], args["seq"]
    model = Decoder(vocab, width, args["layers"], max(1, width // 64), seq)
    return model, lambda g: (torch.randint(0, vocab, (args["batch"], seq), generator=g),
                             torch.randint(0, vocab, (args["batch"] * seq,), generator=g))


class Decoder(nn.Module):
    """A GPT-2-style decoder: token and position embeddings, pre-norm causal self-attention blocks,
    a final norm and an output projection (GPT-2 small: 12 blocks of width 768, 12 heads)."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens):
        h = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        h = self.blocks(h, mask=self.mask.to(h.dtype), is_causal=True)
        return self.head(self.norm(h)).flatten(0, 1)


def build(spec: str | None, ef: bool, args: dict, device):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire import ddp as gwddp

    torch.manual_seed(0)
    module, _ = make_model(args)
    module = module.to(device, getattr(torch, args["dtype"]))
    # PyTorch's powerSGD_hook on gloo: one bucket. It issues each bucket's second allreduce from the
    # first one's future callback, which gloo runs on its own worker thread, so with several buckets
    # the order of collectives differs between ranks and gloo aborts ("op.preamble.length <=
    # op.nbytes. 2088 vs 1024 ... collective mismatch") or hangs: seen with that hook alone on
    # this MLP in 3 of 3 runs of 30 steps (docs/ddp.md). NCCL completes a future when its work is enqueued, so
    # the callbacks run in order there and the default buckets stay.
    one_bucket = spec == "torch:powerSGD_hook" and device.type != "cuda"
    model = DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=sum(p.numel() * p.element_size() for p in module.parameters()) / 2**20 + 1
                if one_bucket else None)
    state = None
    if spec == "torch:powerSGD_hook":  # error feedback and warm start on, compressing from step 2
        model.register_comm_hook(powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=POWERSGD_RANK,
                                                             start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook)
    elif spec and spec.startswith("torch:"):
        model.register_comm_hook(None, getattr(default_hooks, spec.removeprefix("torch:")))
    elif spec:
        state = gwddp.register(model, spec, error_feedback=ef)
    return model, state, torch.optim.SGD(model.parameters(), lr=0.01)


def powersgd_bytes(model, world_size: int, min_compression_rate: float = 2.0) -> int:
    """Bytes per step of PyTorch's powerSGD_hook by the hook's rule: each matrix (a tensor seen as
    shape[0] x rest) worth compressing sends P and Q, (n + m) * rank elements; the rest travel
    whole (PowerSGD's rule of compressing only when n*m >= rate * (n + m) * rank)."""
    total = 0
    for p in model.parameters():
        size = p.element_size()
        n, m = p.shape[0], p.numel() // max(p.shape[0], 1)
        if p.dim() > 1 and n * m >= min_compression_rate * (n + m) * POWERSGD_RANK:
            total += (n + m) * POWERSGD_RANK * size
        else:
            total += p.numel() * size
    return total * (world_size - 1)


def steps(model, opt, x, y, count: int) -> tuple[list[float], float]:
    """Each step's time (CUDA events on a GPU, else perf_counter), and the process's CPU seconds
    per step over the ``count`` steps (all its threads: gloo's included)."""
    import torch
    from torch import nn

    cuda = x.device.type == "cuda"
    times = []
    cpu_start = time.process_time()
    for _ in range(count):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start_s = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()
        if cuda:
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        else:
            times.append(time.perf_counter() - start_s)
    return times, (time.process_time() - cpu_start) / count


def block_order(count: int, block: int) -> list[int]:
    """The configurations' order in block ``block``, rotated by one from each block to the next
    (A B C, B C A, C A B, ...): over ``count`` blocks each configuration takes each place once, and
    with three or more none runs two blocks back to back (which would find its model still in the
    cache). Reversing instead (A B C, C B A) would give the first and last that advantage, never
    the middle one: it made ``none``, in the middle, look 1-2 % slower."""
    shift = block % count
    return list(range(shift, count)) + list(range(shift))


def child(rank: int, world_size: int, folder: str, configs: list, args: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args["device"] == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            store=dist.FileStore(os.path.join(folder, "store"), world_size),
                            rank=rank, world_size=world_size)
    g = torch.Generator().manual_seed(rank)
    x, y = (t.to(device) for t in make_model(args)[1](g))
    if x.is_floating_point():
        x = x.to(getattr(torch, args["dtype"]))
    runs = [build(spec, ef, args, device) for _, spec, ef in configs]
    times: list[list[float]] = [[] for _ in configs]
    cpu: list[list[float]] = [[] for _ in configs]  # CPU seconds per step, one entry per timed round
    counted = [0] * len(configs)
    per_block = max(1, args["steps_per_round"] // args["blocks"])
    for round_ in range(args["rounds"]):
        spent = [0.0] * len(configs)
        for block in range(args["blocks"]):
            for i in block_order(len(configs), round_ * args["blocks"] + block):
                model, state, opt = runs[i]
                dist.barrier()
                before = state.bytes_sent if state else 0
                took, cpu_s = steps(model, opt, x, y, per_block)
                spent[i] += cpu_s * per_block
                if round_:  # the first round warms up (and crosses DDP's bucket rebuild)
                    times[i] += took
                    counted[i] += (state.bytes_sent - before) if state else 0
        if round_:
            cpu = [c + [s / (per_block * args["blocks"])] for c, s in zip(cpu, spent, strict=True)]
    numel = sum(p.numel() for p in runs[0][0].parameters())
    out = []
    for (_, spec, _), (_, state, _), t, sent, c in zip(configs, runs, times, counted, cpu, strict=True):
        if spec == "torch:powerSGD_hook":
            sent = powersgd_bytes(runs[0][0], world_size) * len(t)
        elif not state:  # the same rule: the gradient's bytes (2 per element for fp16) to each peer
            size = runs[0][0].module.parameters().__next__().element_size()
            sent = (2 if spec and "fp16" in spec else size) * numel * (world_size - 1) * len(t)
        out.append({"mean_ms": 1e3 * statistics.fmean(t), "p50_ms": 1e3 * statistics.median(t),
                    "bytes": sent / len(t), "numel": numel, "cpu_rounds": c})
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device.type == "cuda":  # device memory, not the host's
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    torch.save({"rows": out, "peak_mib": peak_mib}, os.path.join(folder, f"r{rank}.pt"))
    dist.destroy_process_group()


def launch(configs: list, args: dict) -> list[dict]:
    import torch
    import torch.multiprocessing as mp

    world_size = torch.cuda.device_count() if args["device"] == "cuda" else 2
    with tempfile.TemporaryDirectory() as folder:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=child, args=(r, world_size, folder, configs, args))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(900)
        if any(p.is_alive() or p.exitcode != 0 for p in procs):
            for p in procs:
                if p.is_alive():
                    p.kill()
            raise SystemExit(f"children exited with {[p.exitcode for p in procs]}")
        return [torch.load(os.path.join(folder, f"r{r}.pt"), weights_only=True) for r in range(world_size)]


def cpu_per_round(results: list[dict], i: int) -> list[float]:
    """Configuration i's CPU seconds per step in each timed round, summed over the ranks: the CPU
    time of all the training processes, every thread of each (gloo's, and the hook's callbacks)."""
    return [sum(rounds) for rounds in zip(*(r["rows"][i]["cpu_rounds"] for r in results), strict=True)]


def cpu_ratios(results: list[dict], i: int, ref: int) -> list[float]:
    """Per timed round, configuration i's CPU time per step over configuration ref's: both measured
    in the same round, in alternating blocks, so that load on the shared machine falls on both alike."""
    return [a / b for a, b in zip(cpu_per_round(results, i), cpu_per_round(results, ref), strict=True)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds of steps; the first is warm-up (default 12; "
                        "--ratio: 6, i.e. 5 timed runs)")
    parser.add_argument("--steps-per-round", type=int, help="steps of each configuration per round (default 10; "
                        "--ratio: 60)")
    parser.add_argument("--blocks", type=int, help="each round's steps in this many blocks per configuration, "
                        "the order rotated from one block to the next (default 1; --ratio: 6)")
    parser.add_argument("--ratio", action="store_true",
                        help="the none hook against torch's allreduce_hook, and allreduce_hook against itself "
                             "(A/A: the method's noise), by CPU time; no wall-time table, no memory runs")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", action="append", help="only these labels (plain DDP always runs)")
    add_run_flags(parser, only=("device",), helps={"device": "cpu: 2 gloo processes; cuda: one NCCL process per "
                                                             "visible GPU"})
    parser.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                        help="the model's dtype, hence the gradients' (16-bit: mixed-precision training)")
    parser.add_argument("--layers", type=int, default=12, help="gpt2: blocks")
    parser.add_argument("--width", type=int, default=768, help="gpt2: model width")
    parser.add_argument("--vocab", type=int, default=50257, help="gpt2: vocabulary")
    parser.add_argument("--seq", type=int, default=512, help="gpt2: tokens per sequence")
    parser.add_argument("--small", action="store_true",
                        help="a quick run that checks the benchmark works: a 64-wide MLP, 3 rounds of 2 steps, "
                             "no peak-memory runs")
    a, _ = parse_run_args(parser, argv)
    defaults = (6, 60, 6) if a.ratio else (12, 10, 1)
    a.rounds, a.steps_per_round, a.blocks = (given if given is not None else default for given, default in
                                             zip((a.rounds, a.steps_per_round, a.blocks), defaults, strict=True))
    if a.small:
        a.rounds, a.steps_per_round, a.batch = 3, 2 * a.blocks, 8
    if a.rounds < 2 or a.steps_per_round < 1 or a.blocks < 1:
        raise SystemExit(f"ddp_hook: --rounds {a.rounds} --steps-per-round {a.steps_per_round} --blocks {a.blocks}: "
                         "rounds must be >= 2 (the first warms up), steps per round and blocks >= 1")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("ddp_hook: --device cuda, but torch sees no CUDA device here; use --device cpu")
    if a.ratio:
        configs = RATIO_CONFIGS
    else:
        configs = [c for c in CONFIGS if not a.only or c[0] in a.only or c[0] == "plain DDP"]
    args = {"rounds": a.rounds, "steps_per_round": a.steps_per_round, "blocks": a.blocks, "batch": a.batch,
            "device": a.device, "model": a.model, "dtype": a.dtype, "layers": a.layers, "width": a.width,
            "vocab": a.vocab, "seq": a.seq, "hidden": 64 if a.small else 1024}
    results = launch(configs, args)
    timing = results[0]["rows"]
    per_block = max(1, a.steps_per_round // a.blocks)
    timed = (a.rounds - 1) * per_block * a.blocks
    where = "NCCL, a GPU per process" if a.device == "cuda" else "2 gloo processes x 1 thread"
    print(f"{a.model}, {timing[0]['numel']:,} {a.dtype} parameters, batch {a.batch} per rank, {where}, "
          f"{timed} timed steps per configuration in {a.rounds - 1} interleaved rounds of {a.blocks} "
          f"block(s), load average {os.getloadavg()[0]:.1f}\n")
    if a.ratio:
        print_ratios(configs, results, a.rounds - 1)
        return
    peaks = [float("nan")] * len(configs) if a.small else [
        max(r["peak_mib"] for r in launch([c], {**args, "rounds": 2})) for c in configs]
    base = timing[0]["mean_ms"]
    peak_label = "peak GPU MiB" if a.device == "cuda" else "peak RSS MiB"
    labels = [c[0] for c in configs]
    ref = labels.index("torch allreduce_hook") if "torch allreduce_hook" in labels else 0
    print(f"| configuration | mean ms/step | p50 ms/step | mean vs plain | CPU ms/step | CPU vs {labels[ref]} "
          f"(median of {a.rounds - 1} rounds) | bytes/step sent | {peak_label} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, ((label, _, _), row, peak) in enumerate(zip(configs, timing, peaks, strict=True)):
        cpu_ms = 1e3 * statistics.fmean(cpu_per_round(results, i)) / len(results)
        print(f"| {label} | {row['mean_ms']:.2f} | {row['p50_ms']:.2f} | {row['mean_ms'] / base:.2f} "
              f"| {cpu_ms:.2f} | {statistics.median(cpu_ratios(results, i, ref)):.3f} | {row['bytes']:,.0f} "
              f"| {peak:.0f} |")


def print_ratios(configs: list, results: list[dict], runs: int) -> None:
    """``--ratio``: each configuration's CPU time per step, then the ratios per round, their median
    and spread: the none hook against allreduce_hook (the first model, as the issue asks; and the
    mean of both models, whose different memory layouts then weigh alike), and allreduce_hook
    against itself (A/A)."""
    print("| configuration | CPU ms/step per process (mean of the rounds) |")
    print("|---|---:|")
    for i, (label, _, _) in enumerate(configs):
        print(f"| {label} | {1e3 * statistics.fmean(cpu_per_round(results, i)) / len(results):.2f} |")
    both = [(a + b) / 2 for a, b in zip(cpu_per_round(results, 0), cpu_per_round(results, 2), strict=True)]
    rows = [(f"{configs[1][0]} / {configs[0][0]}", cpu_ratios(results, 1, 0)),
            (f"{configs[1][0]} / both {configs[0][0]} models",
             [n / r for n, r in zip(cpu_per_round(results, 1), both, strict=True)]),
            (f"{configs[0][0]} / itself (A/A: the method's noise)", cpu_ratios(results, 2, 0))]
    print(f"\n| CPU-time ratio | median of {runs} rounds | min | max | each round |")
    print("|---|---:|---:|---:|---|")
    for label, ratios in rows:
        print(f"| {label} | {statistics.median(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | "
              f"{', '.join(f'{r:.3f}' for r in ratios)} |")


if __name__ == "__main__":
    main()
