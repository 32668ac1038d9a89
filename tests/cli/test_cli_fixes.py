"""Command-line defects a new user met: each test here failed before its fix (the reviewer's list,
tests/cli: --resume of a comparison without checkpoints, a --variant of one flag, a closed pipe,
a comparison's title, configuration errors found before anything runs, --out folders)."""

import fcntl
import json
import os
import shutil
import subprocess
import sys

import pytest

from gradwire.cli import main

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_compare_resume_of_a_finished_comparison_without_checkpoints(tmp_path, data_dir, capsys):
    """A comparison that saved no checkpoint and finished is kept as it is by --resume (exit 0, every
    variant "already finished"): its variants' configs are resolved before they are compared with
    config.json (--lr and --momentum are the algorithm's there)."""
    out = tmp_path / "cmp"
    common = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html",
              "--variant", "--algorithm sync", "--variant", "--name q --compressor qsgd:levels=4"]
    assert main(common) == 0
    before = {p: p.read_bytes() for p in out.rglob("*.json*")}
    capsys.readouterr()
    assert main([*common, "--resume"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count("already finished at step 4") == 2
    assert {p: p.read_bytes() for p in out.rglob("*.json*")} == before


def test_a_variant_of_one_flag(tmp_path, data_dir, capsys):
    """``--variant "--error-feedback"`` is a value (argparse took it for an option: "expected one argument")."""
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html",
                 "--compressor", "qsgd:levels=4", "--variant", "--name plain", "--variant", "--error-feedback"]) == 0
    assert json.loads((out / "sync_+_qsgd_levels=4_+_EF" / "config.json").read_text())["error_feedback"] is True


def test_a_candidate_of_one_flag_is_read_as_a_value(tmp_path, capsys):
    """plan's ``--candidate "--error-feedback"`` reaches plan's own checks (it was argparse's
    "expected one argument"): here --error-feedback without a compressor, refused by name."""
    code = main(["plan", "--task", "digits-logreg", "--steps", "2", "--target-loss", "1", "--out", str(tmp_path / "p"),
                 "--candidate", "--error-feedback"])
    assert code == 2
    assert "--error-feedback needs --compressor" in one_line(capsys)
    assert not (tmp_path / "p").exists()


def test_a_variant_flag_error_points_to_help_that_exists(tmp_path, capsys):
    """A mistyped flag in a --variant points to `gradwire run --help` (there is no
    `gradwire compare --variant --help`)."""
    with pytest.raises(SystemExit) as e:
        main(["compare", *TINY, "--out", str(tmp_path / "c"), "--variant", "--algoritm sync"])
    assert e.value.code == 2
    line = one_line(capsys)
    assert "--algoritm" in line and "(see gradwire run --help" in line and "--variant --help" not in line
    assert not (tmp_path / "c").exists()


@pytest.mark.multiprocess
@pytest.mark.parametrize("args", [["list"], ["reproduce", "--list"]])
def test_a_closed_pipe_is_no_traceback(args):
    """``gradwire list | head``: the reader closed the pipe; no BrokenPipeError traceback, and the
    status a command killed by SIGPIPE has (141)."""
    read, write = os.pipe()
    os.close(read)  # a reader that has gone before anything was written
    try:
        p = subprocess.run([sys.executable, "-m", "gradwire", *args], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert p.stderr == "" and p.returncode == 141, p.stderr


def test_a_comparisons_title_says_what_its_variants_share(tmp_path, data_dir, capsys):
    """Variants that set their own task and workers: the title and the page's lead line no longer
    describe the common flags' task and worker count (which no variant ran) as every variant's."""
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out),
                 "--variant", "--algorithm sync", "--variant", "--name mlp4 --task digits-mlp --workers 4"]) == 0
    title = (out / "comparison.md").read_text().splitlines()[0]
    assert title == "# none stragglers, ps:mbps=100,latency_ms=1, variants differ in task and workers", title
    html = (out / "report.html").read_text()
    assert "gradwire comparison: none stragglers, ps:mbps=100,latency_ms=1, variants differ in task and workers" in html
    assert "2 variants on the same seed and partition; they differ in task and workers (Config below)" in html
    assert "same task" not in html


def test_out_that_is_the_root_or_the_current_directory_is_refused(tmp_path, monkeypatch):
    """(the root only through the check itself: a test never runs with --out /)"""
    from gradwire.errors import ConfigError
    from gradwire.report.run_folder import require_named

    for out, needle in (("/", "is the file system's root"), ("/..", "is the file system's root"),
                        (".", "is the current directory")):
        monkeypatch.chdir(tmp_path)
        with pytest.raises(ConfigError, match=needle):
            require_named(out)
    require_named("runs/x")


@pytest.mark.parametrize("command", ["run", "compare"])
def test_run_and_compare_refuse_out_dot(tmp_path, data_dir, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    variant = ["--variant", "--algorithm sync"] if command == "compare" else []
    assert main([command, *TINY, "--data-dir", str(data_dir), "--out", ".", *variant]) == 2
    assert "--out '.' is the current directory" in one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_run_and_compare_refuse_a_folder_holding_other_runs(tmp_path, data_dir, capsys):
    """``--out runs`` (the folder of every run) was taken as a run's folder: the run's files went in
    beside the others' folders."""
    runs = tmp_path / "runs"
    assert main(["run", *TINY, "--data-dir", str(data_dir), "--out", str(runs / "a")]) == 0
    capsys.readouterr()
    assert main(["run", *TINY, "--data-dir", str(data_dir), "--out", str(runs)]) == 2
    assert f"--out '{runs}' holds other results (a/ is a run, comparison or plan)" in one_line(capsys)
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(runs),
                 "--variant", "--algorithm sync"]) == 2
    assert "holds other results (a/" in one_line(capsys)
    assert sorted(p.name for p in runs.iterdir()) == ["a"]


def test_a_failure_that_a_stop_interrupted_is_said_first(tmp_path, capsys, monkeypatch):
    """Under torch a peer's death fails the run (CommunicationError, summary.json: failed); torchrun's
    SIGTERM then lands while the run ends and its Stopped (no step) replaced the failure: rank 0 said
    "stopped by SIGTERM before training began ... nothing of it was written", exit 143."""
    import signal

    import gradwire.run.loop as loop
    from gradwire.errors import CommunicationError, Stopped

    out = tmp_path / "o"

    def peer_dies(cfg, **_):
        out.mkdir()
        try:
            raise CommunicationError("gloo: Connection closed by peer [127.0.0.1]:1234")
        finally:  # the summary is written, then the stop lands (the run's signal handler raises it)
            (out / "summary.json").write_text(json.dumps({"status": "failed", "steps": 2135}))
            raise Stopped(signal.SIGTERM)

    monkeypatch.setattr(loop, "run", peer_dies)
    assert main(["run", *TINY, "--out", str(out)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gradwire run: communication error: gloo: Connection closed by peer [127.0.0.1]:1234",
                   f"gradwire run: then stopped by SIGTERM while the run ended ({out / 'summary.json'} says failed "
                   "at step 2135)"], err


def test_an_interrupted_comparison_is_taken_again_with_other_variants_under_overwrite(tmp_path, data_dir, capsys):
    """A comparison stopped before its comparison.md, run again with other variants or seeds: its own
    folder holds the earlier variants' runs, which --overwrite (or --resume) claims; without either
    it is refused, naming them."""
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--seeds", "0,1",
                 "--variant", "--algorithm sync", "--variant", "--algorithm local"]) == 0
    for name in ("comparison.md", "comparison.csv"):  # as an interrupted comparison leaves it
        (out / name).unlink()
    capsys.readouterr()
    again = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--seeds", "0,1",
             "--variant", "--algorithm sync", "--variant", "--algorithm diana"]
    assert main(again) == 2
    assert "holds other results" in one_line(capsys)
    assert main([*again, "--overwrite"]) == 0
    assert (out / "comparison.md").is_file() and "diana" in (out / "comparison.md").read_text()


@pytest.mark.parametrize("argv, flag, close", [
    (["run", "--steps", "3", "--wokers", "4"], "--wokers 4", "--workers"),
    (["compare", "--wokers", "4"], "--wokers 4", "--workers"),
    (["plan", "--max-wrokers", "8"], "--max-wrokers 8", "--max-workers"),
    (["reproduce", "--qiuck"], "--qiuck", "--quick"),
    (["report", "runs/x", "--bogus"], "--bogus", None),
])
def test_an_unknown_flag_points_to_its_commands_help(capsys, argv, flag, close):
    """A sub-command's unknown flag is its own parser's error, with its --help (it was "gradwire: error:
    ... (see gradwire --help)"), and the command's flag it most resembles, where one is close."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    hint = f"; did you mean {close}?" if close else ""
    assert capsys.readouterr().err == (f"gradwire {argv[0]}: error: unrecognized arguments: {flag}{hint} "
                                       f"(see gradwire {argv[0]} --help)\n")


def test_compare_overwrite_removes_the_replaced_comparisons_other_variant_folders(tmp_path, data_dir, capsys):
    """--overwrite with another set of variants: the replaced comparison's variant folders (as its
    comparison.csv names them) that the new one lacks go once its table is written (they stayed beside
    the new ones); a folder that comparison did not record stays."""
    out = tmp_path / "cmp"
    common = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html"]
    assert main([*common, "--seeds", "0,1", "--variant", "--algorithm sync", "--variant", "--name q --compressor "
                 "qsgd:levels=4"]) == 0
    (out / "mine").mkdir()
    (out / "mine" / "notes.txt").write_text("kept")
    # a run of the user's whose label the record names ("sync seed 0"), in a folder compare did not name
    shutil.copytree(out / "sync-seed0", out / "mine-run")
    # a variant's folder that is now a link to a folder elsewhere: not the comparison's own
    shutil.move(out / "q-seed1", tmp_path / "elsewhere")
    (out / "q-seed1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    capsys.readouterr()
    with open(out / "sync-seed1" / ".gradwire.lock", "a+") as held:  # a gradwire process writing there
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main([*common, "--overwrite", "--variant", "--algorithm sync", "--variant", "--algorithm local"]) == 0
    said = capsys.readouterr().out
    assert "removed the replaced comparison's variant folders: q-seed0, sync-seed0\n" in said
    assert "kept the replaced comparison's variant folders that a gradwire process is writing: sync-seed1" in said
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["local", "mine", "mine-run", "q-seed1", "sync",
                                                                    "sync-seed1"]
    shutil.rmtree(out / "sync-seed1")
    assert (out / "mine" / "notes.txt").read_text() == "kept"
    assert (out / "mine-run" / "summary.json").exists() and (tmp_path / "elsewhere" / "summary.json").exists()
    # a comparison stopped before its table records none: its folders stay
    (out / "comparison.csv").unlink()
    assert main([*common, "--overwrite", "--variant", "--algorithm sync"]) == 0
    assert "removed" not in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["local", "mine", "mine-run", "q-seed1", "sync"]


@pytest.mark.parametrize("flags, sentence", [
    ([], "Each variant's own folder holds its config.json, metrics.jsonl, summary.json and curves.png."),
    (["--no-curves"], "Each variant's own folder holds its config.json, metrics.jsonl, summary.json (no curves.png: "
                      "the runs were made with --no-curves)."),
    (["--variant", "--name nc --algorithm sync --no-curves"],
     "Each variant's own folder holds its config.json, metrics.jsonl, summary.json, and curves.png where the run "
     "drew it (not with --no-curves)."),
])
def test_comparison_md_names_curves_png_only_where_the_runs_drew_it(tmp_path, data_dir, flags, sentence):
    """comparison.md said each variant's folder holds curves.png, with --no-curves too."""
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html",
                 "--variant", "--algorithm sync", *flags]) == 0
    assert (out / "comparison.md").read_text().rstrip().endswith("\n" + sentence)
