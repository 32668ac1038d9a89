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
