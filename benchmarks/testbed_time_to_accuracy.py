"""Time to a target test accuracy on MNIST-1D, 4 workers over real rate-limited links (the
namespace test bed, scripts/testbed.py): uncompressed sync against QSGD-compressed sync and DIANA,
at several link rates, beside the simulator's prediction for the same runs.

    sudo .venv/bin/python benchmarks/testbed_time_to_accuracy.py [--rates 100,10,2] [--steps 400] [--target 0.8]
    .venv/bin/python benchmarks/testbed_time_to_accuracy.py --sim-only        (no root: simulator columns only)

Runs: mnist1d-cnn (about 5k parameters, 21 KB of float32 gradient), lr 0.1, heavy-ball 0.9, batch
32 per worker, seed 0, evaluation every 25 steps. Variants: `sync` (dense allreduce), `sync` with
`qsgd:levels=7,bucket=128` (4-bit symbols + one norm per 128: ~7.5x smaller packets, sent by
allgather) and `diana` with the same compressor.

Columns:
- steps: first evaluated step whose test accuracy reaches the target (testbed / simulator; one
  algorithm and one seed give the same numbers on both backends, so they should agree).
- testbed s: wall seconds from the step-0 record to that step (process start, rendezvous, data
  set-up and the first evaluation excluded; rank 0's evaluations every 25 steps included).
- ms/step: the whole run's training wall time per step.
- MB: bytes gradwire counts up to the target (all workers, ring-collective accounting), then the
  whole run's counted bytes and the bytes the veth interfaces really sent (frames with TCP/IP and
  Ethernet headers, ACKs, rendezvous), from scripts/testbed.py's record; tbf drops: packets the
  rate limiters dropped because their queue was full (TCP then retransmits).
- sim s: the simulator's time to the same step with `--network ring:mbps=R` plus a fixed compute
  time per step: its communication time (a run with ~zero compute) + steps x C, where C is
  calibrated once from the testbed: dense sync's ms/step at the highest rate minus the simulator's
  communication per step there (`--compute-ms` sets C by hand; --sim-only needs it).

The machine has 2 cores: 4 worker processes (plus 4 torchrun agents) share them, so compute is
contended and wall times vary with other load on the machine; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "scripts" / "testbed.py"
COMMON = ["--task", "mnist1d-cnn", "--lr", "0.1", "--momentum", "0.9", "--batch-size", "32", "--eval-every", "25",
          "--seed", "0"]
QSGD = "qsgd:levels=7,bucket=128"
VARIANTS = {  # label -> run flags
    "sync (dense)": ["--algorithm", "sync"],
    f"sync + {QSGD}": ["--algorithm", "sync", "--compressor", QSGD],
    f"diana + {QSGD}": ["--algorithm", "diana", "--compressor", QSGD],
}
WORKERS = 4
SIM_LATENCY_MS = 0.05  # a veth hop: tens of microseconds


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_")


def read_metrics(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]


def first_reaching(rows: list[dict], target: float, metric: str = "test_acc", lower: bool = False) -> dict | None:
    """The first evaluation record whose ``metric`` reaches ``target`` (at or above it; at or
    below it with ``lower``, for a loss), or None."""
    return next((r for r in rows if r.get(metric) is not None
                 and (r[metric] <= target if lower else r[metric] >= target)), None)


def at_target(rows: list[dict], target: float, time_key: str) -> dict:
    """The first record reaching ``target``: its step, time since the step-0 record, counted bytes."""
    t0 = rows[0][time_key]
    hit = first_reaching(rows, target)
    last = rows[-1]
    return {"step": hit and hit["step"], "seconds": hit and hit[time_key] - t0, "mb": hit and hit["bytes_sent"] / 1e6,
            "best_acc": max(r["test_acc"] for r in rows if r.get("test_acc") is not None),
            "final_acc": last["test_acc"], "total_mb": last["bytes_sent"] / 1e6,
            "s_per_step": (last[time_key] - t0) / max(1, last["step"])}


def this_checkout_env() -> dict[str, str]:
    """The environment with this checkout's ``src`` first on PYTHONPATH: every process the bed
    starts inside the namespaces (they inherit it) imports this gradwire, not an installed one."""
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=str(ROOT / "src") + (os.pathsep + path if path else ""))


def testbed_run(rate: float, command: list[str], out: Path, timeout_s: float, prefix: str, *,
                nodes: int = WORKERS, burst_kbit: float | None = None, label: str = "") -> dict:
    """Run ``command`` (what follows ``--`` of scripts/testbed.py: ``["run", ...]`` or ``["torchrun",
    SCRIPT, ...]``, whose ``--out`` is ``out``) on ``nodes`` namespaces at ``rate`` Mbit/s; the bytes
    the veth interfaces sent (MB) and the packets tbf dropped, from the bed's record."""
    burst = [] if burst_kbit is None else ["--burst-kbit", f"{burst_kbit:g}"]
    cmd = [sys.executable, str(TESTBED), "--nodes", str(nodes), "--mbps", f"{rate:g}", *burst, "--timeout-s",
           str(timeout_s), "--prefix", prefix, "--", *command]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60, cwd=ROOT, env=this_checkout_env())
    if p.returncode != 0:
        raise RuntimeError(f"testbed run {label} at {rate:g} Mbit/s failed ({p.returncode}):\n{p.stderr[-3000:]}")
    bed = json.loads((out / "testbed" / "testbed.json").read_text())
    return {"wire_mb": sum(x["tx_bytes"] for x in bed["links"]) / 1e6,
            "drops": sum(x["upload_drops"] + x["download_drops"] for x in bed["links"])}


def run_testbed(rate: float, label: str, steps: int, out: Path, timeout_s: float, k: int) -> dict:
    command = ["run", *COMMON, *VARIANTS[label], "--steps", str(steps), "--name", label, "--out", str(out)]
    return testbed_run(rate, command, out, timeout_s, f"gwb-{os.getpid()}-{k}", label=label)


def run_sim(rate: float, label: str, steps: int, out: Path) -> None:
    cmd = [sys.executable, "-m", "gradwire", "run", *COMMON, *VARIANTS[label], "--steps", str(steps),
           "--workers", str(WORKERS), "--network", f"ring:mbps={rate:g},latency_ms={SIM_LATENCY_MS}",
           "--stragglers", "none:compute_s=1e-9", "--name", label, "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=dict(os.environ, CI="1"))
    if p.returncode != 0:
        raise RuntimeError(f"simulator run {label} at {rate} Mbit/s failed:\n{p.stderr[-3000:]}")


def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def table(results: list[dict], target: float, compute_s: float | None) -> str:
    t = f"{target:.0%}"
    head = (f"| Mbit/s | variant | steps to {t} (testbed / sim) | testbed s to {t} | sim s to {t} | ms/step | "
            f"MB to {t} | MB run (counted / wire) | tbf drops | final acc |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        tb, sim = r.get("testbed"), r["sim"]
        sim_s = None if compute_s is None or sim["step"] is None else sim["seconds"] + sim["step"] * compute_s
        tb_step, tb_s = ("-", "-") if tb is None else (fmt(tb["step"], "d", "n/r"), fmt(tb["seconds"], ".1f", "n/r"))
        steps = f"{tb_step} / {fmt(sim['step'], 'd', 'n/r')}"
        wire = f"{tb['total_mb']:.1f} / {r['wire_mb']:.1f}" if tb else f"{sim['total_mb']:.1f} / -"
        lines.append(f"| {r['rate']:g} | {r['label']} | {steps} | {tb_s} | "
                     f"{fmt(sim_s, '.1f')} | {fmt(tb and tb['s_per_step'] * 1e3, '.1f')} | "
                     f"{fmt((tb or sim)['mb'], '.1f')} | {wire} | {r.get('drops', '-')} | "
                     f"{(tb or sim)['final_acc']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,10,2", help="link rates in Mbit/s, comma-separated (default 100,10,2)")
    add_run_flags(ap, only=("steps", "out"), defaults={"steps": 400, "out": "runs/testbed-tta"},
                  helps={"steps": "steps per run (400: all variants reach 80%%)",
                         "out": "run folders, results.md and results.json"})
    ap.add_argument("--target", type=float, default=0.8, help="target test accuracy (default 0.8)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="longest testbed run before it is stopped")
    ap.add_argument("--compute-ms", type=float, help="simulator compute per step C (default: calibrated)")
    ap.add_argument("--sim-only", action="store_true", help="skip the testbed (no root needed)")
    ns, _ = parse_run_args(ap)
    rates = sorted((float(x) for x in ns.rates.split(",")), reverse=True)
    if not ns.sim_only and os.geteuid() != 0:
        print("testbed_time_to_accuracy.py: error: the testbed needs root; run with sudo, or pass --sim-only",
              file=sys.stderr)
        return 2
    out = (ROOT / ns.out) if not Path(ns.out).is_absolute() else Path(ns.out)
    started, load_before = time.perf_counter(), os.getloadavg()
    results, k = [], 0
    for rate in rates:
        for label in VARIANTS:
            r = {"rate": rate, "label": label}
            if not ns.sim_only:
                k += 1
                folder = out / f"testbed-{rate:g}mbps" / slug(label)
                print(f"[testbed {rate:g} Mbit/s] {label} ...", flush=True)
                r |= run_testbed(rate, label, ns.steps, folder, ns.timeout_s, k)
                r["testbed"] = at_target(read_metrics(folder), ns.target, "wall_time_s")
                print(f"  {json.dumps(r['testbed'])}", flush=True)
            folder = out / f"sim-{rate:g}mbps" / slug(label)
            run_sim(rate, label, ns.steps, folder)
            r["sim"] = at_target(read_metrics(folder), ns.target, "sim_time_s")
            results.append(r)
    compute_s = None if ns.compute_ms is None else ns.compute_ms / 1e3
    if compute_s is None and not ns.sim_only:  # dense sync at the highest rate: measured minus modelled comm
        dense = results[0]
        compute_s = max(0.0, dense["testbed"]["s_per_step"] - dense["sim"]["s_per_step"])
    md = table(results, ns.target, compute_s)
    notes = (f"\n\n4 workers (one process per node namespace; 2 cores shared by 4 workers and 4 torchrun agents), "
             f"mnist1d-cnn, {ns.steps} steps, target {ns.target:.0%}. n/r = not reached. Simulator compute per step "
             f"C = {fmt(compute_s and compute_s * 1e3, '.2f', 'not set')} ms"
             f"{' (calibrated)' if ns.compute_ms is None and not ns.sim_only else ''}, "
             f"ring latency {SIM_LATENCY_MS} ms. Load average before/after: {load_before[0]:.1f} / "
             f"{os.getloadavg()[0]:.1f}. Benchmark wall time {time.perf_counter() - started:.0f} s.")
    (out / "results.md").write_text(md + notes + "\n")
    (out / "results.json").write_text(json.dumps({"results": results, "compute_s": compute_s, "steps": ns.steps,
                                                  "target": ns.target}, indent=2) + "\n")
    print(md + notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
