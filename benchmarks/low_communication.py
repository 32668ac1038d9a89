"""The low-communication methods on the simulator, small: bits per parameter per round from the
byte ledger and quality against uncompressed DiLoCo (``rates``), and DiLoCo with backup replicas
against DiLoCo under the heavy-tailed ``tail`` straggler model (``stragglers``), and Streaming
DiLoCo's fully overlapped rounds with and without eager updates (``overlap``).

    python benchmarks/low_communication.py rates        # 4 workers, digits-mlp, 600 inner steps
    python benchmarks/low_communication.py stragglers   # 16 workers, tail:p=0.05,slowdown=10
    python benchmarks/low_communication.py overlap      # 4 workers, digits-mlp, τ = H, eager or not

Bits per parameter per round are exact, from the ledger (``bytes_sent``): on the ``ring`` network
an all-gather of n messages counts (n - 1) times their sum and an allreduce of B bytes counts
2 (n - 1) B (``transports/network.py``), so the mean message one worker sends per round is
``ledger / ((n - 1) n)`` bytes for the all-gathers (SparseLoCo, DeMo) and ``ledger / (2 (n - 1))``
for DiLoCo's allreduce. Quality is the mean ``test_loss`` of the last three evaluations. Results go
to ``--out`` (one run folder each) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.config import RunConfig  # noqa: E402
from gradwire.run.loop import run  # noqa: E402

RING = "ring:mbps=100,latency_ms=1"
# SparseLoCo's receiving-end rules: Algorithm 1's (1/R) Σ, or the authors' trainer's (docs/low_communication.md)
SPARSE_RULES = {"mean": "", "authors": ",aggregate=senders_mean,clip=median_norm"}


def records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def final_quality(rows: list[dict]) -> float:
    return sum(r["test_loss"] for r in rows[-3:]) / 3


def train(out: Path, label: str, **fields) -> list[dict]:
    folder = out / label
    if (folder / "summary.json").exists() and (folder / "metrics.jsonl").exists():  # a run of this grid already made
        if json.loads((folder / "summary.json").read_text()).get("status") == "finished":
            return records(folder)
    cfg = RunConfig(**fields, out=str(folder))
    summary = run(cfg, progress=False)
    assert summary["status"] == "finished", summary
    return records(folder)


def rates(args) -> None:
    """SparseLoCo and DeMo at several densities against DiLoCo, the same steps and batches."""
    h, workers = args.inner_steps, args.workers
    common = dict(task=args.task, workers=workers, steps=args.steps, batch_size=16, eval_every=args.steps // 10,
                  network=RING, seed=args.seed, data_dir=args.data_dir)
    variants = [("diloco" + (f" {args.diloco_keys}" if args.diloco_keys else ""),
                 f"diloco:inner_steps={h}" + (f",{args.diloco_keys}" if args.diloco_keys else ""), h, "allreduce",
                 args.lr)]
    if args.ddp:  # synchronous data-parallel SGD (DDP's algorithm): the quality target's reference
        variants.append(("DDP (sync, AdamW)", "sync --optimizer adamw:beta1=0.9,beta2=0.95,eps=1e-8", 1, "allreduce",
                         args.ddp_lr))
    variants += [(f"sparseloco k={k}/4096 α={alpha:g}" + ("" if rule == "mean" else f" {rule}"),
                  f"sparseloco:inner_steps={h},k={k},outer_lr={alpha:g}" + SPARSE_RULES[rule], h, "allgather", args.lr)
                 for rule in args.sparse_rule for k in args.sparse_k for alpha in args.sparse_outer_lr]
    variants += [(f"demo k={k}/{args.demo_chunk}" + (f" η={eta:g}" if eta != 0.003 else ""),  # 0.003: earlier names
                  f"demo:chunk={args.demo_chunk},k={k}", 1, "allgather", eta)
                 for k in args.demo_k for eta in args.demo_lr]
    variants += [(f"muloco {c or 'default'}" + (f" {keys}" if keys else ""),
                  f"muloco:inner_steps={h}" + (f",{keys}" if keys else "") + (f" --compressor {c}" if c else ""), h,
                  "allgather", args.lr) for c in args.muloco for keys in args.muloco_keys]
    rows, base, ddp = [], None, None
    for label, algorithm, steps_per_round, kind, lr in variants:
        algorithm, _, optimizer = algorithm.partition(" --optimizer ")
        algorithm, _, compressor = algorithm.partition(" --compressor ")
        folder = label.replace(" ", "_").replace("/", "of").replace("=", "").replace(":", "_").replace(",", "_")
        recs = train(Path(args.out), folder, algorithm=algorithm, lr=lr,
                     **(common | ({"compressor": compressor} if compressor else {})
                        | ({"optimizer": optimizer} if optimizer else {})))
        params = json.loads((Path(args.out) / folder / "config.json").read_text())["num_parameters"]
        rounds = args.steps // steps_per_round
        ledger = recs[-1]["bytes_sent"]
        per_message = ledger / ((workers - 1) * workers) if kind == "allgather" else ledger / (2 * (workers - 1))
        bits_round = 8 * per_message / rounds / params
        quality = final_quality(recs)
        base = base or quality
        if label.startswith("DDP"):
            ddp = quality
        rows.append((label, bits_round, bits_round / steps_per_round, quality, 100 * (quality / base - 1)))
    print(f"task {args.task}, {workers} workers, {args.steps} steps of batch 16, inner lr {args.lr} "
          f"(DeMo's {', '.join(f'{e:g}' for e in args.demo_lr)}, DDP's {args.ddp_lr}), H={h}, seed {args.seed}")
    print("| variant | bits/param/round (message) | bits/param/step | test loss (last 3) | vs DiLoCo | vs DDP |")
    print("|---|---|---|---|---|---|")
    for label, bits, per_step, quality, delta in rows:
        vs_ddp = f"{100 * (quality / ddp - 1):+.2f} %" if ddp else "-"
        print(f"| {label} | {bits:.4f} | {per_step:.4f} | {quality:.4f} | {delta:+.2f} % | {vs_ddp} |", flush=True)


def stragglers(args) -> None:
    """DiLoCo (every replica, every round) against backup-diloco (the first n - b), and async-diloco
    if asked, under ``tail``:
    the simulated time at which each first reaches DiLoCo's final quality."""
    h = args.inner_steps
    common = straggler_run(args)
    out = Path(args.out) / f"seed{args.seed}"
    d_outer, b_outer, a_outer = (f",{o}" if o else "" for o in (args.diloco_outer, args.backup_outer,
                                                                   args.async_outer))
    diloco = train(out, "diloco" + d_outer.replace(",", "_").replace("=", ""),
                   algorithm=f"diloco:inner_steps={h}{d_outer}", steps=args.rounds * h, eval_every=h, **common)
    target = final_quality(diloco)
    t_diloco = diloco[-1]["sim_time_s"]
    print(f"16 workers, {args.task}, stragglers {args.stragglers}, network {args.network}, H={h}, lr {args.lr}, "
          f"seed {args.seed}")
    print(f"DiLoCo ({args.diloco_outer or 'defaults'}): {args.rounds} rounds in {t_diloco:.2f} simulated s; "
          f"quality (test loss, last 3) {target:.4f}")
    print("| variant | rounds run | simulated s per round | first reaches DiLoCo's quality at | vs DiLoCo's time |")
    print("|---|---|---|---|---|")
    print(f"| DiLoCo | {args.rounds} | {t_diloco / args.rounds:.3f} | {t_diloco:.2f} s | 1.00 |")
    for b in args.backups:
        recs = train(out, f"backup_b{b}_{args.late}" + b_outer.replace(",", "_").replace("=", ""),
                     algorithm=f"backup-diloco:backups={b},late={args.late},inner_steps={h}{b_outer}",
                     steps=2 * args.rounds, eval_every=1, **common)
        # the same 3-evaluation mean as the target, over a window of evaluations h rounds apart in DiLoCo's
        print(f"| backup-diloco b={b}, late={args.late} {args.backup_outer} | {2 * args.rounds} | "
              f"{reached_at(recs, target, t_diloco, 2 * args.rounds)} |")
    if args.asynchronous:  # a step of async-diloco is 16 arrivals: as many inner steps as a DiLoCo round
        recs = train(out, "async" + a_outer.replace(",", "_").replace("=", ""),
                     algorithm=f"async-diloco:inner_steps={h}{a_outer}", steps=2 * args.rounds, eval_every=1, **common)
        print(f"| async-diloco {args.async_outer} | {2 * args.rounds} | "
              f"{reached_at(recs, target, t_diloco, 2 * args.rounds)} |")


def straggler_run(args) -> dict:
    return dict(task=args.task, workers=16, batch_size=16, lr=args.lr, stragglers=args.stragglers,
                network=args.network, seed=args.seed, data_dir=args.data_dir)


def grid(lrs: list[float], momenta: list[float], warmups: list[int]) -> list[str]:
    return [f"outer_lr={lr},outer_momentum={mu},outer_warmup={w}" for lr in lrs for mu in momenta for w in warmups]


def stragglers_tune(args) -> None:
    """The same number of outer settings (η, μ, warm-up) for DiLoCo and for each straggler-tolerant
    variant, on one (held-out) seed: DiLoCo's pick is the lowest final quality, a variant's the
    earliest simulated time at which it reaches the picked DiLoCo's quality."""
    h = args.inner_steps
    common = straggler_run(args)
    out = Path(args.out) / f"tune_seed{args.seed}"
    d_grid = grid(args.lrs, args.momenta, args.warmups)
    a_grid = grid(args.async_lrs, args.momenta, args.warmups)
    print(f"tuning on seed {args.seed}: {len(d_grid)} settings each; H={h}, {args.rounds} DiLoCo rounds, "
          f"{2 * args.rounds} of the others")
    print("| DiLoCo setting | simulated s | quality (test loss, last 3) |")
    print("|---|---|---|")
    best = None
    for setting in d_grid:
        recs = train(out, "diloco_" + setting.replace(",", "_").replace("=", ""),
                     algorithm=f"diloco:inner_steps={h},{setting}", steps=args.rounds * h, eval_every=h, **common)
        q = final_quality(recs)
        print(f"| {setting} | {recs[-1]['sim_time_s']:.2f} | {q:.4f} |", flush=True)
        if best is None or q < best[1]:
            best = (setting, q, recs[-1]["sim_time_s"])
    setting, target, t_diloco = best
    print(f"DiLoCo's pick: {setting}, quality {target:.4f} in {t_diloco:.2f} s")
    variants = [(f"backup-diloco b={b}" + ("" if args.late == "drop" else f" late={args.late}"),
                 f"backup-diloco:backups={b},late={args.late},inner_steps={h}", d_grid) for b in args.backups]
    if args.asynchronous:
        variants.append(("async-diloco", f"async-diloco:inner_steps={h}", a_grid))
    for label, spec, settings in variants:
        print(f"| {label} setting | s per round | reaches DiLoCo's quality at | vs DiLoCo's time | best 3-eval mean | "
              f"last 3-eval mean |")
        print("|---|---|---|---|---|---|")
        for s in settings:
            recs = train(out, label.replace(" ", "_").replace("=", "") + "_" + s.replace(",", "_").replace("=", ""),
                         algorithm=f"{spec},{s}", steps=2 * args.rounds, eval_every=1, **common)
            smooth = [sum(r["test_loss"] for r in recs[max(0, i - 2): i + 1]) / min(3, i + 1)
                      for i in range(len(recs))]
            print(f"| {s} | {reached_at(recs, target, t_diloco, 2 * args.rounds)} | {min(smooth):.4f} | "
                  f"{smooth[-1]:.4f} |", flush=True)


def reached_at(recs: list[dict], target: float, t_diloco: float, rounds: int) -> str:
    """Table cells: simulated s per round, when the 3-evaluation mean first reaches ``target``, and
    that time against DiLoCo's."""
    smooth = [(recs[i]["sim_time_s"], sum(r["test_loss"] for r in recs[max(0, i - 2): i + 1]) / min(3, i + 1))
              for i in range(len(recs))]
    reached = next((t for t, q in smooth if q <= target), None)
    when = f"{reached:.2f} s" if reached is not None else "not in 2x the rounds"
    ratio = f"{reached / t_diloco:.2f}" if reached is not None else "-"
    return f"{recs[-1]['sim_time_s'] / rounds:.3f} | {when} | {ratio}"


def overlap(args) -> None:
    """Blocking DiLoCo against Streaming DiLoCo whose rounds travel a whole round (τ = H): merged
    with α (Douillard et al. 2025) or eager (Kale et al. 2025, arXiv:2502.12996). The same batches."""
    h = args.inner_steps
    common = dict(task=args.task, workers=args.workers, steps=args.steps, batch_size=16, lr=args.lr,
                  eval_every=args.steps // 10, network=args.network, seed=args.seed, data_dir=args.data_dir,
                  stragglers=f"none:compute_s={args.compute_s}")
    stream = f"streaming-diloco:inner_steps={h},fragments={args.fragments}" + (f",{args.outer}" if args.outer else "")
    # τ = H with α = 0 is refused (every round would send a zero outer gradient: docs/low_communication.md)
    variants = [("DiLoCo (blocking)", f"{stream},overlap=0,alpha=0"),
                ("overlapped τ=H, α=0.5", f"{stream},overlap={h},alpha=0.5"),
                ("overlapped τ=H, eager", f"{stream},overlap={h},eager=true")]
    print(f"{args.workers} workers, {args.task}, {args.steps} steps of batch 16, H={h}, P={args.fragments}, "
          f"lr {args.lr}, network {args.network}, {args.compute_s} s a step, seed {args.seed}, "
          f"outer: {args.outer or 'defaults'}")
    print("| variant | test loss (last 3) | vs blocking | simulated s | bytes sent |")
    print("|---|---|---|---|---|")
    base = None
    for label, algorithm in variants:
        name = label.split(" (")[0].replace(" ", "_").replace(",", "").replace("=", "").replace("τ", "tau")
        recs = train(Path(args.out) / (args.outer or "defaults").replace(",", "_").replace("=", ""), name,
                     algorithm=algorithm, **common)
        quality = final_quality(recs)
        base = base or quality
        print(f"| {label} | {quality:.4f} | {100 * (quality / base - 1):+.2f} % | {recs[-1]['sim_time_s']:.2f} | "
              f"{recs[-1]['bytes_sent']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("rates", "stragglers", "stragglers-tune", "overlap"):
        p = sub.add_parser(name)
        add_run_flags(p, only=("task", "lr", "seed", "out", "data_dir"),
                      defaults={"task": "digits-mlp", "lr": 0.003, "out": f"runs/low_communication/{name}"})
        p.add_argument("--inner-steps", type=int, default=10)
    r = sub.choices["rates"]
    add_run_flags(r, only=("workers", "steps"), defaults={"workers": 4, "steps": 600})
    r.add_argument("--sparse-k", type=int, nargs="*", default=[16, 32, 64, 128])
    r.add_argument("--demo-k", type=int, nargs="*", default=[1, 2, 4])
    r.add_argument("--diloco-keys", default="", help="more spec keys of the reference DiLoCo, e.g. "
                   "outer_lr=0.7,outer_momentum=0.5")
    r.add_argument("--demo-chunk", type=int, default=64, help="DeMo's DCT chunk s (k of every s coefficients sent)")
    r.add_argument("--sparse-rule", nargs="+", default=["mean"], choices=sorted(SPARSE_RULES),
                   help="SparseLoCo's aggregation: mean (Algorithm 1) or authors (senders_mean with median_norm clip)")
    r.add_argument("--sparse-outer-lr", type=float, nargs="+", default=[1.0], help="SparseLoCo's α (each with each k)")
    r.add_argument("--muloco", nargs="*", default=[], help="MuLoCo runs: '' for its default compressor, or a "
                   "--compressor spec (error feedback stays on)")
    r.add_argument("--ddp", action="store_true", help="also run synchronous data-parallel AdamW (DDP's algorithm, "
                   "the inner optimizer's betas) as the reference")
    r.add_argument("--ddp-lr", type=float, default=0.003, help="its AdamW rate")
    r.add_argument("--demo-lr", type=float, nargs="+", default=[0.003],
                   help="DeMo's η, one run each (its sign update moves each element by η)")
    r.add_argument("--muloco-keys", nargs="+", default=[""], help="more MuLoCo spec keys, one run each "
                   "(e.g. outer_lr=1.0,outer_momentum=0)")
    for name in ("stragglers", "stragglers-tune"):
        s = sub.choices[name]
        s.add_argument("--rounds", type=int, default=40)
        s.add_argument("--backups", type=int, nargs="+", default=[4, 8])
        add_run_flags(s, only=("stragglers", "network"),
                      defaults={"stragglers": "tail:p=0.05,slowdown=10,compute_s=0.05",
                                "network": "ring:mbps=10000,latency_ms=0.1"})
        s.add_argument("--late", default="drop", choices=("drop", "stale", "buffer"),
                       help="backup-diloco's rule for late ones")
        s.add_argument("--asynchronous", action="store_true", help="also run async-diloco (delayed Nesterov)")
    s = sub.choices["stragglers"]
    for who in ("diloco", "backup", "async"):
        s.add_argument(f"--{who}-outer", default="", help=f"more spec keys for {who}, e.g. outer_lr=0.5")
    t = sub.choices["stragglers-tune"]
    t.add_argument("--lrs", type=float, nargs="+", default=[0.3, 0.5, 0.7, 1.0], help="η for DiLoCo and backup-diloco")
    t.add_argument("--async-lrs", type=float, nargs="+", default=[0.1, 0.2, 0.35, 0.5], help="η for async-diloco")
    t.add_argument("--momenta", type=float, nargs="+", default=[0.6, 0.8, 0.9])
    t.add_argument("--warmups", type=int, nargs="+", default=[10])
    o = sub.choices["overlap"]
    add_run_flags(o, only=("workers", "steps", "network"),
                  defaults={"workers": 4, "steps": 600, "network": "ring:mbps=1,latency_ms=10"},
                  helps={"network": "slow: a round's exchange takes steps"})
    o.add_argument("--fragments", type=int, default=1)
    o.add_argument("--compute-s", type=float, default=0.05, help="simulated seconds of one inner step")
    o.add_argument("--outer", default="", help="more spec keys for every variant, e.g. outer_lr=1.0,outer_momentum=0")
    args, _ = parse_run_args(parser)
    {"rates": rates, "stragglers": stragglers, "stragglers-tune": stragglers_tune, "overlap": overlap}[args.what](args)


if __name__ == "__main__":
    main()
