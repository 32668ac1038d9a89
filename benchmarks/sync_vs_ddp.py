"""Step time of gradwire's uncompressed `sync` on the torch backend against PyTorch DDP.

Both run in the same gloo processes (spawned here with a FileStore), on the same model, data
shard and batch size, interleaved in rounds so machine noise hits both alike: gradwire's step is
`Run.train_step()` (flat-buffer gradient, one allreduce of the flat gradient, heavy-ball update);
DDP's is forward, backward (bucketed allreduce overlapped with backward), `optimizer.step()`.
Prints mean and median ms per step, the ratio (target: gradwire within 10% of DDP) and each
process's peak RSS.

    python benchmarks/sync_vs_ddp.py [--nproc 2] [--steps 200] [--rounds 3] [--task mnist1d-mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradwire.cli.flags import add_run_flags, parse_run_args


def worker(rank: int, nproc: int, store_path: str, args: dict, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, nproc), rank=rank, world_size=nproc)
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire.config import RunConfig
    from gradwire.run.loop import Run

    run = Run(RunConfig(task=args["task"], workers=nproc, backend="torch", batch_size=args["batch"], lr=0.01,
                        data_dir=args["data_dir"], out=os.path.join(out, "run")))
    module = run.task.model_fn(torch.Generator().manual_seed(0))
    ddp = DDP(module)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = run.oracle.workers[rank]

    def ddp_step():
        x, y = data.next_batch()
        opt.zero_grad(set_to_none=True)
        run.task.loss_fn(ddp(x), y).backward()
        opt.step()

    times = {"gradwire sync": [], "PyTorch DDP": []}
    for _ in range(10):  # warm-up both
        run.train_step()
        ddp_step()
    for _ in range(args["rounds"]):
        for name, fn in (("gradwire sync", run.train_step), ("PyTorch DDP", ddp_step)):
            dist.barrier()
            for _ in range(args["steps"]):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"times": times, "peak_mb": peak, "params": run.model.numel}, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    add_run_flags(ap, only=("steps", "task", "data_dir"), defaults={"steps": 200},
                  helps={"steps": "steps per round and contender"})
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    a, _ = parse_run_args(ap)
    with tempfile.TemporaryDirectory() as tmp:
        args = {"task": a.task, "batch": a.batch, "steps": a.steps, "rounds": a.rounds, "data_dir": a.data_dir}
        mp.start_processes(worker, args=(a.nproc, os.path.join(tmp, "store"), args, tmp), nprocs=a.nproc,
                           join=True, start_method="spawn")
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(a.nproc)]
    print(f"{a.task} ({ranks[0]['params']} parameters), {a.nproc} gloo processes on this machine, batch {a.batch}, "
          f"{a.rounds} interleaved rounds of {a.steps} steps\n")
    print("| contender | mean ms/step | median ms/step | ratio to DDP (mean) | peak RSS per process (MB) |")
    print("|---|---|---|---|---|")
    ref = statistics.mean(ranks[0]["times"]["PyTorch DDP"]) * 1e3
    for name in ("PyTorch DDP", "gradwire sync"):
        ts = [t * 1e3 for t in ranks[0]["times"][name]]
        print(f"| {name} | {statistics.mean(ts):.3f} | {statistics.median(ts):.3f} | {statistics.mean(ts) / ref:.2f}x "
              f"| {max(r['peak_mb'] for r in ranks):.0f} |")
    print("\ntarget: gradwire sync within 10% of DDP (ratio <= 1.10); rank 0's step times shown")


if __name__ == "__main__":
    sys.exit(main())
