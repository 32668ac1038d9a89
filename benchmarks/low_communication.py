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


def records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def final_quality(rows: list[dict]) -> float:
    return sum(r["test_loss"] for r in rows[-3:]) / 3


def train(out: Path, label: str, **fields) -> list[dict]:
    cfg = RunConfig(**fields, out=str(out / label))
    summary = run(cfg, progress=False)
    assert summary["status"] == "finished", summary
    return records(out / label)


def rates(args) -> None:
    """SparseLoCo and DeMo at several densities against DiLoCo, the same steps and batches."""
    h, workers = args.inner_steps, args.workers
    common = dict(task=args.task, workers=workers, steps=args.steps, batch_size=16, eval_every=args.steps // 10,
                  network=RING, seed=args.seed, data_dir=args.data_dir)
    alpha = args.sparse_outer_lr
    variants = [("diloco", f"diloco:inner_steps={h}", h, "allreduce", args.lr)]
    variants += [(f"sparseloco k={k}/4096", f"sparseloco:inner_steps={h},k={k},outer_lr={alpha}", h, "allgather",
                  args.lr) for k in args.sparse_k]
    variants += [(f"demo k={k}/64", f"demo:chunk=64,k={k}", 1, "allgather", args.demo_lr) for k in args.demo_k]
    rows, base = [], None
    for label, algorithm, steps_per_round, kind, lr in variants:
        recs = train(Path(args.out), label.replace(" ", "_").replace("/", "of"), algorithm=algorithm, lr=lr, **common)
        params = json.loads((Path(args.out) / label.replace(" ", "_").replace("/", "of") / "config.json")
                            .read_text())["num_parameters"]
        rounds = args.steps // steps_per_round
        ledger = recs[-1]["bytes_sent"]
        per_message = ledger / ((workers - 1) * workers) if kind == "allgather" else ledger / (2 * (workers - 1))
        bits_round = 8 * per_message / rounds / params
        quality = final_quality(recs)
        base = base or quality
        rows.append((label, bits_round, bits_round / steps_per_round, quality, 100 * (quality / base - 1)))
    print(f"task {args.task}, {workers} workers, {args.steps} steps of batch 16, inner lr {args.lr} "
          f"(DeMo's {args.demo_lr}), SparseLoCo outer_lr {alpha}, seed {args.seed}")
    print("| variant | bits/param/round (message) | bits/param/step | test loss (last 3) | vs DiLoCo |")
    print("|---|---|---|---|---|")
    for label, bits, per_step, quality, delta in rows:
        print(f"| {label} | {bits:.4f} | {per_step:.4f} | {quality:.4f} | {delta:+.2f} % |")


def stragglers(args) -> None:
    """DiLoCo (every replica, every round) against backup-diloco (the first n - b), and async-diloco
    if asked, under ``tail``:
    the simulated time at which each first reaches DiLoCo's final quality."""
    h = args.inner_steps
    common = dict(task=args.task, workers=16, batch_size=16, lr=args.lr, stragglers=args.stragglers,
                  network=args.network, seed=args.seed, data_dir=args.data_dir)
    out = Path(args.out)
    diloco = train(out, "diloco", algorithm=f"diloco:inner_steps={h}", steps=args.rounds * h, eval_every=h, **common)
    target = final_quality(diloco)
    t_diloco = diloco[-1]["sim_time_s"]
    print(f"16 workers, {args.task}, stragglers {args.stragglers}, network {args.network}, H={h}, lr {args.lr}")
    print(f"DiLoCo: {args.rounds} rounds in {t_diloco:.2f} simulated s; quality (test loss, last 3) {target:.4f}")
    print("| variant | rounds run | simulated s per round | first reaches DiLoCo's quality at | vs DiLoCo's time |")
    print("|---|---|---|---|---|")
    print(f"| DiLoCo | {args.rounds} | {t_diloco / args.rounds:.3f} | {t_diloco:.2f} s | 1.00 |")
    for b in args.backups:
        recs = train(out, f"backup_b{b}", algorithm=f"backup-diloco:backups={b},late={args.late},inner_steps={h}",
                     steps=2 * args.rounds, eval_every=1, **common)
        # the same 3-evaluation mean as the target, over a window of evaluations h rounds apart in DiLoCo's
        print(f"| backup-diloco b={b}, late={args.late} | {2 * args.rounds} | "
              f"{reached_at(recs, target, t_diloco, 2 * args.rounds)} |")
    if args.asynchronous:  # a step of async-diloco is 16 arrivals: as many inner steps as a DiLoCo round
        recs = train(out, "async", algorithm=f"async-diloco:inner_steps={h}", steps=2 * args.rounds, eval_every=1,
                     **common)
        print(f"| async-diloco | {2 * args.rounds} | {reached_at(recs, target, t_diloco, 2 * args.rounds)} |")


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
    for name in ("rates", "stragglers", "overlap"):
        p = sub.add_parser(name)
        add_run_flags(p, only=("task", "lr", "seed", "out", "data_dir"),
                      defaults={"task": "digits-mlp", "lr": 0.003, "out": f"runs/low_communication/{name}"})
        p.add_argument("--inner-steps", type=int, default=10)
    r = sub.choices["rates"]
    add_run_flags(r, only=("workers", "steps"), defaults={"workers": 4, "steps": 600})
    r.add_argument("--sparse-k", type=int, nargs="+", default=[16, 32, 64, 128])
    r.add_argument("--demo-k", type=int, nargs="+", default=[1, 2, 4])
    r.add_argument("--sparse-outer-lr", type=float, default=1.0, help="SparseLoCo's α")
    r.add_argument("--demo-lr", type=float, default=0.003, help="DeMo's η (its sign update moves each element by η)")
    s = sub.choices["stragglers"]
    s.add_argument("--rounds", type=int, default=40)
    s.add_argument("--backups", type=int, nargs="+", default=[4, 8])
    add_run_flags(s, only=("stragglers", "network"), defaults={"stragglers": "tail:p=0.05,slowdown=10,compute_s=0.05",
                                                            "network": "ring:mbps=10000,latency_ms=0.1"})
    s.add_argument("--late", default="drop", choices=("drop", "stale"), help="backup-diloco's rule for late ones")
    s.add_argument("--asynchronous", action="store_true", help="also run async-diloco (delayed Nesterov)")
    o = sub.choices["overlap"]
    add_run_flags(o, only=("workers", "steps", "network"),
                  defaults={"workers": 4, "steps": 600, "network": "ring:mbps=1,latency_ms=10"},
                  helps={"network": "slow: a round's exchange takes steps"})
    o.add_argument("--fragments", type=int, default=1)
    o.add_argument("--compute-s", type=float, default=0.05, help="simulated seconds of one inner step")
    o.add_argument("--outer", default="", help="more spec keys for every variant, e.g. outer_lr=1.0,outer_momentum=0")
    args, _ = parse_run_args(parser)
    {"rates": rates, "stragglers": stragglers, "overlap": overlap}[args.what](args)


if __name__ == "__main__":
    main()
