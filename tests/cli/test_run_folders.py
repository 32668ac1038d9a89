"""Nothing lost, nothing silent: a run folder is replaced only when asked, one process writes it,
SIGTERM and SIGINT end a run with its summary (and a checkpoint that resumes it), progress shows
in logs, and what config.json and the plots say is what ran."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gradwire import version
from gradwire.cli import main
from gradwire.errors import ConfigError
from tests.helpers import gw, read_jsonl

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2"]


def tiny(data_dir, *args: str) -> list[str]:
    return ["run", *TINY, "--data-dir", str(data_dir), *args]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("gradwire run: error:") or err[0].startswith("gradwire compare: error:"), err
    return err[0]


def test_a_folder_holding_a_run_is_replaced_only_when_asked(tmp_path, data_dir, capsys):
    out = tmp_path / "o"
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2")) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(tiny(data_dir, "--out", str(out), "--lr", "0.5")) == 2
    line = one_error_line(capsys)
    assert str(out) in line and "--overwrite" in line and "--resume" in line and "already holds a run" in line
    assert (out / "metrics.jsonl").read_text() == before  # untouched
    assert main(tiny(data_dir, "--out", str(out), "--lr", "0.5", "--overwrite")) == 0
    assert (out / "metrics.jsonl").read_text() != before
    assert not (out / "checkpoint").exists()  # the old run's checkpoint went with it
    assert json.loads((out / "config.json").read_text())["lr"] == 0.5
    capsys.readouterr()
    assert main(tiny(data_dir, "--out", str(out), "--overwrite", "--resume")) == 2
    assert "pass one of them" in one_error_line(capsys)


def test_empty_out_is_refused(tmp_path, data_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(tiny(data_dir, "--out", "")) == 2
    assert "--out '' names no folder" in one_error_line(capsys)
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", "", "--variant", "--algorithm sync"]) == 2
    assert "--out '' names no folder" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_without_out_each_run_gets_a_fresh_folder(tmp_path, data_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(tiny(data_dir)) == 0
    assert main(tiny(data_dir)) == 0
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(re.fullmatch(r"sync-\d{8}-\d{6}(-2)?", f) for f in folders), folders
    assert all((tmp_path / "runs" / f / "summary.json").exists() for f in folders)
    assert f"-> runs/{folders[-1]}" in capsys.readouterr().out
    assert main(tiny(data_dir, "--resume")) == 2  # nothing to continue in a fresh folder
    assert "--resume continues the run in --out" in one_error_line(capsys)


def test_compare_replaces_variant_folders_only_when_asked(tmp_path, data_dir, capsys):
    args = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(tmp_path / "cmp"),
            "--variant", "--algorithm sync"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    line = one_error_line(capsys)
    assert str(tmp_path / "cmp") in line and "--overwrite" in line
    (tmp_path / "cmp" / "comparison.md").unlink()  # the variant's own folder still holds its run
    assert main(args) == 2
    line = one_error_line(capsys)
    assert str(tmp_path / "cmp" / "sync") in line and "--overwrite" in line and "--resume" in line
    assert main([*args, "--overwrite"]) == 0


def test_a_folder_being_written_is_locked(tmp_path, data_dir, capsys):
    from gradwire.report.run_folder import FolderLock

    out = tmp_path / "busy"
    held = FolderLock(out).acquire()  # as another writer would hold it (flock: per open file)
    try:
        assert main(tiny(data_dir, "--out", str(out))) == 2
        line = one_error_line(capsys)
        assert f"run folder {out} is being written by another gradwire process (pid {os.getpid()})" in line
        assert not (out / "metrics.jsonl").exists()
    finally:
        held.release()
    assert main(tiny(data_dir, "--out", str(out))) == 0  # ... and a finished run lets go of it
    assert main(tiny(data_dir, "--out", str(out), "--overwrite")) == 0


def test_a_run_being_written_is_said_to_be_so_before_its_files_are_judged(tmp_path, data_dir, capsys):
    """A folder that holds a run another process is writing: the lock's message, not "--overwrite"."""
    from gradwire.report.run_folder import FolderLock

    out = tmp_path / "busy"
    assert main(tiny(data_dir, "--out", str(out))) == 0
    held = FolderLock(out).acquire()
    try:
        assert main(tiny(data_dir, "--out", str(out))) == 2
        assert f"is being written by another gradwire process (pid {os.getpid()})" in one_error_line(capsys)
    finally:
        held.release()


def test_a_lock_file_removed_under_a_waiting_opener_is_not_shared(tmp_path, monkeypatch):
    """Run A made the folder and is refused: it removes its lock file and folder while locked. Run B
    had opened that file just before: once B holds its lock it finds the path gone, and locks a new
    file instead, so a third run C is refused while B writes (before, B and C both held locks)."""
    import fcntl as real_fcntl

    from gradwire.report import run_folder
    from gradwire.report.run_folder import FolderLock

    out = tmp_path / "new"
    a = FolderLock(out).acquire()
    calls, original = [], real_fcntl.flock

    def flock(f, op):  # B's first lock: A lets go between B's open and B's lock
        calls.append(op)
        if len(calls) == 1:
            a.discard()
        return original(f, op)

    monkeypatch.setattr(run_folder.fcntl, "flock", flock)
    b = FolderLock(out).acquire()
    monkeypatch.undo()
    try:
        assert len(calls) >= 3  # the stale file's lock, its unlock, the new file's lock
        path = out / run_folder.LOCK_NAME
        assert os.fstat(b._file.fileno()).st_ino == os.stat(path).st_ino
        with pytest.raises(ConfigError, match="being written by another gradwire process"):
            FolderLock(out).acquire()
    finally:
        b.release()


def test_simulator_under_torchrun_is_refused(tmp_path, data_dir, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(tiny(data_dir, "--out", str(tmp_path / "o"), "--backend", "sim")) == 2
    line = one_error_line(capsys)
    assert "torchrun started 2" in line and "use --backend torch" in line
    assert not (tmp_path / "o").exists()


def _metrics(folder) -> list[dict]:
    rows = read_jsonl(folder / "metrics.jsonl")
    return [{k: v for k, v in row.items() if k not in ("wall_time_s", "eval_time_s")} for row in rows]


def test_sigterm_stops_with_summary_and_a_checkpoint_that_resumes(tmp_path, data_dir):
    common = ["--task", "digits-logreg", "--workers", "2", "--eval-every", "1", "--checkpoint-every", "50",
              "--data-dir", str(data_dir)]
    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "gradwire", "run", *common, "--steps", "100000", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not ((out / "metrics.jsonl").exists() and len(read_jsonl(out / "metrics.jsonl")) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    summary = json.loads((out / "summary.json").read_text())
    stop = summary["steps"]
    assert summary["status"] == "stopped" and summary["stopped_by"] == "SIGTERM" and 1 <= stop < 50
    assert summary["checkpoint_step"] == stop and summary["error"] == f"stopped by SIGTERM at step {stop}"
    assert err.strip().splitlines() == [f"gradwire run: stopped by SIGTERM at step {stop}; {out / 'summary.json'} "
                                        f"written; --resume continues from step {stop}"]
    # --resume continues to the same figures as a run never stopped
    steps = str(stop + 4)
    assert main(["run", *common, "--steps", steps, "--out", str(out), "--resume"]) == 0
    assert main(["run", *common, "--steps", steps, "--out", str(tmp_path / "whole")]) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    assert _metrics(out) == _metrics(tmp_path / "whole")


def test_sigint_stops_between_steps_with_a_checkpoint(tmp_path, data_dir, capsys, monkeypatch):
    from gradwire.run import loop

    original = loop.Run.train_step

    def train_step(self):
        info = original(self)
        if self.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # handled after this step, before the next
        return info

    monkeypatch.setattr(loop.Run, "train_step", train_step)
    out = tmp_path / "o"
    previous = signal.getsignal(signal.SIGINT)
    assert main(tiny(data_dir, "--out", str(out), "--steps", "10", "--checkpoint-every", "5")) == 130
    assert signal.getsignal(signal.SIGINT) is previous  # the run's handler is gone
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["steps"] == 3 and summary["stopped_by"] == "SIGINT"
    assert (out / "checkpoint" / "latest").read_text().strip() == "step-00000003"
    assert "stopped by SIGINT at step 3" in capsys.readouterr().err


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, data_dir):
    env = dict(os.environ, GRADWIRE_PROGRESS_S="0.001")
    p = gw(*tiny(data_dir, "--out", str(tmp_path / "o"), "--steps", "6"), env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    pattern = r"sync: step \d+/6( loss=\S+ acc=\S+)? \d+\.\d MB \d+ s"
    assert lines and all(re.fullmatch(pattern, x) for x in lines), lines
    assert lines[-1].startswith("sync: step 6/6 loss=")


def testprogress_mode(monkeypatch):
    from gradwire.errors import ConfigError
    from gradwire.report.progress import progress_mode

    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("GRADWIRE_PROGRESS_S", raising=False)
    assert progress_mode(None) == (None, 10.0)  # quiet in CI unless asked
    assert progress_mode(True) == ("lines", 10.0)
    monkeypatch.setenv("GRADWIRE_PROGRESS_S", "2.5")
    assert progress_mode(None) == ("lines", 2.5)
    assert progress_mode(False)[0] is None
    monkeypatch.setenv("GRADWIRE_PROGRESS_S", "0")
    assert progress_mode(True)[0] is None
    monkeypatch.setenv("GRADWIRE_PROGRESS_S", "soon")
    with pytest.raises(ConfigError, match="GRADWIRE_PROGRESS_S='soon' is not a number of seconds"):
        progress_mode(None)


def test_version():
    p = gw("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"gradwire {version()}"


@pytest.mark.curves
@pytest.mark.parametrize("backend, label", [("sim", "simulated time (s)"),
                                            ("torch", "elapsed time (s)")])
def test_time_axis_is_named_by_backend(tmp_path, monkeypatch, backend, label):
    from matplotlib.axes import Axes

    from gradwire.report.compare import write_report
    from gradwire.report.run_folder import RunFolder

    seen = []
    original = Axes.set_xlabel
    monkeypatch.setattr(Axes, "set_xlabel", lambda self, text, *a, **k: (seen.append(text), original(self, text))[1])
    folder = RunFolder(tmp_path / "r", enabled=True)
    folder.open({"backend": backend}, {}, None)
    for step in (0, 1):
        folder.metrics({"step": step, "sim_time_s": step * 0.5, "bytes_sent": step * 10, "train_loss": 1.0 - step / 4,
                        "test_acc": 0.5})
    summary = {"label": "x", "status": "finished", "steps": 1, "final": {"test_acc": 0.5}, "bytes_sent": 10,
               "sim_time_s": 0.5, "wall_time_s": 1.0}
    folder.finish(summary, "x")
    assert label in seen and seen.count(label) == 2  # curves.png: one time column, two rows
    seen.clear()
    write_report(tmp_path, [summary], [tmp_path / "r"], "t")
    assert label in seen
    header = (tmp_path / "comparison.md").read_text().splitlines()[2]
    assert ("sim time (s)" if backend == "sim" else label) in header


@pytest.mark.parametrize("args, resolved", [(["--algorithm", "diana"], "pquant:p=inf,block=64"),
                                            (["--compressor", "qsgd:levels=4"], "qsgd:levels=4,bucket=512,format=2"),
                                            (["--algorithm", "signsgd:down=vote", "--lr", "0.01"], "sign:scaled=false"),
                                            (["--algorithm", "signsgd", "--lr", "0.01"],
                                             "sign:scaled=false up, sign:scaled=true down (rank 0's error feedback)"),
                                            (["--compressor", "sign:ratio=0.5"], "sign:scaled=false,ratio=0.5"),
                                            ([], "none")])
def test_config_json_names_the_compressor_that_ran(tmp_path, data_dir, args, resolved):
    assert main(tiny(data_dir, "--out", str(tmp_path / "o"), "--steps", "1", *args)) == 0
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["compressor_resolved"] == resolved
    assert config["compressor"] == (args[1] if args[:1] == ["--compressor"] else "none")


@pytest.mark.parametrize("algorithm, resolved", [("dagc:budget=0.05", "keep-topk (per worker)"),
                                                 ("dqsgd", "qsgd:bucket=512 (levels per step)"),
                                                 ("local:period=2", None)])
def test_an_algorithm_choosing_its_own_compressors_is_not_recorded_as_none(tmp_path, data_dir, algorithm,
                                                                            resolved):
    from gradwire.config import RunConfig
    from gradwire.run.loop import Run

    r = Run(RunConfig(task="digits-logreg", workers=2, out=str(tmp_path / "x"), data_dir=str(data_dir),
                      algorithm=algorithm))
    assert r.algorithm.compressor_spec() == resolved  # its own (one per worker), or none at all


def test_help_says_what_a_run_without_out_writes(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps the help; compare without spaces
    assert "--outOUTrunfolder(default:afreshruns/<label>-<YYYYmmdd-HHMMSS>)" in text


def test_rows_truncated_for_a_resume_replace_the_file_atomically(tmp_path, monkeypatch):
    """A resumed run's steps.jsonl keeps the rows up to its checkpoint; a crash while the kept rows
    are written (here: a full disk halfway) leaves the file as it was, never a half file that
    lost rows before the checkpoint."""
    from pathlib import Path

    from gradwire.report import run_folder

    path = tmp_path / "steps.jsonl"
    original = "".join(json.dumps({"step": k, "loss": 1.0 / k}) + "\n" for k in range(1, 9)) + '{"step": 9, "lo'
    path.write_text(original)
    real_write_text = Path.write_text

    def full_disk(self, data, *args, **kwargs):
        real_write_text(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        run_folder._truncate_jsonl(path, 5)
    assert path.read_text() == original
    monkeypatch.setattr(Path, "write_text", real_write_text)
    run_folder._truncate_jsonl(path, 5)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4, 5]


def _all_files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".gradwire.lock"}


@pytest.mark.parametrize("refused, needle", [
    (["--batch-size", "5000"], "batch"),  # larger than every shard
    (["--workers", "64", "--partition", "dirichlet:alpha=0.001"], "would get no data"),  # an empty shard
])
def test_overwrite_refused_once_the_run_is_built_keeps_the_old_run(tmp_path, data_dir, capsys, refused, needle):
    """--overwrite with a setting refused only while the run is built: exit 2, and the old run's
    metrics, summary and checkpoint are all still there, byte for byte (they were deleted before
    the refusal). A good --overwrite then replaces them."""
    out = tmp_path / "o"
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2")) == 0
    before = _all_files(out)
    assert {"metrics.jsonl", "summary.json", "checkpoint/latest"} <= {str(p) for p in before}
    capsys.readouterr()
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2", *refused, "--overwrite")) == 2
    assert needle in one_error_line(capsys)
    assert _all_files(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted([".gradwire.lock", *{p.parts[0] for p in before}])
    assert main(tiny(data_dir, "--out", str(out), "--lr", "0.5", "--overwrite")) == 0
    assert json.loads((out / "config.json").read_text())["lr"] == 0.5
    assert not (out / "checkpoint").exists() and not (out / ".gradwire-replaced").exists()


def test_a_run_set_aside_by_a_killed_overwrite_comes_back(tmp_path, data_dir, capsys):
    """An --overwrite run killed after it set the old run aside and before it wrote anything: the
    next claim of the folder puts the old run back (here --resume finds it finished)."""
    from gradwire.report.run_folder import set_aside

    out = tmp_path / "o"
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2")) == 0
    before = _all_files(out)
    set_aside(out)
    assert not (out / "summary.json").exists()
    capsys.readouterr()
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2", "--resume")) == 0
    assert "already finished at step 4" in capsys.readouterr().out
    assert _all_files(out) == before


@pytest.mark.parametrize("flag", ["--resume", "--resume-or-start"])
def test_resume_of_a_folder_being_written_names_the_writer(tmp_path, data_dir, capsys, flag):
    """Another process has just started writing the folder (no checkpoint yet): --resume says so,
    naming its pid (it said "nothing to resume: ... holds a run (config.json) but no checkpoint"),
    and --resume-or-start does not start a second writer."""
    from gradwire.report.run_folder import FolderLock

    out = tmp_path / "busy"
    held = FolderLock(out).acquire()
    try:
        (out / "config.json").write_text("{}")
        assert main(tiny(data_dir, "--out", str(out), flag)) == 2
        assert one_error_line(capsys) == (f"gradwire run: error: run folder {out} is being written by another "
                                          f"gradwire process (pid {os.getpid()}); wait for it to end or choose "
                                          "another --out")
        assert sorted(p.name for p in out.iterdir()) == [".gradwire.lock", "config.json"]
    finally:
        held.release()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_threads_backend_stops_with_its_summary(tmp_path, data_dir, capsys, monkeypatch, signum):
    """A stop signal to a --backend threads run: every process's loop stops at its next step, and
    the summary says 'stopped', exit 128 + the signal (SIGTERM ended it with no summary, SIGINT
    wrote 'failed': "cannot schedule new futures after shutdown"). --resume continues it from its
    last regular checkpoint."""
    import threading

    from gradwire.run import loop

    original = loop.Run.train_step

    def train_step(self):
        info = original(self)
        if self.step == 3 and self.process_rank == 0:
            os.kill(os.getpid(), signum)
        return info

    monkeypatch.setattr(loop.Run, "train_step", train_step)
    out = tmp_path / "o"
    previous = signal.getsignal(signum)
    def args(steps: int, *more: str) -> list[str]:
        return tiny(data_dir, "--backend", "threads", "--out", str(out), "--steps", str(steps), "--checkpoint-every",
                    "2", *more)

    assert main(args(100000)) == 128 + signum
    assert signal.getsignal(signum) is previous
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gradwire-process-")]  # all ended
    summary = json.loads((out / "summary.json").read_text())
    stop, name = summary["steps"], signal.Signals(signum).name
    assert summary["status"] == "stopped" and summary["stopped_by"] == name and 3 <= stop < 100000
    assert summary["error"] == f"stopped by {name} at step {stop}"
    assert f"gradwire run: stopped by {name} at step {stop}; {out / 'summary.json'} written" in capsys.readouterr().err
    monkeypatch.setattr(loop.Run, "train_step", original)
    assert main(args(stop + 2, "--resume")) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"


def test_a_stop_before_training_says_nothing_was_written(tmp_path, data_dir, capsys, monkeypatch):
    """A stop while the run is built (on the torch backend: a rank blocked in the rendezvous, which
    hears the signal only when it returns) ends with one line saying nothing was written; it said
    "metrics so far are in the run folder" on every rank, with no folder there."""
    from gradwire.errors import Stopped
    from gradwire.run import loop

    def stopped_while_built(cfg, transport=None):
        raise Stopped(signal.SIGTERM)

    monkeypatch.setattr(loop, "Run", stopped_while_built)
    out = tmp_path / "o"
    assert main(tiny(data_dir, "--out", str(out))) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().splitlines() == [
        "gradwire run: stopped by SIGTERM before training began (while the run was built: its data, its processes' "
        "rendezvous); nothing of it was written"]
    assert not out.exists()


def test_a_signal_while_a_failure_ends_the_run_does_not_hide_it(tmp_path, data_dir, capsys, monkeypatch):
    """torchrun sends SIGTERM to the survivors once a peer died: it arrives while the run writes the
    summary of its CommunicationError. The failure is what ends the run (exit 4, summary 'failed'),
    not a stop 'before training began'."""
    from gradwire.algorithms.sync import SyncSGD
    from gradwire.errors import CommunicationError
    from gradwire.run import loop
    from gradwire.run.stops import StopSignals

    original = loop.Run.train_step

    def train_step(self):
        if self.step == 2:
            raise CommunicationError("allreduce: Connection closed by peer")
        return original(self)

    def close_with_a_signal(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in the main thread

    monkeypatch.setattr(loop.Run, "train_step", train_step)
    monkeypatch.setattr(SyncSGD, "close", close_with_a_signal)
    # the torch backend's handling (a signal stops at once, not after the step), on the simulator
    monkeypatch.setattr(loop, "StopSignals", lambda deferred, checkpoints=False: StopSignals(False, checkpoints))
    out = tmp_path / "failed"
    code = main(["run", "--task", "digits-logreg", "--workers", "2", "--steps", "5", "--out", str(out),
                 "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 4 and "Connection closed by peer" in err and "stopped by SIGTERM" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "Connection closed by peer" in summary["error"]
