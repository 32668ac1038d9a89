"""plan refuses, in one line and before any run, what it would have accepted and ignored: a
candidate's --workers or --out, run flags its profiling overrides (--resume, --resume-or-start,
--checkpoint-every), a negative --validate-max-steps, and an --out that is a run's or a comparison's
folder or holds other results; it honours ``workers:`` in its --config file."""

import pytest

from gradwire.cli import main

BASE = ["plan", "--task", "digits-logreg", "--steps", "2", "--target-loss", "1"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("args, needles", [
    (["--candidate", "--workers 3"], ["--candidate '--workers 3' sets --workers 3", "would ignore", "(--workers)"]),
    (["--candidate", "--name x --out X"], ["sets --out X", "OUT/profile", "(--out)"]),
    (["--candidate", "--name x --resume"], ["sets --resume,", "(--resume)"]),
    (["--resume"], ["plan's command line sets --resume,", "(--resume)"]),
    (["--resume-or-start"], ["sets --resume-or-start,", "(--resume-or-start)"]),
    (["--checkpoint-every", "5"], ["sets --checkpoint-every 5", "(--checkpoint-every)"]),
    (["--resume", "--overwrite"], ["sets --resume,"]),
    (["--validate-max-steps", "-1"], ["validate-max-steps=-1 must be >= 0", "(--validate-max-steps)"]),
])
def test_plan_refuses_what_it_would_ignore(tmp_path, capsys, args, needles):
    out = tmp_path / "p"
    assert main([*BASE, "--out", str(out), *args]) == 2
    line = one_line(capsys)
    assert line.startswith("gradwire plan: error: ") and all(n in line for n in needles), line
    assert not out.exists()


def test_plan_refuses_resume_in_its_config_file(tmp_path, capsys):
    config = tmp_path / "p.yaml"
    config.write_text("resume_or_start: true\n")
    assert main([*BASE, "--config", str(config), "--out", str(tmp_path / "p")]) == 2
    assert "sets --resume-or-start," in one_line(capsys)


def test_plan_takes_its_worker_counts_from_the_config_file(tmp_path, capsys):
    """``workers: [2, 4]`` in the file: plan's counts (ignored before: 1,2,4,8), here refused for
    giving 2 distinct counts where the fit needs 3, which shows they were read."""
    config = tmp_path / "p.yaml"
    config.write_text("workers: [2, 4]\n")
    assert main([*BASE, "--config", str(config), "--out", str(tmp_path / "p")]) == 2
    assert "workers=2,4 gives 2 distinct" in one_line(capsys)


def test_plan_refuses_an_out_that_is_a_run_or_holds_other_results(tmp_path, data_dir, capsys):
    run_folder = tmp_path / "runs" / "r"
    assert main(["run", "--task", "digits-logreg", "--workers", "2", "--steps", "2", "--eval-every", "2",
                 "--data-dir", str(data_dir), "--out", str(run_folder)]) == 0
    before = sorted(p.name for p in run_folder.iterdir())
    capsys.readouterr()
    assert main([*BASE, "--out", str(run_folder)]) == 2
    assert f"plan folder {run_folder} holds a run (summary.json): a plan needs a folder of its own" in one_line(capsys)
    assert main([*BASE, "--out", str(tmp_path / "runs")]) == 2
    assert "holds other results (r/ is a run, comparison or plan)" in one_line(capsys)
    assert sorted(p.name for p in run_folder.iterdir()) == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r"]


SYNTH = ["plan", "--task", "synthetic-logreg:samples=256,dim=5", "--steps", "2", "--workers", "1,2,4"]


@pytest.mark.parametrize("args, line", [
    # inf passed the > 0 check: all profiling ran, then the prediction crashed (OverflowError, exit 1)
    (["--deadline", "inf"], "deadline=inf must be a finite number of seconds > 0 (--deadline)"),
    (["--target-loss", "1", "--budget", "inf"],
     "budget=inf must be a finite number of seconds > 0; without --budget every --workers count is profiled "
     "(--budget)"),
    # --algorithms replaced --algorithm unseen (compare refuses --seed with --seeds likewise)
    (["--target-loss", "1", "--algorithm", "diana", "--algorithms", "sync,local"],
     "--algorithm diana and --algorithms sync,local: the candidates' algorithms are those of --algorithms, so "
     "--algorithm would be ignored; give one of them (add diana to --algorithms)"),
    (["--target-loss", "1", "--compressor", "qsgd", "--compressors", "none"],
     "--compressor qsgd and --compressors none: the candidates' compressors are those of --compressors, so "
     "--compressor would be ignored; give one of them (add qsgd to --compressors)"),
])
def test_plan_refuses_an_endless_goal_or_a_flag_a_list_replaces(tmp_path, capsys, args, line):
    out = tmp_path / "p"
    assert main([*SYNTH, "--out", str(out), *args]) == 2
    assert one_line(capsys) == f"gradwire plan: error: {line}"
    assert not out.exists()  # before any profiling run


@pytest.mark.parametrize("args, start", [
    # each was accepted: an empty list read as no list (the common algorithm), an empty item dropped,
    # and "--algorithms ," profiled nothing and then failed with "no candidate could be fitted ()"
    (["--algorithms", ""], "--algorithms '' gives no value; expected comma-separated algorithm specs (async, "),
    (["--algorithms", ","], "--algorithms ',' gives no value; expected comma-separated algorithm specs (async, "),
    (["--algorithms", "sync,,local"], "--algorithms 'sync,,local' has an empty item (a stray ','); expected "
     "comma-separated algorithm specs (async, "),
    (["--compressors", "none,"], "--compressors 'none,' has an empty item (a stray ','); expected comma-separated "
     "compressor specs (bf16, "),
    (["--candidate", ""], "--candidate '' gives no run flags; give the flags that make the candidate differ from "
     "the common ones, e.g. --candidate \"--compressor topk:ratio=0.01\""),
    (["--candidate", "--name a --compressor sign", "--candidate", " "], "--candidate ' ' gives no run flags;"),
    (["--workers", "1,,2,4"], "--workers '1,,2,4' has an empty item (a stray ','); expected comma-separated integers"),
    (["--validate", ""], "--validate '' gives no value; expected comma-separated integers"),
])
def test_plan_refuses_an_empty_candidate_list_or_item(tmp_path, capsys, args, start):
    out = tmp_path / "p"
    assert main([*SYNTH, "--target-loss", "1", "--out", str(out), *args]) == 2
    line = one_line(capsys)
    assert line.startswith(f"gradwire plan: error: {start}"), line
    if "specs (" in start:  # the valid names, from the registries' torch-free table
        assert ("diana" in line and "sync" in line) if "algorithm" in start else ("qsgd" in line and "none" in line)
    assert not out.exists()
