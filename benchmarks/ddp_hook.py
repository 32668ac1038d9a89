"""Step time of plain DDP against the gradwire.ddp hook, 2 gloo processes on this machine.

    python benchmarks/ddp_hook.py [--rounds 12] [--steps-per-round 10] [--batch 64] [--only fp16 ...]

Model: an MLP 512-1024-512-10 (1.05M float32 parameters, 4.2 MB of gradient; three buckets once
DDP has rebuilt them), one synthetic batch per rank, SGD. A step is forward, backward (where the
hook runs) and the update.

Timing: one pair of processes (spawn, FileStore, one thread each) builds one DDP model per
configuration and runs them in interleaved rounds (``--steps-per-round`` steps of each in turn),
so that other load on the machine falls on every configuration alike; the first round is warm-up.
Peak RSS: each configuration again in a fresh pair of processes (20 steps), so that it is its own.

Columns: mean and median (p50) step time of rank 0 in ms over the timed steps, the ratio of the
mean to plain DDP's, bytes per step by the hook's rule (payload this rank contributed x peers
reached; for PyTorch's hooks and plain DDP, the gradient's bytes by the same rule), and the larger
of the two ranks' peak RSS (ru_maxrss).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# (label, gradwire spec or "torch:<hook>", error feedback). PyTorch's own Python hooks
# (torch.distributed.algorithms.ddp_comm_hooks.default_hooks) show what any Python hook costs
# against DDP's built-in C++ allreduce.
CONFIGS = [("plain DDP", None, False), ("torch allreduce_hook", "torch:allreduce_hook", False),
           ("torch fp16_compress_hook", "torch:fp16_compress_hook", False), ("none", "none", False),
           ("fp16", "fp16", False), ("qsgd:levels=4", "qsgd:levels=4", False),
           ("topk:ratio=0.01 + EF", "topk:ratio=0.01", True)]


def build(spec: str | None, ef: bool):
    import torch
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire import ddp as gwddp

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                              nn.Linear(512, 10)))
    state = None
    if spec and spec.startswith("torch:"):
        model.register_comm_hook(None, getattr(default_hooks, spec.removeprefix("torch:")))
    elif spec:
        state = gwddp.register(model, spec, error_feedback=ef)
    return model, state, torch.optim.SGD(model.parameters(), lr=0.01)


def steps(model, opt, x, y, count: int) -> list[float]:
    from torch import nn

    times = []
    for _ in range(count):
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def child(rank: int, world_size: int, folder: str, configs: list, args: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), world_size),
                            rank=rank, world_size=world_size)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args["batch"], 512, generator=g), torch.randint(0, 10, (args["batch"],), generator=g)
    runs = [build(spec, ef) for _, spec, ef in configs]
    times: list[list[float]] = [[] for _ in configs]
    counted = [0] * len(configs)
    for round_ in range(args["rounds"]):
        for i, (model, state, opt) in enumerate(runs):
            dist.barrier()
            before = state.bytes_sent if state else 0
            took = steps(model, opt, x, y, args["steps_per_round"])
            if round_:  # the first round warms up (and crosses DDP's bucket rebuild)
                times[i] += took
                counted[i] += (state.bytes_sent - before) if state else 0
    numel = sum(p.numel() for p in runs[0][0].parameters())
    out = []
    for (_, spec, _), (_, state, _), t, sent in zip(configs, runs, times, counted, strict=True):
        if not state:  # the same rule: the gradient's bytes (2 per element for fp16) to each peer
            sent = (2 if spec and "fp16" in spec else 4) * numel * (world_size - 1) * len(t)
        out.append({"mean_ms": 1e3 * statistics.fmean(t), "p50_ms": 1e3 * statistics.median(t),
                    "bytes": sent / len(t), "numel": numel})
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    torch.save({"rows": out, "peak_mib": peak_mib}, os.path.join(folder, f"r{rank}.pt"))
    dist.destroy_process_group()


def launch(configs: list, args: dict, world_size: int = 2) -> list[dict]:
    import torch
    import torch.multiprocessing as mp

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of steps; the first is warm-up")
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", action="append", help="only these labels (plain DDP always runs)")
    a = parser.parse_args()
    configs = [c for c in CONFIGS if not a.only or c[0] in a.only or c[0] == "plain DDP"]
    args = {"rounds": a.rounds, "steps_per_round": a.steps_per_round, "batch": a.batch}
    timing = launch(configs, args)[0]["rows"]
    peaks = [max(r["peak_mib"] for r in launch([c], {**args, "rounds": 2})) for c in configs]
    base = timing[0]["mean_ms"]
    timed = (a.rounds - 1) * a.steps_per_round
    print(f"{timing[0]['numel']:,} parameters, batch {a.batch} per rank, 2 gloo processes x 1 thread, "
          f"{timed} timed steps per configuration in {a.rounds - 1} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| configuration | mean ms/step | p50 ms/step | mean vs plain | bytes/step sent | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for (label, _, _), row, peak in zip(configs, timing, peaks, strict=True):
        print(f"| {label} | {row['mean_ms']:.2f} | {row['p50_ms']:.2f} | {row['mean_ms'] / base:.2f} "
              f"| {row['bytes']:,.0f} | {peak:.0f} |")


if __name__ == "__main__":
    main()
