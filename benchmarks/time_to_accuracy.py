"""Time to a target validation loss on a communication-bound language model, 4 workers over real
rate-limited links (the namespace test bed, scripts/testbed.py): PyTorch DDP and its PowerSGD hook
against gradwire's compressed sync, PowerSGD, local SGD, DiLoCo and Streaming DiLoCo (issue 13).

    sudo .venv/bin/python benchmarks/time_to_accuracy.py                  # both rates, ~40 min
    sudo .venv/bin/python benchmarks/time_to_accuracy.py --quick          # smoke run, ~3 min
    sudo .venv/bin/python benchmarks/time_to_accuracy.py --rates 100 --only ddp-sgd,gw-topk
    sudo .venv/bin/python benchmarks/time_to_accuracy.py --only adamw     # the AdamW rows, ~25 min
    sudo .venv/bin/python benchmarks/time_to_accuracy.py --long           # AdamW, 1000 steps, ~40 min
    sudo .venv/bin/python benchmarks/time_to_accuracy.py --long --seed 1 --out runs/tta-long-seed1  # another seed
    sudo .venv/bin/python benchmarks/time_to_accuracy.py --long --lr-schedule cosine:warmup=50,min_ratio=0.1 \
        --out runs/tta-long-cosine                                        # every row warmed up and decayed
    .venv/bin/python benchmarks/time_to_accuracy.py --report-only         # table + plot from the run folders

The task: `stdlib-lm` (byte-level transformer, 1,445,824 parameters, a 5.8 MB float32 gradient;
docs/diloco.md), batch 8 sequences of 64 bytes per worker, seed 0 (`--seed`), the same initial
model and the same batches for every variant (benchmarks/ddp_train.py builds them with gradwire's
own task code).
The validation set is cut to `val_bytes=4096` so that rank 0's evaluation (every --eval-every
steps; the other workers wait for it) costs a few per cent of a run, not a third.

Variants (`--only` takes the keys; `--list` prints them with their command lines):
- `ddp-sgd`, `ddp-adamw`: PyTorch DDP, uncompressed allreduce (benchmarks/ddp_train.py under
  torchrun); SGD with heavy ball 0.9 at lr 0.05, or AdamW at lr 1e-3 (DiLoCo's inner settings);
- `ddp-sgd-powersgd`, `ddp-adamw-powersgd`: the same with PyTorch's `powerSGD_hook` (rank 4,
  start_powerSGD_iter 2);
- `ddp-adamw-gw-powersgd`: the same DDP AdamW script with gradwire's hook, `gradwire.ddp` with
  `powersgd:rank=4` (the hook that matches PyTorch's; docs/powersgd.md);
- `gw-topk`, `gw-sign`, `gw-qsgd`, `gw-powersgd`: `gradwire run --algorithm sync` (SGD, heavy ball
  0.9, lr 0.05) with `topk:ratio=0.01` + error feedback, `sign:scaled=true` + error feedback,
  `qsgd:levels=7,bucket=128`, `powersgd:rank=4`;
- `gw-local`: local SGD, averaging every 20 steps (SGD as above);
- `gw-adamw`, `gw-adamw-powersgd8`, `gw-adamw-powersgd16`: `gradwire run --algorithm sync
  --optimizer adamw:beta2=0.95 --weight-decay 0.1 --lr 1e-3` (DDP AdamW's settings), uncompressed
  and with `powersgd:rank=8` and `rank=16`;
- `ddp-adamw-powersgd32`, `ddp-adamw-powersgd32h`: PyTorch's hook at rank 32 (where AdamW stays
  within 1 % of DDP), plain and wrapped in `fp16_compress_wrapper` (half the bytes);
- `ddp-adamw-gw-powersgd32h`, `ddp-adamw-gw-powersgd32h-b1`: `gradwire.ddp` with
  `powersgd:rank=32,dtype=fp16,start_step=2` (fp16 factors), DDP's default buckets or 1 MB ones;
- `gw-adamw-powersgd32h`: `gradwire run --algorithm sync` AdamW with `powersgd:rank=32,dtype=fp16`;
  `gw-adamw-powersgd24h` the same at rank 24 (the lowest rank under 1 % on the simulator), and
  `gw-adamw-powersgd48h`, `-64h` at ranks 48 and 64 (over 1000 steps, within 1 % of DDP by the
  mean of the last five evaluations on every seed tried, where rank 32 is not);
- `gw-adamw-ov`: `gw-adamw` with `sync:overlap=true` (1 MB buckets, as DDP's first);
- `gw-adamw-powersgd32h-ov`, `-ov2`, `-ov3`: the same with `sync:overlap=true` (each bucket's
  allreduces during the backward pass), 1, 2 and 3 MB buckets;
- `gw-adamw-acp32h`, `gw-adamw-acp32h-ov`, `-ov3`: ACP-SGD, `powersgd:rank=32,dtype=fp16,
  alternate=true` (one allreduce a step), without overlap, and with 1 and 3 MB buckets;
- `gw-diloco`: DiLoCo, H = 20 inner AdamW steps (lr 1e-3), outer Nesterov 0.7 / 0.9;
- `gw-streaming`: Streaming DiLoCo, H = 20, 4 fragments, overlap 2 steps, fp16 outer gradients.
- `gw-streaming-eager`: the same with each round overlapped by a whole inner phase (τ = H) and
  eager updates, outer step 0.5 without momentum (where eager kept blocking DiLoCo's quality on
  the simulator: docs/low_communication.md, "Eager updates"; added, not yet run on the test bed).
- `gw-sparseloco`, `gw-demo`, `gw-muloco`: SparseLoCo (H = 20), DeMo and MuLoCo (H = 20) at their
  defaults, inner lr 1e-3 (docs/low_communication.md; rows added, not yet run on the test bed).

Columns:
- s to L: wall seconds from the step-0 record to the first evaluation with validation loss <= L
  (start-up, rendezvous and data set-up excluded; rank 0's evaluations included, the same for all);
  "n/r": not reached. Resolution: --eval-every steps.
- speed-up: DDP's time (same optimiser family) over this row's; "vs best DDP" uses the faster DDP.
- MB to L: bytes counted up to that evaluation (all workers, ring-collective accounting, the rule
  gradwire's torch transport uses; DDP's from the shapes, see ddp_train.py); MB run: counted for
  the whole run / what the four veth interfaces really sent (TCP/IP, rendezvous, evaluation waits).
- final loss: validation loss after the last step; Δ vs DDP: relative to DDP with the same
  optimiser family (the issue's target: within 1 %). Δ last 5 vs DDP: the same for the mean of
  the last five evaluations, steadier than one evaluation (at a constant rate the 4 KB validation
  set's loss moves by up to 4.4 % between evaluations; docs/time_to_accuracy.md, "Ninth pass").
  loss at T s: each run's last validation loss measured within T seconds of its step 0, T the
  shortest run's length (equal wall time).
- s to L less evals: the main target's time less rank 0's evaluations before it, as each run
  measured them (``eval_time_s`` in metrics.jsonl, written by ddp_train.py and by ``gradwire run``);
  for a gradwire run folder from before ``gradwire run`` measured them, estimated, "≈", as their
  number times the median of the runs that did.

The machine has 2 cores: 4 worker processes (plus torchrun agents) share them, so compute per step
is contended and wall times move with other load; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from testbed_time_to_accuracy import ROOT, first_reaching, fmt, read_metrics, testbed_run  # noqa: E402

TASK = "stdlib-lm:val_bytes=4096"
WORKERS = 4
SGD = ["--lr", "0.05", "--momentum", "0.9"]
ADAMW_LR = ["--lr", "0.001"]
# gradwire's --optimizer adamw with ddp_train.py's AdamW settings (betas 0.9/0.95, weight decay 0.1)
ADAMW = ["--optimizer", "adamw:beta2=0.95", "--weight-decay", "0.1", *ADAMW_LR]
DDP_SCRIPT = "benchmarks/ddp_train.py"


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    family: str  # "sgd" or "adamw": the optimiser inside, for the DDP it is compared with
    kind: str  # "ddp" (torchrun benchmarks/ddp_train.py) or "gradwire" (gradwire run)
    flags: tuple[str, ...]


R32H = "powersgd:rank=32,dtype=fp16"  # rank 32, fp16 factors: AdamW about 1 % above DDP after 1000 steps
ACP = f"{R32H},alternate=true"  # the same as ACP-SGD: one allreduce a step


def gw_adamw_sync(key: str, algorithm: str, compressor: str) -> Variant:
    """A ``gradwire run --algorithm <algorithm> --compressor <compressor>`` row with DDP AdamW's settings."""
    return Variant(key, f"gradwire {algorithm} {compressor}, AdamW", "adamw", "gradwire",
                   ("--algorithm", algorithm, "--compressor", compressor, *ADAMW))


VARIANTS = [
    Variant("ddp-sgd", "DDP allreduce, SGD", "sgd", "ddp", ("--optimizer", "sgd", *SGD)),
    Variant("ddp-adamw", "DDP allreduce, AdamW", "adamw", "ddp", ("--optimizer", "adamw", *ADAMW_LR)),
    Variant("ddp-sgd-powersgd", "DDP + torch powerSGD_hook r=4, SGD", "sgd", "ddp",
            ("--optimizer", "sgd", *SGD, "--hook", "powersgd", "--powersgd-rank", "4", "--start-powersgd-iter", "2")),
    Variant("ddp-adamw-powersgd", "DDP + torch powerSGD_hook r=4, AdamW", "adamw", "ddp",
            ("--optimizer", "adamw", *ADAMW_LR, "--hook", "powersgd", "--powersgd-rank", "4",
             "--start-powersgd-iter", "2")),
    Variant("ddp-adamw-gw-powersgd", "DDP + gradwire.ddp powersgd:rank=4, AdamW", "adamw", "ddp",
            ("--optimizer", "adamw", *ADAMW_LR, "--hook", "gradwire:powersgd:rank=4,start_step=2")),
    Variant("gw-topk", "gradwire sync topk:ratio=0.01 + EF", "sgd", "gradwire",
            ("--algorithm", "sync", "--compressor", "topk:ratio=0.01", "--error-feedback", *SGD)),
    Variant("gw-sign", "gradwire sync sign:scaled=true + EF", "sgd", "gradwire",
            ("--algorithm", "sync", "--compressor", "sign:scaled=true", "--error-feedback", *SGD)),
    Variant("gw-qsgd", "gradwire sync qsgd:levels=7,bucket=128", "sgd", "gradwire",
            ("--algorithm", "sync", "--compressor", "qsgd:levels=7,bucket=128", *SGD)),
    Variant("gw-powersgd", "gradwire sync powersgd:rank=4", "sgd", "gradwire",
            ("--algorithm", "sync", "--compressor", "powersgd:rank=4", *SGD)),
    Variant("gw-local", "gradwire local SGD, τ=20", "sgd", "gradwire", ("--algorithm", "local:period=20", *SGD)),
    Variant("gw-adamw", "gradwire sync, AdamW, uncompressed", "adamw", "gradwire", ("--algorithm", "sync", *ADAMW)),
    Variant("gw-adamw-ov", "gradwire sync:overlap=true, AdamW, uncompressed", "adamw", "gradwire",
            ("--algorithm", "sync:overlap=true", *ADAMW)),
    Variant("gw-adamw-powersgd8", "gradwire sync powersgd:rank=8, AdamW", "adamw", "gradwire",
            ("--algorithm", "sync", "--compressor", "powersgd:rank=8", *ADAMW)),
    Variant("gw-adamw-powersgd16", "gradwire sync powersgd:rank=16, AdamW", "adamw", "gradwire",
            ("--algorithm", "sync", "--compressor", "powersgd:rank=16", *ADAMW)),
    Variant("ddp-adamw-powersgd32", "DDP + torch powerSGD_hook r=32, AdamW", "adamw", "ddp",
            ("--optimizer", "adamw", *ADAMW_LR, "--hook", "powersgd", "--powersgd-rank", "32",
             "--start-powersgd-iter", "2")),
    Variant("ddp-adamw-powersgd32h", "DDP + torch powerSGD_hook r=32 in fp16_compress_wrapper, AdamW", "adamw", "ddp",
            ("--optimizer", "adamw", *ADAMW_LR, "--hook", "powersgd", "--powersgd-rank", "32",
             "--start-powersgd-iter", "2", "--powersgd-fp16")),
    Variant("ddp-adamw-gw-powersgd32h", "DDP + gradwire.ddp powersgd:rank=32,dtype=fp16, AdamW", "adamw", "ddp",
            ("--optimizer", "adamw", *ADAMW_LR, "--hook", "gradwire:powersgd:rank=32,dtype=fp16,start_step=2")),
    Variant("ddp-adamw-gw-powersgd32h-b1", "DDP (1 MB buckets) + gradwire.ddp powersgd:rank=32,dtype=fp16, AdamW",
            "adamw", "ddp", ("--optimizer", "adamw", *ADAMW_LR, "--hook",
                             "gradwire:powersgd:rank=32,dtype=fp16,start_step=2", "--bucket-cap-mb", "1")),
    gw_adamw_sync("gw-adamw-powersgd24h", "sync", "powersgd:rank=24,dtype=fp16"),
    gw_adamw_sync("gw-adamw-powersgd32h", "sync", R32H),
    gw_adamw_sync("gw-adamw-powersgd48h", "sync", "powersgd:rank=48,dtype=fp16"),
    gw_adamw_sync("gw-adamw-powersgd64h", "sync", "powersgd:rank=64,dtype=fp16"),
    gw_adamw_sync("gw-adamw-powersgd32h-ov", "sync:overlap=true", R32H),
    gw_adamw_sync("gw-adamw-powersgd32h-ov2", "sync:overlap=true,bucket_mb=2", R32H),
    gw_adamw_sync("gw-adamw-powersgd32h-ov3", "sync:overlap=true,bucket_mb=3", R32H),
    gw_adamw_sync("gw-adamw-acp32h", "sync", ACP),
    gw_adamw_sync("gw-adamw-acp32h-ov", "sync:overlap=true", ACP),
    gw_adamw_sync("gw-adamw-acp32h-ov3", "sync:overlap=true,bucket_mb=3", ACP),
    Variant("gw-diloco", "gradwire DiLoCo, H=20 (AdamW inside)", "adamw", "gradwire",
            ("--algorithm", "diloco:inner_steps=20", *ADAMW_LR)),
    Variant("gw-streaming", "gradwire Streaming DiLoCo, H=20, P=4, τ=2, fp16", "adamw", "gradwire",
            ("--algorithm", "streaming-diloco:inner_steps=20,fragments=4,overlap=2,alpha=0.5", "--compressor", "fp16",
             *ADAMW_LR)),
    Variant("gw-streaming-eager", "gradwire Streaming DiLoCo, eager, H=20, P=4, τ=20, fp16", "adamw", "gradwire",
            ("--algorithm", "streaming-diloco:inner_steps=20,fragments=4,overlap=20,eager=true,outer_lr=0.5,"
             "outer_momentum=0", "--compressor", "fp16", *ADAMW_LR)),
    # the low-communication methods (docs/low_communication.md), at their defaults with DiLoCo's H and inner lr
    Variant("gw-sparseloco", "gradwire SparseLoCo, H=20, 128 of 4096, ternary values", "adamw", "gradwire",
            ("--algorithm", "sparseloco:inner_steps=20", *ADAMW_LR)),
    Variant("gw-demo", "gradwire DeMo, 4 of 64 DCT coefficients, sign update", "adamw", "gradwire",
            ("--algorithm", "demo", *ADAMW_LR)),
    Variant("gw-muloco", "gradwire MuLoCo, H=20, Muon inside, ternary deltas + EF", "adamw", "gradwire",
            ("--algorithm", "muloco:inner_steps=20", *ADAMW_LR)),
]
BY_KEY = {v.key: v for v in VARIANTS}
# at 1 Gbit/s, where time is short: the baselines and the best of each kind
FAST_RATE_KEYS = ("ddp-sgd", "ddp-adamw", "ddp-sgd-powersgd", "ddp-adamw-powersgd", "gw-topk", "gw-powersgd",
                  "gw-adamw", "gw-adamw-powersgd8", "gw-adamw-powersgd16", "ddp-adamw-powersgd32",
                  "ddp-adamw-gw-powersgd32h-b1", "gw-adamw-powersgd32h", "gw-diloco", "gw-streaming")
# the AdamW rows side by side (issue 13's verdict with AdamW): --only adamw
ADAMW_KEYS = ("ddp-adamw", "ddp-adamw-powersgd", "ddp-adamw-powersgd32", "ddp-adamw-powersgd32h",
              "ddp-adamw-gw-powersgd", "ddp-adamw-gw-powersgd32h", "ddp-adamw-gw-powersgd32h-b1",
              "gw-adamw-powersgd16", "gw-adamw-powersgd32h", "gw-adamw-powersgd32h-ov3", "gw-adamw-acp32h")
QUICK_KEYS = ("ddp-sgd", "ddp-sgd-powersgd", "gw-topk", "gw-diloco")
# --long: AdamW trained 5x longer, where the low-rank rows fall behind (docs/time_to_accuracy.md,
# "A longer run"); the main target 2.0 is the loss DDP reaches about a third of the way through
LONG_KEYS = ("ddp-adamw", "ddp-adamw-powersgd", "ddp-adamw-powersgd32h", "gw-adamw-powersgd32h",
             "gw-adamw-powersgd24h")
LONG = {"rates": "100", "steps": 1000, "targets": "2.0,3.0,2.6,1.8,1.6", "timeout_s": 1500.0}


def command(v: Variant, steps: int, eval_every: int, out: Path, task: str = TASK, seed: int = 0,
            schedule: str = "constant") -> list[str]:
    """What follows ``--`` of scripts/testbed.py for variant ``v``; ``schedule`` (gradwire's
    --lr-schedule spec, which ddp_train.py takes too) reaches every row, the constant default left
    implicit."""
    common = ["--batch-size", "8", "--seed", str(seed), "--steps", str(steps), "--eval-every", str(eval_every),
              *(["--lr-schedule", schedule] if schedule != "constant" else []), "--out", str(out)]
    if v.kind == "ddp":
        return ["torchrun", DDP_SCRIPT, "--task", task, *v.flags, *common, "--name", v.label]
    return ["run", "--task", task, *v.flags, *common, "--name", v.label, "--overwrite"]


def burst_for(rate: float) -> float:
    """tbf bucket in kbit: the bed's 32 kbit up to 100 Mbit/s (docs/testbed.md); above, 1 ms of
    traffic (1000 kbit at 1 Gbit/s), as a 2-core machine's timers cannot pace a smaller bucket at
    that rate: `--check` at 1000 Mbit/s measured 623-820 Mbit/s with 320 kbit, 962 with 1000."""
    return 32.0 if rate <= 100 else rate


TAIL = 5  # evaluations averaged for "Δ last 5"


def summarise(rows: list[dict], targets: list[float]) -> dict:
    t0 = rows[0]["wall_time_s"]
    last = rows[-1]
    tail = rows[-TAIL:]
    out = {"steps": last["step"], "final_loss": last["test_loss"], "best_loss": min(r["test_loss"] for r in rows),
           "tail_loss": sum(r["test_loss"] for r in tail) / len(tail),
           "total_mb": last["bytes_sent"] / 1e6, "s_per_step": (last["wall_time_s"] - t0) / max(1, last["step"]),
           "run_s": last["wall_time_s"] - t0, "targets": {}}
    if "eval_time_s" in last and len(rows) > 1:  # the run measured its evaluations
        out["s_per_eval"] = last["eval_time_s"] / (len(rows) - 1)
    for target in targets:
        hit = first_reaching(rows, target, "test_loss", lower=True)
        out["targets"][str(target)] = None if hit is None else {
            "step": hit["step"], "seconds": hit["wall_time_s"] - t0, "mb": hit["bytes_sent"] / 1e6,
            "evals_before": rows.index(hit), "eval_s_before": hit.get("eval_time_s")}
    return out


def curves(rows: list[dict]) -> dict:
    t0 = rows[0]["wall_time_s"]
    return {"seconds": [r["wall_time_s"] - t0 for r in rows], "mb": [r["bytes_sent"] / 1e6 for r in rows],
            "loss": [r["test_loss"] for r in rows], "step": [r["step"] for r in rows]}


def table(results: list[dict], rate: float, targets: list[float]) -> str:
    rows = [r for r in results if r["rate"] == rate]
    main = str(targets[0])
    ddp = {r["family"]: r for r in rows if r["key"] in ("ddp-sgd", "ddp-adamw")}

    def secs(r: dict, t: str) -> float | None:
        hit = r["summary"]["targets"].get(t)
        return None if hit is None else hit["seconds"]

    ddp_times = [secs(r, main) for r in ddp.values() if secs(r, main) is not None]
    best_ddp = min(ddp_times) if ddp_times else None
    equal_s = min(r["summary"]["run_s"] for r in rows)  # the shortest run: every row's loss at that time

    def loss_at(r: dict, t: float) -> float:
        c = r["curves"]
        return [loss for sec, loss in zip(c["seconds"], c["loss"], strict=True) if sec <= t + 1e-9][-1]

    measured = sorted(r["summary"]["s_per_eval"] for r in rows if "s_per_eval" in r["summary"])
    per_eval = measured[len(measured) // 2] if measured else None  # the median of the runs that measured it

    def without_evals(r: dict) -> str:
        """Time to the main target less rank 0's evaluations before it, as the run measured them;
        estimated (≈) as their number times ``per_eval`` for a run folder that did not."""
        hit = r["summary"]["targets"].get(main)
        if hit is None or "evals_before" not in hit:
            return "n/r" if hit is None else "-"
        if hit["eval_s_before"] is not None:
            return f"{hit['seconds'] - hit['eval_s_before']:.1f}"
        return "-" if per_eval is None else f"≈{hit['seconds'] - hit['evals_before'] * per_eval:.1f}"

    head = ["variant", "opt.", *(f"s to {t}" for t in targets), f"s to {main} less evals",
            f"speed-up to {main}, x (same opt. / best DDP)",
            f"steps to {main}", f"MB to {main}", "ms/step", "MB run (counted / wire)", "tbf drops", "final loss",
            "Δ final vs DDP", f"Δ last {TAIL} vs DDP", f"loss at {equal_s:.0f} s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = [f"(*) {r['label']}: {r['note']}" for r in rows if r.get("note")]
    for r in rows:
        s = r["summary"]
        hit = s["targets"].get(main)
        base = ddp.get(r["family"])
        mine = secs(r, main)
        same = None if base is None or mine is None or secs(base, main) is None else secs(base, main) / mine
        vs_best = None if best_ddp is None or mine is None else best_ddp / mine
        delta = None if base is None else s["final_loss"] / base["summary"]["final_loss"] - 1
        tail = None if base is None else s["tail_loss"] / base["summary"]["tail_loss"] - 1
        lines.append("| " + " | ".join([
            r["label"] + (" (*)" if r.get("note") else ""), r["family"],
            *(fmt(secs(r, str(t)), ".1f", "n/r") for t in targets), without_evals(r),
            f"{fmt(same, '.2f', 'n/r')} / {fmt(vs_best, '.2f', 'n/r')}", fmt(hit and hit["step"], "d", "n/r"),
            fmt(hit and hit["mb"], ".1f", "-"), f"{s['s_per_step'] * 1e3:.0f}",
            f"{s['total_mb']:.0f} / {r['wire_mb']:.0f}", str(r["drops"]), f"{s['final_loss']:.3f}",
            fmt(delta and delta * 100, "+.1f", "0.0") + " %", fmt(tail and tail * 100, "+.1f", "0.0") + " %",
            f"{loss_at(r, equal_s):.3f}"]) + " |")
    return "\n".join(lines + ([""] + notes if notes else []))


def verdict(results: list[dict], rate: float, target: float) -> str:
    """Issue 13's targets for every gradwire variant: >= 3x faster to ``target`` than DDP (with the
    same optimiser, and than the faster DDP), faster than PyTorch's PowerSGD hook (same optimiser;
    the fastest of the hook's rows that ran, whatever their rank), final loss within 1 % of DDP's
    (same optimiser)."""
    rows = {r["key"]: r for r in results if r["rate"] == rate}
    t = str(target)

    def secs(key: str) -> float | None:
        r = rows.get(key)
        hit = r and r["summary"]["targets"].get(t)
        return hit["seconds"] if hit else None

    best_ddp = min((x for x in (secs("ddp-sgd"), secs("ddp-adamw")) if x is not None), default=None)
    lines = []
    for key, r in rows.items():
        if r["kind"] != "gradwire" and "-gw-" not in key:
            continue
        mine, fam = secs(key), r["family"]
        hooks = [k for k in rows if k.startswith(f"ddp-{fam}-powersgd")]  # PyTorch's hook, at every rank run
        ddp = secs(f"ddp-{fam}")
        hook = min((x for x in map(secs, hooks) if x is not None), default=None)  # the fastest of them
        base = rows.get(f"ddp-{fam}")
        delta = base and r["summary"]["final_loss"] / base["summary"]["final_loss"] - 1
        checks = [
            ("3x DDP (same opt.)", mine is not None and ddp is not None and ddp / mine >= 3),
            ("3x best DDP", mine is not None and best_ddp is not None and best_ddp / mine >= 3),
            ("faster than torch PowerSGD hook (same opt.)",
             None if not hooks else mine is not None and (hook is None or mine < hook)),
            ("final loss within 1 % of DDP (same opt.)", delta is not None and delta <= 0.01),
        ]
        lines.append(f"- {r['label']}: " + "; ".join(f"{name} {'n/a' if ok is None else 'yes' if ok else 'no'}"
                                                      for name, ok in checks))
    return "\n".join(lines)


def colours(keys: list[str]) -> dict[str, tuple]:
    """A colour per distinct row key of one figure, in first-seen order: tab10's for up to 10 rows,
    then tab20's, so no two rows of a plot share one up to 20 (indexing by the variant's place in
    VARIANTS, as before, gave DDP and rank 64 the same blue)."""
    from matplotlib import colormaps

    distinct = list(dict.fromkeys(keys))
    cmap = colormaps["tab10" if len(distinct) <= 10 else "tab20"]
    return {key: cmap(i % cmap.N) for i, key in enumerate(distinct)}


def plot(results: list[dict], rates: list[float], targets: list[float], path: Path, workers: int = WORKERS,
         seed: int = 0, schedule: str = "constant") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rates), 2, figsize=(13, 4.6 * len(rates)), squeeze=False)
    colour = colours([r["key"] for r in results])
    for row, rate in zip(axes, rates, strict=True):
        for r in (x for x in results if x["rate"] == rate):
            c = r["curves"]
            ls = "--" if r["kind"] == "gradwire" else ":" if "-gw-" in r["key"] else "-"
            kw = {"label": r["label"], "ls": ls, "color": colour[r["key"]], "marker": "o", "ms": 2.5,
                  "lw": 1.4}
            row[0].plot(c["seconds"], c["loss"], **kw)
            sent = [(m, loss) for m, loss in zip(c["mb"], c["loss"], strict=True) if m > 0]  # log axis: no step 0
            row[1].plot([m for m, _ in sent], [loss for _, loss in sent], **kw)
        for ax in row:
            for t in targets:
                ax.axhline(t, color="grey", lw=0.7, ls=":")
            ax.set_ylabel("validation loss (nats/byte)")
            ax.set_ylim(top=4.0)
            ax.grid(alpha=0.3)
        row[0].set_xlabel("wall seconds since step 0")
        row[0].set_title(f"{rate:g} Mbit/s: validation loss against time")
        row[1].set_xscale("log")
        row[1].set_xlabel("MB sent, all workers (log; counted, ring accounting)")
        row[1].set_title(f"{rate:g} Mbit/s: validation loss against bytes")
    axes[0][1].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"stdlib-lm (1.45M parameters), {workers} workers on the namespace test bed, batch 8/worker, "
                 f"seed {seed}{'' if schedule == 'constant' else f', lr schedule {schedule}'}; "
                 "solid: PyTorch DDP (+ its hook), dotted: DDP + gradwire.ddp, dashed: gradwire run",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def finished_anyway(folder: Path, steps: int) -> dict | None:
    """The bed's record of a testbed run that exited non-zero although training finished (every
    step run and its summary written: a process died on the way out), marked as such; else None."""
    summary = folder / "summary.json"
    if not summary.exists() or not (folder / "testbed" / "testbed.json").exists():
        return None
    done = json.loads(summary.read_text())
    if done.get("status") != "finished" or done.get("steps") != steps:
        return None
    bed = json.loads((folder / "testbed" / "testbed.json").read_text())
    out = {"wire_mb": sum(x["tx_bytes"] for x in bed["links"]) / 1e6,
           "drops": sum(x["upload_drops"] + x["download_drops"] for x in bed["links"])}
    if any(bed["exit_codes"]):
        out["note"] = (f"training finished (summary written), then the nodes exited {bed['exit_codes']}: "
                       "a process failed on the way out (OUT/testbed/node*.log)")
    return out


def collect(out: Path, rate: float, v: Variant, targets: list[float], bed: dict) -> dict:
    folder = out / f"{rate:g}mbps" / v.key
    rows = read_metrics(folder)
    return {"rate": rate, "key": v.key, "label": v.label, "family": v.family, "kind": v.kind,
            "summary": summarise(rows, targets), "curves": curves(rows)} | bed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,1000", help="link rates in Mbit/s, comma-separated (default 100,1000)")
    add_run_flags(ap, only=("steps", "workers", "task", "eval_every", "seed", "lr_schedule", "out"),
                  defaults={"steps": 200, "workers": WORKERS, "task": TASK, "eval_every": 20,
                            "lr_schedule": "constant", "out": "runs/time-to-accuracy"},
                  helps={"steps": "steps per run", "workers": "nodes of the test bed",
                         "task": "gradwire task spec (smaller for a smoke run)",
                         "eval_every": "evaluate the validation loss every E steps",
                         "seed": "seed of every row: initial model, partition and batches. A repeated run repeats the "
                                 "losses bit for bit, so only another seed tests the loss conditions",
                         "lr_schedule": "learning-rate schedule of every row, gradwire's spec (ddp_train.py takes the "
                                        "same): constant, cosine:warmup=W,min_ratio=R, linear:warmup=W,min_ratio=R",
                         "out": "run folders, results.md, results.json, plot"})
    ap.add_argument("--targets", default="3.0,2.6",
                    help="validation losses to time, the first one the main target (default 3.0,2.6: DDP with "
                         "SGD reaches 3.0 within 200 steps, AdamW also 2.6)")
    ap.add_argument("--only", help="comma-separated variant keys, or adamw for the AdamW rows (default: all at "
                    f"the first rate, {','.join(FAST_RATE_KEYS)} at the others)")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: 100 Mbit/s only, 30 steps, {','.join(QUICK_KEYS)}, target 4.0")
    ap.add_argument("--long", action="store_true",
                    help=f"AdamW over {LONG['steps']} steps at 100 Mbit/s: {','.join(LONG_KEYS)}, targets "
                         f"{LONG['targets']} (~40 min)")
    ap.add_argument("--plot", help="also write the plot here (e.g. docs/img/time_to_accuracy.png)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="longest testbed run before it is stopped")
    ap.add_argument("--report-only", action="store_true", help="no runs: table and plot from --out's run folders")
    ap.add_argument("--list", action="store_true", help="print the variants' command lines and exit")
    ns, _ = parse_run_args(ap)
    if ns.quick:
        ns.rates, ns.steps, ns.eval_every, ns.targets = "100", 30, 10, "4.0"
        ns.only = ns.only or ",".join(QUICK_KEYS)
        ns.out = ns.out if ns.out != "runs/time-to-accuracy" else "runs/time-to-accuracy-quick"
    if ns.long:
        for key, value in LONG.items():
            setattr(ns, key, value)
        ns.only = ns.only or ",".join(LONG_KEYS)
        ns.out = ns.out if ns.out != "runs/time-to-accuracy" else "runs/time-to-accuracy-long"
    from gradwire.algorithms.optim import LR_SCHEDULES, lr_schedule
    from gradwire.errors import ConfigError
    from gradwire.spec import spec_of

    def canonical(spec: str) -> str:  # every parameter, in a fixed order: equal schedules compare equal
        return spec_of(LR_SCHEDULES.build(spec))

    try:  # one line now, not a failed run per row later
        lr_schedule(ns.lr_schedule, ns.steps)
        ns.lr_schedule = canonical(ns.lr_schedule)
    except ConfigError as e:
        ap.error(f"--lr-schedule: {e}")
    rates = [float(x) for x in ns.rates.split(",")]
    targets = [float(x) for x in ns.targets.split(",")]
    if ns.only == "adamw":
        ns.only = ",".join(ADAMW_KEYS)
    unknown = [k for k in (ns.only or "").split(",") if k and k not in BY_KEY]
    if unknown:
        ap.error(f"--only: unknown variants {unknown}; valid: {', '.join(BY_KEY)}")
    out = (ROOT / ns.out) if not Path(ns.out).is_absolute() else Path(ns.out)

    def chosen(i: int) -> list[Variant]:
        if ns.only:
            return [BY_KEY[k] for k in ns.only.split(",")]
        return VARIANTS if i == 0 else [BY_KEY[k] for k in FAST_RATE_KEYS]

    if ns.list:
        for i, rate in enumerate(rates):
            for v in chosen(i):
                folder = out / f"{rate:g}mbps" / v.key
                line = command(v, ns.steps, ns.eval_every, folder, ns.task, ns.seed, ns.lr_schedule)
                print(f"[{rate:g} Mbit/s] {v.key}: scripts/testbed.py --nodes {ns.workers} --mbps {rate:g} "
                      f"--burst-kbit {burst_for(rate):g} -- {' '.join(line)}")
        return 0
    if not ns.report_only and os.geteuid() != 0:
        print("time_to_accuracy.py: error: the testbed needs root; run with sudo (or --report-only)", file=sys.stderr)
        return 2
    started, load_before = time.perf_counter(), os.getloadavg()
    results_path = out / "results.json"
    previous = json.loads(results_path.read_text()) if results_path.exists() else {}
    if previous and previous.get("seed", 0) != ns.seed:  # one table, one seed (older folders: seed 0)
        ap.error(f"--seed {ns.seed}: {out} holds runs of seed {previous.get('seed', 0)}; pass --seed "
                 f"{previous.get('seed', 0)} or give another --out")
    held = previous.get("lr_schedule", "constant")  # and one schedule (older folders: constant)
    if previous and canonical(held) != ns.lr_schedule:
        ap.error(f"--lr-schedule {ns.lr_schedule}: {out} holds runs under {held}; pass --lr-schedule {held} "
                 "or give another --out")
    beds = {(r["rate"], r["key"]): {k: r[k] for k in ("wire_mb", "drops", "note") if k in r}
            for r in previous.get("results", [])}
    results, k = [], 0
    # report the rates run now, then those an earlier run into --out recorded (a second rate run
    # later into the same folder must not drop the first from the table and the plot)
    earlier = sorted({x["rate"] for x in previous.get("results", [])} - set(rates))
    for i, rate in enumerate(rates + earlier):
        runs = {v.key for v in chosen(i)} if not ns.report_only and rate in rates else set()
        for v in VARIANTS:  # runs the chosen ones, reports every one with a run folder (earlier runs too)
            folder = out / f"{rate:g}mbps" / v.key
            if v.key in runs:
                k += 1
                print(f"[{rate:g} Mbit/s] {v.label} ...", flush=True)
                t = time.perf_counter()
                try:
                    line = command(v, ns.steps, ns.eval_every, folder, ns.task, ns.seed, ns.lr_schedule)
                    beds[(rate, v.key)] = testbed_run(rate, line, folder, ns.timeout_s, f"tta-{os.getpid()}-{k}",
                                                      nodes=ns.workers, burst_kbit=burst_for(rate), label=v.label)
                except RuntimeError as e:  # one failed run does not end the benchmark: say so, go on
                    print(f"  {str(e)[:300]}", file=sys.stderr, flush=True)
                    beds.pop((rate, v.key), None)
                    beds[(rate, v.key)] = finished_anyway(folder, ns.steps)
                    if beds[(rate, v.key)] is None:
                        continue
                beds[(rate, v.key)]["bench_s"] = time.perf_counter() - t
            if (rate, v.key) not in beds:  # a run folder without a record in results.json: from its own
                beds[(rate, v.key)] = finished_anyway(folder, ns.steps)
            if not (folder / "metrics.jsonl").exists() or beds.get((rate, v.key)) is None:
                continue
            results.append(collect(out, rate, v, targets, beds[(rate, v.key)]))
            s = results[-1]["summary"]
            print(f"  final loss {s['final_loss']:.3f}, {s['s_per_step'] * 1e3:.0f} ms/step, "
                  f"to {targets[0]}: {s['targets'][str(targets[0])]}", flush=True)
            done = {(x["rate"], x["key"]) for x in results}  # keep earlier runs' records (other rates, --only)
            kept = [x for x in previous.get("results", []) if (x["rate"], x["key"]) not in done]
            record = {"results": kept + results, "steps": ns.steps, "targets": targets, "task": ns.task,
                      "workers": ns.workers, "seed": ns.seed, "lr_schedule": ns.lr_schedule}
            (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    if not results:  # every run failed, or --report-only found no run folder
        print(f"time_to_accuracy.py: error: no finished run to report under {out}", file=sys.stderr)
        return 2 if ns.report_only else 1
    done_rates = [r for r in rates + earlier if any(x["rate"] == r for x in results)]
    md = []
    for rate in done_rates:
        md.append(f"### {rate:g} Mbit/s\n\n{table(results, rate, targets)}\n\nIssue 13's targets at {rate:g} Mbit/s "
                  f"(validation loss {targets[0]}):\n\n{verdict(results, rate, targets[0])}")
    evals = [x["summary"]["s_per_eval"] for x in results if "s_per_eval" in x["summary"]]
    notes = (f"\n\n{ns.workers} workers (one process per node namespace; 2 cores shared), `{ns.task}`, batch 8 per "
             "worker, "
             f"{ns.steps} steps, seed {ns.seed}, learning rate {ns.lr_schedule}, "
             f"evaluation every {ns.eval_every} steps"
             f"{f' (rank 0, {min(evals):.2f}-{max(evals):.2f} s each, as measured)' if evals else ''}, "
             f"targets {', '.join(map(str, targets))}. n/r = not reached."
             + ("" if ns.report_only else f" Load average before/after: {load_before[0]:.1f} / "
                f"{os.getloadavg()[0]:.1f}. Benchmark wall time {time.perf_counter() - started:.0f} s."))
    text = "\n\n".join(md) + notes + "\n"
    (out / "results.md").write_text(text)
    for path in [out / "time_to_accuracy.png", *([ROOT / ns.plot] if ns.plot else [])]:
        plot(results, done_rates, targets, path, ns.workers, ns.seed, ns.lr_schedule)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
