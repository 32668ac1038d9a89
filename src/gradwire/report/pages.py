"""``gradwire report``: one self-contained report.html for a run folder or a comparison folder.

A run's page: the summary table, loss and accuracy against steps, bytes and time, the timeline
(a Gantt chart of the first steps, report/gantt.py), each worker's time, bytes, dropped
gradients and staleness, the per-step staleness where the algorithm measures it, and the resolved
config. A comparison's page: the same for every variant, side by side, the curves on shared axes
and the config keys in which the variants differ. Built with ``report.html.page``; a run folder
written before timelines existed gets a page without one.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gradwire.errors import ConfigError  # noqa: E402
from gradwire.report.compare import (  # noqa: E402
    COLUMNS,
    SEEDS_CSV,
    SEEDS_NOTE,
    mean_curve,
    read_seed_rows,
    row_of,
    seed_cells,
)
from gradwire.report.gantt import plot_timeline, window_end  # noqa: E402
from gradwire.report.html import Heading, Image, Paragraph, Preformatted, Table, write_page  # noqa: E402
from gradwire.report.plots import plot_runs, time_label  # noqa: E402
from gradwire.report.recovery import report_blocks as recovery_blocks  # noqa: E402
from gradwire.report.run_folder import read_complete_jsonl, read_json_or_empty  # noqa: E402
from gradwire.report.timeline import per_worker, read_timeline  # noqa: E402

REPORT_NAME = "report.html"
TIMELINE_CAPTION = ("Blue: computing; orange: communicating; grey: waiting; red hatched: a computation whose gradient "
                    "was dropped; green band: a collective in flight behind computation; server row: a tick per "
                    "message handled (a cross: dropped).")
TIMELINE_STEPS = 12  # the Gantt chart shows the first steps: a long run's thousands of bars are unreadable
WORKER_COLUMNS = [("compute_s", "compute (s)"), ("comm_s", "communicate (s)"), ("wait_s", "wait (s)"),
                  ("overlap_s", "overlapped comm (s)"), ("bytes", "bytes"), ("dropped", "dropped gradients"),
                  ("staleness_mean", "mean staleness")]


class RunData:
    """What a run folder holds, read once; ``summary`` falls back to the last metrics row for a
    run that is still going or crashed before its summary."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.config = read_json_or_empty(self.folder / "config.json")
        self.metrics, skipped_metrics = read_complete_jsonl(self.folder / "metrics.jsonl")
        self.steps, skipped_steps = read_complete_jsonl(self.folder / "steps.jsonl")
        # lines that hold no whole record (a run killed mid-write): file name -> how many
        self.skipped = {name: n for name, n in (("metrics.jsonl", skipped_metrics), ("steps.jsonl", skipped_steps))
                        if n}
        self.setup = read_json_or_empty(self.folder / "algorithm.json")
        summary = read_json_or_empty(self.folder / "summary.json")
        if not summary:
            last = self.metrics[-1] if self.metrics else {}
            summary = {"label": self.config.get("name") or self.config.get("algorithm", self.folder.name),
                       "status": "no summary.json (still running, or ended without one)",
                       "steps": last.get("step", 0), "final": last or None, "bytes_sent": last.get("bytes_sent", 0),
                       "sim_time_s": last.get("sim_time_s", 0.0), "wall_time_s": last.get("wall_time_s", 0.0),
                       "best_test_acc": max((m["test_acc"] for m in self.metrics if m.get("test_acc") is not None),
                                            default=None)}
        self.summary = summary
        self.label = summary.get("label", self.folder.name)
        self.backend = self.config.get("backend", "sim")
        self.timeline = read_timeline(self.folder)


def is_run(folder: Path) -> bool:
    return (Path(folder) / "config.json").exists() or (Path(folder) / "metrics.jsonl").exists()


def _png(draw) -> bytes:
    buf = io.BytesIO()
    draw(buf)
    return buf.getvalue()


def _summary_table(runs: list[RunData]) -> Table:
    rows = [row_of(r.summary) | {"label": r.label} for r in runs]
    keep = [(k, h) for k, h in COLUMNS if any(row.get(k) is not None for row in rows)]
    keep = [(k, time_label(r.backend for r in runs) if k == "sim_time_s" else h) for k, h in keep]
    return Table([h for _, h in keep], [[row.get(k) for k, _ in keep] for row in rows])


def _fresh(png: Path, runs: list[RunData]) -> bool:
    """``png`` exists and was drawn after every run's last evaluation (so it shows them all)."""
    if not png.exists():
        return False
    newest = max(((r.folder / "metrics.jsonl").stat().st_mtime for r in runs if (r.folder / "metrics.jsonl").exists()),
                 default=0.0)
    return png.stat().st_mtime >= newest


def _curves(runs: list[RunData], title: str, drawn: Path | None = None, variants: list[str] | None = None) -> list:
    """The curves, from ``drawn`` (curves.png, comparison.png: the same plot) when it is up to date.
    ``variants`` (a comparison over seeds): drawn again, each variant's mean over its runs "V seed S"."""
    with_metrics = [r for r in runs if r.metrics]
    if not with_metrics:
        return [Paragraph("No evaluations recorded (metrics.jsonl is empty or missing).")]
    if drawn is not None and _fresh(drawn, with_metrics):
        png = drawn.read_bytes()
    else:
        curves = {r.label: r.metrics for r in with_metrics}
        if variants:
            groups = {v: [r.metrics for r in with_metrics if re.fullmatch(re.escape(v) + r" seed \d+", r.label)
                          and r.summary.get("status") == "finished"]  # as the table: finished runs only
                      for v in variants}
            curves = {f"{v} (mean of {len(g)} seeds)": mean_curve(g) for v, g in groups.items() if g}
        png = _png(lambda buf: plot_runs(curves, buf, title, backends=[r.backend for r in with_metrics]))
    return [Image(png, alt=f"loss and accuracy against steps, bytes and time: {title}",
                  caption="Rows: training objective (and f - f* where known), test loss, test accuracy; columns: "
                          "against steps, MB sent, and time.")]


def _timeline_blocks(run: RunData, xmax: float | None = None, caption: bool = True) -> list:
    if run.timeline is None:
        return [Paragraph(f"{run.label}: no timeline in this run folder (written before gradwire recorded "
                          "timelines).")]
    recs, clock = run.timeline
    if not len(recs):
        return [Paragraph(f"{run.label}: the timeline is empty.")]
    png = _png(lambda buf: plot_timeline(recs, clock, buf, f"{run.label}: first {TIMELINE_STEPS} steps",
                                         steps=TIMELINE_STEPS, xmax=xmax))
    return [Image(png, alt=f"timeline of {run.label}: per-worker compute, communication and waiting",
                  caption=TIMELINE_CAPTION if caption else "")]


WALL_NOTE = ("Real backend: a blocking collective's time includes waiting for slower peers; collectives' bytes are "
             "not split per worker (only server-mode messages are).")


def _worker_table(runs: list[RunData]) -> list:
    """One table of every worker of every run (a variant column when there are several)."""
    timed = [r for r in runs if r.timeline is not None and len(r.timeline[0])]
    if not timed:
        return [Paragraph("No timeline recorded: no per-worker figures.")]
    several = len(runs) > 1
    received = any(r.summary.get("gradients_received") for r in timed)
    headers = (["variant"] if several else []) + ["worker"] + [h for _, h in WORKER_COLUMNS] + (
        ["gradients received"] if received else [])
    rows = []
    for r in timed:
        got = r.summary.get("gradients_received") or {}
        for w, t in per_worker(r.timeline[0]).items():
            values = [None if t[k] != t[k] else t[k] for k, _ in WORKER_COLUMNS]  # NaN: not measured
            rows.append(([r.label] if several else []) + [w] + values + ([got.get(str(w))] if received else []))
    blocks = [Table(headers, rows)]
    if any(r.timeline[1] == "wall" for r in timed):
        blocks.insert(0, Paragraph(WALL_NOTE))
    # one under the other at their own size (900 px): side by side in a row, three variants' charts
    # were shrunk to a third of the page, their labels too small to read
    images = [Image(_png(lambda buf, r=r: _plot_workers(per_worker(r.timeline[0]), buf, r.label)),
                    alt=f"per-worker time and bytes of {r.label}") for r in timed]
    return blocks + images


def _plot_workers(totals: dict, buf, label: str) -> None:
    workers = list(totals)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 0.3 * len(workers) + 1.8), layout="constrained")
    left = [0.0] * len(workers)
    for key, name, color in (("compute_s", "compute", "#4C72B0"), ("comm_s", "communicate", "#DD8452"),
                             ("wait_s", "wait", "#CFCFCF")):
        values = [totals[w][key] for w in workers]
        a.barh([str(w) for w in workers], values, left=left, color=color, label=name)
        left = [x + v for x, v in zip(left, values)]
    a.set_xlabel("seconds")
    a.set_ylabel("worker")
    a.invert_yaxis()
    a.legend(fontsize=8)
    a.set_title("time per worker")
    b.barh([str(w) for w in workers], [totals[w]["bytes"] / 1e6 for w in workers], color="#55A868")
    b.invert_yaxis()
    b.set_xlabel("MB")
    b.set_title("bytes per worker")
    fig.suptitle(label, fontsize=10)
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)


def _staleness_blocks(runs: list[RunData]) -> list:
    stale = [r for r in runs if any("staleness_mean" in s for s in r.steps)]
    if not stale:
        return []

    def draw(buf):
        fig, ax = plt.subplots(figsize=(7, 3))
        for r in stale:
            pts = [(s["step"], s["staleness_mean"]) for s in r.steps if "staleness_mean" in s]
            ax.plot(*zip(*pts), label=f"{r.label} (mean)")
        ax.set_xlabel("steps")
        ax.set_ylabel("staleness (updates)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)

    return [Heading("Staleness", 3), Image(_png(draw), alt="mean staleness of the applied gradients per step")]


PATH_KEYS = ("out", "data_dir")  # a page shows these by their last part: an absolute path says where it was made


def shown_config(config: dict) -> dict:
    """``config`` as a page shows it: no ``out`` (the page is about that folder), and each other path
    by its last part only."""
    return {k: (Path(v).name if k in PATH_KEYS and isinstance(v, str) and v else v)
            for k, v in config.items() if k != "out"}


def _config_table(config: dict, keys=None) -> Table:
    keys = sorted(config) if keys is None else keys
    return Table(["key", "value"], [[k, json.dumps(config.get(k)) if isinstance(config.get(k), (list, dict))
                                      else config.get(k)] for k in keys])


def skipped_lines(runs: list[RunData]) -> list[str]:
    """One sentence per file of which a report skipped incomplete lines."""
    return [f"{r.folder.name}/{name}: {n} incomplete line{'s' * (n > 1)} skipped (a run killed while writing "
            "leaves its last line cut off); the report shows the complete ones"
            for r in runs for name, n in r.skipped.items()]


def run_page(folder: Path) -> list:
    run = RunData(folder)
    # the folder's name, not its absolute path: a page is shared, and the path says where it was made
    blocks = [Paragraph(f"Run folder {run.folder.name}; status: {run.summary.get('status')}"
                        + (f" ({run.summary['error']})" if run.summary.get("error") else "")),
              *[Paragraph(f"Note: {s}.") for s in skipped_lines([run])],
              Heading("Summary"), _summary_table([run]),
              Heading("Curves"), *_curves([run], run.label, run.folder / "curves.png"),
              Heading("Timeline"), *_timeline_blocks(run), Heading("Workers"), *_worker_table([run]),
              *_staleness_blocks([run]), *recovery_blocks(run.steps), Heading("Resolved config"),
              _config_table(shown_config(run.config))]
    if run.setup:
        blocks += [Heading("Algorithm set-up (algorithm.json)", 3), Preformatted(json.dumps(run.setup, indent=2))]
    return blocks


def distinct_labels(runs: list[RunData]) -> None:
    """Runs that share a label (a folder of separate runs, each `sync`) are told apart by their run
    folder's name: the page's tables and curves are keyed by label."""
    counts = collections.Counter(r.label for r in runs)
    for r in runs:
        if counts[r.label] > 1:
            r.label = f"{r.label} ({r.folder.name})"


def comparison_page(folder: Path, run_dirs: list[Path]) -> list:
    runs = [RunData(d) for d in run_dirs]
    distinct_labels(runs)
    for r in runs:
        r.config = shown_config(r.config)
    ends = [window_end(r.timeline[0], TIMELINE_STEPS) for r in runs if r.timeline is not None and len(r.timeline[0])]
    xmax = max(ends) if ends else None  # one time axis for every variant's chart
    differing = sorted({k for r in runs for k in r.config if k not in ("out", "name")
                        and len({json.dumps(x.config.get(k), sort_keys=True) for x in runs}) > 1})
    common = {k: v for k, v in runs[0].config.items() if k not in differing and k not in ("out", "name")}
    seeds = Path(folder) / SEEDS_CSV
    over_seeds, variants = [], None
    if seeds.exists():  # gradwire compare --seeds: every variant once per seed
        table = read_seed_rows(seeds)
        variants = [str(r["label"]) for r in table]
        over_seeds = [Heading("Over seeds"), Paragraph(SEEDS_NOTE), Table(*seed_cells(table))]
    blocks = [Paragraph(f"Comparison folder {Path(folder).resolve().name}: {len(runs)} "
                        f"{_what_is_compared(differing, bool(over_seeds))}."),
              *[Paragraph(f"Note: {s}.") for s in skipped_lines(runs)],
              Heading("Summary"), _summary_table(runs), *over_seeds, Heading("Curves"),
              *_curves(runs, "all variants", Path(folder) / "comparison.png", variants),
              Heading("Timelines"), Paragraph("Each variant's first steps, one under the other on the same time axis."),
              *[b for i, r in enumerate(runs) for b in _timeline_blocks(r, xmax, caption=i == len(runs) - 1)],
              Heading("Workers"), *_worker_table(runs),
              *_staleness_blocks(runs), Heading("Config")]
    if differing:
        blocks += [Paragraph("Where the variants differ:"),
                   Table(["key"] + [r.label for r in runs], [[k] + [r.config.get(k) for r in runs] for k in differing])]
    blocks += [Paragraph("Common to every variant:"), _config_table(common)]
    return blocks


# the keys that set what a variant trains on and where: the lead line says which the variants share
SETTING_KEYS = ("task", "seed", "partition", "workers", "network", "stragglers")


def _what_is_compared(differing: list[str], over_seeds: bool) -> str:
    """The comparison page's lead line after its count of runs: what the variants share of the
    task, seed, partition, workers, network and stragglers, and which of these they differ in."""
    def listed(keys: list[str]) -> str:
        return keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} and {keys[-1]}"

    varies = [k for k in SETTING_KEYS if k in differing and not (over_seeds and k == "seed")]
    if over_seeds:
        what = "runs (every variant once per seed)"
        same = [k for k in ("task",) if k not in varies]
        what += f" on the same {listed(same)}" if same else ""
        what += "; the runs of one seed share the initial model, batches" + ("" if "partition" in varies
                                                                             else " and partition")
    else:
        same = [k for k in ("task", "seed", "partition") if k not in varies]
        what = "variants" + (f" on the same {listed(same)}" if same else "")
    if varies:
        what += f"; they differ in {listed(varies)} (Config below)"
    return what


def variant_dirs(folder: Path, notes: list[str] | None = None) -> list[Path]:
    """A comparison folder's variant run folders, in comparison.csv's order where it names them.
    ``notes`` is told, a sentence each, of a variant the table names whose run folder (or summary)
    is missing, and of a table that cannot be read or names none of the runs there (then every run
    in the folder is shown)."""
    notes = [] if notes is None else notes
    found = sorted(d for d in Path(folder).iterdir() if d.is_dir() and is_run(d))
    table = Path(folder) / "comparison.csv"
    if not table.exists():  # a comparison still running (or stopped before its report): every run in it
        return found
    labels = table_labels(table)
    if labels is None:  # not what gradwire compare writes (label,status,...)
        if found:
            notes.append(f"{table} is not a comparison table (its first line is not label,status,...): the page "
                         f"shows every run in {folder} instead ({len(found)})")
        return found
    by_label = {read_json_or_empty(d / "summary.json").get("label"): d for d in found}
    missing = [x for x in labels if x not in by_label]
    if found and len(missing) == len(labels):
        notes.append(f"{table} names none of the runs in {folder} (it names {', '.join(map(repr, labels)) or 'none'}): "
                     f"the page shows every run in the folder instead ({len(found)})")
        return found
    for x in missing:
        notes.append(f"{table} names variant {x!r}, but no run folder in {folder} holds its run (its folder or "
                     "its summary.json is missing): the page leaves it out")
    # only the runs of the comparison the table is of: an earlier comparison's folders may remain beside them
    return [by_label[x] for x in labels if x in by_label]


def table_labels(table: Path) -> list[str] | None:
    """The variants' labels a comparison.csv names, in its order; None where it cannot be read or is
    not what gradwire compare writes (a first line label,status,...)."""
    try:
        with open(table, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not rows or rows[0][:1] != ["label"]:
        return None
    return [row[0] for row in rows[1:] if row]


def write_report(folder: str | Path, run_dirs: list[Path] | None = None, *, out: str | Path | None = None,
                 title: str | None = None, warn=None) -> Path:
    """Write ``report.html`` for a run folder, or a comparison folder (``run_dirs``: its variants,
    found in it when not given); returns its path (``out``, default FOLDER/report.html). ``warn``
    is told, a sentence each, of the incomplete lines skipped (the page says so too)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; give a run folder or a comparison folder")
    if run_dirs is None and is_run(folder):
        blocks = run_page(folder)
        title = title or f"gradwire run: {RunData(folder).label}"
        skipped = skipped_lines([RunData(folder)])
    else:
        notes: list[str] = []
        run_dirs = variant_dirs(folder, notes) if run_dirs is None else run_dirs
        if not run_dirs:
            why = f" ({'; '.join(notes)})" if notes else ""
            raise ConfigError(f"{folder} holds no run (config.json, metrics.jsonl) and no variant run folders{why}; "
                              "give a run folder (gradwire run --out) or a comparison folder (gradwire compare --out)")
        blocks = comparison_page(folder, run_dirs)
        blocks[1:1] = [Paragraph(f"Note: {n}.") for n in notes]  # (after the lead line)
        title = title or f"gradwire comparison: {folder.name}"
        skipped = [*notes, *skipped_lines([RunData(d) for d in run_dirs])]
    for sentence in skipped if warn is not None else ():
        warn(sentence)
    return write_page(Path(out) if out is not None else folder / REPORT_NAME, title, blocks)
