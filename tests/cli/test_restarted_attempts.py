"""A restarted attempt of ``gradwire launch --max-restarts`` (cli/supervise.py) resumes the run the
first attempt started: with ``--overwrite`` in the run command it could never start (the run
refuses --overwrite beside --resume-or-start), so every restart failed at once."""

import json
import os
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("how", ["failed", "killed"])
def test_a_restarted_overwrite_run_that_failed_before_writing_starts_afresh(tmp_path, data_dir, capsys, monkeypatch,
                                                                          how):
    """First attempt: --overwrite of an old finished run fails while the run is built (a rank never
    joined: ``failed``) or is killed there (its set-aside old run left behind: ``killed``); the
    restarted attempt (--resume-or-start, no --overwrite) replaces the old run with a new one from
    step 0. It found the old run back and said 'already finished' (exit 0, the old run kept)."""
    from gradwire.report.run_folder import set_aside
    from gradwire.run import loop

    out = tmp_path / "o"
    base = ["run", "--task", "digits-logreg", "--workers", "2", "--eval-every", "2", "--checkpoint-every", "2",
            "--data-dir", str(data_dir), "--out", str(out), "--no-curves"]
    assert main([*base, "--steps", "6", "--lr", "0.05"]) == 0  # the old run
    argv = [*base, "--steps", "6", "--lr", "0.02", "--overwrite"]
    if how == "failed":
        def never_joined(self, *args, **kwargs):
            raise RuntimeError("rank 1 never joined the rendezvous")

        monkeypatch.setattr(loop.Run, "__init__", never_joined)
        with pytest.raises(RuntimeError, match="never joined"):
            main(argv)
        monkeypatch.undo()
    else:
        set_aside(out)  # what a kill right after the claim leaves
    capsys.readouterr()
    assert main(restarted_command(argv)) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary.get("resumed_from_step") is None
    assert json.loads((out / "config.json").read_text())["lr"] == 0.02  # the new run's
    assert not (out / ".gradwire-replaced").exists()


def test_an_overwrite_refused_while_built_puts_the_old_run_back_and_a_plain_claim_recovers_a_killed_one(
        tmp_path, data_dir):
    """A refusal (ConfigError) while the run is built, and a kill after the claim followed by a plain
    run's claim, both leave the old run as it was; so does a kill in the middle of setting it aside
    (its half-made aside is moved back whole, whatever the next claim)."""
    from gradwire.report.run_folder import REPLACED_NAME, _run_entries, claim, set_aside

    out = tmp_path / "o"
    base = ["run", "--task", "digits-logreg", "--workers", "2", "--eval-every", "2", "--data-dir", str(data_dir),
            "--out", str(out), "--no-curves", "--steps", "4"]
    assert main(base) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".gradwire.lock"}
    assert main([*base, "--batch-size", "5000", "--overwrite"]) == 2  # refused once the run is built
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".gradwire.lock"} == before
    set_aside(out)
    claim(out, overwrite=False, resume=True).release()  # a plain --resume's claim: the old run back
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".gradwire.lock"} == before
    aside = out / REPLACED_NAME  # killed after moving one entry of the old run
    aside.mkdir()
    first = _run_entries(out)[0]
    first.rename(aside / first.name)
    claim(out, overwrite=False, resume=True, replacing=True).release()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".gradwire.lock"} == before
    assert not aside.exists()
