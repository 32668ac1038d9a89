"""report.html: one self-contained page (inlined PNGs, no script, no external resource) for a
run and for a comparison; html.page's blocks; older run folders without a timeline."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from gradwire.cli import main
from gradwire.report.html import Heading, Image, Paragraph, Preformatted, Row, Table, cell, page, render
from gradwire.report.pages import RunData, _what_is_compared, write_report
from gradwire.report.timeline import read_timeline
from tests.report.conftest import VARIANTS

PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
                           "awAAAABJRU5ErkJggg==")


def images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def tables(html: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of a page as (its headers, its rows of cell texts)."""
    found = re.findall(r"<table><thead><tr>(.*?)</tr></thead><tbody>(.*?)</tbody></table>", html)
    return [(re.findall(r"<th>(.*?)</th>", head), [re.findall(r"<td>(.*?)</td>", tr)
                                                  for tr in re.findall(r"<tr>(.*?)</tr>", body)])
            for head, body in found]


def table_after(html: str, text: str) -> tuple[list[str], list[list[str]]]:
    """The first table after ``text`` on the page."""
    return tables(html.split(text, 1)[1])[0]


def run_folder(folder: Path, config: dict, summary: dict | None = None, metrics: list[dict] = ()) -> Path:
    """A run folder with only the files given (no timeline): a page built from it draws nothing slow."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return folder


def test_page_escapes_text_and_inlines_images(tmp_path):
    (tmp_path / "a.png").write_bytes(PNG_1PX)
    html = page("T <1>", [Heading("H & h", 3), Paragraph("<script>alert(1)</script>"), Preformatted("a < b"),
                          Table(["x", "y"], [["<b>", 0.000123456], [None, 2.5]]),
                          Row([Image(tmp_path / "a.png", alt='say "hi"'), Image(PNG_1PX, alt="b", caption="c")])])
    assert "<title>T &lt;1&gt;</title>" in html and "<h3>H &amp; h</h3>" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html
    assert "<td>&lt;b&gt;</td><td>1.235e-04</td>" in html and "<td>–</td><td>2.5</td>" in html
    assert images(html) == [PNG_1PX, PNG_1PX] and 'alt="say &quot;hi&quot;"' in html
    with pytest.raises(ValueError, match="not a PNG"):
        page("x", [Image(b"GIF89a", alt="no")])
    with pytest.raises(TypeError, match="not a page block"):
        page("x", ["a bare string"])


def test_comparison_report_shows_every_variant_self_contained(comparison):
    html = (comparison / "report.html").read_text()  # written by compare itself
    for v in VARIANTS:
        assert html.count(f"<td>{v}</td>") >= 2  # the summary table and the per-worker table
    # curves, a timeline per variant, per-worker charts per variant, the async run's staleness
    shots = images(html)
    assert len(shots) == 1 + 3 + 3 + 1 and all(s.startswith(b"\x89PNG\r\n\x1a\n") for s in shots)
    assert not re.search(r"<script|<link|src=\"(?!data:)|https?://", html)
    assert "Where the variants differ" in html and "<td>algorithm</td>" in html


def test_run_report_and_an_older_run_folder_without_timeline(comparison, tmp_path):
    run_dir = tmp_path / "old"
    shutil.copytree(comparison / "sync_backups=1", run_dir)
    assert read_timeline(run_dir) is not None
    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    assert len(images(html)) == 3 and "<td>dropped gradients</td>" not in html and "dropped gradients</th>" in html
    shutil.rmtree(run_dir / "timeline")  # as written before timelines existed
    out = write_report(run_dir, out=tmp_path / "old.html")
    html = out.read_text()
    assert "no timeline in this run folder" in html and len(images(html)) == 1  # the curves only


def test_report_of_a_folder_without_runs_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no run" in err


def test_report_of_a_run_killed_mid_line_reads_the_complete_lines(comparison, tmp_path, capsys):
    """A killed run leaves metrics.jsonl and steps.jsonl cut mid-line: the report reads every whole
    line, says how many it skipped (stderr and the page), and draws the rest; the page names the
    folder, never its absolute path."""
    run_dir = tmp_path / "killed"
    shutil.copytree(comparison / "async", run_dir)
    (run_dir / "summary.json").unlink()  # killed before its summary
    for name in ("metrics.jsonl", "steps.jsonl"):
        text = (run_dir / name).read_text()
        (run_dir / name).write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # half a last line
    assert main(["report", str(run_dir)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gradwire report: warning: killed/{name}: 1 incomplete line skipped (a run killed while writing "
                   "leaves its last line cut off); the report shows the complete ones"
                   for name in ("metrics.jsonl", "steps.jsonl")]
    html = (run_dir / "report.html").read_text()
    assert "killed/metrics.jsonl: 1 incomplete line skipped" in html and len(images(html)) >= 2
    assert str(tmp_path) not in html and "Run folder killed;" in html
    config = json.loads((run_dir / "config.json").read_text())
    assert config["out"].startswith("/") and config["out"] not in html  # where the run was made: not shown
    data_dir = str(Path(config["data_dir"]).resolve())  # the data cache, also an absolute path: its name only
    assert Path(config["data_dir"]).is_absolute() and data_dir not in html and config["data_dir"] not in html
    html = (comparison / "report.html").read_text()
    assert str(comparison.parent) not in html and f"Comparison folder {comparison.name}:" in html
    assert data_dir not in html


def test_a_damaged_run_folder_still_gets_its_page(comparison, tmp_path, capsys):
    """An empty timeline header (a run killed as it began), a summary without bytes_sent and a metrics row
    without sim_time_s: the page is drawn, with blanks where the figures are missing (each gave a
    traceback). The header is now written atomically."""
    run_dir = tmp_path / "damaged"
    shutil.copytree(comparison / "async", run_dir)
    (run_dir / "timeline" / "sim.json").write_text("")
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary["bytes_sent"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    del rows[1]["sim_time_s"]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run_dir)]) == 0, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err and (run_dir / "report.html").exists()


def test_a_comparison_page_fits_its_tables_and_draws_worker_charts_readably(comparison):
    """Long unbroken values (spec strings) may wrap inside a cell, so "where the variants differ"
    shrinks to the page instead of running off a 1400-px window; each variant's per-worker chart
    is shown at its own width (900 px), not a third of the page beside the others."""
    from gradwire.report.html import STYLE

    html = (comparison / "report.html").read_text()
    assert "overflow-wrap:anywhere" in STYLE.split("th{background")[0].split("th,td{")[1]
    charts = re.findall(r'<figure><img src="data:image/png;base64,([^"]*)" alt="per-worker', html)
    assert len(charts) == len(VARIANTS)
    assert '<div class="row"><div><figure><img src="data:image/png;base64,' not in html
    widths = [int.from_bytes(base64.b64decode(c)[16:20], "big") for c in charts]  # the PNG header's width
    assert all(w >= 800 for w in widths), widths


def test_a_cell_of_a_million_or_more_is_in_scientific_notation():
    assert cell(1e6) == "1.000e+06" and cell(-1e6) == "-1.000e+06" and cell(2.5e7) == "2.500e+07"
    assert cell(123456.0) == "1.235e+05" and cell(999.5) == "999.5" and cell(1e-3) == "0.001"


def test_a_heading_level_is_kept_between_2_and_4():
    """The page's title is its only h1: a heading asks for 2, 3 or 4 and gets the nearest of them."""
    assert [render(Heading("x", level)) for level in (0, 1, 2, 3, 4, 5)] == [
        "<h2>x</h2>", "<h2>x</h2>", "<h2>x</h2>", "<h3>x</h3>", "<h4>x</h4>", "<h4>x</h4>"]


def test_a_real_backends_time_is_called_elapsed_in_the_summary(tmp_path):
    run_dir = run_folder(tmp_path / "r", {"backend": "torch", "algorithm": "sync"},
                         {"label": "sync", "status": "finished", "steps": 2, "sim_time_s": 1.5, "bytes_sent": 10})
    html = write_report(run_dir).read_text()
    headers, rows = table_after(html, "<h2>Summary</h2>")
    assert "elapsed time (s)" in headers and "sim time (s)" not in headers
    assert rows[0][headers.index("elapsed time (s)")] == "1.5"


def test_a_worker_figure_not_measured_is_a_blank_cell(comparison):
    """Staleness is not measured under sync (NaN in the timeline): its cell is blank, not "nan"."""
    html = (comparison / "report.html").read_text()
    headers, rows = table_after(html, "<h2>Workers</h2>")
    stale = headers.index("mean staleness")
    sync = [row for row in rows if row[0] == "sync:backups=1"]
    assert len(sync) == 4 and all(row[stale] == "–" for row in sync)
    assert "<td>nan</td>" not in html


def test_the_gradients_a_server_received_are_given_per_worker(comparison, tmp_path):
    """summary.json keys gradients_received by the worker's number as text (JSON keys): each worker's
    row shows its own count, a blank where a worker sent none."""
    run_dir = tmp_path / "served"
    shutil.copytree(comparison / "async", run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps(summary | {"gradients_received": {"0": 3, "1": 2}}))
    html = write_report(run_dir, out=tmp_path / "served.html").read_text()
    headers, rows = table_after(html, "<h2>Workers</h2>")
    assert headers[0] == "worker" and headers[-1] == "gradients received"
    assert [(row[0], row[-1]) for row in rows] == [("0", "3"), ("1", "2"), ("2", "–"), ("3", "–")]


def test_the_config_tables_split_the_keys_the_variants_differ_in_from_the_common_ones(tmp_path):
    """Where the variants differ: the keys they differ in (not ``name``, the label the columns already
    show); common to every variant: the others, each with its one value."""
    runs = [run_folder(tmp_path / "cmp" / name, {"name": name, "algorithm": algorithm, "task": "digits-logreg",
                                                  "lr": 0.1, "out": str(tmp_path / "cmp" / name)},
                       {"label": name, "status": "finished", "steps": 2})
            for name, algorithm in (("a", "sync"), ("b", "async"))]
    html = write_report(tmp_path / "cmp", runs).read_text()
    assert table_after(html, "Where the variants differ:") == (["key", "a", "b"], [["algorithm", "sync", "async"]])
    assert table_after(html, "Common to every variant:") == (["key", "value"], [["lr", "0.1"],
                                                                              ["task", "digits-logreg"]])


@pytest.mark.parametrize("differing, over_seeds, lead", [
    (["seed"], True, "runs (every variant once per seed) on the same task; the runs of one seed share the "
                     "initial model, batches and partition"),
    (["partition"], True, "runs (every variant once per seed) on the same task; the runs of one seed share the "
                          "initial model, batches; they differ in partition (Config below)"),
    (["algorithm"], False, "variants on the same task, seed and partition"),
    (["partition", "lr"], False, "variants on the same task and seed; they differ in partition (Config below)"),
])
def test_the_lead_line_says_what_the_variants_share(differing, over_seeds, lead):
    assert _what_is_compared(differing, over_seeds) == lead


def test_the_best_accuracy_of_a_run_without_a_summary_is_its_greatest(tmp_path):
    """A run still going (or ended without summary.json): its best test accuracy is the greatest
    its metrics recorded, not the first or the last."""
    run_dir = run_folder(tmp_path / "r", {"algorithm": "sync"}, None,
                         [{"step": 0, "test_acc": 0.1}, {"step": 4, "test_acc": 0.9}, {"step": 8, "test_acc": 0.5}])
    summary = RunData(run_dir).summary
    assert summary["best_test_acc"] == 0.9 and summary["final"]["test_acc"] == 0.5
