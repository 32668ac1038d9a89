"""Time to DDP's quality: how long each method needs to reach the validation loss that DDP with
AdamW itself reaches, on networks of 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, at 4, 16 and 64 workers.

    .venv/bin/python benchmarks/time_to_quality.py all            # everything below, in order (hours)
    .venv/bin/python benchmarks/time_to_quality.py curves --workers 4 --rows ddp,diloco --seeds 1
    .venv/bin/python benchmarks/time_to_quality.py compute        # CPU seconds per step, one core
    .venv/bin/python benchmarks/time_to_quality.py report         # table and plots from what ran

Every stage skips what its folder (``--out``, default runs/time-to-quality) already holds, so the
costly part, ``curves``, can be stopped and run again by the same command.

**Where the numbers come from.**

1. *Curves* (``curves``): each row trains on the simulator (``gradwire run`` in process, one
   thread) and records its validation loss every ``EVAL_EVERY`` steps and its bytes. The loss
   against steps does not depend on the network (no stragglers: every worker computes every step),
   only on the method and the number of workers, so one run per (row, setting, seed, workers)
   serves every rate. First ``tune`` runs every row's ``TRIALS`` (the same number for every row,
   DDP included) on ``TUNING_SEED``; the table's seeds (``TABLE_SEEDS``) never include it.
2. *Compute* (``compute``): each row's CPU seconds per step, measured alone on one core
   (``torch.set_num_threads(1)``, ``time.thread_time``: forward, backward, optimizer and codec of one
   worker, median of ``COMPUTE_STEPS`` steps after a warm-up). CPU time, not wall time, because
   the machine is shared: wall time there measures the neighbours. The backward pass's share is
   measured too (the part a DDP-style overlap can hide communication behind).
3. *Time* (``report``): a step lasts its compute plus the communication that compute does not hide,
   from gradwire's ring model (``transports/network.py``: an allreduce of B bytes a worker among n
   costs 2(n-1)(latency + B/(n·bandwidth)); ``step_seconds`` below), with B each row's measured
   payload per step. The target is DDP's own final quality: the mean of its last ``LAST``
   evaluations at N steps (``target_quality``); every row may run to 2N; its time to the target is
   its first evaluation at or below it.

Rows (``ROWS``): DDP (gradwire's sync AdamW, equal to PyTorch DDP with AdamW:
tests/ddp/test_ddp_train_benchmark.py), DDP with a bf16 cast (PyTorch's bf16 hook's arithmetic but
for the sum's precision: gradwire sums the bf16 payloads in float32), DDP with gradient
accumulation over k = 2, 4, 8 micro-batches (one allreduce per k micro-batches of 8), gradwire sync
with PowerSGD and with QSGD, local AdamW (parameters averaged every H steps), DiLoCo and Streaming
DiLoCo. PyTorch's own PowerSGD hook needs real processes (benchmarks/ddp_train.py under torchrun);
it is listed, marked "not run".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args

TASK = "stdlib-lm:dim=64,layers=2,heads=2,val_bytes=65536"
BATCH = 8                      # sequences of 64 bytes per worker and micro-batch
EVAL_EVERY = 50
LAST = 5                       # evaluations averaged into a quality
TUNING_SEED = 0
TABLE_SEEDS = (1, 2, 3)
RATES_MBPS = (10.0, 100.0, 1000.0)
WORKERS = (4, 16, 64)
LATENCY_MS = 1.0
COMPUTE_STEPS = 30
ADAMW = dict(optimizer="adamw:beta2=0.95", weight_decay=0.1)  # DDP's AdamW (benchmarks/ddp_train.py)
LRS = (1e-3, 2e-3, 4e-3)       # every row's trials: the same three learning rates


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    algorithm: str
    run: dict = field(default_factory=dict)  # RunConfig fields besides the learning rate
    micro_batches: int = 1     # gradient accumulation: k micro-batches of BATCH per optimizer step
    collectives: int = 1       # allreduces per communication round (latency terms)
    period: int = 1            # steps per communication round
    overlap: str = "backward"  # backward: hidden behind the backward pass (DDP); none; tau:K (K steps)
    runs: bool = True          # False: needs real processes, not run by this script


H = 20
ROWS = [
    Row("ddp", "DDP (AdamW)", "sync", ADAMW),
    Row("ddp-bf16", "DDP + bf16 cast", "sync", ADAMW | dict(compressor="bf16")),
    *[Row(f"ddp-accum{k}", f"DDP, accumulation k={k}", "sync", ADAMW | dict(batch_size=BATCH * k), micro_batches=k)
      for k in (2, 4, 8)],
    Row("torch-powersgd", "PyTorch PowerSGD hook", "sync", ADAMW, collectives=2, runs=False),
    Row("gw-powersgd", "gradwire sync + PowerSGD r8 fp16", "sync",
        ADAMW | dict(compressor="powersgd:rank=8,dtype=fp16"), collectives=2),
    Row("gw-qsgd", "gradwire sync + QSGD 4-bit + EF", "sync",
        ADAMW | dict(compressor="qsgd:levels=7,bucket=128", error_feedback=True), overlap="none",
        runs=False),  # an allgather (not summable): the time model here prices allreduces only
    Row("local-adamw", f"local AdamW, averaged every {H}", f"diloco:inner_steps={H},outer_lr=1,outer_momentum=0,"
        "outer_warmup=0", period=H, overlap="none"),
    Row("diloco", f"DiLoCo H={H}", f"diloco:inner_steps={H}", period=H, overlap="none"),
    Row("streaming", f"Streaming DiLoCo H={H} P=4 τ=2 fp16",
        f"streaming-diloco:inner_steps={H},fragments=4,overlap=2,alpha=0.5",
        dict(compressor="fp16"), period=H // 4, overlap="tau:2"),
]
ROW = {r.key: r for r in ROWS}


# -- the pure logic (tests/report/test_time_to_quality.py) ------------------------------------------

def window_mean(values: list[float], end: int, n: int = LAST) -> float:
    """Mean of the ``n`` values up to and including index ``end``."""
    chunk = values[max(0, end - n + 1):end + 1]
    return sum(chunk) / len(chunk)


def target_quality(steps: list[int], losses: list[float], n_steps: int) -> float:
    """DDP's quality: the mean of its last LAST evaluations at or before step N."""
    end = max(i for i, s in enumerate(steps) if s <= n_steps)
    return window_mean(losses, end)


def quarter_gain(steps: list[int], losses: list[float], n_steps: int) -> float:
    """Relative improvement over the last quarter before N (each end a LAST-evaluation mean): the
    plateau test wants < 2 %."""
    end = max(i for i, s in enumerate(steps) if s <= n_steps)
    starts = [i for i, s in enumerate(steps) if s <= 3 * n_steps // 4]
    if not starts:
        return float("nan")
    before, after = window_mean(losses, starts[-1]), window_mean(losses, end)
    return (before - after) / before


def evaluation_noise(losses: list[float]) -> float:
    """One evaluation's relative scatter about the trend: r_i = (L_i - (L_{i-1} + L_{i+1})/2) / L_i;
    for independent noise of deviation σ, r has deviation σ·sqrt(3/2), so σ = std(r)/sqrt(1.5)."""
    r = [(losses[i] - (losses[i - 1] + losses[i + 1]) / 2) / losses[i] for i in range(1, len(losses) - 1)]
    return statistics.pstdev(r) / math.sqrt(1.5) if len(r) > 1 else float("nan")


def steps_to_target(steps: list[int], losses: list[float], target: float) -> int | None:
    """The first evaluated step whose loss is at or below the target (None: never)."""
    return next((s for s, v in zip(steps, losses) if v <= target), None)


def allreduce_seconds(payload_bytes: float, workers: int, mbps: float, latency_ms: float = LATENCY_MS,
                      collectives: int = 1) -> float:
    """gradwire's ring allreduce (transports/network.py, RingNetwork.allreduce; Patarasuk 2009):
    2(n-1)(latency + B/(n·bw)) per collective; ``payload_bytes`` is B summed over the collectives."""
    if workers <= 1:
        return 0.0
    bandwidth = mbps * 1e6 / 8
    return 2 * (workers - 1) * (collectives * latency_ms / 1e3 + payload_bytes / (workers * bandwidth))


def step_seconds(row: Row, compute_s: float, backward_s: float, payload_bytes: float, workers: int,
                 mbps: float | None) -> float:
    """One step's time: compute, plus the communication it cannot hide. ``payload_bytes``: what one
    worker contributes per communication round; ``mbps`` None: a network of zero cost."""
    if mbps is None:
        return compute_s
    comm = allreduce_seconds(payload_bytes, workers, mbps, collectives=row.collectives)
    if row.overlap == "backward":  # DDP: the buckets' allreduces run while the backward pass goes on
        return compute_s + max(0.0, comm - backward_s)
    if row.overlap.startswith("tau:"):  # Streaming DiLoCo: a fragment travels while τ steps compute
        tau = int(row.overlap.split(":")[1])
        return compute_s + max(0.0, comm - tau * compute_s) / row.period
    return compute_s + comm / row.period


def check_seeds(tuning_seed: int, table_seeds) -> None:
    """The learning rate is chosen on a seed that the table does not report."""
    if tuning_seed in table_seeds:
        raise ValueError(f"tuning seed {tuning_seed} is also a table seed ({list(table_seeds)}): choose another")


def best_trial(trials: dict[float, float]) -> float:
    """The trial (learning rate) with the lowest final quality; NaN (diverged) never wins."""
    finite = {lr: q for lr, q in trials.items() if math.isfinite(q)}
    if not finite:
        raise ValueError("every trial diverged")
    return min(finite, key=lambda lr: (finite[lr], lr))


def summarise(values: list[float | None]) -> tuple[float | None, float | None, float | None, int]:
    """(mean, min, max) over the seeds that reached the target, and how many did."""
    got = [v for v in values if v is not None]
    if not got:
        return None, None, None, 0
    return sum(got) / len(got), min(got), max(got), len(got)


def table_rows(target: float, results: dict, compute: dict, workers: int) -> list[dict]:
    """One line per row: time to the target at each rate (mean and range over the seeds that
    reached it) and its ratio to DDP on a network of zero cost. ``results[key]`` = list of
    per-seed dicts {steps, losses, payload_bytes}; ``compute[key]`` = {compute_s, backward_s}."""
    zero = None
    lines = []
    for row in ROWS:
        line = {"key": row.key, "label": row.label}
        runs, cost = results.get(row.key), compute.get(row.key)
        if not row.runs or not runs or cost is None:
            line["status"] = "not run"
            lines.append(line)
            continue
        reached = [steps_to_target(r["steps"], r["losses"], target) for r in runs]
        line["best"] = min(min(r["losses"]) for r in runs)
        line["steps"] = summarise(reached)
        payload = statistics.mean(r["payload_bytes"] for r in runs)
        line["bits_per_param_step"] = 8 * payload / runs[0]["params"] / row.period
        line["cpu_ms"] = 1e3 * cost["compute_s"]
        for mbps in (None, *RATES_MBPS):
            t = step_seconds(row, cost["compute_s"], cost["backward_s"], payload, workers, mbps)
            line[f"t@{mbps}"] = summarise([None if s is None else s * t for s in reached])
        if row.key == "ddp":
            zero = line["t@None"][0]
        lines.append(line)
    for line in lines:
        for mbps in RATES_MBPS:
            mean = line.get(f"t@{mbps}", (None,))[0]
            line[f"x@{mbps}"] = None if mean is None or not zero else mean / zero
    return lines


def _fmt_range(s, unit="", digits=0, seeds=True) -> str:
    mean, lo, hi, n = s
    if mean is None:
        return "not reached"
    text = f"{mean:.{digits}f}{unit}" + (f" ({lo:.{digits}f}-{hi:.{digits}f})" if n > 1 else "")
    return text + (f", {n} seed{'s' if n > 1 else ''}" if seeds else "")


def markdown(lines: list[dict], workers: int, target: float) -> str:
    head = (f"\n### {workers} workers (target: validation loss {target:.4f})\n\n| row | steps to target | "
            + " | ".join(f"time @ {m:g} Mbit/s (x DDP at zero cost)" for m in RATES_MBPS)
            + " | bits/param/step | CPU ms/step |\n|---" + "|---" * (len(RATES_MBPS) + 3) + "|\n")
    out = []
    for line in lines:
        if line.get("status") == "not run":
            out.append(f"| {line['label']} | not run |" + " |" * (len(RATES_MBPS) + 2))
            continue
        if line["steps"][0] is None:
            out.append(f"| {line['label']} | not reached (best {line['best']:.4f}) |" + " — |" * len(RATES_MBPS)
                       + f" {line['bits_per_param_step']:.2f} | {line['cpu_ms']:.1f} |")
            continue
        cells = [f"{_fmt_range(line[f't@{m}'], ' s', 1, seeds=False)}, {line[f'x@{m}']:.2f}x" for m in RATES_MBPS]
        out.append(f"| {line['label']} | {_fmt_range(line['steps'])} | " + " | ".join(cells)
                   + f" | {line['bits_per_param_step']:.2f} | {line['cpu_ms']:.1f} |")
    return head + "\n".join(out) + "\n"


# -- the costly stages --------------------------------------------------------------------------------

def run_folder(out: Path, row: Row, lr: float, seed: int, workers: int) -> Path:
    return out / f"w{workers}" / row.key / f"lr{lr:g}-seed{seed}"


def config(row: Row, lr: float, seed: int, workers: int, steps: int, folder: Path):
    from gradwire.config import RunConfig

    fields = dict(task=TASK, workers=workers, batch_size=BATCH, steps=steps, eval_every=EVAL_EVERY, threads=1,
                  network=f"ring:mbps=100,latency_ms={LATENCY_MS:g}", seed=seed, lr=lr, algorithm=row.algorithm,
                  out=str(folder), overwrite=True) | row.run
    return RunConfig(**fields)


def train(row: Row, lr: float, seed: int, workers: int, steps: int, out: Path) -> Path:
    """One curve, unless its folder already holds a finished one."""
    from gradwire.errors import DivergenceError
    from gradwire.run.loop import run

    folder = run_folder(out, row, lr, seed, workers)
    summary = folder / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("status") in ("finished", "diverged"):
        return folder
    print(f"[time_to_quality] {row.key} lr={lr:g} seed={seed} workers={workers} steps={steps}", flush=True)
    try:
        run(config(row, lr, seed, workers, steps, folder), progress=False)
    except DivergenceError:
        pass  # its summary says so; its quality is NaN
    return folder


def read_curve(folder: Path, row: Row) -> dict:
    """Evaluations (steps > 0), bytes, and what one worker sends per communication round: a ring
    allreduce of B bytes a worker is counted 2(n-1)B in the ledger."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] > 0]
    cfg = json.loads((folder / "config.json").read_text())
    steps = [r["step"] for r in rows]
    losses = [float("nan") if r.get("test_loss") is None else r["test_loss"] for r in rows]
    per_step = rows[-1]["bytes_sent"] / max(1, 2 * (cfg["workers"] - 1)) / steps[-1] if rows else 0.0
    return {"steps": steps, "losses": losses, "bytes": [r["bytes_sent"] for r in rows],
            "payload_bytes": per_step * row.period, "params": cfg["num_parameters"], "workers": cfg["workers"]}


def measure_compute(row: Row, lr: float) -> dict:
    """CPU seconds of one worker's step on one core (thread time), median over COMPUTE_STEPS, and
    the backward pass's share of a plain forward+backward at the same batch."""
    import tempfile

    import torch

    from gradwire.run.loop import Run

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        r = Run(config(row, lr, TUNING_SEED, 1, COMPUTE_STEPS + 5, Path(tmp) / "run"))
        times = []
        for i in range(COMPUTE_STEPS + 5):
            start = time.thread_time()
            r.train_step()
            if i >= 5:
                times.append(time.thread_time() - start)
        model, task = r.model.module, r.task
        # one micro-batch's backward: all that the allreduce, issued after the last micro-batch, can hide
        x, y = task.x_train[:BATCH], task.y_train[:BATCH]
        fwd, bwd = [], []
        for _ in range(10):
            start = time.thread_time()
            loss = task.loss_fn(model(x), y)
            mid = time.thread_time()
            loss.backward()
            fwd.append(mid - start)
            bwd.append(time.thread_time() - mid)
        # what one worker sends per communication round, from the ledger of 4 simulated workers
        rounds = 4
        r = Run(config(row, lr, TUNING_SEED, 4, rounds * row.period, Path(tmp) / "bytes"))
        for _ in range(rounds * row.period):
            r.train_step()
        payload = r.transport.bytes_sent / (2 * 3) / rounds
    return {"compute_s": statistics.median(times), "backward_s": statistics.median(bwd),
            "forward_s": statistics.median(fwd), "steps": COMPUTE_STEPS, "payload_bytes": payload}


def step_time_table(compute: dict) -> str:
    """The time model alone: each row's step time over DDP's on a network of zero cost, at every
    worker count and rate (no curves needed: what a step costs, not how many steps it takes)."""
    ddp = compute["ddp"]["compute_s"]
    head = "| row | " + " | ".join(f"{w} w @ {m:g}" for w in WORKERS for m in RATES_MBPS) + " |\n"
    lines = [head, "|---" * (1 + len(WORKERS) * len(RATES_MBPS)) + "|\n"]
    for row in ROWS:
        cost = compute.get(row.key)
        if not row.runs or cost is None or "payload_bytes" not in cost:
            continue
        cells = [step_seconds(row, cost["compute_s"], cost["backward_s"], cost["payload_bytes"], w, m) / ddp
                 for w in WORKERS for m in RATES_MBPS]
        lines.append(f"| {row.label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |\n")
    return "".join(lines)


def load_results(out: Path, workers: int, seeds, lrs: dict) -> dict:
    results = {}
    for row in ROWS:
        lr = lrs.get(row.key)
        if lr is None:
            continue
        curves = [read_curve(run_folder(out, row, lr, s, workers), row) for s in seeds
                  if (run_folder(out, row, lr, s, workers) / "summary.json").exists()]
        if curves:
            results[row.key] = curves
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("stage", choices=["tune", "curves", "compute", "report", "all"])
    p.add_argument("--rows", default=",".join(r.key for r in ROWS if r.runs))
    p.add_argument("--n-steps", type=int, default=2000, help="N: DDP's steps; every row may run 2N")
    add_run_flags(p, only=("out", "workers", "seed", "lr"), sweep=("workers", "seed"),
                  defaults={"out": "runs/time-to-quality", "workers": list(WORKERS), "seed": list(TABLE_SEEDS)},
                  helps={"lr": "skip the tuning: every row at this rate (marked)"})
    args, _ = parse_run_args(p, argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [ROW[k] for k in args.rows.split(",")]
    workers, seeds = args.workers, args.seeds
    check_seeds(TUNING_SEED, seeds)
    stages = ["tune", "compute", "curves", "report"] if args.stage == "all" else [args.stage]
    lrs_file = out / "tuning.json"
    lrs = json.loads(lrs_file.read_text()) if lrs_file.exists() else {}
    if "tune" in stages:
        for row in rows:
            if not row.runs:
                continue
            trials = {}
            for lr in LRS:
                curve = read_curve(train(row, lr, TUNING_SEED, workers[0], 2 * args.n_steps, out), row)
                trials[lr] = window_mean(curve["losses"], len(curve["losses"]) - 1)
            lrs[row.key] = best_trial(trials)
            lrs[f"{row.key}:trials"] = {f"{lr:g}": q for lr, q in trials.items()}
            lrs_file.write_text(json.dumps(lrs, indent=1) + "\n")
    if args.lr is not None:
        lrs = lrs | {r.key: args.lr for r in rows} | {"untuned": args.lr}
        lrs_file.write_text(json.dumps(lrs, indent=1) + "\n")
    if "compute" in stages:
        path = out / "compute.json"
        compute = json.loads(path.read_text()) if path.exists() else {}
        for row in rows:
            if row.runs and "payload_bytes" not in compute.get(row.key, {}):
                compute[row.key] = measure_compute(row, lrs.get(row.key, LRS[1]))
                path.write_text(json.dumps(compute, indent=1) + "\n")
    if "curves" in stages:
        for w in workers:
            for row in rows:
                if row.runs and row.key in lrs:
                    for s in seeds:
                        train(row, lrs[row.key], s, w, 2 * args.n_steps, out)
    if "report" in stages:
        from time_to_quality_report import write_report

        write_report(out, workers, seeds, lrs, args.n_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
