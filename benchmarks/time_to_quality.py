"""Time to DDP's quality: how long each method needs to reach the validation loss that DDP with
AdamW itself reaches, on networks of 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, at 4, 16 and 64 workers.

    .venv/bin/python benchmarks/time_to_quality.py tune --rows ddp,diloco    # the lr trials, seed 0
    .venv/bin/python benchmarks/time_to_quality.py curves --workers 4 --rows ddp,diloco --seeds 1,2,3
    .venv/bin/python benchmarks/time_to_quality.py torch --seeds 1,2,3        # PyTorch's PowerSGD hook
    .venv/bin/python benchmarks/time_to_quality.py compute        # CPU seconds per step, one core
    .venv/bin/python benchmarks/time_to_quality.py report --workers 4,16   # table and plots from what ran

Every stage skips what its folder (``--out``, default runs/time-to-quality) already holds, so the
costly part, ``curves``, can be stopped and run again by the same command.

**The protocol** (docs/time_to_accuracy.md gives the measurements behind each choice).

- Every row, DDP included, trains under the same learning-rate schedule: a linear warm-up over
  ``WARMUP`` updates, then a cosine decay to ``MIN_RATIO`` of the peak at N (``SCHEDULE``; the
  DiLoCo family's inner AdamW follows it, update by update, across rounds). Past N the rate stays
  at the floor, so a row may run on to 2N. A row with accumulation over k micro-batches sees k
  times the samples per update: its schedule spans N/k updates (warm-up ``WARMUP``/k), it runs up
  to 2N/k and evaluates every ``EVAL_EVERY``/k updates: the same samples as DDP everywhere.
- The target is DDP's own final quality: the mean over the table's seeds of the mean of its last
  ``LAST`` evaluations at N (``target_quality``). DDP's curves run first (to 2N); every other
  row's curve stops ``STOP_AFTER`` evaluations after its first at or below the target
  (``reached``), or at 2N.
- Fair tuning (``tune``): every row gets the same ``LRS`` trials (the peak rate; the DiLoCo
  family's inner rate, outer settings at the row's values), each run to N steps (not 2N) on
  ``TUNING_SEED``, which the table never reports; the lowest quality at N wins.

**Where the numbers come from.**

1. *Curves* (``curves``): each row trains on the simulator (gradwire's ``Run``, in process, one
   thread) and records its validation loss every ``EVAL_EVERY`` steps and its bytes. The loss
   against steps does not depend on the network (no stragglers: every worker computes every step),
   only on the method and the number of workers, so one curve per (row, lr, seed, workers) serves
   every rate.
2. *Compute* (``compute``): each row's CPU seconds per step, measured alone on one core
   (``torch.set_num_threads(1)``, ``time.process_time``: forward, backward, optimizer and codec of
   one worker), in blocks that the rows take in turn, DDP among them (``measure_compute``); a row's
   step is the median over blocks of its block over DDP's of the same turn, times DDP's fastest
   block (``compute_ratio``).
   CPU time, not wall time, because the machine is shared: wall time there measures the
   neighbours. The backward pass's share is measured too (the part a DDP-style overlap can hide
   communication behind).
3. *Time* (``report``): a step lasts its compute plus the communication that compute does not hide,
   from gradwire's ring model (``transports/network.py``): an allreduce of B bytes a worker among n
   costs 2(n-1)(latency + B/(n·bandwidth)), an allgather of B bytes a worker (n-1)(latency +
   B/bandwidth) (``collective_seconds``), with B each row's measured payload per round. A row's
   time to the target is its first evaluation at or below it, times its step time. ``report
   --collectives halving-doubling`` prices the same bytes in O(log n) rounds instead (what NCCL's
   trees approach; not validated here, as gloo runs rings).

Rows (``ROWS``): DDP (gradwire's sync AdamW, equal to PyTorch DDP with AdamW:
tests/ddp/test_ddp_train_benchmark.py), DDP with a bf16 cast (PyTorch's bf16 hook's arithmetic but
for the sum's precision: gradwire sums the bf16 payloads in float32), DDP with gradient
accumulation over k = 2, 4, 8 micro-batches (one allreduce per k micro-batches of 8), PyTorch's
own PowerSGD hook (benchmarks/ddp_train.py under torchrun, 4 gloo processes: ``torch``), gradwire
sync with PowerSGD and with QSGD (an allgather), local AdamW (parameters averaged every H steps),
DiLoCo and Streaming DiLoCo (several settings), and the low-communication methods at
docs/low_communication.md's best settings on this model: MuLoCo (``muloco_row``), SparseLoCo and
DeMo, whose messages (sparse or quantised) travel by allgather. MuLoCo's trials walk one rate for
both of its optimizers: the AdamW part at the trial's lr and Muon at MUON_LR_RATIO times it, both
under the shared schedule (``muon_lr_ratio``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gradwire.cli.flags import Sweep, add_run_flags, parse_run_args
from gradwire.spec import parse_spec

TASK = "stdlib-lm:dim=64,layers=2,heads=2,val_bytes=65536"
DEFAULT_BATCH = 8              # sequences of 64 bytes per worker and micro-batch
BATCH = DEFAULT_BATCH          # this invocation's (--batch-size)
N_STEPS = 1000                 # N: DDP's steps, the schedule's horizon; every row may run 2N
EVAL_EVERY = 50
EARLY_EVERY = 200              # evaluations up to N/2 (eval_every)
LAST = 5                       # evaluations averaged into a quality
STOP_AFTER = 3                 # evaluations a row runs on after its first at or below the target
WARMUP = 50                    # updates of linear warm-up
MIN_RATIO = 0.1                # the rate at N and after, as a fraction of the peak
TUNING_SEED = 0
TABLE_SEEDS = (1, 2, 3)
RATES_MBPS = (10.0, 100.0, 1000.0)
WORKERS = (4, 16, 64)
LATENCY_MS = 1.0
TIME_NETWORKS = ("ring", "halving-doubling")  # transports/network.py's topologies the time model may price
COMPUTE_STEPS = 10             # steps a block (measure_compute)
COMPUTE_BLOCKS = 10
DECODE_REPEATS = 10            # timings of one round's decode (wire_costs): the fastest counts
ADAMW = dict(optimizer="adamw:beta2=0.95", weight_decay=0.1)  # DDP's AdamW (benchmarks/ddp_train.py)
LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # the grid every row's trials walk (next_trial)
FIRST_TRIALS = (2e-3, 4e-3)    # every row's first two trials
TORCH_POWERSGD_RANK = 4        # PyTorch's hook: matrix_approximation_rank (ranks tried: docs)


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    algorithm: str
    run: dict = field(default_factory=dict)  # RunConfig fields besides the learning rate
    micro_batches: int = 1     # gradient accumulation: k micro-batches of BATCH per optimizer step
    inner_steps: int = 1       # server mode: each replica's inner steps per step of the run (a step is a round)
    collective: str = "allreduce"  # allreduce (summable payloads), allgather (QSGD's), scatter (--compressed-mean
    #                                scatter: two all-to-alls) or server (server_round_seconds)
    collectives: int = 1       # collectives per communication round (latency terms)
    period: int = 1            # steps per communication round
    overlap: str = "backward"  # backward: hidden behind the backward pass (DDP); none; tau:K (K steps)
    runner: str = "sim"        # sim: gradwire's simulator here; torch: ddp_train.py under torchrun
    compute_algorithm: str = ""  # the spec the compute stage times on one worker, where the row's needs more

    @property
    def batches_per_step(self) -> int:
        """Micro-batches each worker takes per step of the run: k for accumulation, H in server mode."""
        return self.micro_batches * self.inner_steps


H = 20
MUON_LR_RATIO = 10             # MuLoCo's Muon η per unit of the walked lr (Muon's authors' 0.02 at lr 2e-3)
MESSAGE_K96 = "chunked-topk:chunk=4096,k=96"  # docs/low_communication.md: 0.212 bits/param/round
MUON = dict(optimizer=f"muon:lr_ratio={MUON_LR_RATIO}", weight_decay=0.0)  # MuLoCo's inner rule as DDP's
MULOCO_MEASURED = "muon_momentum=0.95,beta2=0.95"  # the MuLoCo rows' inner settings (muloco_row)
MULOCO_DEFAULTS = "muon_momentum=0.9,beta2=0.99"    # MuLoCo's own since 2026-11-30 (the rows named -mu0.9)


def diloco_row(key: str, label: str, keys: str, h: int, *, method: str = "diloco", compressor: str = "",
               collective: str = "allreduce") -> Row:
    """A row of the DiLoCo family (DiLoCo, MuLoCo, SparseLoCo) of period H, not overlapped: ``keys``
    are ``method``'s spec keys; a non-summable message (``compressor``, or the method's own) travels
    by allgather."""
    return Row(key, label, f"{method}:{keys}", dict(compressor=compressor) if compressor else {},
               collective=collective, period=h, overlap="none")


def muloco_row(key: str, label: str, h: int, compressor: str = "", keys: str = "outer_lr=1,outer_momentum=0",
               inner: str = MULOCO_MEASURED, mean: str = "gather") -> Row:
    """MuLoCo with Muon's η tied to the walked lr (``muon_lr_ratio``, MUON_LR_RATIO; scheduled as
    every row's rate), the outer step η 1, μ 0 (docs/low_communication.md's pick at H = 3), and its
    message (default: MuLoCo's 2-bit pquant) by allgather: quantised or sparse, not summable. A round
    that travels (``overlap=τ`` in ``keys``) is priced as hidden behind τ inner steps. A cast (fp16) is summed by
    allreduce instead. ``mean="scatter"``: the message's mean taken by its chunks' owners
    (``--compressed-mean scatter``: two all-to-alls, the ``scatter`` collective)."""
    from gradwire.algorithms.muloco import MuLoCo
    from gradwire.averaging import CompressedMean
    from gradwire.compress import build as build_compressor

    # the collective MuLoCo's averager takes for this message (it always keeps error feedback): an
    # allreduce for a cast (fp16, bf16), else an allgather
    message = CompressedMean(build_compressor(compressor or MuLoCo.default_compressor), {}, error_feedback=True)
    # ``inner``: Muon's momentum and the AdamW part's β2; by default as every MuLoCo row was measured
    # (MuLoCo's defaults until 2026-11-30, when the default task's sweep moved them to 0.9 and 0.99:
    # docs/defaults.md, eighth round), MULOCO_DEFAULTS for the rows named -mu0.9
    row = diloco_row(key, label, f"inner_steps={h},{keys},muon_lr_ratio={MUON_LR_RATIO},{inner}", h,
                     method="muloco",
                     compressor=compressor, collective="allreduce" if message.allreduced() else "allgather")
    if mean == "scatter":
        row = dataclasses.replace(row, run=row.run | dict(compressed_mean="scatter"), collective="scatter")
    tau = int(parse_spec(row.algorithm)[1].get("overlap", 0))
    return dataclasses.replace(row, overlap=f"tau:{tau}") if tau else row


def server_row(key: str, label: str, spec: str, h: int, compute_algorithm: str = "", run: dict | None = None) -> Row:
    """A server-mode DiLoCo (backup-diloco, async-diloco; Row.inner_steps): a step of the run is an
    outer round of H inner steps a replica, priced as the simulator's round through the server with
    the row's compute and messages (``server_round_seconds``)."""
    return Row(key, label, spec, run or {}, collective="server", inner_steps=h, overlap="none",
               compute_algorithm=compute_algorithm)


SIGN_EF = dict(compressor="sign:scaled=true", error_feedback=True)  # 1 bit up; with answer=change, down too


def streaming_row(key: str, label: str, keys: str, *, period: int, tau: int) -> Row:
    """A Streaming DiLoCo row with fp16 fragments, a fragment's allreduce every ``period`` steps,
    overlapped with τ inner steps: ``keys`` are streaming-diloco's spec keys."""
    return Row(key, label, f"streaming-diloco:{keys}", dict(compressor="fp16"), period=period, overlap=f"tau:{tau}")


ROWS = [
    Row("ddp", "DDP (AdamW)", "sync", ADAMW),
    Row("ddp-bf16", "DDP + bf16 cast", "sync", ADAMW | dict(compressor="bf16")),
    *[Row(f"ddp-accum{k}", f"DDP, accumulation k={k}", "sync", ADAMW | dict(batch_size=DEFAULT_BATCH * k),
          micro_batches=k) for k in (2, 4, 8)],
    # one bucket (ddp_train.py: PyTorch's hook on gloo needs it), so it starts after the backward pass;
    # three allreduces: the uncompressed vectors, then P, then Q
    Row("torch-powersgd", f"PyTorch PowerSGD hook r{TORCH_POWERSGD_RANK}", "sync", ADAMW, collectives=3,
        overlap="none", runner="torch"),
    Row("gw-powersgd", "gradwire sync + PowerSGD r8 fp16", "sync",
        ADAMW | dict(compressor="powersgd:rank=8,dtype=fp16"), collectives=2),
    Row("gw-qsgd", "gradwire sync + QSGD 4-bit + EF", "sync",
        ADAMW | dict(compressor="qsgd:levels=7,bucket=128", error_feedback=True), collective="allgather",
        overlap="none"),  # not summable: an allgather of the whole gradient's payload (sync.py's docstring)
    Row("local-adamw", f"local AdamW, averaged every {H}", f"diloco:inner_steps={H},outer_lr=1,outer_momentum=0,"
        "outer_warmup=0", period=H, overlap="none"),
    Row("diloco", f"DiLoCo H={H}", f"diloco:inner_steps={H}", period=H, overlap="none"),
    streaming_row("streaming", f"Streaming DiLoCo H={H} P=4 τ=2 fp16",
                  f"inner_steps={H},fragments=4,overlap=2,alpha=0.5", period=H // 4, tau=2),
    streaming_row("streaming-h40", "Streaming DiLoCo H=40 P=4 τ=10 fp16",
                  "inner_steps=40,fragments=4,overlap=10,alpha=0.5", period=10, tau=10),
    # the outer rate annealed with the inner one (outer_schedule=inner: η f(t-1) at the round after step t)
    *[diloco_row(f"diloco-h{h}-anneal", f"DiLoCo H={h}, outer rate annealed", f"inner_steps={h},outer_schedule=inner",
                 h) for h in (5, 10, 20)],
    streaming_row("streaming-h40-anneal", "Streaming DiLoCo H=40 P=4 τ=10 fp16, outer rate annealed",
                  "inner_steps=40,fragments=4,overlap=10,alpha=0.5,outer_schedule=inner", period=10, tau=10),
    streaming_row("streaming-h40-eager", "Streaming DiLoCo H=40 P=4 τ=10 fp16, eager",
                  "inner_steps=40,fragments=4,overlap=10,eager=true", period=10, tau=10),
    # the steps gap against H (H=5, 10, 40 not overlapped; H=20 P=2 τ=10 overlapped)
    *[diloco_row(f"diloco-h{h}", f"DiLoCo H={h}", f"inner_steps={h}", h) for h in (5, 10, 40)],
    # the outer rate and momentum: η/(1-μ) = 3.5, 5, 10 at η = 0.35, 0.5, 1; 3.5 at μ = 0.8, 2.3 at 0.7 (papers': 7)
    *[diloco_row(f"diloco-eta{eta:g}", f"DiLoCo H={H}, outer lr {eta:g}", f"inner_steps={H},outer_lr={eta:g}", H)
      for eta in (0.35, 0.5, 1.0)],
    *[diloco_row(f"diloco-mu{mu:g}", f"DiLoCo H={H}, outer momentum {mu:g}", f"inner_steps={H},outer_momentum={mu:g}",
                 H) for mu in (0.7, 0.8)],
    # at μ = 0.8: the outer lr's neighbours, and H = 40
    *[diloco_row(f"diloco-mu0.8-eta{eta:g}", f"DiLoCo H={H}, outer lr {eta:g}, momentum 0.8",
                 f"inner_steps={H},outer_lr={eta:g},outer_momentum=0.8", H) for eta in (0.5, 1.0)],
    diloco_row("diloco-h40-mu0.8", "DiLoCo H=40, outer momentum 0.8", "inner_steps=40,outer_momentum=0.8", 40),
    streaming_row("streaming-mu0.8", f"Streaming DiLoCo H={H} P=4 τ=2 fp16, outer momentum 0.8",
                  f"inner_steps={H},fragments=4,overlap=2,alpha=0.5,outer_momentum=0.8", period=H // 4, tau=2),
    streaming_row("streaming-h20-p2", "Streaming DiLoCo H=20 P=2 τ=10 fp16",
                  "inner_steps=20,fragments=2,overlap=10,alpha=0.5", period=10, tau=10),
    # the low-communication methods at docs/low_communication.md's best settings on stdlib-lm (H = 3)
    muloco_row("muloco-k96-h3", "MuLoCo H=3 top-k 96/4096 + EF", 3, MESSAGE_K96),
    # the blocks of 64 it was measured with (MuLoCo's default became 32 afterwards: docs/defaults.md)
    muloco_row("muloco-h3", "MuLoCo H=3 2-bit pquant + EF", 3, "pquant:p=inf,block=64"),
    muloco_row("muloco-k96-h10", "MuLoCo H=10 top-k 96/4096 + EF", 10, MESSAGE_K96),
    # the 2-bit row's round hidden behind inner steps (tenth pass): travelling one step (τ=1, α 0.5), or
    # eager (τ = H: the whole round); and a 1-bit message (the signs times their mean |x|, EF-signSGD's)
    *[muloco_row(f"muloco-h{h}-{name}-eta{eta:g}", f"MuLoCo H={h} 2-bit pquant + EF, {label}, outer lr {eta:g}", h,
                 "pquant:p=inf,block=64", f"outer_lr={eta:g},outer_momentum=0,{keys}")
      for h, name, label, keys, eta in ((3, "tau1", "τ=1 α=0.5", "overlap=1,alpha=0.5", 1),
                                        (3, "eager", "eager τ=3", "overlap=3,eager=true", 1),
                                        (3, "eager", "eager τ=3", "overlap=3,eager=true", 0.5),
                                        (6, "eager", "eager τ=6", "overlap=6,eager=true", 0.5))],
    *[muloco_row(f"muloco-sign-h3{name}", f"MuLoCo H=3 1-bit sign (times the mean magnitude) + EF{label}", 3,
                 "sign:scaled=true", f"outer_lr=1,outer_momentum=0{keys}")
      for name, label, keys in (("", "", ""), ("-eager", ", eager τ=3", ",overlap=3,eager=true"),
                                ("-tau1", ", τ=1 α=0.5", ",overlap=1,alpha=0.5"),
                                ("-tau2", ", τ=2 α=0.5", ",overlap=2,alpha=0.5"),
                                # the round's τ steps of progress carried onto the new θ (merge=carry,
                                # DaSGD's rule) rather than mixed: nothing discarded or halved
                                ("-tau1-carry", ", τ=1 carried", ",overlap=1,merge=carry"),
                                ("-tau2-carry", ", τ=2 carried", ",overlap=2,merge=carry"),
                                # 3 Newton-Schulz iterations instead of 5 (Muon's cost: the fourth pass)
                                ("-ns3", ", 3 NS steps", ",ns_steps=3"),
                                ("-ns3-tau2-carry", ", 3 NS steps, τ=2 carried", ",ns_steps=3,overlap=2,merge=carry"))],
    # the whole round hidden (τ up to H, carried): at 16 workers a round of the 1-bit message takes about
    # 36 ms at 100 Mbit/s (3 inner steps compute 41 ms) and 225 ms at 10 Mbit/s (12 steps: 166 ms)
    *[muloco_row(f"muloco-sign-h{h}-tau{tau}-carry", f"MuLoCo H={h} 1-bit sign + EF, τ={tau} carried", h,
                 "sign:scaled=true", f"outer_lr=1,outer_momentum=0,overlap={tau},merge=carry")
      for h, tau in ((3, 3), (6, 3), (6, 6), (12, 12), (4, 3))],
    # ... at MuLoCo's inner defaults since 2026-11-30 (Muon μ 0.9, the AdamW part's β2 0.99: docs/defaults.md,
    # eighth round), screened at 16 workers (sixteenth pass): blocking, τ = 1 and τ = 2 carried
    *[muloco_row(f"muloco-sign-h3{name}-mu0.9", f"MuLoCo H=3 1-bit sign + EF{label}, Muon μ 0.9, β2 0.99", 3,
                 "sign:scaled=true", f"outer_lr=1,outer_momentum=0{keys}", inner=MULOCO_DEFAULTS)
      for name, label, keys in (("", "", ""), ("-tau1-carry", ", τ=1 carried", ",overlap=1,merge=carry"),
                                ("-tau2-carry", ", τ=2 carried", ",overlap=2,merge=carry"))],
    # ... with the message's mean taken by its chunks' owners (--compressed-mean scatter: each link carries
    # 2(n-1)/n messages a round instead of n-1, in two exchanges of one latency each)
    *[muloco_row(f"muloco-sign-h3{name}-mu0.9-scatter", f"MuLoCo H=3 1-bit sign + EF{label}, Muon μ 0.9, β2 0.99, "
                 "mean by chunk owners", 3, "sign:scaled=true", f"outer_lr=1,outer_momentum=0{keys}",
                 inner=MULOCO_DEFAULTS, mean="scatter")
      for name, label, keys in (("", "", ""), ("-tau1-carry", ", τ=1 carried", ",overlap=1,merge=carry"),
                                ("-tau2-carry", ", τ=2 carried", ",overlap=2,merge=carry"),
                                ("-tau3-carry", ", τ=3 carried", ",overlap=3,merge=carry"))],
    # ... with the signs of a random subset of each chunk only (rand-k then sign, Qsparse-local-SGD: Basu et al.
    # 2019): under 1 bit a parameter, so that the 16-worker 10 Mbit/s round (28 ms at 1 bit) hides behind two
    # steps of a faster CPU (twentieth pass)
    *[muloco_row(f"muloco-sign{r}-h3-tau2-carry-mu0.9-scatter", f"MuLoCo H=3 sign of {r} of the elements + EF, "
                 "τ=2 carried, Muon μ 0.9, β2 0.99, mean by chunk owners", 3, f"sign:scaled=true,ratio={r}",
                 "outer_lr=1,outer_momentum=0,overlap=2,merge=carry", inner=MULOCO_DEFAULTS, mean="scatter")
      for r in (0.5, 0.75)],
    # ... and a longer round, travelling more steps: H = 6, τ = 3 or 4 (three or four batch-8 steps of a faster CPU
    # hide the 28 ms round at 16 workers; twentieth pass)
    *[muloco_row(f"muloco-sign-h6-tau{tau}-carry-mu0.9-scatter", f"MuLoCo H=6 1-bit sign + EF, τ={tau} carried, "
                 "Muon μ 0.9, β2 0.99, mean by chunk owners", 6, "sign:scaled=true",
                 f"outer_lr=1,outer_momentum=0,overlap={tau},merge=carry", inner=MULOCO_DEFAULTS, mean="scatter")
      for tau in (3, 4)],
    # ... with Muon on the hidden layers' weights only, the embeddings and the head on AdamW (matrices=hidden, as
    # Muon's and MuLoCo's authors do; eighteenth pass), with 5 Newton-Schulz iterations or Polar Express's first 3
    *[muloco_row(f"muloco-sign-h3-tau{tau}-carry-mu0.9-scatter-hidden{ns}",
                 f"MuLoCo H=3 1-bit sign + EF, τ={tau} carried, Muon μ 0.9 on the hidden matrices{label}, β2 0.99, "
                 "mean by chunk owners", 3, "sign:scaled=true",
                 f"outer_lr=1,outer_momentum=0,overlap={tau},merge=carry,matrices=hidden{keys}",
                 inner=MULOCO_DEFAULTS, mean="scatter")
      for tau in (1, 2, 3) for ns, label, keys in (("", "", ""), ("-pe3", ", 3 Polar Express steps",
                                                                 ",ns_steps=3,ns_coefficients=polar-express"))],
    # ... and the whole 10 Mbit/s round hidden at batch 32 (about 225 ms against 33 ms a step), screened there
    *[muloco_row(f"muloco-sign-h{h}-tau{h}-carry-mu0.9", f"MuLoCo H={h} 1-bit sign + EF, τ={h} carried, Muon μ 0.9, "
                 "β2 0.99", h, "sign:scaled=true", f"outer_lr=1,outer_momentum=0,overlap={h},merge=carry",
                 inner=MULOCO_DEFAULTS) for h in (6, 8)],
    # blocking at other H (screening at 16 workers: is what τ = H loses the delay, or the steps between averages?)
    *[muloco_row(f"muloco-sign-h{h}", f"MuLoCo H={h} 1-bit sign + EF", h, "sign:scaled=true") for h in (2, 6)],
    # ... with a smaller outer step (a one-round delay wants one: Kale et al. 2025's Table 2 lowers the outer
    # rate of its delayed variant), screened at 16 workers
    *[muloco_row(f"muloco-sign-h3-tau{tau}-carry-eta{eta:g}", f"MuLoCo H=3 1-bit sign + EF, τ={tau} carried, "
                 f"outer lr {eta:g}", 3, "sign:scaled=true", f"outer_lr={eta:g},outer_momentum=0,overlap={tau},"
                 "merge=carry") for tau, eta in ((2, 0.8), (3, 0.8), (3, 0.6), (2, 1.2), (3, 1.3))],
    # fewer Newton-Schulz iterations (most of Muon's cost): Jordan's coefficients, or Polar Express's first K
    *[muloco_row(f"muloco-k96-h3-ns{k}", f"MuLoCo H=3 top-k 96/4096 + EF, {k} NS steps", 3, MESSAGE_K96,
                 f"outer_lr=1,outer_momentum=0,ns_steps={k}") for k in (2, 3, 4)],
    # a larger message at 3 Newton-Schulz steps: the time targets allow any bit rate (k = 256, 512 of 4096)
    *[muloco_row(f"muloco-k{k}-h3-ns3", f"MuLoCo H=3 top-k {k}/4096 + EF, 3 Newton-Schulz steps", 3,
                 f"chunked-topk:chunk=4096,k={k}", "outer_lr=1,outer_momentum=0,ns_steps=3") for k in (256, 512)],
    # its round travelling while the next inner steps compute (Streaming DiLoCo's τ with one fragment)
    muloco_row("muloco-k512-h3-ns3-tau1", "MuLoCo H=3 top-k 512/4096 + EF, 3 NS steps, τ=1 α=0.5", 3,
               "chunked-topk:chunk=4096,k=512", "outer_lr=1,outer_momentum=0,ns_steps=3,overlap=1,alpha=0.5"),
    muloco_row("muloco-k512-h3-ns3-eager", "MuLoCo H=3 top-k 512/4096 + EF, 3 NS steps, eager τ=3", 3,
               "chunked-topk:chunk=4096,k=512", "outer_lr=1,outer_momentum=0,ns_steps=3,overlap=3,eager=true"),
    *[muloco_row(f"muloco-k512-h3-ns3-{name}-eta0.5",
                 f"MuLoCo H=3 top-k 512/4096 + EF, 3 NS steps, {label}, outer lr 0.5", 3,
                 "chunked-topk:chunk=4096,k=512", f"outer_lr=0.5,outer_momentum=0,ns_steps=3,{keys}")
      for name, label, keys in (("tau1", "τ=1 α=0.5", "overlap=1,alpha=0.5"),
                                ("eager", "eager τ=3", "overlap=3,eager=true"))],
    muloco_row("muloco-k96-h3-ns3-tau1-eta0.5", "MuLoCo H=3 top-k 96/4096 + EF, 3 NS steps, τ=1 α=0.5, outer lr 0.5",
               3, MESSAGE_K96, "outer_lr=0.5,outer_momentum=0,ns_steps=3,overlap=1,alpha=0.5"),
    *[muloco_row(f"muloco-k96-h3-pe{k}", f"MuLoCo H=3 top-k 96/4096 + EF, {k} Polar Express steps", 3, MESSAGE_K96,
                 f"outer_lr=1,outer_momentum=0,ns_steps={k},ns_coefficients=polar-express") for k in (2, 3)],
    # where MuLoCo's quality goes at 16 workers (screening): its rounds with a near-lossless fp16 message, at
    # H = 3 and at H = 1 (Muon on each worker's own gradient, the updates averaged every step: DDP with Muon
    # but for orthogonalising each worker's batch instead of their mean)
    *[muloco_row(f"muloco-fp16-h{h}-ns3", f"MuLoCo H={h} fp16, 3 NS steps", h, "fp16",
                 "outer_lr=1,outer_momentum=0,ns_steps=3") for h in (1, 3)],
    # ... and the fp16 round hidden whole (eager, τ = H = 6: a 16-worker allreduce of 274 KB at 100 Mbit/s
    # takes about 71 ms, six steps about 76)
    *[muloco_row(f"muloco-fp16-h6-ns3-eager-eta{eta:g}", f"MuLoCo H=6 fp16, 3 NS steps, eager τ=6, outer lr {eta:g}",
                 6, "fp16", f"outer_lr={eta:g},outer_momentum=0,ns_steps=3,overlap=6,eager=true") for eta in (1, 0.5)],
    # MuLoCo's 1-bit H=3 rounds with DDP's own AdamW as the inner step (fourteenth pass): Muon's step costs
    # 1.5x AdamW's on this model, which alone put the 16-worker MuLoCo rows at 1.24x DDP's zero-cost time
    Row("diloco-sign-h3", "DiLoCo H=3 η 1 μ 0, 1-bit sign (times the mean magnitude) + EF",
        "diloco:inner_steps=3,outer_lr=1,outer_momentum=0", SIGN_EF, collective="allgather", period=3, overlap="none"),
    # ... and its rounds nearly uncompressed (screening: the sign message's cost, against the locality's)
    diloco_row("diloco-fp16-h3", "DiLoCo H=3 η 1 μ 0, fp16", "inner_steps=3,outer_lr=1,outer_momentum=0", 3,
               compressor="fp16"),
    diloco_row("sparseloco-k96-h3", "SparseLoCo H=3 top-k 96/4096 α=1", "inner_steps=3,k=96,outer_lr=1", 3,
               method="sparseloco", collective="allgather"),
    Row("demo-k1of64", "DeMo top-1 of 64 DCT, sign", "demo:chunk=64,k=1", collective="allgather", overlap="none"),
    # the control for MuLoCo: its inner rule (Muon on the matrices, AdamW on the rest, η = 10·lr, no weight
    # decay) as DDP's optimizer, every step's gradient averaged
    Row("ddp-muon", "DDP with Muon (MuLoCo's inner rule)", "sync", MUON),
    # and gradwire's compressors under it: MuLoCo's 0.21-bit message every step, PowerSGD's
    Row("gw-muon-topk96", "gradwire sync + Muon + top-k 96/4096 + EF", "sync",
        MUON | dict(compressor=MESSAGE_K96, error_feedback=True), collective="allgather", overlap="none"),
    Row("gw-muon-powersgd", "gradwire sync + Muon + PowerSGD r8 fp16", "sync",
        MUON | dict(compressor="powersgd:rank=8,dtype=fp16"), collectives=2),
    # DiLoCo's straggler insurance (docs/low_communication.md) at DiLoCo's H and outer settings, where no
    # worker straggles: what it costs. Server mode: a step is a round of H inner steps; the replicas upload
    # their Δ and the server answers each with θ (32 bits a parameter), all over the server's link.
    # backup-diloco with b = 1 cannot run on one worker: its compute is timed at b = 0 (the same replica work)
    server_row("backup-diloco", f"DiLoCo H={H}, 1 backup replica (server)",
               f"backup-diloco:backups=1,inner_steps={H}", H, f"backup-diloco:backups=0,inner_steps={H}"),
    server_row("async-diloco", f"asynchronous DiLoCo H={H} (server)",
               f"async-diloco:inner_steps={H}", H),
    # its outer rate (default 0.2, set on digits-mlp at 8 workers, where a round reads θ a round late),
    # screened at the walked inner rate as DiLoCo's outer settings were (diloco-eta*)
    *[server_row(f"async-diloco-eta{eta:g}", f"asynchronous DiLoCo H={H}, outer lr {eta:g} (server)",
                 f"async-diloco:inner_steps={H},outer_lr={eta:g}", H) for eta in (0.35, 0.7)],
    # ... compressed both ways: the 1-bit scaled sign with error feedback up, θ's change through it down
    server_row("backup-diloco-sign", f"DiLoCo H={H}, 1 backup replica, 1-bit sign + EF both ways (server)",
               f"backup-diloco:backups=1,inner_steps={H},answer=change", H,
               f"backup-diloco:backups=0,inner_steps={H},answer=change", SIGN_EF),
    server_row("async-diloco-sign", f"asynchronous DiLoCo H={H}, 1-bit sign + EF both ways (server)",
               f"async-diloco:inner_steps={H},answer=change", H, run=SIGN_EF),
    # ... at MuLoCo's 1-bit setting (H = 3, outer lr 1, no momentum: the sign keeps a small round's change)
    server_row("backup-diloco-sign-h3", "DiLoCo H=3 η 1 μ 0, 1 backup replica, 1-bit sign + EF both ways (server)",
               "backup-diloco:backups=1,inner_steps=3,outer_lr=1,outer_momentum=0,answer=change", 3,
               "backup-diloco:backups=0,inner_steps=3,outer_lr=1,outer_momentum=0,answer=change", SIGN_EF),
    server_row("async-diloco-sign-h3", "asynchronous DiLoCo H=3 η 1 μ 0, 1-bit sign + EF both ways (server)",
               "async-diloco:inner_steps=3,outer_lr=1,outer_momentum=0,answer=change", 3, run=SIGN_EF),
    # screening: which way the 1-bit message costs quality (up only, θ itself down), and a 2-bit message
    server_row("backup-diloco-sign-up", f"DiLoCo H={H}, 1 backup replica, 1-bit sign + EF up, θ down (server)",
               f"backup-diloco:backups=1,inner_steps={H}", H, f"backup-diloco:backups=0,inner_steps={H}",
               SIGN_EF),
    server_row("backup-diloco-pquant", f"DiLoCo H={H}, 1 backup replica, 2-bit pquant + EF both ways (server)",
               f"backup-diloco:backups=1,inner_steps={H},answer=change", H,
               f"backup-diloco:backups=0,inner_steps={H},answer=change",
               dict(compressor="pquant:p=inf,block=32", error_feedback=True)),
]
ROW = {r.key: r for r in ROWS}


# -- the pure logic (tests/report/test_time_to_quality.py) ------------------------------------------

def schedule(row: Row, n_steps: int) -> tuple[str, int]:
    """The row's lr schedule and its horizon in steps of the run: warm-up, cosine to MIN_RATIO at N
    samples' worth of updates (N/k for accumulation over k), the floor after. In server mode a step
    is a round of H inner updates and the replicas' schedule spans --steps × H of them
    (algorithms/outer_replicas.py): the horizon is N/H rounds, the warm-up DDP's WARMUP updates."""
    k = row.micro_batches
    return f"cosine:warmup={max(1, WARMUP // k)},min_ratio={MIN_RATIO:g}", n_steps // row.batches_per_step


def eval_every(step: int, horizon: int) -> int:
    """Evaluations are sparse (every EARLY_EVERY) up to half the horizon, where no row is near the
    target and the tuning's measurements do not look, and every EVAL_EVERY after."""
    return EARLY_EVERY if step <= horizon // 2 else EVAL_EVERY


def evaluates_here(row: Row, step: int, horizon: int, algorithm_says) -> bool:
    """Whether update ``step`` is evaluated: where the algorithm says (``algorithm_says(step,
    every, horizon)``: every ``every`` steps, DiLoCo's round ends after them), or, for accumulation
    over k (a server-mode round of H), where the samples seen cross a multiple of ``every``
    micro-batches' worth (DDP's grid in samples); and at the horizon."""
    k = row.batches_per_step
    every = eval_every(step * k, horizon * k)
    if k == 1:
        return algorithm_says(step, every, horizon)
    return (step * k) // every > ((step - 1) * k) // every or step == horizon


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


def late_losses(steps: list[int], losses: list[float], n_steps: int) -> list[float]:
    """The evaluations that ``evaluation_noise`` is measured on: those after N/2, up to N."""
    return [v for s, v in zip(steps, losses) if n_steps // 2 < s <= n_steps]


def steps_to_target(steps: list[int], losses: list[float], target: float) -> float | None:
    """Where the curve first reaches the target (None: never): the first evaluation at or below
    it, moved back by linear interpolation to where the line from the evaluation before crosses
    the target (evaluations are 50-200 steps apart; the first one under it alone would count up to a
    whole interval of steps the row did not need)."""
    first = next((i for i, v in enumerate(losses) if v <= target), None)
    if first is None:
        return None
    if first == 0 or not math.isfinite(losses[first - 1]):  # nothing to draw a line from
        return float(steps[first])
    (s0, v0), (s1, v1) = (steps[first - 1], losses[first - 1]), (steps[first], losses[first])
    return s0 + (s1 - s0) * (v0 - target) / (v0 - v1)


def reached(losses: list[float], target: float | None, after: int = STOP_AFTER) -> bool:
    """Whether a curve may stop: ``after`` evaluations have followed its first at or below the
    target (the table needs only the first; the rest show it was no fluke)."""
    if target is None:
        return False
    first = next((i for i, v in enumerate(losses) if v <= target), None)
    return first is not None and len(losses) - 1 - first >= after


def collective_seconds(kind: str, payload_bytes: float, workers: int, mbps: float,
                       latency_ms: float = LATENCY_MS, collectives: int = 1, network: str = "ring") -> float:
    """gradwire's network model itself (transports/network.py) for ``collectives`` equal collectives
    that carry ``payload_bytes`` of one worker's between them. ``ring`` (RingNetwork; Patarasuk & Yuan
    2009, what gloo runs): allreduce 2(n-1)(latency + B/(n·bw)); allgather (n-1)(latency + B/bw), per
    collective. ``halving-doubling`` (HalvingDoublingNetwork): the same bytes in 2·log2 n rounds (an
    allreduce, n a power of two; two more otherwise) or ceil(log2 n) (an allgather). ``scatter`` (the
    compressed mean's scatter route): two all-to-alls of one n-th of the message each, every message
    posted at once, 2·(latency + (n-1)·B/(n·bw)) on either network (``Network.alltoall``); with the
    owners' messages in a codec of their own, B is the mean of the two (the ledger's count over
    ``ledger_divisor``: a link's time is linear in its slot, so the sum of the two is exact)."""
    from gradwire.transports.network import NETWORKS

    if workers <= 1:
        return 0.0
    net, each = NETWORKS.build(f"{network}:mbps={mbps!r},latency_ms={latency_ms!r}"), payload_bytes / collectives
    if kind == "allreduce":
        return collectives * net.allreduce(each, workers).time_s
    if kind == "allgather":
        return collectives * net.allgather([each] * workers).time_s
    if kind == "scatter":
        return collectives * 2 * net.alltoall(each / workers, workers).time_s
    raise ValueError(f"collective {kind!r}: allreduce, allgather or scatter")


def allreduce_seconds(payload_bytes: float, workers: int, mbps: float, latency_ms: float = LATENCY_MS,
                      collectives: int = 1) -> float:
    return collective_seconds("allreduce", payload_bytes, workers, mbps, latency_ms, collectives)


SERVER_ROUNDS = (3, 6)          # server_round_seconds: the simulated rounds it runs, and the last it averages from


@functools.cache
def server_round_seconds(algorithm: str, compute_s: float, workers: int, mbps: float, latency_ms: float = LATENCY_MS,
                         compressor: str = "none", error_feedback: bool = False) -> float:
    """One round of a server-mode row (backup-diloco, async-diloco) on gradwire's simulator itself:
    ``algorithm`` on ``workers`` replicas of the benchmark's model, each round's computing taking
    ``compute_s`` (the straggler model ``none``: no one straggles), their messages over the star
    network (``ps``, whose ``ServerLink`` serialises the server's link in each direction, latency
    ``latency_ms``) at ``mbps``, through the row's ``compressor``. The simulated seconds per round
    from round SERVER_ROUNDS[0] to SERVER_ROUNDS[1] (past the first rounds, where every replica
    starts at once): where the answers go out one after another, the replicas' next rounds are
    staggered and their uploads overlap the others' answers. Run with one inner step a round, the
    whole round's compute on it: the times and the messages (their size does not depend on H) are
    the same, and the simulation costs 1/H of the gradients."""
    from gradwire.config import RunConfig
    from gradwire.run.loop import Run
    from gradwire.spec import render

    first, last = SERVER_ROUNDS
    name, keys = parse_spec(algorithm)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(task=TASK, workers=workers, batch_size=BATCH, steps=last, eval_every=last, lr=1e-3, threads=1,
                        algorithm=render(name, keys | {"inner_steps": "1"}), seed=TUNING_SEED,
                        network=f"ps:mbps={mbps!r},latency_ms={latency_ms!r}",
                        stragglers=f"none:compute_s={compute_s!r}", out=str(Path(tmp) / "run"), overwrite=True,
                        compressor=compressor, error_feedback=error_feedback)
        r = Run(cfg)
        for _ in range(first):
            r.train_step()
        start = r.clock.now
        for _ in range(last - first):
            r.train_step()
        r.algorithm.close()
        return (r.clock.now - start) / (last - first)


def ledger_divisor(kind: str, workers: int) -> int:
    """The ledger counts a ring allreduce of B bytes a worker as 2(n-1)B and an allgather of B
    each as (n-1)·n·B (transports/ledger.py): what to divide by for one worker's B."""
    if kind == "scatter":  # two all-to-alls of n slots: B is the whole message, n slots (chunks' headers included)
        return 2 * (workers - 1)
    return 2 * (workers - 1) if kind == "allreduce" else (workers - 1) * workers


def compute_ratio(compute: dict, key: str) -> tuple[float, str]:
    """Row ``key``'s step over DDP's and how it was obtained: the median over blocks of the row's
    block over DDP's of the same turn (``paired_ratio``, "paired") wherever DDP's blocks of the row's
    session are known; else its fastest block over the fastest block of the DDP measured beside it
    ("fastest", the estimator of compute.json files written before rows kept DDP's blocks).

    Why the median of pairs: a machine's clock moves by ±5-10 % within minutes, and the fastest
    block of either side can be one such moment; the eighteenth pass's τ = 2 row was priced at 1.18x
    DDP's step by one block 25 % faster than its nine others, where its blocks over DDP's beside
    them give 1.50x. The pairs share the moment, and the median ignores a lone outlier."""
    if key == "ddp":
        return 1.0, "paired"
    paired = paired_ratio(compute, key)
    if paired is not None:
        return paired, "paired"
    cost = compute[key]
    return cost["compute_s"] / cost["ddp_compute_s"], "fastest"


def row_cost(compute: dict, key: str) -> dict:
    """Row ``key``'s measured costs (compute.json) for the time model, in the reference DDP's terms:
    its compute is its ratio to the DDP measured beside it in the same ``compute`` invocation (every
    invocation measures ddp with the rows it is asked for; ``compute_ratio``) times the reference
    DDP's step, so that a row measured on a faster or busier day keeps its ratio to DDP, not its
    seconds; its decode times are scaled by the two DDPs' fastest blocks; the backward pass is the
    reference session's. ``priced_by`` says which ratio ("paired" or "fastest"). A figure from before
    sessions were recorded is refused."""
    cost, ddp = compute[key], compute["ddp"]
    missing = [k for k in ("session", "ddp_compute_s", "decode_s", "size_exchanges", "bucket_shares") if k not in cost]
    if missing:
        raise SystemExit(f"compute.json: row {key!r} was measured without {', '.join(missing)} (before the time "
                         f"model priced them): run `compute --rows {key}` again")
    scale = ddp["compute_s"] / cost["ddp_compute_s"]
    ratio, priced_by = compute_ratio(compute, key)
    scaled = {"compute_s": ratio * ddp["compute_s"], "decode_s": cost["decode_s"] * scale,
              "backward_s": ddp["backward_s"], "priced_by": priced_by}
    if "scatter_round_s" in cost:
        scaled["scatter_round_s"] = {n: s * scale for n, s in cost["scatter_round_s"].items()}
    return cost | scaled


def backward_overhang(row: Row, cost: dict, workers: int, mbps: float, network: str = "ring") -> float:
    """DDP's buckets against its backward pass: bucket i (``cost["bucket_shares"]``, the gradient's
    shares in the order the backward pass fills them) is ready once that share of the backward is
    done, and its collectives (each bucket paying its own latencies) run one bucket after another
    as soon as it is ready and the link is free; what runs past the end of the backward pass is not
    hidden. One bucket (a gradient under the 1 MiB first bucket, PyTorch's and gradwire's): nothing
    is hidden."""
    ready = free = 0.0
    for share in cost["bucket_shares"]:
        ready += share * cost["backward_s"]
        free = max(free, ready) + collective_seconds(row.collective, cost["payload_bytes"] * share, workers, mbps,
                                                     collectives=row.collectives, network=network)
    return max(0.0, free - cost["backward_s"])


def step_seconds(row: Row, cost: dict, workers: int, mbps: float | None, network: str = "ring") -> float:
    """One step's time of one worker among ``workers``: its compute, with every payload of an
    all-gathered round decoded (the 1-worker measurement decodes its own only: ``decode_s`` each
    for the n - 1 others), plus the communication it cannot hide: a variable-size message's blocking
    exchange of sizes (8 bytes each, before the payload's collective starts: never hidden), then the
    payload (``payload_bytes`` one worker's per round). A server-mode row's round, its compute and
    its messages to and from the server, is the simulator's (``server_round_seconds``). A scatter
    round's averaging (a worker's n chunks encoded, n messages of its chunk decoded and its mean
    encoded again, the n owners' chunks decoded) is measured at each worker count
    (``scatter_round_s``, ``scatter_round_seconds``): the one-worker measurement holds the one-worker
    round, and the difference is added a round. ``cost``:
    ``row_cost``'s; ``mbps`` None: a network of zero cost; ``network``: NETWORKS' ring or
    halving-doubling."""
    from gradwire.transports.ledger import SIZE_BYTES

    compute = cost["compute_s"] + (workers - 1) * cost["decode_s"] / row.period
    if row.collective == "scatter":  # the round's averaging at this worker count, not at the measurement's one
        rounds = cost.get("scatter_round_s")
        if rounds is None or str(workers) not in rounds:
            raise SystemExit(f"compute.json: row {row.key!r} has no scatter round cost at {workers} workers "
                             f"(measured at {sorted(rounds or {}, key=int)}): run `compute --rows {row.key}` again")
        compute += (rounds[str(workers)] - rounds["1"]) / row.period
    if mbps is None:
        return compute
    if row.collective == "server":  # the simulator's round through the server (no other network applies)
        return server_round_seconds(row.algorithm, compute, workers, mbps, compressor=row.run.get("compressor", "none"),
                                    error_feedback=row.run.get("error_feedback", False))
    exchange = cost["size_exchanges"] * collective_seconds("allgather", SIZE_BYTES, workers, mbps, network=network)
    if row.overlap == "backward":  # DDP: the buckets' allreduces run while the backward pass goes on
        return compute + exchange + backward_overhang(row, cost, workers, mbps, network)
    comm = collective_seconds(row.collective, cost["payload_bytes"], workers, mbps, collectives=row.collectives,
                              network=network)
    if row.overlap.startswith("tau:"):  # Streaming DiLoCo: a fragment travels while τ steps compute
        tau = int(row.overlap.split(":")[1])
        return compute + (exchange + max(0.0, comm - tau * compute)) / row.period
    return compute + (exchange + comm) / row.period


def next_trial(trials: dict[float, float], grid=LRS, first=FIRST_TRIALS) -> float | None:
    """The same search for every row: the ``first`` trials, then the untried grid neighbour of the
    best trial so far, until both neighbours of the best have been tried (a minimum on the grid)
    or the grid ends. Diverged trials (NaN) count as worst."""
    for lr in first:
        if lr not in trials:
            return lr
    score = {lr: q if math.isfinite(q) else math.inf for lr, q in trials.items()}
    best = min(score, key=lambda lr: (score[lr], lr))
    i = grid.index(best)
    for j in (i + 1, i - 1):
        if 0 <= j < len(grid) and grid[j] not in trials:
            return grid[j]
    return None


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


def table_rows(target: float, results: dict, compute: dict, workers: int, network: str = "ring") -> list[dict]:
    """One line per row: time to the target at each rate (mean and range over the seeds that
    reached it) and its ratio to DDP on a network of zero cost. ``results[key]`` = list of
    per-seed dicts {steps, losses, params}; ``compute[key]`` = an entry of ``measure_compute``
    (priced through ``row_cost``)."""
    zero = None
    lines = []
    for row in ROWS:
        line = {"key": row.key, "label": row.label}
        runs, cost = results.get(row.key), compute.get(row.key)
        if not runs or cost is None:
            line["status"] = "not run"
            lines.append(line)
            continue
        cost = row_cost(compute, row.key)
        hit = [steps_to_target(r["steps"], r["losses"], target) for r in runs]
        line["seeds"] = len(runs)
        line["best"] = min(min(r["losses"]) for r in runs)
        # a server-mode row's steps are rounds: shown in inner steps (DDP's steps), as its bits and CPU
        line["steps"] = summarise([None if s is None else s * row.inner_steps for s in hit])
        payload = cost["payload_bytes"]
        # every byte a worker's link carries for the round: its payload; in server mode its upload and
        # the server's answer to it (each bits per parameter: up + down)
        line["bits_up"] = 8 * payload / runs[0]["params"]
        line["bits_down"] = 8 * cost["answer_bytes"] / runs[0]["params"] if row.collective == "server" else 0.0
        line["bits_per_param_round"] = line["bits_up"] + line["bits_down"]
        line["bits_per_param_step"] = line["bits_per_param_round"] / (row.period * row.inner_steps)
        line["cpu_ms"] = 1e3 * step_seconds(row, cost, workers, None) / row.inner_steps
        for mbps in (None, *RATES_MBPS):
            t = step_seconds(row, cost, workers, mbps, network)
            line[f"t@{mbps}"] = summarise([None if s is None else s * t for s in hit])
        if row.key == "ddp":
            zero = line["t@None"][0]
        lines.append(line)
    for line in lines:
        for mbps in RATES_MBPS:
            mean = line.get(f"t@{mbps}", (None,))[0]
            ddp = next((x.get(f"t@{mbps}", (None,))[0] for x in lines if x["key"] == "ddp"), None)
            line[f"x@{mbps}"] = None if mean is None or not zero else mean / zero
            line[f"vs_ddp@{mbps}"] = None if mean is None or not ddp else ddp / mean
    return lines


RATE_BITS = 0.25               # the bit-rate target: bits per parameter per communication round, every byte counted


def quality_at_rate(lines: list[dict], max_bits: float = RATE_BITS) -> str:
    """The bit-rate target's table: every row that ran and sends at most ``max_bits`` bits per
    parameter per round (``table_rows``' lines), whether it reached DDP's quality (on how many
    seeds, in how many steps) and, where not, the best loss it got to."""
    head = (f"\n#### DDP's quality at ≤ {max_bits:g} bits/param/round\n\n| row | bits/param/round | "
            "reached DDP's quality | steps to it |\n|---|---|---|---|\n")
    out = []
    for line in lines:
        bits = line.get("bits_per_param_round")
        if bits is None or bits > max_bits:
            continue
        n = line["steps"][3]
        verdict = (f"yes, {n} of {line['seeds']} seeds" if n else f"no (best {line['best']:.4f})")
        steps = _fmt_range(line["steps"], seeds=False) if n else "—"
        out.append(f"| {line['label']} | {bits:.3f} | {verdict} | {steps} |")
    return head + ("\n".join(out) if out else f"| none ran at ≤ {max_bits:g} bits | | | |") + "\n"


def _fmt_range(s, unit="", digits=0, seeds=True) -> str:
    mean, lo, hi, n = s
    if mean is None:
        return "not reached"
    text = f"{mean:.{digits}f}{unit}" + (f" ({lo:.{digits}f}-{hi:.{digits}f})" if n > 1 else "")
    return text + (f", {n} seed{'s' if n > 1 else ''}" if seeds else "")


def _bits_cell(line: dict) -> str:
    """Bits per parameter per round; a server-mode row's as up + down (the server's answer)."""
    if line.get("bits_down"):
        return f"{line['bits_up']:.3g} up + {line['bits_down']:.3g} down"
    return f"{line['bits_per_param_round']:.3g}"


def markdown(lines: list[dict], workers: int, target: float) -> str:
    head = (f"\n### {workers} workers (target: validation loss {target:.4f})\n\n| row | steps to target | "
            + " | ".join(f"time @ {m:g} Mbit/s (x DDP at zero cost; DDP's speed-up)" for m in RATES_MBPS)
            + " | bits/param/step | bits/param/round | CPU ms/step |\n|---" + "|---" * (len(RATES_MBPS) + 4) + "|\n")
    out = []
    for line in lines:
        if line.get("status") == "not run":
            out.append(f"| {line['label']} | not run |" + " |" * (len(RATES_MBPS) + 3))
            continue
        if line["steps"][0] is None:
            out.append(f"| {line['label']} | not reached in {line['seeds']} seeds (best {line['best']:.4f}) |"
                       + " — |" * len(RATES_MBPS) + f" {line['bits_per_param_step']:.3g} | "
                       f"{_bits_cell(line)} | {line['cpu_ms']:.1f} |")
            continue
        cells = [f"{_fmt_range(line[f't@{m}'], ' s', 1, seeds=False)}, {line[f'x@{m}']:.2f}x; "
                 f"{line[f'vs_ddp@{m}']:.2f}x" for m in RATES_MBPS]
        of = "" if line["steps"][3] == line["seeds"] else f" of {line['seeds']}"
        out.append(f"| {line['label']} | {_fmt_range(line['steps'])}{of} | " + " | ".join(cells)
                   + f" | {line['bits_per_param_step']:.3g} | {_bits_cell(line)} | "
                   f"{line['cpu_ms']:.1f} |")
    return head + "\n".join(out) + "\n"


# -- the costly stages --------------------------------------------------------------------------------

def run_folder(out: Path, row: Row, lr: float, seed: int, workers: int) -> Path:
    return out / f"w{workers}" / row.key / f"lr{lr:g}-seed{seed}"


def config(row: Row, lr: float, seed: int, workers: int, n_steps: int, folder: Path):
    """The run's config; its ``steps`` is the schedule's horizon (N/k updates), which the curve
    may run past (``train``)."""
    from gradwire.config import RunConfig

    spec, horizon = schedule(row, n_steps)
    fields = dict(task=TASK, workers=workers, batch_size=BATCH, steps=horizon, eval_every=EVAL_EVERY, threads=1,
                  network=f"ring:mbps=100,latency_ms={LATENCY_MS:g}", seed=seed, lr=lr, algorithm=row.algorithm,
                  lr_schedule=spec, out=str(folder), overwrite=True) | row.run
    return RunConfig(**fields)


def validation_loss(r) -> float:
    """The validation loss of the parameters the run's algorithm evaluates (the mean over rows
    where it evaluates each worker's): the test pass of gradwire's ``evaluate`` without its
    training-set pass, which the curves do not use."""
    import torch

    r.driver.before_evaluation()
    params = r.algorithm.eval_params()
    rows = params if params.dim() == 2 else params[None]
    x, y = r.task.x_test, r.task.y_test
    total = 0.0
    with torch.no_grad():
        for p in rows:
            for i in range(0, len(x), 4096):
                total += float(r.task.loss_fn(r.model.forward(p, x[i:i + 4096]), y[i:i + 4096])) * len(y[i:i + 4096])
    return total / len(x) / len(rows)


def read_curve(folder: Path) -> dict | None:
    path = folder / "curve.json"
    return json.loads(path.read_text()) if path.exists() else None


class Curve:
    """One curve being trained (``advance``), then written (``save``: ``curve.json``, the evaluated
    steps, validation losses, ledger bytes). Several can be held at once: DDP's seeds run to N
    together, and on from there only until each reaches the target their qualities at N set."""

    def __init__(self, row: Row, lr: float, seed: int, workers: int, n_steps: int, max_steps: int,
                 evaluate_from: int = 0):
        from gradwire.run.loop import Run

        self.evaluate_from = evaluate_from  # no evaluation at or before this update (tuning: only the last ones)
        self.row, self.lr, self.seed, self.workers, self.n_steps, self.max_steps = row, lr, seed, workers, n_steps, \
            max_steps
        self.horizon = schedule(row, n_steps)[1]
        self._tmp = tempfile.TemporaryDirectory()
        self.r = Run(config(row, lr, seed, workers, n_steps, Path(self._tmp.name) / "run"))
        self.step, self.steps, self.losses, self.bytes, self.status = 0, [], [], [], "running"
        self.target, self.cpu_s = None, 0.0

    def advance(self, until: int, target: float | None = None, own_target: bool = False) -> None:
        """Train to update ``until`` (at most ``max_steps``), stopping once ``reached``;
        ``own_target``: DDP alone on one seed, whose target is its own quality at N."""
        r, row = self.r, self.row
        self.target = target if target is not None else self.target
        print(f"[time_to_quality] {row.key} lr={self.lr:g} seed={self.seed} workers={self.workers} "
              f"{self.step} to {min(until, self.max_steps)} (target {self.target})", flush=True)
        cpu = time.thread_time()
        while self.status == "running" and self.step < min(until, self.max_steps):
            self.step = step = self.step + 1
            info = r.train_step()
            if not math.isfinite(info["loss"]):
                self.status = "diverged"
                break
            if (step > self.evaluate_from and evaluates_here(row, step, self.horizon, r.algorithm.evaluates_at)) \
                    or step == self.max_steps:
                r.window.clear()
                self.steps.append(step)
                self.losses.append(validation_loss(r))
                self.bytes.append(r.transport.bytes_sent)
                if not math.isfinite(self.losses[-1]):
                    self.status = "diverged"
                elif own_target and self.target is None and step >= self.horizon:
                    self.target = target_quality(self.steps, self.losses, self.horizon)
                if self.status == "running" and reached(self.losses, self.target):
                    self.status = "reached"
        if self.status == "running" and self.step >= self.max_steps:
            self.status = "finished"
        self.cpu_s += time.thread_time() - cpu

    def save(self, out: Path) -> dict:
        self.r.algorithm.close()
        self._tmp.cleanup()
        curve = {"row": self.row.key, "lr": self.lr, "seed": self.seed, "workers": self.workers,
                 "n_steps": self.n_steps, "horizon": self.horizon, "max_steps": self.max_steps, "target": self.target,
                 "status": self.status if self.status != "running" else "stopped", "steps": self.steps,
                 "losses": self.losses, "bytes": self.bytes, "params": int(self.r.model.flatten().numel()),
                 "cpu_s": self.cpu_s}
        folder = run_folder(out, self.row, self.lr, self.seed, self.workers)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "curve.json").write_text(json.dumps(curve) + "\n")
        return curve


def done(curve: dict | None, max_steps: int) -> bool:
    return bool(curve) and (curve["status"] in ("diverged", "reached") or curve["steps"][-1] >= max_steps)


def train(row: Row, lr: float, seed: int, workers: int, n_steps: int, max_steps: int, out: Path,
          target: float | None = None, own_target: bool = False, evaluate_from: int = 0) -> dict:
    """One curve to ``max_steps`` updates, or until it has ``reached`` the target; a finished
    curve on disk is returned as it is."""
    curve = read_curve(run_folder(out, row, lr, seed, workers))
    if done(curve, max_steps):
        return curve
    c = Curve(row, lr, seed, workers, n_steps, max_steps, evaluate_from)
    c.advance(max_steps, target, own_target)
    return c.save(out)


def train_ddp(lr: float, seeds, workers: int, n_steps: int, out: Path) -> float:
    """DDP's table curves: every seed to N (held together), then the target (their mean quality
    at N), then each seed on until it has reached it (or 2N). Returns the target."""
    todo = [s for s in seeds if not done(read_curve(run_folder(out, ROW["ddp"], lr, s, workers)), 2 * n_steps)]
    if len(seeds) == 1 and todo:
        train(ROW["ddp"], lr, seeds[0], workers, n_steps, 2 * n_steps, out, own_target=True)
    elif todo:
        if len(todo) < len(seeds):
            raise RuntimeError(f"DDP at {workers} workers: seeds {todo} unfinished, the others done: run them "
                               "again together (delete their curves)")
        curves = [Curve(ROW["ddp"], lr, s, workers, n_steps, 2 * n_steps) for s in seeds]
        for c in curves:
            c.advance(n_steps)
        target = statistics.mean(target_quality(c.steps, c.losses, n_steps) for c in curves)
        for c in curves:
            c.advance(2 * n_steps, target)
            c.save(out)
    lrs = {"ddp": lr}
    return ddp_target(out, lrs, workers, seeds, n_steps)


def train_torch(row: Row, lr: float, seed: int, n_steps: int, max_steps: int, out: Path,
                rank: int = TORCH_POWERSGD_RANK, procs: int = 4, tag: str = "") -> dict:
    """PyTorch's PowerSGD hook: benchmarks/ddp_train.py under torchrun, ``procs`` gloo processes,
    the same task, batches, initial model, AdamW and schedule; its metrics.jsonl becomes a curve."""
    folder = run_folder(out, row, lr, seed, procs)
    folder = folder.with_name(folder.name + tag)
    curve = read_curve(folder)
    if curve and curve["steps"][-1] >= max_steps:
        return curve
    spec, horizon = schedule(row, n_steps)
    print(f"[time_to_quality] {row.key} r{rank} lr={lr:g} seed={seed} procs={procs} to {max_steps}", flush=True)
    here = Path(__file__).resolve().parent
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
           str(here / "ddp_train.py"), "--task", TASK, "--steps", str(max_steps), "--lr-horizon", str(horizon),
           "--batch-size", str(BATCH), "--seed", str(seed), "--optimizer", "adamw", "--lr", f"{lr:g}",
           "--lr-schedule", spec, "--eval-every", str(EVAL_EVERY), "--hook", "powersgd",
           "--powersgd-rank", str(rank), "--out", str(folder / "run")]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cpu = time.perf_counter()
    sys.path.insert(0, str(here))
    from bounded import run_group

    # bounded: 0.35-0.55 s a step at 16 processes on 2 cores (docs/time_to_accuracy.md); this allows ~4x that,
    # and a timeout ends torchrun's workers too
    run_group(cmd, 600 + 0.15 * max_steps * procs, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [x for x in rows if x["step"] > 0]
    cfg = json.loads((folder / "run" / "config.json").read_text())
    curve = {"row": row.key, "lr": lr, "seed": seed, "workers": procs, "n_steps": n_steps, "horizon": horizon,
             "max_steps": max_steps, "target": None, "status": "finished", "steps": [x["step"] for x in rows],
             "losses": [x["test_loss"] for x in rows], "bytes": [x["bytes_sent"] for x in rows],
             "params": cfg["num_parameters"], "powersgd_rank": rank, "wall_s": time.perf_counter() - cpu}
    (folder / "curve.json").write_text(json.dumps(curve) + "\n")
    return curve


def _sim_stepper(row: Row, lr: float, n_steps: int, folder: Path):
    from gradwire.run.loop import Run

    if row.compute_algorithm:
        row = dataclasses.replace(row, algorithm=row.compute_algorithm)
    r = Run(config(row, lr, TUNING_SEED, 1, n_steps, folder))
    return r.train_step


_KEPT_GROUPS = []  # process groups measure_compute destroyed, kept until the process exits


def _torch_powersgd_stepper(lr: float, folder: Path):
    """PyTorch DDP with the PowerSGD hook in one process (a 1-rank gloo group): forward, backward
    with the hook (compression and decompression; the allreduces trivial), AdamW."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ddp_train import build

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
    task, model, data = build(TASK, world=1, rank=0, seed=TUNING_SEED, batch_size=BATCH)
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=TORCH_POWERSGD_RANK,
                               start_powerSGD_iter=2, random_seed=0)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def step():
        x, y = data.next_batch()
        opt.zero_grad(set_to_none=False)
        task.loss_fn(ddp(x), y).backward()
        opt.step()

    return step


def wire_costs(row: Row, lr: float, n_steps: int, folder: Path) -> dict:
    """What one worker's rounds put on the wire and take to read, from 4 simulated workers over 4
    rounds: ``payload_bytes`` sent per round (the ledger's count over ``ledger_divisor``);
    ``decode_s``, the CPU seconds of decoding one payload of an all-gathered round into the mean
    (the last round's ``CompressedMean.decode_mean`` timed DECODE_REPEATS times again, its fastest
    over the payloads it read: interference only adds time; 0 where the round is summed by
    allreduce); ``size_exchanges`` per round, the all-gathers started without a known size, which
    the torch transport precedes with a blocking exchange of sizes. For PyTorch's hook, its shapes
    (ddp_train.py's ``powersgd_floats``, float32), fixed-size allreduces."""
    from gradwire.averaging.compressed import CompressedMean
    from gradwire.run.loop import Run

    if row.runner == "torch":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ddp_train import build, powersgd_floats

        floats = powersgd_floats(build(TASK, world=1, rank=0, seed=0, batch_size=BATCH)[1], TORCH_POWERSGD_RANK)
        return {"payload_bytes": 4.0 * floats, "decode_s": 0.0, "size_exchanges": 0.0}
    if row.collective == "server":
        return server_wire(row, lr, n_steps, folder)
    rounds, decodes, unsized = 4, [], []
    r = Run(config(row, lr, TUNING_SEED, 4, n_steps, folder))
    transport, original = r.transport, CompressedMean.decode_mean

    def counted(name):
        start = getattr(transport, name)

        def call(*args, **kwargs):
            unsized.append(kwargs.get("size") is None)
            return start(*args, **kwargs)
        return call

    def timed(self, buffers, like):
        decodes.append((self, buffers, like))
        return original(self, buffers, like)

    transport.allgather, transport.allgather_start = counted("allgather"), counted("allgather_start")
    CompressedMean.decode_mean = timed
    try:
        for _ in range(rounds * row.period):
            r.train_step()
    finally:
        CompressedMean.decode_mean = original
    if row.collective == "allgather" and not decodes:
        raise RuntimeError(f"{row.key}: an all-gathered round that CompressedMean.decode_mean never decoded; "
                           "its decode cost would be priced as 0")
    decode_s = 0.0
    if decodes:
        averager, buffers, like = decodes[-1]
        times = []
        for _ in range(DECODE_REPEATS):
            start = time.process_time()
            original(averager, buffers, like)
            times.append(time.process_time() - start)
        decode_s = min(times) / len(buffers)
    out = {"payload_bytes": r.transport.bytes_sent / ledger_divisor(row.collective, 4) / rounds,
           "decode_s": decode_s, "size_exchanges": sum(unsized) / rounds}
    if row.collective == "scatter":
        averager, numel = r.algorithm.averager, r.algorithm.theta.numel()
        out["scatter_round_s"] = {str(n): scatter_round_seconds(averager, numel, n) for n in SCATTER_WORKERS}
    return out


SCATTER_WORKERS = (1, 4, 16, 64)  # the worker counts a scatter round's averaging is measured at


def scatter_round_seconds(averager, numel: int, workers: int, repeats: int = DECODE_REPEATS) -> float:
    """The CPU seconds of one worker's share of a scatter round among ``workers``, in
    ``averager``'s settings (its compressor, error feedback and owners' codec): its vector encoded in n chunks, the
    n messages of the chunk it owns decoded, averaged and encoded again, the n owners' chunks decoded
    into the mean; the fastest of ``repeats`` (interference only adds time). The messages decoded are
    its own, as every worker's are alike in size and work."""
    import torch

    from gradwire.averaging.compressed import CompressedMean

    scaled = next(iter(averager.ef.values())).scaled if averager.ef else True  # MuLoCo's: unscaled
    mean = CompressedMean(averager.compressor, {0: torch.Generator().manual_seed(0)},
                          error_feedback=averager.ef is not None, route="scatter", world_size=workers,
                          owner_generator=lambda r: torch.Generator().manual_seed(1), scaled_error_feedback=scaled,
                          owner_compressor=averager.owned.inner)
    x, like = torch.randn(numel, generator=torch.Generator().manual_seed(2)), torch.zeros(numel)
    slot, _ = mean.slot_size(numel, like.dtype)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        payload = mean.payloads({0: x})[0]
        owned = mean.reduce_chunk(0, dict.fromkeys(range(workers), payload[:slot]), like, "grad")
        mean.assemble(dict.fromkeys(range(workers), owned), like, "grad")  # n owners' chunks, in the owners' codec
        times.append(time.process_time() - start)
    return min(times)


def server_wire(row: Row, lr: float, n_steps: int, folder: Path, rounds: int = 4) -> dict:
    """A server-mode row's messages, from 4 simulated workers over ``rounds`` rounds: the mean bytes of
    a replica's upload (``payload_bytes``: its Δ through the codec, with the message's header) and of
    the server's answer (``answer_bytes``: θ), each as the ledger counts it (every message received,
    the late ones too; their sum is the ledger's total). No decode is priced on the replicas (the server
    decodes), and no exchange of sizes (point-to-point messages carry their own)."""
    from gradwire.run.loop import Run
    from gradwire.transports.base import SERVER

    r = Run(config(row, lr, TUNING_SEED, 4, n_steps, folder))
    transport, sizes = r.transport, {"up": [], "down": []}
    recv = transport.recv

    def recorded(nbytes, src, dst, **kwargs):  # the ledger counts a message as it is received
        if kwargs.get("count", True):
            sizes["down" if src == SERVER else "up"].append(nbytes)
        return recv(nbytes, src, dst, **kwargs)

    transport.recv = recorded
    for _ in range(rounds):
        r.train_step()
    if sum(sizes["up"]) + sum(sizes["down"]) != transport.bytes_sent or not sizes["up"] or not sizes["down"]:
        raise RuntimeError(f"{row.key}: the messages recorded ({sizes}) are not the ledger's {transport.bytes_sent} "
                           "bytes")
    return {"payload_bytes": statistics.mean(sizes["up"]), "answer_bytes": statistics.mean(sizes["down"]),
            "decode_s": 0.0, "size_exchanges": 0.0}


def bucket_shares(shapes, cap_bytes: int = 2**20, itemsize: int = 4) -> list[float]:
    """The gradient's shares per bucket, in the order the backward pass fills them: gradwire's
    ``BucketPlan`` at ``sync``'s 1 MiB throughout. PyTorch DDP's first bucket is 1 MiB too, its later
    ones 25 MiB: the same plan for a gradient under about 26 MiB (this benchmark's is 0.52 MiB),
    more buckets than PyTorch's above."""
    from gradwire.algorithms.buckets import BucketPlan

    plan = BucketPlan(shapes, max(1, cap_bytes // itemsize))
    total = sum(plan.numels)
    return [sum(plan.numels[i] for i in bucket) / total for bucket in plan.buckets]


def time_blocks(steppers: dict, blocks: int, steps: int = COMPUTE_STEPS, warmup: int = 5, also=None):
    """CPU seconds per call of each of ``steppers`` ({key: callable}) on this process
    (``time.process_time``): after ``warmup`` calls each, ``blocks`` blocks of ``steps`` calls, the
    steppers taking turns block by block, so that a neighbour's load falls on every one alike (the
    caller takes each one's fastest block: interference only adds time). ``also``, if given, runs after
    every round and its values are returned beside: ({key: [block means]}, [also's values])."""
    for step in steppers.values():
        for _ in range(warmup):
            step()
    means, extra = {key: [] for key in steppers}, []
    for _ in range(blocks):
        for key, step in steppers.items():
            start = time.process_time()
            for _ in range(steps):
                step()
            means[key].append((time.process_time() - start) / steps)
        if also is not None:
            extra.append(also())
    return means, extra


def measure_compute(rows: list[Row], lrs: dict, n_steps: int, blocks: int = COMPUTE_BLOCKS) -> dict:
    """Each row's CPU seconds per step of one worker on one core (``time.process_time``: the
    process's CPU, which includes any thread PyTorch's hook callbacks run on): ``blocks`` blocks of
    COMPUTE_STEPS steps, the rows taking turns block by block, so that a neighbour's load falls on
    every row alike; each block's mean is kept (``blocks_s``), and ``compute_s`` is the fastest
    (interference only adds time; the time model prices a row by ``compute_ratio``).
    Also one micro-batch's backward pass (what a DDP-style overlap can hide communication behind),
    the same way; the gradient's buckets (``bucket_shares``) for the rows that overlap it; and each
    row's wire (``wire_costs``). DDP is always measured with the rows asked for, and every entry
    keeps its session and the DDP beside it (``row_cost`` prices a row by its ratio to that DDP) and
    DDP's blocks of that session (``ddp_blocks_s``: ``paired_ratio`` pairs them with the row's)."""
    import torch

    torch.set_num_threads(1)
    if ROW["ddp"] not in rows:  # the reference every row's figure is scaled by (row_cost)
        rows = [ROW["ddp"], *rows]
    session = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        steppers = {row.key: (_torch_powersgd_stepper(lrs.get(row.key, FIRST_TRIALS[0]), Path(tmp))
                              if row.runner == "torch" else
                              _sim_stepper(row, lrs.get(row.key, FIRST_TRIALS[0]), n_steps, Path(tmp) / row.key))
                    for row in rows}
        from gradwire.run.loop import Run

        r = Run(config(ROW["ddp"], FIRST_TRIALS[0], TUNING_SEED, 1, n_steps, Path(tmp) / "bwd"))
        model, task = r.model.module, r.task
        x, y = task.x_train[:BATCH], task.y_train[:BATCH]

        def backward():
            loss = task.loss_fn(model(x), y)
            start = time.process_time()
            loss.backward()
            return time.process_time() - start

        means, backwards = time_blocks(steppers, blocks, also=lambda: statistics.mean(
            backward() for _ in range(COMPUTE_STEPS)))
        shares = bucket_shares([p.shape for p in model.parameters()])
        for row in rows:
            result[row.key] = {"compute_s": min(means[row.key]), "blocks_s": means[row.key],
                               "backward_s": min(backwards), "steps": COMPUTE_STEPS, "blocks": blocks,
                               "session": session, "ddp_compute_s": min(means["ddp"]),
                               "ddp_blocks_s": means["ddp"],
                               "bucket_shares": shares if row.overlap == "backward" else [1.0],
                               **wire_costs(row, lrs.get(row.key, FIRST_TRIALS[0]), n_steps,
                                            Path(tmp) / f"{row.key}-bytes")}
        if any(row.runner == "torch" for row in rows):  # the one-rank group of _torch_powersgd_stepper
            import gc

            import torch.distributed as dist

            steppers.clear()
            gc.collect()  # its DDP model first, on this thread (docs/ddp.md, "Limits"), then the group,
            if dist.is_initialized():  # kept alive: its destructor must not run on one of its own threads
                _KEPT_GROUPS.append(dist.group.WORLD)
                dist.destroy_process_group()
    return result


def paired_ratio(compute: dict, key: str) -> float | None:
    """The median over blocks of row ``key``'s block over DDP's block of the same turn: DDP's blocks
    of the row's session as the row keeps them (``ddp_blocks_s``), or DDP's own where DDP was last
    measured in that session; None where neither is known."""
    cost, ddp = compute[key], compute["ddp"]
    beside = cost.get("ddp_blocks_s") or (ddp.get("blocks_s") if cost.get("session") == ddp.get("session") else None)
    if not beside or len(beside) != len(cost.get("blocks_s", ())):
        return None
    return statistics.median(a / b for a, b in zip(cost["blocks_s"], beside))


def fastest_priced(compute: dict, keys=None) -> list[str]:
    """The rows (of ``keys``, default all) that ``row_cost`` can only price by their fastest block
    (``compute_ratio``'s "fastest": DDP's blocks of their session unknown), each with its ratio."""
    lines = []
    for key in keys if keys is not None else compute:
        if key in compute and "ddp_compute_s" in compute[key]:
            ratio, how = compute_ratio(compute, key)
            if how == "fastest":
                lines.append(f"{key} ({ratio:.2f}x)")
    return lines


def step_time_table(compute: dict, network: str = "ring") -> str:
    """The time model alone: each row's step time over DDP's on a network of zero cost, at every
    worker count and rate (no curves needed: what a step costs, not how many steps it takes)."""
    ddp = compute["ddp"]["compute_s"]
    head = "| row | " + " | ".join(f"{w} w @ {m:g}" for w in WORKERS for m in RATES_MBPS) + " |\n"
    lines = [head, "|---" * (1 + len(WORKERS) * len(RATES_MBPS)) + "|\n"]
    for row in ROWS:
        if row.key not in compute:
            continue
        cost = row_cost(compute, row.key)
        cells = [step_seconds(row, cost, w, m, network) / row.inner_steps / ddp for w in WORKERS for m in RATES_MBPS]
        lines.append(f"| {row.label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |\n")
    return "".join(lines)


def load_tuning(out: Path) -> dict:
    """Every row's trials (out/tuning/<row>.json) merged into out/tuning.json: {row: best lr,
    row:trials: {lr: {quality, quarter_gain, evaluation_noise}}}."""
    merged = {}
    for path in sorted((out / "tuning").glob("*.json")):
        merged |= json.loads(path.read_text())
    if merged:
        (out / "tuning.json").write_text(json.dumps(merged, indent=1) + "\n")
    return merged


def tune(row: Row, n_steps: int, workers: int, out: Path) -> dict:
    """The row's trials on TUNING_SEED (``next_trial``), each to N; a trial's quality is the mean of
    its last LAST evaluations at N (DDP evaluates from N/2 on, for the plateau and scatter
    measurements; the others only those last evaluations). The best wins."""
    trials, quality = {}, {}
    horizon = schedule(row, n_steps)[1]
    evaluate_from = 0 if row.key == "ddp" else (n_steps - LAST * EVAL_EVERY) // row.batches_per_step
    while (lr := next_trial(quality)) is not None:
        if row.runner == "torch":
            c = train_torch(row, lr, TUNING_SEED, n_steps, n_steps, out, procs=workers)
        else:
            c = train(row, lr, TUNING_SEED, workers, n_steps, horizon, out, evaluate_from=evaluate_from)
        finite = c["status"] != "diverged" and all(math.isfinite(v) for v in c["losses"])
        quality[lr] = target_quality(c["steps"], c["losses"], horizon) if finite else float("nan")
        trials[f"{lr:g}"] = {"quality": quality[lr], "quarter_gain": quarter_gain(c["steps"], c["losses"], horizon),
                             "evaluation_noise": evaluation_noise(late_losses(c["steps"], c["losses"], horizon)),
                             "status": c["status"], "cpu_s": c.get("cpu_s")}
    result = {row.key: best_trial(quality), f"{row.key}:trials": trials}
    (out / "tuning").mkdir(parents=True, exist_ok=True)
    (out / "tuning" / f"{row.key}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def screen(row: Row, lrs: list[float], n_steps: int, workers: int, out: Path) -> dict:
    """Trials of ``row`` at the given rates only, outside the walk (``tune``): the settings screened
    at one inner rate. Recorded in out/screening/<row>.json, never as the row's chosen rate: merged
    into what the file holds when they are written, under a lock, so that screens of one row run as
    separate processes at once (one rate each) keep each other's trials."""
    import fcntl

    horizon = schedule(row, n_steps)[1]
    evaluate_from = (n_steps - LAST * EVAL_EVERY) // row.batches_per_step
    trials = {}
    for lr in lrs:
        c = train(row, lr, TUNING_SEED, workers, n_steps, horizon, out, evaluate_from=evaluate_from)
        finite = c["status"] != "diverged" and all(math.isfinite(v) for v in c["losses"])
        trials[f"{lr:g}"] = target_quality(c["steps"], c["losses"], horizon) if finite else float("nan")
    path = out / "screening" / f"{row.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = json.loads(path.read_text()) if path.exists() else {"row": row.key, "algorithm": row.algorithm,
                                                                     "trials": {}}
        result["trials"] |= trials
        path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def pick_screened(row: Row, workers: int, out: Path) -> dict:
    """The reduced protocol (``tune --lrs ... --pick``): the best of the row's screened trials
    (screening/<row>.json) becomes its chosen rate, written as tuning/<row>.json with every screened
    trial and a note saying it was screened, not walked. The plateau measurements stay NaN: a screened
    trial evaluates only its last evaluations."""
    screened = json.loads((out / "screening" / f"{row.key}.json").read_text())["trials"]
    quality = {float(lr): q for lr, q in screened.items()}
    nan = float("nan")
    result = {row.key: best_trial(quality),
              f"{row.key}:trials": {lr: {"quality": q, "quarter_gain": nan, "evaluation_noise": nan,
                                         "status": "finished" if math.isfinite(q) else "diverged"}
                                    for lr, q in screened.items()},
              f"{row.key}:note": f"screened at {workers} workers on seed {TUNING_SEED} ({len(screened)} trials: "
                                 f"{', '.join(screened)}), not walked"}
    (out / "tuning").mkdir(parents=True, exist_ok=True)
    (out / "tuning" / f"{row.key}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def screened_rates(out: Path) -> dict:
    """{row: rate} for the rows screened at one rate only (out/screening/<row>.json, ``screen``): a
    variant of a walked row, screened at that row's chosen rate, whose table curves then run at it."""
    rates = {}
    for path in sorted((out / "screening").glob("*.json")):
        trials = json.loads(path.read_text())["trials"]
        if len(trials) == 1:
            rates[path.stem] = float(next(iter(trials)))
    return rates


def ddp_target(out: Path, lrs: dict, workers: int, seeds, n_steps: int) -> float | None:
    """The target at ``workers``: DDP's quality at N averaged over the seeds; None until every
    seed's DDP curve has passed N."""
    curves = [read_curve(run_folder(out, ROW["ddp"], lrs["ddp"], s, workers)) for s in seeds]
    if not all(c and c["steps"][-1] >= n_steps for c in curves):
        return None
    return statistics.mean(target_quality(c["steps"], c["losses"], n_steps) for c in curves)


def main(argv=None) -> int:
    global BATCH, TASK
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("stage", choices=["tune", "curves", "torch", "compute", "report"])
    p.add_argument("--rows", default=",".join(r.key for r in ROWS))
    p.add_argument("--n-steps", type=int, default=N_STEPS, help="N: DDP's steps; every row may run 2N")
    p.add_argument("--torch-rank", type=int, default=TORCH_POWERSGD_RANK, help="torch stage: PowerSGD rank")
    p.add_argument("--lrs", default=None, help="torch stage: these trials instead of the tuned lr (seed 0); tune "
                   "stage: only these trials, outside the walk (screening/<row>.json; a row screened at one rate "
                   "takes it in the other stages)")
    p.add_argument("--target-seeds", nargs="+", action=Sweep, metavar="SEED", default=None,
                   help="curves stage: the DDP seeds whose mean quality at N is the target (default: --seeds); "
                   "to run a row's seeds as separate processes against one target: --seeds 2 --target-seeds 1,2,3")
    p.add_argument("--pick", action="store_true",
                   help="tune stage with --lrs: the best screened rate becomes the row's chosen rate (a reduced "
                   "protocol, noted in tuning/<row>.json; the walk is the full one)")
    p.add_argument("--collectives", choices=TIME_NETWORKS, default="ring",
                   help="report stage: the network model (transports/network.py) whose collectives the time model "
                   "prices (ring: gloo's, validated on the test bed; halving-doubling: O(log n) rounds, NCCL's tree "
                   "regime); not ring: results-halving-doubling.md")
    add_run_flags(p, only=("out", "workers", "seed", "batch_size", "task"), sweep=("workers", "seed"),
                  defaults={"out": "runs/time-to-quality", "workers": [4], "seed": list(TABLE_SEEDS),
                            "batch_size": DEFAULT_BATCH, "task": None},
                  helps={"batch_size": "sequences per worker and micro-batch (another batch: use another --out)",
                         "task": f"compute stage only: measure the rows' steps on another task (default: {TASK}); "
                                 "its own --out, since the other stages' curves are on the table's task"})
    args, _ = parse_run_args(p, argv)
    if args.pick and not (args.stage == "tune" and args.lrs):
        raise SystemExit("--pick chooses among screened rates: give it with the tune stage and --lrs")
    if args.task is not None and args.stage != "compute":
        raise SystemExit(f"--task {args.task}: only the compute stage measures another task (the other stages' "
                         f"curves are on {TASK})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [ROW[k] for k in args.rows.split(",")]
    TASK = args.task or TASK
    BATCH = args.batch_size  # every stage reads it when it builds a run
    if BATCH != DEFAULT_BATCH and args.stage != "report" and any(r.micro_batches > 1 for r in rows):
        raise SystemExit("the accumulation rows are defined at --batch-size 8 only")
    workers, seeds, n = args.workers, args.seeds, args.n_steps
    if args.stage == "tune":
        for row in rows:
            if args.lrs:
                print(json.dumps(screen(row, [float(x) for x in args.lrs.split(",")], n, workers[0], out)), flush=True)
                if args.pick:
                    print(json.dumps(pick_screened(row, workers[0], out)), flush=True)
                continue
            tune(row, n, workers[0], out)
        load_tuning(out)
        return 0
    check_seeds(TUNING_SEED, seeds)
    lrs = screened_rates(out) | load_tuning(out)  # a walked row's own rate wins
    if args.stage == "compute":
        path = out / "compute.json"
        compute = json.loads(path.read_text()) if path.exists() else {}
        compute |= measure_compute(rows, lrs, n)  # every row asked for, measured together
        path.write_text(json.dumps(compute, indent=1) + "\n")
    if args.stage == "torch":
        row = ROW["torch-powersgd"]
        for w in workers:
            if args.lrs:  # rank trials on the tuning seed
                for lr in (float(x) for x in args.lrs.split(",")):
                    train_torch(row, lr, TUNING_SEED, n, n, out, rank=args.torch_rank, procs=w,
                                tag=f"-r{args.torch_rank}")
            else:
                for s in seeds:
                    train_torch(row, lrs[row.key], s, n, 2 * n, out, procs=w)
    if args.stage == "curves":
        for w in workers:
            if "ddp" in args.rows.split(","):
                train_ddp(lrs["ddp"], seeds, w, n, out)
            target_seeds = args.target_seeds or seeds
            check_seeds(TUNING_SEED, target_seeds)
            target = ddp_target(out, lrs, w, target_seeds, n)
            if target is None:
                print(f"[time_to_quality] {w} workers: DDP's curves for seeds {target_seeds} first", flush=True)
                continue
            for row in rows:
                if row.key != "ddp" and row.runner == "sim":
                    for s in seeds:
                        train(row, lrs[row.key], s, w, n, 2 * schedule(row, n)[1], out, target=target)
    if args.stage == "report":
        from time_to_quality_report import write_report

        write_report(out, workers, seeds, lrs, n, network=args.collectives)
    return 0


if __name__ == "__main__":
    sys.exit(main())
