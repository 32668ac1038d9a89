"""Paper-style curves: loss and accuracy (or suboptimality) against steps, bytes and time: simulated
seconds on the simulator, elapsed ones on a real backend (the runs' backends name the axis)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

AXES = [("step", "steps", 1.0), ("bytes_sent", "MB sent (all messages)", 1e-6),
        ("sim_time_s", "simulated time (s)", 1.0)]  # the time axis's label follows the backends


def time_label(backends: Iterable[str]) -> str:
    """What ``sim_time_s`` measures: simulated seconds on ``sim``, real elapsed ones otherwise."""
    kinds = set(backends) or {"sim"}
    if kinds == {"sim"}:
        return "simulated time (s)"
    if "sim" not in kinds:
        return "elapsed time (s)"
    return "time (s): simulated on sim, elapsed otherwise"


def _rows(records_by_label: dict[str, list[dict]]) -> list[tuple[str, str, bool]]:
    """The quantities plotted: the training objective, f - f* where the task knows f*, the test
    (validation) loss where the task reports one, the test accuracy, and the learning rate where a
    run followed a schedule (``--lr-schedule``: its metrics record ``lr``)."""
    def recorded(key: str) -> bool:
        return any(rec.get(key) is not None for recs in records_by_label.values() for rec in recs)

    rows = [("train_loss", "training objective", True)]
    if recorded("suboptimality"):
        rows.append(("suboptimality", "f(x) - f*", True))
    if recorded("test_loss"):
        rows.append(("test_loss", "test loss", True))
    rows.append(("test_acc", "test accuracy", False))
    if recorded("lr"):
        rows.append(("lr", "learning rate", False))
    return rows


def log_worthy(values: Iterable[float]) -> bool:
    """Whether a quantity plotted on a log axis should keep it: its positive values span at least a
    decade. Narrower (a language model's loss from 5.6 down to 2.2) a log axis gains nothing and gets
    tick labels such as 3x10^0; such an axis stays linear."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) >= 10 * min(positive)


def plot_runs(records_by_label: dict[str, list[dict]], path: Path, title: str = "", *,
              backends: Iterable[str] = ("sim",)) -> Path:
    """One PNG with a grid: a row per quantity, a column per x-axis, a line per run. ``backends``:
    those the runs used (config.json's ``backend``), which name the time axis. A record holding
    ``KEY:lo`` and ``KEY:hi`` beside ``KEY`` (a mean over seeds: ``report.compare.mean_curve``)
    gets the band between them shaded in the line's colour."""
    rows = _rows(records_by_label)
    columns = [(k, time_label(backends) if k == "sim_time_s" else x, s) for k, x, s in AXES]
    fig, axes = plt.subplots(len(rows), len(columns), figsize=(4.2 * len(columns), 3.0 * len(rows)),
                             squeeze=False)
    for i, (key, ylabel, log) in enumerate(rows):
        log = log and log_worthy(rec[key] for recs in records_by_label.values() for rec in recs
                                 if rec.get(key) is not None)
        for j, (xkey, xlabel, scale) in enumerate(columns):
            ax = axes[i][j]
            for label, recs in records_by_label.items():
                pts = [(rec[xkey] * scale, rec[key]) for rec in recs  # a row without the axis: not drawn
                       if rec.get(key) is not None and rec.get(xkey) is not None]
                if log:
                    pts = [(x, y) for x, y in pts if y > 0]
                if pts:
                    (line,) = ax.plot(*zip(*pts), label=label, marker="." if len(pts) < 30 else None)
                    band = [(rec[xkey] * scale, rec[f"{key}:lo"], rec[f"{key}:hi"]) for rec in recs
                            if rec.get(key) is not None and rec.get(xkey) is not None
                            and f"{key}:lo" in rec and f"{key}:hi" in rec
                            and not (log and rec[f"{key}:lo"] <= 0)]
                    if band:
                        xs, lo, hi = zip(*band)
                        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            if log:
                ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path
