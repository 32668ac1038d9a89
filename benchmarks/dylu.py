"""Asynchronous DiLoCo with and without dynamic local updates (DyLU, Liu et al. 2024) against
DiLoCo, under persistently slow workers (the ``slow`` straggler model): quality against simulated
time, 16 workers on the simulator.

    python benchmarks/dylu.py tune --seed 3 --data-dir data-cache          # the same grid for each method
    python benchmarks/dylu.py compare --seed 0 --diloco-outer ... --async-outer ... --dylu-outer ...

DiLoCo runs ``--rounds`` rounds of H inner steps; its quality is the mean test loss of its last three
evaluations and its end is T, the simulated time it took. The asynchronous runs are evaluated after
every step (16 arrivals) and run long enough to pass T; for each the table gives its quality at T
(the mean of its last three evaluations at or before T) and the simulated time at which its
3-evaluation mean first reaches DiLoCo's quality. Tuning (``tune``, a held-out seed) gives each
method the same outer settings to try: DiLoCo's pick is its lowest quality, an asynchronous
variant's its lowest quality at the picked DiLoCo's T.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.config import RunConfig
from gradwire.run.loop import run

# async steps per DiLoCo round needed to pass DiLoCo's end time T under the default stragglers (16
# arrivals a step; with DyLU the slow workers' phases are shorter, so a step passes sooner); a run
# that ends before T says so in its row; --steps-per-round sets them for other straggler models
STEPS_PER_ROUND = {"async": 2.5, "dylu": 4.0}


def records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def train(folder: Path, **fields) -> list[dict]:
    if (folder / "summary.json").exists():  # a run of this grid already made
        if json.loads((folder / "summary.json").read_text()).get("status") == "finished":
            return records(folder)
    summary = run(RunConfig(**fields, out=str(folder)), progress=False)
    assert summary["status"] == "finished", summary
    return records(folder)


def smoothed(recs: list[dict]) -> list[tuple[float, float]]:
    """(simulated s, mean test loss of this and the two evaluations before) after every evaluation."""
    return [(recs[i]["sim_time_s"], sum(r["test_loss"] for r in recs[max(0, i - 2): i + 1]) / min(3, i + 1))
            for i in range(len(recs))]


def at_time(recs: list[dict], t: float) -> float:
    return [q for s, q in smoothed(recs) if s <= t][-1]


def reached(recs: list[dict], target: float) -> float | None:
    return next((s for s, q in smoothed(recs) if q <= target), None)


def common(args) -> dict:
    return dict(task=args.task, workers=16, batch_size=16, lr=args.lr, stragglers=args.stragglers,
                network=args.network, seed=args.seed, data_dir=args.data_dir)


def method_runs(args, out: Path, setting: dict[str, str]) -> dict[str, list[dict]]:
    """DiLoCo, async-diloco and async-diloco with DyLU, each with its outer setting (spec keys)."""
    h, rounds, fields = args.inner_steps, args.rounds, common(args)
    runs = {"diloco": train(out / ("diloco_" + slug(setting["diloco"])), algorithm=f"diloco:inner_steps={h},"
                            f"{setting['diloco']}", steps=rounds * h, eval_every=h, **fields)}
    for name, extra in (("async", ""), ("dylu", ",dylu=true")):
        runs[name] = train(out / (name + "_" + slug(setting[name])),
                           algorithm=f"async-diloco:inner_steps={h},{setting[name]}{extra}",
                           steps=math.ceil(args.steps_per_round[name] * rounds), eval_every=1, **fields)
    return runs


def slug(setting: str) -> str:
    return setting.replace(",", "_").replace("=", "")


def row(name: str, setting: str, recs: list[dict], t: float, target: float) -> str:
    when = reached(recs, target)
    passes = recs[-1]["sim_time_s"] >= t
    return (f"| {name} | {setting} | {len(recs) - 1} | {recs[-1]['sim_time_s']:.1f} | "
            f"{at_time(recs, t):.4f}{'' if passes else ' (ended before T)'} | "
            f"{'-' if when is None else f'{when:.1f} s'} | {'-' if when is None else f'{when / t:.2f}'} |")


HEADER = ("| method | outer setting | steps | simulated s | quality at DiLoCo's end T | reaches DiLoCo's quality at | "
          "vs T |\n|---|---|---|---|---|---|---|")


def compare(args) -> None:
    out = Path(args.out) / f"seed{args.seed}"
    setting = {"diloco": args.diloco_outer, "async": args.async_outer, "dylu": args.dylu_outer}
    runs = method_runs(args, out, setting)
    target, t = sum(r["test_loss"] for r in runs["diloco"][-3:]) / 3, runs["diloco"][-1]["sim_time_s"]
    print(f"seed {args.seed}, 16 workers, {args.task}, stragglers {args.stragglers}, network {args.network}, "
          f"H={args.inner_steps}, inner lr {args.lr}; DiLoCo {args.rounds} rounds: T = {t:.1f} s, quality {target:.4f}")
    print(HEADER)
    for name in ("diloco", "async", "dylu"):
        print(row(name, setting[name], runs[name], t, target), flush=True)


def tune(args) -> None:
    out = Path(args.out) / f"tune_seed{args.seed}"
    h, rounds, fields = args.inner_steps, args.rounds, common(args)
    grids = {"diloco": [f"outer_lr={lr},outer_momentum={mu}" for lr in args.lrs for mu in args.momenta],
             "async": [f"outer_lr={lr},outer_momentum={mu}" for lr in args.async_lrs for mu in args.momenta]}
    grids["dylu"] = grids["async"]
    print(f"tuning on seed {args.seed}: {len(grids['diloco'])} outer settings each, H={h}, {rounds} DiLoCo rounds")
    print("| DiLoCo setting | simulated s | quality (last 3) |\n|---|---|---|")
    best = None
    for s in grids["diloco"]:
        recs = train(out / ("diloco_" + slug(s)), algorithm=f"diloco:inner_steps={h},{s}", steps=rounds * h,
                     eval_every=h, **fields)
        q = sum(r["test_loss"] for r in recs[-3:]) / 3
        print(f"| {s} | {recs[-1]['sim_time_s']:.1f} | {q:.4f} |", flush=True)
        if best is None or q < best[1]:
            best = (s, q, recs[-1]["sim_time_s"])
    s, target, t = best
    print(f"DiLoCo's pick: {s}, quality {target:.4f} at T = {t:.1f} s")
    for name, extra in (("async", ""), ("dylu", ",dylu=true")):
        print(HEADER)
        for s in grids[name]:
            recs = train(out / (name + "_" + slug(s)), algorithm=f"async-diloco:inner_steps={h},{s}{extra}",
                         steps=math.ceil(args.steps_per_round[name] * rounds), eval_every=1, **fields)
            print(row(name, s, recs, t, target), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("tune", "compare"):
        p = sub.add_parser(name)
        add_run_flags(p, only=("task", "lr", "seed", "out", "data_dir", "stragglers", "network"),
                      defaults={"task": "digits-mlp", "lr": 0.003, "out": f"runs/dylu/{name}",
                                "stragglers": "slow:count=8,slowdown=3,compute_s=0.05",
                                "network": "ring:mbps=10000,latency_ms=0.1"})
        p.add_argument("--inner-steps", type=int, default=10)
        p.add_argument("--rounds", type=int, default=40, help="DiLoCo's rounds")
        p.add_argument("--steps-per-round", type=float, nargs=2, default=[STEPS_PER_ROUND["async"],
                       STEPS_PER_ROUND["dylu"]], metavar=("ASYNC", "DYLU"),
                       help="steps of async-diloco without and with DyLU per DiLoCo round (to pass its end T)")
    t = sub.choices["tune"]
    t.add_argument("--lrs", type=float, nargs="+", default=[0.5, 0.7], help="DiLoCo's η")
    t.add_argument("--async-lrs", type=float, nargs="+", default=[0.2, 0.35], help="async-diloco's η (with and "
                   "without DyLU)")
    t.add_argument("--momenta", type=float, nargs="+", default=[0.8, 0.9])
    c = sub.choices["compare"]
    for who in ("diloco", "async", "dylu"):
        c.add_argument(f"--{who}-outer", default="outer_lr=0.7,outer_momentum=0.9" if who == "diloco" else
                       "outer_lr=0.2,outer_momentum=0.9", help=f"{who}'s outer spec keys")
    args, _ = parse_run_args(parser)
    args.steps_per_round = dict(zip(("async", "dylu"), args.steps_per_round))
    {"tune": tune, "compare": compare}[args.what](args)


if __name__ == "__main__":
    main()
