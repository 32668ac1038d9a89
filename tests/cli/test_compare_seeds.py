"""gradwire compare --seeds: every variant once per seed, paired by seed, summarised over seeds (the
mean, spread and paired difference from the first variant), so that a difference of a few per cent
can be told from seed-to-seed noise."""

import csv
import json
import math
import statistics

import pytest

from gradwire.cli import main
from gradwire.report.compare import mean_curve, seed_rows

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2"]


def final(folder, key="test_loss"):
    return json.loads((folder / "summary.json").read_text())["final"][key]


def test_every_variant_runs_every_seed_and_the_table_pairs_them(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--seeds", "3,5",
                 "--variant", "--algorithm sync", "--variant", "--name q4 --compressor qsgd:levels=4"]) == 0
    for name in ("sync", "q4"):
        for seed in (3, 5):
            assert json.loads((out / f"{name}-seed{seed}" / "config.json").read_text())["seed"] == seed
    # a seed's run is the plain run with that seed: the same numbers
    alone = tmp_path / "alone"
    assert main(["run", *TINY, "--data-dir", str(data_dir), "--out", str(alone), "--seed", "5"]) == 0
    assert final(out / "sync-seed5") == final(alone)
    assert final(out / "sync-seed3") != final(out / "sync-seed5")

    with open(out / "comparison_seeds.csv", newline="") as f:
        rows = {r["label"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"sync", "q4"} and rows["q4"]["finished"] == "2"
    base = [final(out / f"sync-seed{s}") for s in (3, 5)]
    q4 = [final(out / f"q4-seed{s}") for s in (3, 5)]
    paired = [100 * (v / b - 1) for v, b in zip(q4, base)]
    assert float(rows["q4"]["test_loss_mean"]) == pytest.approx(statistics.fmean(q4))
    assert float(rows["q4"]["test_loss_sd"]) == pytest.approx(statistics.stdev(q4))
    assert float(rows["q4"]["test_loss_vs_first_pct"]) == pytest.approx(statistics.fmean(paired))
    assert float(rows["q4"]["test_loss_vs_first_min_pct"]) == pytest.approx(min(paired))
    assert float(rows["sync"]["test_loss_vs_first_pct"]) == 0.0

    md = (out / "comparison.md").read_text()
    assert "## Over seeds 3, 5" in md and f"{statistics.fmean(paired):+.2f} %" in md
    assert "| sync seed 3 |" in md and "| q4 seed 5 |" in md  # every run's own row too
    html = (out / "report.html").read_text()
    assert "Over seeds" in html and f"{statistics.fmean(paired):+.2f} %" in html
    # a comparison without seeds in the same folder leaves no stale table over seeds behind, and its
    # page, drawn again later, shows its own run only (the seeds' folders, which the replaced comparison's
    # table names, are removed)
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--overwrite",
                 "--variant", "--algorithm sync"]) == 0
    assert not (out / "comparison_seeds.csv").exists() and "Over seeds" not in (out / "comparison.md").read_text()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["sync"]
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "sync seed 3" not in html and "1 variants on the same task" in html


def test_the_plot_shows_each_variants_own_mean_curve(tmp_path, data_dir, monkeypatch):
    from gradwire.report import compare

    drawn = {}
    real = compare.plot_runs
    monkeypatch.setattr(compare, "plot_runs", lambda curves, *a, **k: drawn.update(curves) or real(curves, *a, **k))
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--seeds", "0,1,2",
                 "--variant", "--algorithm sync", "--variant", "--name q4 --compressor qsgd:levels=4"]) == 0
    assert sorted(drawn) == ["q4 (mean of 3 seeds)", "sync (mean of 3 seeds)"]
    for name in ("sync", "q4"):
        runs = [[json.loads(line) for line in (out / f"{name}-seed{s}" / "metrics.jsonl").read_text().splitlines()]
                for s in (0, 1, 2)]
        assert drawn[f"{name} (mean of 3 seeds)"] == mean_curve(runs)
        assert drawn[f"{name} (mean of 3 seeds)"][-1]["test_loss"] == pytest.approx(
            statistics.fmean(final(out / f"{name}-seed{s}") for s in (0, 1, 2)))
    # the page drawn again later, without an up-to-date comparison.png, draws the same mean curves
    from gradwire.report import pages

    again = {}
    monkeypatch.setattr(pages, "plot_runs", lambda curves, *a, **k: again.update(curves) or real(curves, *a, **k))
    (out / "comparison.png").unlink()
    assert main(["report", str(out)]) == 0
    assert again == drawn


@pytest.mark.parametrize("seeds, words", [
    ("0,x", "'x' is not a seed"),
    ("1,2,1", "seed(s) [1] more than once"),
    ("-1", "'-1' is not a seed"),
    ("", "'' is not a seed"),
    ("1" * 5000, "is not a seed"),  # too long for a seed: the same one line, no traceback
])
def test_bad_seeds_are_named(tmp_path, data_dir, capsys, seeds, words):
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "c"), "--seeds", seeds,
                 "--variant", "--algorithm sync"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "--seeds" in err[0], err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("seeds, own", [("0,1", "7"), ("0,1", "0"), ("5", "0")])
def test_a_variant_with_its_own_seed_is_refused_with_seeds(tmp_path, data_dir, capsys, seeds, own):
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "c"), "--seeds", seeds,
                 "--variant", "--algorithm sync", "--variant", f"--name pinned --seed {own}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "['pinned'] set their own seed" in err and f"({seeds})" in err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("seeds", ["0,1", "5"])
def test_seeds_with_seed_on_the_command_line_is_refused(tmp_path, data_dir, capsys, seeds):
    """--seeds replaces --seed: given both, --seed was silently dropped."""
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "c"), "--seeds", seeds,
                 "--seed", "5", "--variant", "--algorithm sync"]) == 2
    assert capsys.readouterr().err == (f"gradwire compare: error: --seeds {seeds} runs every variant once per seed, "
                                       "which replaces --seed 5: give one of them\n")
    assert not (tmp_path / "c").exists()


def test_seeds_in_the_config_file_with_seed_on_the_command_line_is_refused(tmp_path, data_dir, capsys):
    """The same where the seeds come from --config (seeds: [0, 1]): --seed 5 was dropped there too."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seeds: [0, 1]\nvariants:\n  - {algorithm: sync}\n")
    assert main(["compare", "--config", str(cfg), *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "c"),
                 "--seed", "5"]) == 2
    assert capsys.readouterr().err == ("gradwire compare: error: --seeds 0,1 runs every variant once per seed, "
                                       "which replaces --seed 5: give one of them\n")
    assert not (tmp_path / "c").exists()


def test_variants_that_would_share_a_folder_are_refused(tmp_path, data_dir, capsys):
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "c"), "--seeds", "0,1",
                 "--variant", "--name 'a b'", "--variant", "--name a_b"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'a b' and 'a_b' would share the folder 'a_b'" in err
    assert not (tmp_path / "c").exists()


def test_a_variant_named_with_dots_stays_inside_the_comparison(tmp_path, data_dir):
    """A variant named ``..`` (or ``.``, ``.x``) is a folder inside the comparison: ``..`` wrote its run
    into the folder above, and ``.`` beside comparison.md."""
    from gradwire.cli.flags import slug

    assert [slug(t) for t in ("..", ".", ".x", "a.b", "v1.0")] == ["run", "run", "x", "a.b", "v1.0"]
    out = tmp_path / "parent" / "c"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out),
                 "--variant", "--name .. --algorithm sync", "--variant", "--name .x --algorithm local"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["run", "x"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["c"]


@pytest.mark.parametrize("seeds", ["[0, 1]", "'0,1'"])
def test_seeds_in_the_config_file(tmp_path, data_dir, seeds):
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(f"task: digits-logreg\nworkers: 2\nsteps: 2\neval_every: 2\nseeds: {seeds}\n"
                   "variants:\n  - {algorithm: sync}\n")
    assert main(["compare", "--config", str(cfg), "--data-dir", str(data_dir), "--out", str(tmp_path / "c")]) == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir() if p.is_dir()) == ["sync-seed0", "sync-seed1"]
    # gradwire run takes the comparison's common keys, as it takes them beside `variants`
    assert main(["run", "--config", str(cfg), "--data-dir", str(data_dir), "--out", str(tmp_path / "r")]) == 0


def summary(status, loss, mb=1.0):
    return {"status": status, "bytes_sent": mb * 1e6, "sim_time_s": 1.0,
            "final": None if loss is None else {"test_loss": loss, "test_acc": 0.5}}


def test_runs_that_did_not_finish_are_left_out_of_the_figures():
    base = [summary("finished", 2.0), summary("finished", 4.0), summary("finished", 3.0)]
    other = [summary("finished", 2.2), summary("diverged", math.nan), summary("stopped", 3.3)]
    rows = seed_rows([0, 1, 2], ["base", "other"], [base, other])
    assert rows[0]["finished"] == 3 and rows[1]["finished"] == 1
    assert rows[0]["test_loss_mean"] == pytest.approx(3.0) and rows[0]["test_loss_sd"] == pytest.approx(1.0)
    assert rows[1]["test_loss_mean"] == pytest.approx(2.2) and rows[1]["test_loss_sd"] is None  # one value
    assert rows[1]["test_loss_vs_first_pct"] == pytest.approx(10.0)  # seed 0 only: 2.2 against 2.0
    assert rows[1]["mb_sent"] == 1.0  # of the finished run only
    other[0]["bytes_sent"] = 3e6
    assert seed_rows([0, 1, 2], ["base", "other"], [base, other])[1]["mb_sent"] == 3.0
    # a variant that finished no seed has no figures, rather than zeros
    rows = seed_rows([0], ["base", "gone"], [[summary("finished", 2.0)], [summary("diverged", None)]])
    assert "test_loss_mean" not in rows[1] and rows[1]["finished"] == 0 and rows[1]["mb_sent"] is None


def test_the_mean_curve_averages_the_steps_every_seed_reached():
    a = [{"step": 0, "train_loss": 4.0, "bytes_sent": 0}, {"step": 2, "train_loss": 2.0, "bytes_sent": 10},
         {"step": 4, "train_loss": 1.0, "bytes_sent": 20}]
    b = [{"step": 0, "train_loss": 6.0, "bytes_sent": 0}, {"step": 2, "train_loss": 3.0, "bytes_sent": 10,
                                                           "test_loss": 1.0}]  # diverged after step 2
    curve = mean_curve([a, b])
    assert [r["step"] for r in curve] == [0, 2]
    assert [r["train_loss"] for r in curve] == [5.0, 2.5]
    assert [(r["train_loss:lo"], r["train_loss:hi"]) for r in curve] == [(4.0, 6.0), (2.0, 3.0)]
    assert "test_loss" not in curve[1] and "test_loss:lo" not in curve[1]  # one seed only: no mean of it
    assert "bytes_sent:lo" not in curve[1]  # an x-axis: its mean only


def test_one_seed_is_that_seed(tmp_path, data_dir):
    out = tmp_path / "c"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--seeds", "7",
                 "--variant", "--algorithm sync"]) == 0
    assert json.loads((out / "sync" / "config.json").read_text())["seed"] == 7
    assert not (out / "comparison_seeds.csv").exists()


def test_paired_percentages_stay_short():
    # a first variant whose loss is close to 0 makes the paired differences huge: they print in
    # three significant digits, not as a long fixed-point number
    from gradwire.report.compare import seed_cells

    row = {"label": "b", "finished": 2, "seeds": 2, "mb_sent": 1.0, "test_loss_mean": 2.0, "test_loss_sd": 0.1,
           "test_loss_min": 1.9, "test_loss_max": 2.1, "test_loss_vs_first_pct": 2e9,
           "test_loss_vs_first_min_pct": 1.5e9, "test_loss_vs_first_max_pct": 0.53}
    _, cells = seed_cells([row])
    assert "+2e+09 % (+1.5e+09 .. +0.53)" in cells[0]


def test_the_mean_curve_averages_known_numbers_and_bands_their_range():
    """Two seeds' curves with known numbers: the mean at the steps both reached, the least and greatest
    as the band, a step one seed lacks left out."""
    a = [{"step": 0, "test_loss": 2.0, "test_acc": 0.1}, {"step": 5, "test_loss": 1.0, "test_acc": 0.5},
         {"step": 10, "test_loss": 0.5, "test_acc": 0.7}]
    b = [{"step": 0, "test_loss": 4.0, "test_acc": 0.3}, {"step": 5, "test_loss": 2.0, "test_acc": 0.4}]
    got = mean_curve([a, b])
    assert [r["step"] for r in got] == [0, 5]
    assert got[1]["test_loss"] == 1.5 and got[1]["test_loss:lo"] == 1.0 and got[1]["test_loss:hi"] == 2.0
    assert got[0]["test_acc"] == pytest.approx(0.2) and (got[0]["test_acc:lo"], got[0]["test_acc:hi"]) == (0.1, 0.3)


def test_a_seed_that_did_not_finish_is_left_out_of_the_mean_curve(tmp_path, data_dir, monkeypatch):
    """As the table and the page's note say: a diverged seed's curve (cut short, its last loss huge)
    is in no mean curve, on comparison.png and on the report page drawn again; it took the finished
    seeds' curves down to the steps it reached, and its loss into their mean."""
    from gradwire.report import compare, pages

    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--seeds", "0,1",
                 "--variant", "--algorithm sync"]) == 0
    bad = out / "sync-seed1"
    rows = [json.loads(line) for line in (bad / "metrics.jsonl").read_text().splitlines()][:1]
    rows.append({**rows[0], "step": rows[0]["step"] + 1, "test_loss": 1e30})
    (bad / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((bad / "summary.json").read_text()) | {"status": "diverged"}
    (bad / "summary.json").write_text(json.dumps(summary))
    good = [json.loads(line) for line in (out / "sync-seed0" / "metrics.jsonl").read_text().splitlines()]
    drawn: dict = {}
    real = pages.plot_runs
    monkeypatch.setattr(pages, "plot_runs", lambda curves, *a, **k: drawn.update(curves) or real(curves, *a, **k))
    (out / "comparison.png").unlink()
    assert main(["report", str(out)]) == 0
    assert list(drawn) == ["sync (mean of 1 seeds)"] and drawn["sync (mean of 1 seeds)"] == mean_curve([good])
    drawn.clear()
    monkeypatch.setattr(compare, "plot_runs", lambda curves, *a, **k: drawn.update(curves) or real(curves, *a, **k))
    summaries = [json.loads((out / f"sync-seed{s}" / "summary.json").read_text()) for s in (0, 1)]
    compare.write_report(out, summaries, [out / "sync-seed0", bad], "t", seeds=[0, 1], labels=["sync"])
    assert list(drawn) == ["sync (mean of 1 seeds)"] and drawn["sync (mean of 1 seeds)"] == mean_curve([good])


def test_a_variant_name_with_a_bar_or_markup_keeps_the_markdown_table_whole(tmp_path, data_dir):
    """comparison.md escapes a cell's ``|`` (a column more) and ``<`` (raw HTML in the markdown)."""
    out = tmp_path / "c"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out),
                 "--variant", "--name 'a|b <i>' --algorithm sync"]) == 0
    rows = [line for line in (out / "comparison.md").read_text().splitlines() if line.startswith("| a")]
    assert len(rows) == 1 and rows[0].startswith("| a\\|b &lt;i> |")
    header = next(line for line in (out / "comparison.md").read_text().splitlines() if line.startswith("| variant"))
    assert rows[0].replace("\\|", "").count("|") == header.count("|")
