"""The scaling study of docs/scaling.md: speed-up against m, predicted by ``gradwire plan`` from
runs at m <= 16 and measured on the simulator up to 256 workers, on two network models.

For each network this runs one plan (``gradwire.plan.planner.make_plan``, as ``gradwire plan``
does) with three candidates (sync SGD; sync + QSGD 4 levels; sync + top-1% with error feedback),
profiling m = 1, 2, 4, 8, 16, validating the held-out m = 32, 64, 256 (never fitted), plus one
long run of plain sync on 1 worker: the baseline T(1) of the speed-ups. Writes the plans under
OUT/<network>/, OUT/scaling.json and the figure docs/img/scaling.png.

    OMP_NUM_THREADS=1 python benchmarks/scaling_study.py [--out runs/scaling] [--quick]

~15-25 minutes on 2 busy cores (--quick: 2 networks x 1 candidate, validation at 32 only, a smoke run).

``--testbed`` (root; scripts/testbed.py, docs/testbed.md) checks the system model against real gloo
instead: sync and sync + QSGD on mnist1d-mlp at m = 1 (one process, nothing to send), 2 and 3
nodes of the namespace test bed at 100 Mbit/s fit Ernest's f(m); 4 nodes are held out. Beside it,
the simulator's ``ring:mbps=100`` with the compute time measured at m = 1. Writes
OUT/testbed.json (~3 minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args

COMMON = dict(task="mnist1d-mlp", batch_size=8, lr=0.02, momentum=0.9, steps=300, seed=0,
              stragglers="none:compute_s=0.02", data_dir="data-cache")
NETWORKS = {  # (spec, what it stands for): see docs/scaling.md for the choice of bandwidths
    "fast": "ring:mbps=10000,latency_ms=0.01",
    "slow": "ring:mbps=100,latency_ms=0.1",
}
CANDIDATES = {"sync": dict(compressor="none"),
              "sync + qsgd:levels=4": dict(compressor="qsgd:levels=4"),
              "sync + topk:ratio=0.01 + EF": dict(compressor="topk:ratio=0.01", error_feedback=True)}
TARGET = 1.4  # training objective (cross-entropy) to reach
PROFILE, VALIDATE, MAX_WORKERS = [1, 2, 4, 8, 16], [32, 64, 256], 256
SHORT = 5  # steps of the runs that measure seconds per iteration only


def _mean_abs(values):
    vals = [abs(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(ap, only=("out",), defaults={"out": "runs/scaling"})
    ap.add_argument("--quick", action="store_true", help="one candidate, validation at 32 only")
    ap.add_argument("--target", type=float, default=TARGET, help=f"train_loss to reach (default {TARGET})")
    ap.add_argument("--reuse", action="store_true", help="refit from the runs already in --out; run only "
                    "what is missing (a recommendation not measured yet)")
    ap.add_argument("--figure", default="docs/img/scaling.png")
    ap.add_argument("--testbed", action="store_true", help="the real-gloo check on the namespace test bed (root)")
    ap.add_argument("--mbps", type=float, default=100.0, help="--testbed: link rate")
    args, _ = parse_run_args(ap)
    if args.testbed:
        return testbed(Path(args.out), args.mbps)
    import torch

    from gradwire.config import RunConfig
    from gradwire.plan.planner import PlanRequest, make_plan
    from gradwire.run.loop import run

    torch.set_num_threads(1)
    out = Path(args.out)
    cands = dict(list(CANDIDATES.items())[:1]) if args.quick else CANDIDATES
    validate = [32] if args.quick else VALIDATE
    results = {"target": args.target, "common": COMMON, "networks": NETWORKS, "plans": {}}
    started = time.perf_counter()
    # the baseline: plain sync on one worker, run until it reaches the target (no communication at m = 1)
    base = RunConfig(**COMMON, workers=1, network=NETWORKS["fast"]).replace(
        steps=6000, eval_every=50, out=str(out / "baseline-m1"), overwrite=True)
    if args.reuse and (Path(base.out) / "summary.json").exists():
        summary = json.loads((Path(base.out) / "summary.json").read_text())
    else:
        summary = run(base, progress=False)
    from gradwire.plan.convergence import crossing
    from gradwire.report.run_folder import read_jsonl

    hit = crossing(read_jsonl(Path(base.out) / "metrics.jsonl"), args.target, "train_loss")
    results["baseline"] = {"time_s": hit[1] if hit else None, "iterations": hit[0] if hit else None,
                           "seconds_per_iteration": summary["sim_time_s"] / summary["steps"]}
    print(f"baseline m=1: {results['baseline']}", flush=True)
    from gradwire.plan.output import write_plan
    from gradwire.plan.planner import Planner

    def candidates_on(net):
        return [RunConfig(**COMMON, network=NETWORKS[net], name=label).replace(**extra)
                for label, extra in cands.items()]

    # 1. the fast network: an ordinary plan (profiling at m <= 16, held-out m trained in full)
    req = PlanRequest(candidates=candidates_on("fast"), workers=PROFILE, max_workers=MAX_WORKERS,
                      out=out / "fast", target=args.target, validate=validate, validate_max_steps=400)
    plans = {"fast": make_plan(req, reuse=args.reuse)}
    # 2. seconds per iteration on each network at every m, from short runs (SHORT steps): on the simulator
    #    a step's time is set by the network model, the compute time and the bytes, not by the trajectory
    per_step = {net: {} for net in NETWORKS}
    for net in NETWORKS:
        for cand in candidates_on(net):
            for m in sorted({*PROFILE, *validate, MAX_WORKERS}):
                folder = out / "per-step" / net / cand.label().replace(" ", "") / f"m{m}"
                if not (args.reuse and (folder / "summary.json").exists()):
                    run(cand.replace(workers=m, steps=SHORT, eval_every=SHORT, out=str(folder), overwrite=True),
                        progress=False)
                s = json.loads((folder / "summary.json").read_text())
                per_step[net][(cand.label(), m)] = s["sim_time_s"] / s["steps"]
    # 3. the slow network: the same trajectories (the network model changes when things happen, never
    #    what is computed: sync SGD with any compressor trains identically on every network; checked
    #    below on the m = 16 profiling runs), timed with the slow network's seconds per step
    fast = Planner(req)
    fast.load()
    slow_req = PlanRequest(candidates=candidates_on("slow"), workers=PROFILE, max_workers=MAX_WORKERS,
                           out=out / "slow", target=args.target, validate=validate, validate_max_steps=400)
    slow = Planner(slow_req)
    for r in fast.runs:
        f = per_step["slow"].get((r.candidate, r.workers))
        if f is None or r.seconds_per_iteration is None:
            continue
        slow.runs.append(dataclasses.replace(r, seconds_per_iteration=f, sim_time_s=f * r.steps,
                                             reached=(r.reached[0], r.reached[0] * f) if r.reached else None))
    fits = slow.fit()
    rows = slow.predict(fits)
    best = slow.recommend(rows, fits)
    measured = [r for r in slow.runs if r.purpose == "validate"]
    validation = [slow._compare(next(x for x in rows if x["candidate"] == r.candidate and x["workers"] == r.workers),
                                r) for r in measured]
    plans["slow"] = {"goal": plans["fast"]["goal"], "time_kind": "simulated seconds",
                     "fits": {k: {"system": v["system"].to_dict(), "convergence": v["convergence"].to_dict()}
                              for k, v in fits.items()},
                     "predictions": rows, "recommendation": best, "validation": validation,
                     "runs": [r.to_dict() | {"time_to_target_s": r.reached[1] if r.reached else None}
                              for r in slow.runs],
                     "note": "trajectories of the fast network's runs, timed with the slow network's s/step"}
    rec = next((r for r in slow.runs if r.candidate == best["candidate"] and r.workers == best["workers"]
                and r.reached), None)
    if rec is None:  # the slow network's recommendation was not trained yet: train it (on the fast network)
        cand = next(c for c in req.candidates if c.label() == best["candidate"])
        steps = int(min(max(1.3 * (best["iterations"] or 0) + 2, cand.steps), 400))
        r = fast.measure(fast.config(cand, best["workers"], "validate", steps), "validate")
        f = per_step["slow"].get((r.candidate, r.workers)) or best["seconds_per_iteration"]
        rec = dataclasses.replace(r, seconds_per_iteration=f, sim_time_s=f * r.steps,
                                  reached=(r.reached[0], r.reached[0] * f) if r.reached else None)
        slow.runs.append(rec)
        rec = rec if rec.reached else None
    top = slow.measured_best()
    plans["slow"]["validation_summary"] = {
        "mean_abs_error_seconds_per_iteration": _mean_abs(v["error_seconds_per_iteration"] for v in validation),
        "mean_abs_error_time": _mean_abs(v["error_time"] for v in validation), "best_measured": top,
        "recommended_measured_time_s": rec.reached[1] if rec else None,
        "regret": rec.reached[1] / top["time_s"] - 1 if rec and top else None}
    # the check behind step 3: the same losses on both networks at m = 16
    check = {}
    for net in NETWORKS:
        cfg = candidates_on(net)[0].replace(workers=16, steps=20, eval_every=20, overwrite=True,
                                             out=str(out / "network-check" / net))
        run(cfg, progress=False)
        check[net] = [r["loss"] for r in read_jsonl(Path(cfg.out) / "steps.jsonl")]
    results["same_trajectory_on_both_networks"] = check["fast"] == check["slow"]
    # 4. seconds per iteration at m = 256: predicted from m <= 16, measured (short runs)
    results["per_step_256"] = {
        net: {c: {"predicted": next(r["seconds_per_iteration"] for r in plans[net]["predictions"]
                                    if r["candidate"] == c and r["workers"] == MAX_WORKERS),
                  "measured": per_step[net][(c, MAX_WORKERS)]} for c in cands} for net in NETWORKS}
    results["per_step"] = {net: {f"{c} @ {m}": v for (c, m), v in d.items()} for net, d in per_step.items()}
    write_plan(out / "fast" / f"target-{args.target:g}", plans["fast"])
    for net, plan in plans.items():
        results["plans"][net] = plan
        print(f"{net}: recommended {plan['recommendation']['candidate']} at m={plan['recommendation']['workers']}; "
              f"{plan.get('validation_summary')}", flush=True)
    results["wall_s"] = time.perf_counter() - started
    (out / f"scaling-target-{args.target:g}.json").write_text(json.dumps(results, indent=2))
    figure(results, Path(args.figure))
    print(f"{results['wall_s']:.0f} s wall; {out}/scaling-target-{args.target:g}.json, {args.figure}")


TESTBED_RUN = ["--task", "mnist1d-mlp", "--batch-size", "8", "--lr", "0.02", "--momentum", "0.9", "--steps", "120",
               "--eval-every", "1000", "--seed", "0"]
TESTBED_CANDIDATES = {"sync": [], "sync + qsgd:levels=4": ["--compressor", "qsgd:levels=4"]}


def step_seconds(folder: Path) -> float:
    """Mean elapsed seconds per step from steps.jsonl, from the end of step 1 to the last (the
    step-0 evaluation and start-up excluded)."""
    from gradwire.report.run_folder import read_jsonl

    rows = read_jsonl(folder / "steps.jsonl")
    return (rows[-1]["sim_time_s"] - rows[0]["sim_time_s"]) / (rows[-1]["step"] - rows[0]["step"])


def testbed(out: Path, mbps: float) -> None:
    import subprocess

    from gradwire.config import RunConfig
    from gradwire.plan.system_model import SystemModel

    results = {"mbps": mbps, "run": TESTBED_RUN, "candidates": {}}
    for label, extra in TESTBED_CANDIDATES.items():
        measured = {}
        for m in (1, 2, 3, 4):
            folder = out / "testbed" / label.replace(" ", "").replace(":", "-") / f"m{m}"
            run = ["run", *TESTBED_RUN, *extra, "--out", str(folder), "--overwrite"]
            if m == 1:  # one process: nothing crosses a network
                argv = [sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", "1", "--", *run]
            else:
                argv = [sys.executable, "scripts/testbed.py", "--nodes", str(m), "--mbps", str(mbps), "--", *run]
            proc = subprocess.run(argv, timeout=600, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{label} m={m} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
            measured[m] = step_seconds(folder)
            print(f"testbed {label} m={m}: {measured[m] * 1e3:.2f} ms/step", flush=True)
        fit = SystemModel.fit([1, 2, 3], [measured[m] for m in (1, 2, 3)])
        cfg = RunConfig(task="mnist1d-mlp").replace(**({"compressor": "qsgd:levels=4"} if extra else {}))
        # the simulator's prediction: compute = the m = 1 step, communication priced by ring:mbps
        sim = {}
        for m in (2, 3, 4):
            sim_folder = out / "testbed-sim" / label.replace(" ", "").replace(":", "-") / f"m{m}"
            from gradwire.run.loop import run as run_sim

            run_sim(cfg.replace(workers=m, steps=20, batch_size=8, lr=0.02, momentum=0.9, eval_every=1000,
                                network=f"ring:mbps={mbps},latency_ms=0.05",
                                stragglers=f"none:compute_s={measured[1]:.6f}", out=str(sim_folder),
                                overwrite=True), progress=False)
            sim[m] = step_seconds(sim_folder)
        results["candidates"][label] = {
            "measured_s": measured, "ernest_fit_on_1_2_3": fit.to_dict(),
            "ernest_predicted_4_s": fit(4), "ernest_error_4": fit(4) / measured[4] - 1,
            "simulator_s": sim, "simulator_error": {m: sim[m] / measured[m] - 1 for m in sim}}
        print(json.dumps(results["candidates"][label], indent=1), flush=True)
    (out / "testbed.json").write_text(json.dumps(results, indent=2))


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = list(results["plans"])
    fig, axes = plt.subplots(2, len(nets), figsize=(5.2 * len(nets), 8), squeeze=False)
    t1 = results["baseline"]["time_s"]
    f1 = results["baseline"]["seconds_per_iteration"]
    for j, net in enumerate(nets):
        plan = results["plans"][net]
        for k, label in enumerate(plan["fits"]):
            c = f"C{k}"
            rows = [r for r in plan["predictions"] if r["candidate"] == label]
            ms = [r["workers"] for r in rows]
            axes[0][j].plot(ms, [m * f1 / r["seconds_per_iteration"] for m, r in zip(ms, rows)], color=c,
                            label=f"{label} (predicted)")
            meas = [(int(key.split(" @ ")[1]), int(key.split(" @ ")[1]) * f1 / v)
                    for key, v in results["per_step"][net].items() if key.split(" @ ")[0] == label]
            axes[0][j].plot(*zip(*meas), "o", color=c)
            if t1:
                pts = [(r["workers"], t1 / r["time_s"]) for r in rows if r["time_s"]]
                axes[1][j].plot(*zip(*pts), color=c, label=f"{label} (predicted)")
                meas = [(v["workers"], t1 / v["measured_time_s"]) for v in plan["validation"]
                        if v["candidate"] == label and v["measured_time_s"]]
                if meas:
                    axes[1][j].plot(*zip(*meas), "o", color=c)
                prof = [(r["workers"], t1 / r["time_to_target_s"]) for r in plan["runs"]
                        if r["candidate"] == label and r["purpose"] == "profile" and r["time_to_target_s"]]
                if prof:
                    axes[1][j].plot(*zip(*prof), "o", color=c, markerfacecolor="none")
        for i, what in enumerate(["throughput speed-up m·f(1)/f(m)", "time-to-target speed-up T(1)/T(m)"]):
            ax = axes[i][j]
            ax.plot([1, 256], [1, 256], ":", color="gray", label="linear")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("workers m")
            ax.set_ylabel(what)
            ax.set_title(f"{net}: {results['networks'][net]}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    fig.suptitle("lines: predicted from profiling runs at m <= 16; points: measured (top: short runs at every m; "
                 "bottom: hollow = profiling runs, filled = held-out m)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
