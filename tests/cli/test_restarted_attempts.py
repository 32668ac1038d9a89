"""A restarted attempt of ``gradwire launch --max-restarts`` (cli/supervise.py) resumes the run the
first attempt started: with ``--overwrite`` in the run command it could never start (the run
refuses --overwrite beside --resume-or-start), so every restart failed at once."""

import json
import os
import subprocess
import sys

from gradwire.cli import main
from gradwire.cli.supervise import restarted_command

RUN = ["python", "-u", "-m", "gradwire", "run", "--steps", "4"]


def test_a_restarted_command_resumes_without_overwrite():
    assert restarted_command([*RUN, "--overwrite"]) == [*RUN, "--resume-or-start"]
    assert restarted_command(RUN) == [*RUN, "--resume-or-start"]
    # a config file may say overwrite: true; the flag after it wins
    assert restarted_command([*RUN, "--config", "r.yaml"]) == [*RUN, "--config", "r.yaml", "--no-overwrite",
                                                               "--resume-or-start"]
    for asked in ("--resume", "--resume-or-start"):  # the run command's own choice stands
        assert restarted_command([*RUN, asked]) == [*RUN, asked]


def test_the_supervisor_gives_a_restarted_attempt_that_command():
    show = "import sys; print(sys.argv[1:])"
    env = dict(os.environ, RANK="1", TORCHELASTIC_RESTART_COUNT="1")
    p = subprocess.run([sys.executable, "-m", "gradwire.cli.supervise", "--resume-on-restart", sys.executable, "-c",
                        show, "--steps", "4", "--overwrite"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "['--steps', '4', '--resume-or-start']", p.stderr


def test_a_restarted_overwrite_run_resumes_its_first_attempt(tmp_path, data_dir, capsys, monkeypatch):
    """First attempt: --overwrite replaces an old run, checkpoints step 2 and fails in step 3; the
    restarted attempt's command resumes it from step 2 and finishes (it was refused: exit 2)."""
    from gradwire.run.loop import Run

    out = tmp_path / "o"
    argv = ["run", "--task", "digits-logreg", "--workers", "2", "--steps", "6", "--eval-every", "2",
            "--checkpoint-every", "2", "--data-dir", str(data_dir), "--out", str(out), "--overwrite"]
    assert main(argv[:-1]) == 0  # the old run that --overwrite replaces
    train_step = Run.train_step

    def dies_in_step_3(self):
        if self.step == 2:
            raise RuntimeError("a worker process died")
        return train_step(self)

    monkeypatch.setattr(Run, "train_step", dies_in_step_3)
    try:
        main(argv)
    except RuntimeError:
        pass
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    monkeypatch.setattr(Run, "train_step", train_step)
    capsys.readouterr()
    assert main(restarted_command(argv)) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_from_step"] == 2 and summary["steps"] == 6


def test_launch_restarts_an_overwrite_run_from_its_checkpoint(tmp_path, data_dir):
    """End to end on the torch backend: worker 1's process is killed after step 5 of a run that
    --overwrite started over an old one; the restarted group resumes from step 4 and finishes."""
    from tests.helpers import gw

    out = tmp_path / "o"
    common = ["--task", "digits-logreg", "--data-dir", str(data_dir), "--out", str(out), "--no-curves"]
    assert gw("run", *common, "--workers", "2", "--steps", "4").returncode == 0
    p = gw("launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", "run", *common, "--steps", "10",
           "--eval-every", "5", "--checkpoint-every", "4", "--overwrite", env=dict(os.environ, GRADWIRE_KILL_AT="1:5"),
           timeout=300)
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 10 and summary["resumed_from_step"] == 4
