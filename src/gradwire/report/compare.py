"""Side-by-side comparison of several runs on the same task, seed and partition; with several
seeds (``gradwire compare --seeds``), each variant's spread over them and its paired difference
from the first variant."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from gradwire.report.plots import plot_runs, time_label
from gradwire.report.run_folder import read_json_or_empty, read_jsonl

COLUMNS = [("label", "variant"), ("status", "status"), ("steps", "steps"), ("test_loss", "final test loss"),
           ("test_acc", "final test acc"), ("best_test_acc", "best test acc"),
           ("train_loss", "final train objective"), ("suboptimality", "final f - f*"), ("mb_sent", "MB sent"),
           ("sim_time_s", "sim time (s)"), ("wall_time_s", "wall time (s)")]

# the final quantities summarised over seeds, in the order of the table
SEED_METRICS = [("test_loss", "final test loss"), ("test_acc", "final test acc"),
                ("train_loss", "final train objective"), ("suboptimality", "final f - f*")]
SEEDS_CSV = "comparison_seeds.csv"
# a comparison's own files in its folder: comparison_seeds.csv with several seeds, report.html with
# ``compare --html`` (written after these, from them); those of an earlier comparison that this one
# does not write go when it writes its table (they would show the variants it replaced)
COMPARISON_FILES = ("comparison.md", "comparison.csv", SEEDS_CSV, "comparison.png", "report.html")


def row_of(summary: dict) -> dict:
    final = summary.get("final") or {}
    sent = summary.get("bytes_sent")  # (a damaged summary may lack any figure: a blank cell, not a traceback)
    return {"label": summary.get("label", "?"), "status": summary.get("status"), "steps": summary.get("steps"),
            "test_loss": final.get("test_loss"), "test_acc": final.get("test_acc"),
            "best_test_acc": summary.get("best_test_acc"), "train_loss": final.get("train_loss"),
            "suboptimality": final.get("suboptimality"), "mb_sent": None if sent is None else sent / 1e6,
            "sim_time_s": summary.get("sim_time_s"), "wall_time_s": summary.get("wall_time_s")}


def _fmt(v) -> str:
    """A markdown table cell: numbers to 4 figures; text with its ``|`` escaped (a column more
    otherwise) and ``<`` as an entity (raw HTML otherwise, in a name)."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3e}" if (abs(v) < 1e-3 and v != 0) else f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("<", "&lt;")


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _finished_value(summary: dict, key: str) -> float | None:
    """``key`` of the run's final evaluation, or None where the run did not finish (diverged,
    stopped) or never measured it."""
    value = (summary.get("final") or {}).get(key)
    return float(value) if summary.get("status") == "finished" and _finite(value) else None


def seed_rows(seeds: list[int], labels: list[str], summaries: list[list[dict]]) -> list[dict]:
    """One row per variant: over the seeds its runs finished, the mean, sample standard deviation,
    least and greatest of each final quantity (and the mean MB sent and time), and the paired
    relative difference from the first variant (``100 (v_s / b_s - 1)`` per seed s where both
    finished and b_s is not 0: the seeds pair the runs, which start from the same model and draw
    the same batches) as its mean, least and greatest. A run that did not finish is left out of
    every figure.
    ``summaries[v][k]``: variant v's run with ``seeds[k]``."""
    base = summaries[0]
    rows = []
    for label, runs in zip(labels, summaries, strict=True):
        done = [s for s in runs if s.get("status") == "finished"]
        row = {"label": label, "seeds": len(seeds), "finished": len(done),
               "mb_sent": statistics.fmean(s["bytes_sent"] / 1e6 for s in done) if done else None,
               "sim_time_s": statistics.fmean(s["sim_time_s"] for s in done) if done else None}
        for key, _ in SEED_METRICS:
            values = [v for v in (_finished_value(s, key) for s in runs) if v is not None]
            if not values:
                continue
            row[f"{key}_mean"] = statistics.fmean(values)
            row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else None
            row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
            pairs = [(_finished_value(s, key), _finished_value(b, key)) for s, b in zip(runs, base, strict=True)]
            rel = [100.0 * (v / b - 1.0) for v, b in pairs if v is not None and b is not None and b != 0]
            if rel:
                row[f"{key}_vs_first_pct"] = statistics.fmean(rel)
                row[f"{key}_vs_first_min_pct"], row[f"{key}_vs_first_max_pct"] = min(rel), max(rel)
        rows.append(row)
    return rows


# the quantities whose range over seeds the plot shades (KEY:lo .. KEY:hi)
BANDS = ("train_loss", "test_loss", "test_acc", "suboptimality")


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """The seeds' curves averaged: at each step every curve evaluated, the mean of each number
    they all recorded there (steps some seed lacks, as after a divergence, are left out), and for
    the plotted quantities (:data:`BANDS`) their least and greatest as ``KEY:lo`` and ``KEY:hi``."""
    by_step = [{rec["step"]: rec for rec in recs if "step" in rec} for recs in curves]
    steps = sorted(set.intersection(*(set(s) for s in by_step))) if by_step else []
    out = []
    for step in steps:
        recs = [s[step] for s in by_step]
        keys = [k for k, v in recs[0].items() if _finite(v) and not isinstance(v, bool)
                and all(_finite(r.get(k)) for r in recs)]
        row = {k: statistics.fmean(r[k] for r in recs) for k in keys} | {"step": step}
        for k in BANDS:
            if k in keys:
                row[f"{k}:lo"], row[f"{k}:hi"] = min(r[k] for r in recs), max(r[k] for r in recs)
        out.append(row)
    return out


SEEDS_NOTE = ("Each variant ran once per seed; a seed gives every variant the same initial model, batches and "
              "draws, so the runs pair up. \"vs first\" is 100 (v / b − 1) % per seed against the first variant, "
              "over the seeds both finished (and where the first variant's value is not 0). A run that did not "
              "finish is left out of every figure. The standard deviation is the sample one (n − 1).")


def _pct(value: float) -> str:
    """A signed percentage: two decimals (+0.53), or three significant digits once fixed point
    would run long (+1.23e+08, from a first variant whose value is close to 0)."""
    return f"{value:+.2f}" if abs(value) < 1e5 else f"{value:+.3g}"


def seed_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The table over seeds (:func:`seed_rows`'s rows, or comparison_seeds.csv's read back) as
    headers and text cells: comparison.md and report.html show the same table."""
    present = [(k, h) for k, h in SEED_METRICS if any(r.get(f"{k}_mean") is not None for r in rows)]
    head = ["variant", "finished"]
    for _, name in present:
        head += [f"{name}: mean ± sd", "least .. greatest", "vs first, paired: mean (least .. greatest)"]
    head += ["MB sent (mean)"]
    cells = []
    for r in rows:
        line = [_fmt(str(r["label"])), f"{r['finished']} of {r['seeds']}"]
        for key, _ in present:
            if r.get(f"{key}_mean") is None:
                line += ["–", "–", "–"]
                continue
            sd = r.get(f"{key}_sd")
            line += [f"{_fmt(r[f'{key}_mean'])} ± {_fmt(sd)}" if sd is not None else _fmt(r[f"{key}_mean"]),
                     f"{_fmt(r[f'{key}_min'])} .. {_fmt(r[f'{key}_max'])}"]
            if r.get(f"{key}_vs_first_pct") is not None:
                line.append(f"{_pct(r[f'{key}_vs_first_pct'])} % ({_pct(r[f'{key}_vs_first_min_pct'])} .. "
                            f"{_pct(r[f'{key}_vs_first_max_pct'])})")
            else:
                line.append("–")
        line.append(_fmt(r["mb_sent"]))
        cells.append(line)
    return head, cells


def read_seed_rows(path: Path) -> list[dict]:
    """comparison_seeds.csv read back: numbers as numbers, empty cells as None."""
    def value(text: str):
        if text == "":
            return None
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text

    with open(path, newline="") as f:
        return [{k: (v if k == "label" else value(v)) for k, v in row.items()} for row in csv.DictReader(f)]


def _seed_lines(seeds: list[int], rows: list[dict]) -> list[str]:
    """comparison.md's table over seeds."""
    head, cells = seed_cells(rows)
    return ([f"## Over seeds {', '.join(map(str, seeds))}", "", SEEDS_NOTE, "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(line) + " |" for line in cells])


def folders_sentence(run_dirs: list[Path]) -> str:
    """What comparison.md says each variant's folder holds: curves.png only where the run drew it
    (``curves`` in its config.json; not with --no-curves)."""
    drawn = [read_json_or_empty(Path(d) / "config.json").get("curves", True) for d in run_dirs]
    files = "Each variant's own folder holds its config.json, metrics.jsonl, summary.json"
    if all(drawn):
        return f"{files} and curves.png."
    if not any(drawn):
        return f"{files} (no curves.png: the runs were made with --no-curves)."
    return f"{files}, and curves.png where the run drew it (not with --no-curves)."


def write_report(out: Path, summaries: list[dict], run_dirs: list[Path], title: str, *,
                 seeds: list[int] | None = None, labels: list[str] | None = None) -> dict[str, Path]:
    """Write comparison.md, comparison.csv and comparison.png into ``out``, and remove the rest of an
    earlier comparison's files there (:data:`COMPARISON_FILES`: its report.html, which the caller
    writes again where asked). With ``seeds`` (more than one), ``summaries`` and ``run_dirs`` are
    seed-major (every variant of the first seed, then of the next), ``labels`` are the variants' own
    labels; comparison.md adds the table over seeds (also written as comparison_seeds.csv) and the
    plot shows each variant's mean curve."""
    rows = [row_of(s) for s in summaries]
    backends = [read_json_or_empty(Path(d) / "config.json").get("backend", "sim") for d in run_dirs]
    keep = [(k, h) for k, h in COLUMNS if any(r.get(k) is not None for r in rows)]
    if set(backends) != {"sim"}:  # real seconds in sim_time_s: say so
        keep = [(k, time_label(backends) if k == "sim_time_s" else h) for k, h in keep]
    with open(out / "comparison.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([k for k, _ in keep])
        for r in rows:
            w.writerow([r.get(k) for k, _ in keep])
    curves = {s["label"]: read_jsonl(Path(d) / "metrics.jsonl") for s, d in zip(summaries, run_dirs)}
    seed_lines: list[str] = []
    if seeds and len(seeds) > 1:
        n = len(labels)
        by_variant = [[summaries[k * n + v] for k in range(len(seeds))] for v in range(n)]
        table = seed_rows(seeds, labels, by_variant)
        fields = list(dict.fromkeys(k for r in table for k in r))
        with open(out / SEEDS_CSV, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(table)
        seed_lines = _seed_lines(seeds, table)
        runs = list(curves.values())
        finished = {v: [runs[k * n + v] for k in range(len(seeds)) if summaries[k * n + v].get("status") == "finished"]
                    for v in range(n)}  # a run that did not finish is left out of every figure (SEEDS_NOTE)
        curves = {f"{label} (mean of {len(finished[v])} seeds)": mean_curve(finished[v])
                  for v, label in enumerate(labels) if finished[v]}
        title = f"{title}, seeds {', '.join(map(str, seeds))}"
    png = plot_runs(curves, out / "comparison.png", title, backends=backends)
    lines = [f"# {title}", "", "| " + " | ".join(h for _, h in keep) + " |", "|" + "---|" * len(keep)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k, _ in keep) + " |" for r in rows]
    if seed_lines:
        lines += [""] + seed_lines
    lines += ["", f"![curves]({png.name})", "", folders_sentence(run_dirs)]
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    written = {"comparison.md", "comparison.csv", png.name, *([SEEDS_CSV] if seed_lines else [])}
    for name in COMPARISON_FILES:  # an earlier comparison's, replaced by this one
        if name not in written:
            (out / name).unlink(missing_ok=True)
    return {"markdown": out / "comparison.md", "csv": out / "comparison.csv", "plot": png}
