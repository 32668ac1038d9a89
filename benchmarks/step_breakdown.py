"""Where a real-backend step's time goes, from a run folder's timeline (docs/time_to_accuracy.md,
"Overlap and ACP-SGD").

For every worker and step (evaluation steps and the first two left out), from the timeline's raw
records: how long the gradient took (COMPUTE), how many collectives the step ran (COMM records),
the time from the end of computing to the end of the step's last collective, and the time spent
inside collectives (their intervals summed; with ``sync:overlap=true`` some of them lie inside the
computation, and are counted whole: ``read_timeline(..., overlapped=False)``, which still splits
off, as WAIT, each collective's wait for the last rank to arrive). Prints the median of each over
all workers and steps, one line per run folder:

    .venv/bin/python benchmarks/step_breakdown.py runs/time-to-accuracy/100mbps/gw-adamw-powersgd32h ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from gradwire.cli.flags import add_run_flags, parse_run_args
from gradwire.report.timeline import COMM, COMPUTE, read_timeline


def breakdown(run: Path, eval_every: int = 20) -> dict[str, float] | None:
    """Medians over (worker, step) of the four figures above, in seconds (collectives: a count);
    None when the folder has no timeline."""
    found = read_timeline(run, overlapped=False)  # the collectives whole, inside computing or not
    if found is None:
        return None
    recs, _ = found
    rows = []
    for worker in np.unique(recs["worker"]):
        mine = recs[recs["worker"] == worker]
        for step in np.unique(mine["step"]):
            if step <= 2 or step % eval_every == 0:
                continue
            records = mine[mine["step"] == step]
            compute, comm = records[records["kind"] == COMPUTE], records[records["kind"] == COMM]
            if len(compute) != 1 or not len(comm):
                continue
            end = compute["end"][0]
            rows.append((end - compute["start"][0], len(comm), comm["end"].max() - end,
                         float((comm["end"] - comm["start"]).sum())))
    if not rows:
        return None
    medians = np.median(np.array(rows), axis=0)
    return dict(zip(("compute_s", "collectives", "after_compute_s", "in_collectives_s"), medians.tolist(),
                    strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with a timeline/ (real backends)")
    add_run_flags(parser, only=("eval_every",), defaults={"eval_every": 20},
                  helps={"eval_every": "the runs' evaluation period: evaluation steps are left out"})
    args, _ = parse_run_args(parser, argv)
    status = 0
    for run in args.runs:
        b = breakdown(run, args.eval_every)
        if b is None:
            print(f"{run}: no timeline records to break down", file=sys.stderr)
            status = 1
            continue
        print(f"{run.name:28s} computing {1000 * b['compute_s']:.0f} ms | collectives {b['collectives']:.0f} | "
              f"after computing {1000 * b['after_compute_s']:.0f} ms | in collectives "
              f"{1000 * b['in_collectives_s']:.0f} ms")
    return status


if __name__ == "__main__":
    sys.exit(main())
