"""A Gantt chart of a run's timeline (report/timeline.py): a row per worker, a bar per interval.

Computing is blue, blocking communication orange, waiting grey; a computation whose gradient was
dropped (a late backup worker, a gradient too stale) is red and hatched; a collective in flight
while the worker computes (DaSGD, Streaming DiLoCo) is a thin green band under the row. In server
mode the server has a row of its own: a tick where it handled a message, a purple bar while a
message waited in its queue, and a panel below counts the messages waiting at each moment.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from gradwire.report.timeline import COMM, COMPUTE, DROPPED, OVERLAP, QUEUED, SERVE, WAIT  # noqa: E402

COLORS = {COMPUTE: "#4C72B0", COMM: "#DD8452", WAIT: "#CFCFCF", OVERLAP: "#55A868", QUEUED: "#8172B3"}
DROPPED_COLOR = "#C44E52"


def window_end(recs: np.ndarray, steps: int) -> float:
    """The end of the first ``steps`` steps (the run's steps, or each worker's computations in
    server mode): a readable window of a long run."""
    first = recs[recs["step"] <= steps]
    return float((first if len(first) else recs)["end"].max())


def queue_depth(recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Messages waiting at the server over time, from its ``QUEUED`` intervals (a step function:
    times and the depth from each time on)."""
    q = recs[(recs["kind"] == QUEUED) & (recs["end"] > recs["start"])]
    events = sorted([(t, 1) for t in q["start"]] + [(t, -1) for t in q["end"]])
    times = np.array([0.0] + [t for t, _ in events])
    depth = np.cumsum([0] + [d for _, d in events])
    return times, depth


def plot_timeline(recs: np.ndarray, clock: str, path: Path, title: str = "", *, steps: int = 12,
                  xmax: float | None = None) -> Path:
    """Write the Gantt chart of ``recs`` (from ``read_timeline``) for its first ``steps`` steps, or
    up to ``xmax`` seconds (charts side by side on one time axis). ``path``: a file or a binary
    stream (PNG)."""
    end = window_end(recs, steps) if xmax is None else xmax
    shown = recs[recs["start"] <= end]
    workers = sorted({int(w) for w in shown["worker"]})
    served = shown[np.isin(shown["kind"], (SERVE, QUEUED))]
    queued = queue_depth(shown)
    has_queue = queued[1].max(initial=0) > 0
    rows = len(workers) + int(len(served) > 0)
    fig, axes = plt.subplots(2 if has_queue else 1, 1, sharex=True, squeeze=False,
                             figsize=(10, 0.42 * rows + 1.6 + (1.4 if has_queue else 0)),
                             gridspec_kw={"height_ratios": [max(rows, 1), 2] if has_queue else [1]},
                             layout="constrained")
    ax = axes[0][0]
    for i, w in enumerate(workers):
        y = rows - 1 - i
        mine = shown[(shown["worker"] == w)]
        for kind in (WAIT, COMM, COMPUTE):
            sel = mine[mine["kind"] == kind]
            if kind == COMPUTE:
                dropped = sel[sel["flags"] & DROPPED > 0]
                sel = sel[sel["flags"] & DROPPED == 0]
                ax.broken_barh(list(zip(dropped["start"], dropped["end"] - dropped["start"])), (y - 0.35, 0.7),
                               facecolors=DROPPED_COLOR, hatch="//", edgecolor="white", linewidth=0)
            ax.broken_barh(list(zip(sel["start"], sel["end"] - sel["start"])), (y - 0.35, 0.7),
                           facecolors=COLORS[kind], edgecolor="white", linewidth=0.4)  # steps apart
        flying = mine[mine["kind"] == OVERLAP]
        ax.broken_barh(list(zip(flying["start"], flying["end"] - flying["start"])), (y - 0.48, 0.12),
                       facecolors=COLORS[OVERLAP], linewidth=0)
    if len(served):
        q = served[served["kind"] == QUEUED]
        ax.broken_barh(list(zip(q["start"], q["end"] - q["start"])), (-0.35, 0.7), facecolors=COLORS[QUEUED],
                       linewidth=0)
        s = served[served["kind"] == SERVE]
        drop = s["flags"] & DROPPED > 0
        ax.scatter(s["start"][~drop], np.zeros((~drop).sum()), marker="|", s=120, color="black", linewidths=1)
        ax.scatter(s["start"][drop], np.zeros(drop.sum()), marker="x", s=30, color=DROPPED_COLOR)
    labels = [f"worker {w}" for w in workers] + (["server"] if len(served) else [])
    ax.set_yticks(range(rows - 1, -1, -1) if rows else [])
    ax.set_yticklabels(labels)
    ax.set_ylim(-0.6, rows - 0.4)
    ax.set_xlim(0, end * 1.005 if end > 0 else 1)
    handles = [Patch(color=COLORS[COMPUTE], label="compute"), Patch(color=COLORS[COMM], label="communicate"),
               Patch(color=COLORS[WAIT], label="wait"),
               Patch(facecolor=DROPPED_COLOR, hatch="//", label="compute, gradient dropped")]
    if (shown["kind"] == OVERLAP).any():
        handles.append(Patch(color=COLORS[OVERLAP], label="collective in flight (overlapped)"))
    if (served["kind"] == QUEUED).any():
        handles.append(Patch(color=COLORS[QUEUED], label="queued at the server"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 if not has_queue else -0.05),
              ncol=min(len(handles), 3), fontsize=8, frameon=False)
    xlabel = "simulated time (s)" if clock == "simulated" else "elapsed time (s)"
    if has_queue:
        qa = axes[1][0]
        qa.step(queued[0], queued[1], where="post", color=COLORS[QUEUED])
        qa.set_ylabel("messages\nqueued")
        qa.set_xlabel(xlabel)
        qa.grid(alpha=0.3)
    else:
        ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"timeline, first {steps} steps")
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path
