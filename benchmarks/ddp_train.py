"""Plain PyTorch DistributedDataParallel on a gradwire task: the baseline of
benchmarks/time_to_accuracy.py, and a check that gradwire's numbers mean what DDP users expect.

    torchrun --nproc-per-node 2 benchmarks/ddp_train.py --task stdlib-lm --steps 20 --out runs/ddp
    sudo .venv/bin/python scripts/testbed.py --nodes 4 --mbps 100 -- torchrun benchmarks/ddp_train.py \\
        --optimizer adamw --lr 1e-3 --hook powersgd --steps 200 --out runs/ddp-psgd

One process per rank (gloo, CPU), an ordinary training loop: ``DDP(model)``, a torch.optim
optimiser, ``loss.backward(); opt.step()``. What it shares with ``gradwire run --backend torch``
(so that the two start from the same point and see the same data):

- the task (``build_task``), its iid partition between the ranks (``build_partition``, seed
  ``--seed``) and each rank's batches (``WorkerData``: the same seeded epochs, so rank r draws
  exactly the batches gradwire's worker r draws);
- the initial model (``task.model_fn`` from ``hash_seed(seed, "model")``), bit for bit;
- the evaluation (``gradwire.tasks.evaluate.evaluate`` on rank 0, every ``--eval-every`` steps
  and at the last), and the run folder's ``metrics.jsonl`` format (``step``, ``wall_time_s`` since
  the start, taken before the evaluation, ``bytes_sent``, ``train_loss``, ``test_loss``, ...), so
  the benchmark reads both alike. ``eval_time_s``, as ``gradwire run`` writes it, is the time spent in the
  earlier evaluations.

The optimiser: ``sgd`` is torch.optim.SGD (heavy ball as gradwire's ``sync``: same update), ``adamw``
torch.optim.AdamW with DiLoCo's inner defaults (betas 0.9/0.95, eps 1e-8, weight decay 0.1).

The communication hook (``--hook``):

- ``allreduce``: DDP's own (no hook registered), bucketed and overlapped with the backward pass;
- ``powersgd``: PyTorch's ``powerSGD_hook`` (``PowerSGDState(matrix_approximation_rank=R,
  start_powerSGD_iter=S)``, error feedback and warm start on, PyTorch's defaults otherwise);
- ``gradwire:SPEC``: ``gradwire.ddp.register(model, SPEC, error_feedback=--error-feedback)``.

``bytes_sent`` counts all ranks together, as gradwire counts (ring collectives): an allreduce of B
bytes is 2(W-1)B; PowerSGD's three allreduces (uncompressed tensors, Ps, Qs) likewise, from the
shapes, exactly as PyTorch's hook decides what to compress; the gradwire hook's wire counter
(``wire_bytes_sent``: each rank's bytes handed to the collectives, int64 payload sizes, padding to
the longest rank and status bytes included, times its W-1 peers, an all-gather's ring count) summed
over the ranks, times 2/W for the codecs it allreduces (casts, PowerSGD), whose ring count is
2(W-1)B. ``gradwire run --backend torch`` counts the sizes and the padding too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's gradwire

from gradwire.algorithms.optim import lr_schedule, torch_lr_scheduler  # noqa: E402
from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.errors import ConfigError  # noqa: E402
from gradwire.seeding import hash_seed  # noqa: E402
from gradwire.tasks import build_partition, build_task  # noqa: E402
from gradwire.tasks.evaluate import evaluate  # noqa: E402
from gradwire.tasks.oracle import FlatModel, WorkerData  # noqa: E402


def build(task_spec: str, *, world: int, rank: int, seed: int, batch_size: int, data_dir: str = "data-cache"):
    """(task, model, rank's data): what ``gradwire run`` builds for worker ``rank`` of ``world``."""
    task = build_task(task_spec, num_workers=world, seed=seed, data_dir=data_dir)
    shards = build_partition("iid", labels=task.partition_labels(), num_workers=world, seed=seed)
    data = WorkerData(task.x_train[shards[rank]], task.y_train[shards[rank]], batch_size=batch_size, seed=seed,
                      rank=rank)
    model = task.model_fn(torch.Generator().manual_seed(hash_seed(seed, "model")))
    return task, model, data


def powersgd_floats(model: torch.nn.Module, rank: int, min_compression_rate: float = 2.0) -> int:
    """Floats one rank contributes per compressed step of PyTorch's powerSGD_hook: the tensors it
    leaves uncompressed (vectors; matrices where (n + m)·r·rate >= n·m), plus (n + m)·r per
    compressed n x m matrix (P and Q), with r = min(rank, n, m), as torch's ``_should_compress``."""
    total = 0
    for p in model.parameters():
        if p.dim() <= 1:
            total += p.numel()
            continue
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(rank, n, m)
        total += (n + m) * r if (n + m) * r * min_compression_rate < n * m else p.numel()
    return total


def powersgd_step_bytes(model: torch.nn.Module, world: int, rank: int, start_iter: int, fp16: bool):
    """Step (1-based) -> bytes all ranks send in it under PyTorch's powerSGD_hook, ring accounting:
    a plain allreduce of the gradient up to ``start_iter`` (the hook's counter starts at 0), then the
    compressed floats. ``fp16`` (``fp16_compress_wrapper``) halves both: the wrapper casts the whole
    bucket before the hook sees it."""
    itemsize = 2 if fp16 else 4
    plain = 2 * (world - 1) * sum(p.numel() for p in model.parameters()) * itemsize
    compressed = 2 * (world - 1) * powersgd_floats(model, rank) * itemsize
    return lambda step: plain if step <= start_iter else compressed


def make_optimizer(args, params) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """torch.optim.SGD or AdamW as ``args`` say, and gradwire's ``torch_lr_scheduler`` for the
    ``--lr-schedule`` spec (the factor gradwire's rules use for update k of ``args.steps``), stepped
    after each ``opt.step()``."""
    if args.optimizer == "sgd":
        momentum = 0.9 if args.momentum is None else args.momentum
        opt = torch.optim.SGD(params, lr=args.lr, momentum=momentum, weight_decay=args.weight_decay or 0.0)
    else:
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                                weight_decay=0.1 if args.weight_decay is None else args.weight_decay)
    return opt, torch_lr_scheduler(opt, args.lr_schedule, args.lr_horizon or args.steps)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(p, only=("task", "steps", "batch_size", "seed", "optimizer", "lr", "momentum", "weight_decay",
                           "lr_schedule", "error_feedback", "eval_every", "out", "name", "data_dir", "timeout_s"),
                  defaults={"task": "stdlib-lm", "steps": 200, "batch_size": 8, "lr": 0.05, "momentum": None,
                            "lr_schedule": "constant",
                            "weight_decay": None, "out": "runs/ddp", "name": None, "timeout_s": 600.0},
                  helps={"batch_size": "per rank", "optimizer": "sgd or adamw (AdamW's settings: --beta1, --beta2, "
                         "--eps)", "momentum": "sgd only; left out: 0.9",
                         "weight_decay": "left out: 0 for sgd, 0.1 for adamw", "error_feedback": "gradwire:SPEC only",
                         "timeout_s": "process group timeout"})
    p.add_argument("--beta1", type=float, default=0.9, help="adamw only")
    p.add_argument("--beta2", type=float, default=0.95, help="adamw only")
    p.add_argument("--eps", type=float, default=1e-8, help="adamw only")
    p.add_argument("--lr-horizon", type=int, default=None,
                   help="the updates --lr-schedule spans (default: --steps); past it the rate stays at its floor, so a "
                        "run may go on beyond the schedule (benchmarks/time_to_quality.py: to 2N)")
    p.add_argument("--hook", default="allreduce",
                   help="allreduce (DDP's own), powersgd (PyTorch's powerSGD_hook) or gradwire:SPEC")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--start-powersgd-iter", type=int, default=2)
    p.add_argument("--powersgd-fp16", action="store_true",
                   help="--hook powersgd wrapped in PyTorch's fp16_compress_wrapper (the hook runs in half precision: "
                        "half the bytes)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket cap (default: DDP's, 1 MiB first bucket then 25 MiB; with --hook powersgd 25, "
                        "i.e. one bucket for this model, as PyTorch's hook on gloo needs)")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, its run flags typed and checked as ``gradwire run`` checks them."""
    args, _ = parse_run_args(build_parser(), argv)
    if args.optimizer not in ("sgd", "adamw"):  # torch.optim's own: their settings are the flags here
        raise SystemExit(f"ddp_train.py: error: --optimizer {args.optimizer!r}: valid choices are sgd, adamw "
                         "(AdamW's settings: --beta1, --beta2, --eps)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        lr_schedule(args.lr_schedule, args.lr_horizon or args.steps)
    except ConfigError as e:
        raise SystemExit(f"ddp_train.py: error: --lr-schedule: {e}") from None
    started = time.perf_counter()
    torch.set_num_threads(1)  # as gradwire run (--threads 1): one core's worth per rank
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    task, model, data = build(args.task, world=world, rank=rank, seed=args.seed, batch_size=args.batch_size,
                              data_dir=args.data_dir)
    bucket_cap_mb = args.bucket_cap_mb
    if bucket_cap_mb is None and args.hook == "powersgd":
        # one bucket: with several, powerSGD_hook's allreduces, issued from each bucket's future
        # callbacks, reach gloo in a different order on different ranks (measured here: "Received
        # data size doesn't match expected size ... collective mismatch" at step 3 on 4 ranks).
        # An explicit cap also sets the first bucket's (DDP's default first bucket is 1 MiB).
        bucket_cap_mb = 25
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    numel = sum(p.numel() for p in model.parameters())
    dense_bytes = 2 * (world - 1) * numel * 4  # one ring allreduce of the float32 gradient, all ranks
    hook_state = None
    if args.hook == "allreduce":
        step_bytes = lambda step: dense_bytes  # noqa: E731
    elif args.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=args.start_powersgd_iter, random_seed=args.seed)
        if args.powersgd_fp16:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_wrapper

            ddp.register_comm_hook(state, fp16_compress_wrapper(psgd.powerSGD_hook))
        else:
            ddp.register_comm_hook(state, psgd.powerSGD_hook)
        step_bytes = powersgd_step_bytes(model, world, args.powersgd_rank, args.start_powersgd_iter,
                                         args.powersgd_fp16)
    elif args.hook.startswith("gradwire:"):
        import gradwire.ddp

        hook_state = gradwire.ddp.register(ddp, args.hook.split(":", 1)[1], error_feedback=args.error_feedback,
                                           seed=args.seed)
        step_bytes = None
    else:
        raise SystemExit(f"ddp_train.py: error: --hook {args.hook!r}: allreduce, powersgd or gradwire:SPEC")
    opt, schedule = make_optimizer(args, model.parameters())
    writer = rank == 0
    out = Path(args.out)
    eval_model = FlatModel(task.model_fn(torch.Generator().manual_seed(0))) if writer else None
    metrics = None
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        config = vars(args) | {"workers": world, "num_parameters": numel, "torch_version": torch.__version__,
                               "task_resolved": task.name}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        metrics = open(out / "metrics.jsonl", "w")  # noqa: SIM115 (closed below)
    counted, eval_s, window = 0, 0.0, []

    spec = args.hook.split(":", 1)[1] if hook_state is not None else ""
    # the hook counts each rank's payload times its W-1 peers; summed over ranks that is a ring
    # all-gather's count, but W/2 times a ring allreduce's (2(W-1)B), the path of casts and PowerSGD
    allreduce_path = spec.split(":")[0] in ("none", "fp16", "bf16", "powersgd")

    def gradwire_bytes() -> int:  # every rank's wire counter, summed (a collective: all ranks call it)
        t = torch.tensor([float(hook_state.wire_bytes_sent)], dtype=torch.float64)
        dist.all_reduce(t)
        return int(t.item() * (2 / world if allreduce_path else 1))

    def record(step: int) -> None:
        nonlocal eval_s
        total = gradwire_bytes() if hook_state is not None else counted
        if not writer:
            return
        now = time.perf_counter() - started
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        t = time.perf_counter()
        result = evaluate(task, eval_model, params)
        row = {"step": step, "wall_time_s": now, "eval_time_s": eval_s, "bytes_sent": total,
               "batch_loss": sum(window) / len(window) if window else None} | result
        eval_s += time.perf_counter() - t
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    record(0)
    status = "finished"
    try:
        for step in range(1, args.steps + 1):
            x, y = data.next_batch()
            opt.zero_grad(set_to_none=False)
            loss = task.loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            schedule.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                status = f"diverged at step {step} (loss {value})"
                raise SystemExit(f"ddp_train.py: rank {rank}: {status}")
            window.append(value)
            if step_bytes is not None:
                counted += step_bytes(step)
            if step % args.eval_every == 0 or step == args.steps:
                record(step)
                window.clear()
    finally:
        if writer:
            metrics.close()
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
            summary = {"label": args.name or args.hook, "status": status, "steps": rows[-1]["step"] if rows else 0,
                       "final": rows[-1] if rows else None, "wall_time_s": time.perf_counter() - started}
            (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    dist.barrier()  # leave together: a rank tearing gloo down while a peer still talks can abort it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
