"""The command line: clear one-line errors, a run folder, divergence handling."""

import contextlib
import io
import json

import pytest

from gradwire.cli import main
from tests.helpers import gw, read_jsonl


@pytest.mark.parametrize("args, needle", [
    (["run", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "--algorithm", "sinc"], "unknown algorithm 'sinc'; valid algorithms: async, "),
    (["run", "--compressor", "qsgd:level=4"], "compressor 'qsgd' has no parameter 'level'"),
    (["run", "--workers", "zero"], "workers='zero' is not a valid int"),
    (["run", "--batch-size", "-3"], "batch_size=-3 must be a positive integer"),
    (["run", "--dtype", "float16"], "valid choices are float32, float64"),
    (["run", "--algorithm", "sync:backups=8", "--workers", "8", "--steps", "1"], "backups=8 leaves no worker"),
    (["run", "--config", "missing.yaml"], "config file 'missing.yaml' does not exist"),
])
def test_bad_input_one_line_no_traceback(tmp_path, args, needle):
    p = gw(*args, "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path / "d"))
    assert p.returncode == 2
    assert needle in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_bad_config_key_in_file(tmp_path):
    (tmp_path / "c.yaml").write_text("task: digits-logreg\nlearning_rate: 0.1\n")
    p = gw("run", "--config", str(tmp_path / "c.yaml"))
    assert p.returncode == 2 and "unknown config key 'learning_rate'" in p.stderr and "valid keys:" in p.stderr


@pytest.mark.curves
def test_run_writes_folder_and_flags_override_file(tmp_path, data_dir):
    (tmp_path / "c.toml").write_text('task = "digits-logreg"\nsteps = 999\nworkers = 3\n')
    out = tmp_path / "run"
    code = main(["run", "--config", str(tmp_path / "c.toml"), "--steps", "6", "--eval-every", "3",
                 "--out", str(out), "--data-dir", str(data_dir)])
    assert code == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["steps"] == 6 and cfg["workers"] == 3 and cfg["task"] == "digits-logreg"
    recs = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [0, 3, 6]
    for key in ("sim_time_s", "wall_time_s", "bytes_sent", "train_loss", "test_loss", "test_acc"):
        assert key in recs[-1]
    assert recs[-1]["bytes_sent"] > recs[1]["bytes_sent"] > 0
    # eval_time_s: the seconds spent in the evaluations before each row, so that wall_time_s less it,
    # the time spent training, grows with the steps
    assert recs[0]["eval_time_s"] == 0 < recs[1]["eval_time_s"] < recs[2]["eval_time_s"]
    training = [r["wall_time_s"] - r["eval_time_s"] for r in recs]
    assert training == sorted(training) and recs[2]["eval_time_s"] < recs[2]["wall_time_s"]
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    assert (out / "curves.png").stat().st_size > 10_000


@pytest.mark.curves
def test_no_curves_leaves_out_curves_png_and_nothing_else(tmp_path, data_dir):
    from gradwire.cli import main

    small = ["run", "--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2",
             "--data-dir", str(data_dir)]
    assert main([*small, "--out", str(tmp_path / "drawn")]) == 0
    assert main([*small, "--no-curves", "--out", str(tmp_path / "left")]) == 0
    assert (tmp_path / "drawn" / "curves.png").stat().st_size > 10_000
    assert not (tmp_path / "left" / "curves.png").exists()
    drawn = sorted(p.name for p in (tmp_path / "drawn").iterdir())
    assert sorted(p.name for p in (tmp_path / "left").iterdir()) == [n for n in drawn if n != "curves.png"]
    assert json.loads((tmp_path / "left" / "config.json").read_text())["curves"] is False


def test_a_failure_mid_run_is_recorded_as_failed(tmp_path, data_dir, monkeypatch):
    from gradwire.config import RunConfig
    from gradwire.errors import CommunicationError
    from gradwire.run import loop

    calls = []

    def train_step(self):
        calls.append(1)
        if len(calls) == 4:
            raise CommunicationError("rank 1 vanished")
        return original(self)

    original = loop.Run.train_step
    monkeypatch.setattr(loop.Run, "train_step", train_step)
    out = tmp_path / "fail"
    with pytest.raises(CommunicationError):
        loop.run(RunConfig(task="digits-logreg", workers=2, steps=10, eval_every=1, out=str(out),
                           data_dir=str(data_dir)))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 3  # the 4th never completed
    assert summary["error"] == "CommunicationError: rank 1 vanished"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4  # steps 0-3 kept


def test_divergence_names_step_and_worker_and_keeps_metrics(tmp_path, data_dir):
    out = tmp_path / "div"
    p = gw("run", "--task", "digits-mlp", "--workers", "2", "--lr", "1e10", "--steps", "50",
           "--eval-every", "1", "--out", str(out), "--data-dir", str(data_dir))
    assert p.returncode == 3
    err = p.stderr
    assert "non-finite" in err and "at step" in err and "on worker" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["steps"] >= 1
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 1


def test_list_shows_every_axis():
    p = gw("list")
    assert p.returncode == 0
    for word in ("mnist1d-cnn", "dirichlet", "lognormal", "ring", "diana", "qsgd", "levels"):
        assert word in p.stdout


def test_list_of_one_kind_shows_everything_its_flag_takes():
    def listed(*args: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["list", *args]) == 0
        return out.getvalue()

    compressors = listed("compressors")  # --compressor takes powersgd too, which is an averager
    assert "  qsgd " in compressors and "  powersgd " in compressors and "--compressor" in compressors
    tasks = listed("tasks")
    assert "mnist1d-mlp" in tasks and "qsgd" not in tasks and "(--task;" in tasks


def test_compare_writes_table_and_plot(tmp_path, data_dir):
    out = tmp_path / "cmp"
    code = main(["compare", "--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2",
                 "--out", str(out), "--data-dir", str(data_dir), "--variant", "--algorithm sync",
                 "--variant", "--name q4 --compressor qsgd:levels=4 --error-feedback"])
    assert code == 0
    md = (out / "comparison.md").read_text()
    assert "| sync |" in md and "| q4 |" in md
    csv_lines = (out / "comparison.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[0].startswith("label,status")
    assert (out / "comparison.png").exists() and (out / "q4" / "metrics.jsonl").exists()
