"""What recording the timeline costs: training steps with and without the recorder, side by side.

For each algorithm and worker count, one simulated ``Run`` (MNIST-1D MLP) takes steps in blocks,
alternately with the run loop's recorder (``report/timeline.py``: intervals appended per step,
flushed to ``timeline/sim.bin`` after each step, as ``gradwire run`` does) and with the null
recorder (what a run would do without timelines); blocks interleave so that the machine's load
drifts equally over both. Prints the median seconds per step of each, their ratio, the
timeline's bytes per step, and the recorder's own cost per step: the same number of ``add`` calls
and a ``flush``, timed alone (steady where a loaded machine makes the ratio noisy).

    python benchmarks/report_overhead.py [--steps 20] [--repeats 5] [--workers 8 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args

ALGORITHMS = ("sync", "sync:backups=2", "dasgd:period=4,delay=1")


def measure(algorithm: str, workers: int, steps: int, repeats: int) -> dict:
    import torch

    from gradwire.config import RunConfig
    from gradwire.report.timeline import NULL_TIMELINE, RECORD, Timeline
    from gradwire.run.loop import Run

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(task="mnist1d-mlp", workers=workers, algorithm=algorithm, steps=10**6,
                        stragglers="tail:p=0.05,slowdown=10", out=str(Path(tmp) / "run"))
        run = Run(cfg)
        recorder = Timeline(Path(tmp) / "timeline", "sim", clock=run.clock)
        run.train_step()  # warm-up
        times = {"off": [], "on": []}
        for _ in range(repeats):
            for mode in ("off", "on"):
                timeline = recorder if mode == "on" else NULL_TIMELINE
                run.ctx.timeline = run.transport.timeline = timeline
                start = time.perf_counter()
                for _ in range(steps):
                    run.train_step()
                    timeline.flush()
                times[mode].append((time.perf_counter() - start) / steps)
        recorder.close()
        size = (Path(tmp) / "timeline" / "sim.bin").stat().st_size
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    per_step = round(size / RECORD.itemsize / (steps * repeats))
    return {"algorithm": algorithm, "workers": workers, "off_ms": 1e3 * off, "on_ms": 1e3 * on,
            "ratio": on / off, "bytes_per_step": size / (steps * repeats), "recorder_us": recorder_cost(per_step)}


def recorder_cost(records: int, rounds: int = 2000) -> float:
    """Microseconds to record ``records`` intervals and flush them to a file (median of 5 batches)."""
    from gradwire.report.timeline import COMPUTE, Timeline
    from gradwire.transports.clocks import SimClock

    with tempfile.TemporaryDirectory() as tmp:
        timeline = Timeline(Path(tmp), "bench", clock=SimClock())
        batches = []
        for _ in range(5):
            start = time.perf_counter()
            for k in range(rounds):
                for w in range(records):
                    timeline.add(w, COMPUTE, float(k), k + 0.5)
                timeline.flush()
            batches.append((time.perf_counter() - start) / rounds * 1e6)
        timeline.close()
    return statistics.median(batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_flags(ap, only=("steps", "workers"), defaults={"steps": 20, "workers": [8, 64]}, sweep=("workers",),
                  helps={"steps": "steps per block"})
    ap.add_argument("--repeats", type=int, default=5, help="blocks of each mode, interleaved")
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    args, _ = parse_run_args(ap)
    print(f"{'algorithm':<24} {'workers':>7} {'off ms/step':>12} {'on ms/step':>11} {'on/off':>7} {'bytes/step':>11} "
          f"{'recorder us/step':>16}")
    for algorithm in args.algorithms:
        for workers in args.workers:
            r = measure(algorithm, workers, args.steps, args.repeats)
            print(f"{r['algorithm']:<24} {r['workers']:>7} {r['off_ms']:>12.3f} {r['on_ms']:>11.3f} "
                  f"{r['ratio']:>7.3f} {r['bytes_per_step']:>11.0f} {r['recorder_us']:>16.1f}", flush=True)


if __name__ == "__main__":
    main()
