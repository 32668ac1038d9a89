"""Defects a new user's review of compare and the config file found: each test here failed before
its fix (a replaced comparison's report.html left beside its new table, a resumed variant's other
settings reported as other --steps, a file's seeds run as one seed, a file's folder mode against
a flag's, compare's --help describing a run's folder)."""

import json

from gradwire.cli import main

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_comparison_written_without_html_leaves_no_older_report_html(tmp_path, data_dir, capsys):
    """--overwrite --no-html and --resume --no-html (a variant added) write a new table: the older
    comparison's report.html, which shows the variants replaced, goes with it (as a run's report.html
    goes with the run --overwrite replaces)."""
    out = tmp_path / "cmp"
    base = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out)]
    assert main([*base, "--no-html", "--variant", "--algorithm sync", "--variant", "--algorithm local"]) == 0
    (out / "report.html").write_text("the page of sync and local")
    assert main([*base, "--overwrite", "--no-html", "--variant", "--algorithm diana"]) == 0
    assert not (out / "report.html").exists()
    assert "diana" in (out / "comparison.md").read_text() and not (out / "local").exists()
    assert main([*base, "--resume", "--variant", "--algorithm diana"]) == 0  # --html: written again
    assert "diana" in (out / "report.html").read_text()
    added = ["--variant", "--algorithm diana", "--variant", "--algorithm sync"]
    assert main([*base, "--resume", "--no-html", *added]) == 0
    assert not (out / "report.html").exists()
    assert "| sync |" in (out / "comparison.md").read_text()


def test_a_run_continued_without_curves_leaves_no_older_curves_png(tmp_path, data_dir):
    """--resume --no-curves: the curves.png of the run before it was continued (fewer steps) goes, as
    comparison.md then says (\"no curves.png: the runs were made with --no-curves\")."""
    out = tmp_path / "run"
    run = ["run", *TINY, "--checkpoint-every", "2", "--data-dir", str(data_dir), "--out", str(out)]
    assert main(run) == 0
    (out / "curves.png").write_bytes(b"the curves of steps 0-4")  # (the tests draw no curves: conftest.py)
    assert main([*run, "--steps", "6", "--resume", "--no-curves"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert not (out / "curves.png").exists()


def test_compare_resume_with_other_settings_names_them(tmp_path, data_dir, capsys):
    """A variant that finished without a checkpoint, resumed with another --lr and the same --steps:
    the refusal names the lr, with the variant (it said the variant could not go on to --steps 4,
    the steps it has); other --steps keep their own message."""
    out = tmp_path / "cmp"
    base = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html",
            "--variant", "--algorithm sync --lr 0.5", "--variant", "--algorithm local"]
    assert main(base) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock"}
    capsys.readouterr()
    assert main([*base, "--lr", "0.05", "--resume"]) == 2  # sync keeps its own --lr 0.5; local's changes
    assert one_line(capsys) == (
        f"gradwire compare: error: variant 'local': run folder {out / 'local'} holds a run that finished at step 4 "
        "with other settings (lr: 0.8 there vs 0.05 now) and saved no checkpoint to continue it from; starting "
        "again from step 0 would replace it: give its settings to keep it, pass --overwrite to replace it, or "
        "choose another --out (--lr)")
    assert main([*base, "--steps", "6", "--resume"]) == 2
    assert "variant 'sync' finished at step 4" in one_line(capsys)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock"} == before


def test_compare_resume_from_checkpoints_with_other_settings_is_refused_before_any_variant_runs(
        tmp_path, data_dir, capsys):
    """Variants that saved checkpoints, resumed to more --steps with another --lr for the second: the
    second's checkpoint does not fit, and that is said before the first variant runs on (it ran on to
    --steps 6, then the second failed at its checkpoint's load)."""
    out = tmp_path / "cmp"
    base = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html", "--checkpoint-every", "2",
            "--variant", "--algorithm sync --lr 0.5", "--variant", "--algorithm local"]
    assert main(base) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock"}
    capsys.readouterr()
    assert main([*base, "--steps", "6", "--lr", "0.05", "--resume"]) == 2
    line = one_line(capsys)
    assert line.startswith("gradwire compare: error: variant 'local': checkpoint ") and "lr: checkpoint 0.8" in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock"} == before
    assert main([*base, "--steps", "6", "--resume"]) == 0  # the same settings go on


def test_run_refuses_a_config_file_with_seeds(tmp_path, data_dir, capsys):
    """seeds is compare's key: `gradwire run --config` with it ran one seed (seed 0, or the file's
    seed) without a word; refused in one line, before anything is written. A comparison's file
    (with variants) still gives the run its common keys, and its note names the seed it runs."""
    config = tmp_path / "f.yaml"
    config.write_text("task: digits-logreg\nsteps: 4\nworkers: 2\nseed: 4\nseeds: [0, 1]\n")
    out = tmp_path / "run"
    assert main(["run", "--config", str(config), "--data-dir", str(data_dir), "--out", str(out)]) == 2
    assert one_line(capsys) == (f"gradwire run: error: seeds=[0, 1] in {config} is gradwire compare's key: "
                                f"`gradwire compare --config {config}` runs each seed; a run has one seed: give "
                                "seed: S in the file, or --seed S (--seeds)")
    assert not out.exists()
    # --seed on the command line chooses the run's one seed, as the refusal says to
    assert main(["run", "--config", str(config), "--seed", "1", "--data-dir", str(data_dir), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["seed"] == 1
    capsys.readouterr()
    out = tmp_path / "run2"
    config.write_text("task: digits-logreg\nsteps: 4\nworkers: 2\nseeds: [0, 1]\nvariants:\n  - {algorithm: sync}\n")
    assert main(["run", "--config", str(config), "--data-dir", str(data_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().err == (f"gradwire run: {config} lists 1 variants and seeds [0, 1], which `gradwire "
                                       "compare` runs; this is one run of the file's common keys (seed 0)\n")


def test_an_unknown_config_key_lists_compares_keys_too(tmp_path, capsys):
    config = tmp_path / "f.yaml"
    config.write_text("task: digits-logreg\nseed_list: [0, 1]\n")
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    line = one_line(capsys)
    assert "unknown config key 'seed_list'; valid keys: task, " in line
    assert line.endswith("(each also a flag: --key-name), and gradwire compare's own: variants, seeds (at the top "
                         "of its config file)")


def test_a_folder_mode_flag_overrides_the_files(tmp_path, data_dir, capsys):
    """resume, resume_or_start and overwrite are one choice (how the folder is treated): a flag for it
    replaces the file's (it was refused as two conflicting flags, one of them never typed); two such
    flags on the command line are still refused."""
    config = tmp_path / "f.yaml"
    config.write_text("task: digits-logreg\nsteps: 4\nworkers: 2\neval_every: 2\nresume: true\ncheckpoint_every: 2\n")
    out = tmp_path / "run"
    base = ["run", "--config", str(config), "--data-dir", str(data_dir), "--out", str(out)]
    assert main([*base, "--resume-or-start"]) == 0, capsys.readouterr().err  # nothing there yet: starts
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    (out / "mine.txt").write_text("kept")
    assert main([*base, "--overwrite", "--steps", "2"]) == 0, capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["steps"] == 2 and (out / "mine.txt").exists()
    capsys.readouterr()
    assert main([*base, "--overwrite", "--resume"]) == 2
    assert one_line(capsys).endswith("--overwrite replaces the run in " + str(out) + " and --resume continues it: "
                                     "pass one of them")
    assert main(base) == 0  # no flag: the file's choice, resume, continues the run to the file's 4 steps
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["resumed"]


def test_compare_help_describes_the_comparison_folder(capsys, monkeypatch):
    """compare's --out, --curves and --tensorboard say what compare writes (a comparison folder, each
    variant's run in a subfolder), not what a run writes; run's own help is unchanged."""
    monkeypatch.setenv("COLUMNS", "1000")  # (argparse's width: a help on one line)
    for command in ("compare", "run"):
        try:
            main([command, "--help"])
        except SystemExit:
            pass
    text = " ".join(capsys.readouterr().out.split())
    compare_help, run_help = text.split("usage: gradwire run", 1)
    assert "--out OUT comparison folder: comparison.md, comparison.csv, comparison.png, report.html, and each " \
           "variant's run in OUT/<variant>/" in compare_help
    assert "(default: a fresh runs/compare-<YYYYmmdd-HHMMSS>)" in compare_help
    assert "draw each variant's OUT/<variant>/curves.png at the end" in compare_help
    assert "also write each variant's scalars to OUT/<variant>/tensorboard" in compare_help
    assert "OUT/curves.png" not in compare_help and "run folder" not in compare_help
    assert "--out OUT run folder (default: a fresh runs/<label>-<YYYYmmdd-HHMMSS>)" in run_help
    assert "draw OUT/curves.png at the end" in run_help
