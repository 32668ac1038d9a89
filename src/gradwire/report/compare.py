"""Side-by-side comparison of several runs on the same task, seed and partition."""

from __future__ import annotations

import csv
from pathlib import Path

from gradwire.report.plots import plot_runs, time_label
from gradwire.report.run_folder import read_json_or_empty, read_jsonl

COLUMNS = [("label", "variant"), ("status", "status"), ("steps", "steps"), ("test_acc", "final test acc"),
           ("best_test_acc", "best test acc"), ("train_loss", "final train objective"),
           ("suboptimality", "final f - f*"), ("mb_sent", "MB sent"), ("sim_time_s", "sim time (s)"),
           ("wall_time_s", "wall time (s)")]


def row_of(summary: dict) -> dict:
    final = summary.get("final") or {}
    return {"label": summary["label"], "status": summary["status"], "steps": summary["steps"],
            "test_acc": final.get("test_acc"), "best_test_acc": summary.get("best_test_acc"),
            "train_loss": final.get("train_loss"), "suboptimality": final.get("suboptimality"),
            "mb_sent": summary["bytes_sent"] / 1e6, "sim_time_s": summary["sim_time_s"],
            "wall_time_s": summary["wall_time_s"]}


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3e}" if (abs(v) < 1e-3 and v != 0) else f"{v:.4g}"
    return str(v)


def write_report(out: Path, summaries: list[dict], run_dirs: list[Path], title: str) -> dict[str, Path]:
    """Write comparison.md, comparison.csv and comparison.png into ``out``."""
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
    png = plot_runs(curves, out / "comparison.png", title, backends=backends)
    lines = [f"# {title}", "", "| " + " | ".join(h for _, h in keep) + " |", "|" + "---|" * len(keep)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k, _ in keep) + " |" for r in rows]
    lines += ["", f"![curves]({png.name})", "", "Each variant's own folder holds its config.json, "
              "metrics.jsonl, summary.json and curves.png."]
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    return {"markdown": out / "comparison.md", "csv": out / "comparison.csv", "plot": png}
