"""A configuration that cannot run is refused before anything runs: by compare before its first
variant, by plan before its first profiling run, by launch before torchrun starts a process (the
reviewer found each one refused only at run time, after other runs had started or written)."""

import os
import subprocess
import sys

import pytest

from gradwire.cli import main

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2"]


@pytest.fixture(autouse=True)
def _launch_stamp(monkeypatch):
    """``gradwire launch`` sets GRADWIRE_RUN_STAMP in its process (this one, here): undone after each test."""
    monkeypatch.setenv("GRADWIRE_RUN_STAMP", "20260101-000000")


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("variant, needles", [
    ("--algorithm sync:backups=2", ["backups=2 leaves no worker to aggregate with 2 workers", "--algorithm"]),
    ("--name b --backend torch", ["backend='torch'", "torchrun", "gradwire launch", "(--backend)"]),
])
def test_compare_refuses_a_later_variant_before_the_first_runs(tmp_path, data_dir, capsys, variant, needles):
    out = tmp_path / "cmp"
    code = main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out),
                 "--variant", "--algorithm sync", "--variant", variant])
    assert code == 2
    line = one_line(capsys)
    assert line.startswith("gradwire compare: error: ") and all(n in line for n in needles), line
    assert not out.exists()  # no variant ran: nothing half-written for a rerun to refuse


def test_plan_refuses_a_candidate_open_at_no_worker_count_before_profiling(tmp_path, data_dir, capsys):
    """sync:backups=8 runs at none of --workers 2,4,8: refused before the first candidate is profiled
    (plan profiled the others, then found it at run time), while a count that is closed to a
    candidate but not to all (backups=2 at 2 workers) is still only left out."""
    out = tmp_path / "p"
    code = main(["plan", *TINY[:2], "--steps", "4", "--workers", "2,4,8", "--target-loss", "1", "--data-dir",
                 str(data_dir), "--out", str(out), "--candidate", "--algorithm sync",
                 "--candidate", "--algorithm sync:backups=2", "--candidate", "--algorithm sync:backups=8"])
    assert code == 2
    line = one_line(capsys)
    assert "candidate 'sync:backups=8' runs at none of --workers 2,4,8" in line and "backups=8 leaves no" in line
    assert not out.exists()


def _torchrun_recorder(monkeypatch) -> list:
    import torch.distributed.run as torchrun

    started = []
    monkeypatch.setattr(torchrun, "main", lambda argv: started.append(argv))
    return started


def test_launch_refuses_too_many_backups_before_torchrun_starts(monkeypatch, capsys, tmp_path):
    """2 processes, one of them the server: 1 worker, and backups=1 leaves none (the processes found it,
    a worker "lost" while "the server carries on", exit 1)."""
    started = _torchrun_recorder(monkeypatch)
    code = main(["launch", "--nproc-per-node", "2", "--max-restarts", "2", "--", "run", "--algorithm",
                 "sync:backups=1", "--steps", "20", "--out", str(tmp_path / "o")])
    assert code == 2 and started == []
    line = one_line(capsys)
    assert "--nproc-per-node 2 starts 1 worker and the server, but" in line, line
    assert "backups=1 leaves no worker to aggregate with 1 worker" in line


def test_launch_refuses_a_folder_holding_a_run_before_torchrun_starts(monkeypatch, capsys, tmp_path, data_dir):
    """A restarted attempt (--max-restarts) got --resume-or-start and resumed the old run that the first
    attempt had refused to touch; the refusal now comes before torchrun, and the old run stays as it was."""
    out = tmp_path / "o"
    assert main(["run", *TINY, "--data-dir", str(data_dir), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    started = _torchrun_recorder(monkeypatch)
    code = main(["launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", "run", "--task", "digits-logreg",
                 "--steps", "6", "--data-dir", str(data_dir), "--out", str(out)])
    assert code == 2 and started == []
    line = one_line(capsys)
    assert "already holds a run" in line and "--overwrite" in line and "--resume" in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_launch_reads_fault_tolerance_from_the_config_file(monkeypatch, tmp_path):
    """``fault_tolerance:`` in the run's --config file starts replicas as the flag does (launch
    looked for the literal "--fault-tolerance" on the command line)."""
    import gradwire.fault.launch as ft_launch

    seen = []
    monkeypatch.setattr(ft_launch, "launch_replicas", lambda ns, run_args, cfg, check: seen.append(cfg) or 0)
    started = _torchrun_recorder(monkeypatch)
    config = tmp_path / "ft.yaml"
    config.write_text("fault_tolerance: torchft:min_replicas=1,timeout_s=10\nsteps: 4\n")
    assert main(["launch", "--nproc-per-node", "2", "--", "run", "--config", str(config)]) == 0
    assert started == [] and [c.fault_tolerance for c in seen] == ["torchft:min_replicas=1,timeout_s=10"]


def _supervise(tmp_path, code: int, restart_count: str = "0"):
    refused = tmp_path / "refused"
    env = dict(os.environ, RANK="1", TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RESTART_COUNT=restart_count,
               GRADWIRE_LAUNCH_REFUSED=str(refused))
    child = f"import sys; print('child ran'); sys.exit({code})"
    p = subprocess.run([sys.executable, "-m", "gradwire.cli.supervise", "--server-algorithm", "--",
                        sys.executable, "-c", child], capture_output=True, text=True, env=env)
    return p, refused


@pytest.mark.multiprocess
def test_the_supervisor_ends_a_refused_configuration_with_2(tmp_path):
    """A worker process whose run exits 2 refused its configuration: not "lost" (exit 0, the server
    carrying on), and a restarted attempt does not run it again."""
    p, refused = _supervise(tmp_path, 2)
    assert p.returncode == 2 and "lost" not in p.stderr and refused.exists(), p.stderr
    again, _ = _supervise(tmp_path, 0, restart_count="1")
    assert again.returncode == 2 and "child ran" not in again.stdout
    refused.unlink()
    p, _ = _supervise(tmp_path, 1)  # any other failure of a worker process: lost, as before
    assert p.returncode == 0 and "lost (exit code 1); the server carries on" in p.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_launch_ends_with_2_when_its_processes_refuse(tmp_path, data_dir):
    """A setting only the built run can judge (a batch larger than a worker's shard) refuses in every
    process: launch exits 2, and --max-restarts starts no attempt that runs it again."""
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", "2", "--max-restarts", "2",
                        "--", "run", "--task", "digits-logreg", "--batch-size", "100000", "--steps", "2",
                        "--data-dir", str(data_dir), "--out", str(out), "--no-curves"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 2, p.stderr[-3000:]
    assert "lost" not in p.stderr
    # both processes refused alike: their line once (it was printed by each), then the launcher's, and
    # not torchrun's log of each failed process
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[-2:] == ["gradwire run: error: batch_size=100000 is larger than the smallest shard, worker 1's 718 "
                          "samples; pass --batch-size 718 or less, or --batch-size full",
                          "gradwire launch: error: the run refused its configuration (exit 2, its message above); "
                          "no restarted attempt ran it"], p.stderr[-3000:]
    assert p.stderr.count("batch_size=100000") == 1 and "exitcode" not in p.stderr
    assert not (out / "summary.json").exists()


@pytest.mark.multiprocess
def test_a_restart_resumes_only_a_folder_an_attempt_claimed(tmp_path):
    """--resume-or-start on a restarted attempt only once the run's claim of its folder said so: an
    attempt that ended before its claim left the folder as it was (a run there is not ours to resume)."""
    claimed = tmp_path / "claimed"
    env = dict(os.environ, RANK="0", TORCHELASTIC_RESTART_COUNT="1", GRADWIRE_LAUNCH_CLAIMED=str(claimed))

    def child_args() -> str:
        p = subprocess.run([sys.executable, "-m", "gradwire.cli.supervise", "--resume-on-restart", sys.executable,
                            "-c", "import sys; print(sys.argv[1:])", "--steps", "4", "--overwrite"],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    assert child_args() == "['--steps', '4', '--overwrite']"
    claimed.touch()
    assert child_args() == "['--steps', '4', '--resume-or-start']"


def test_the_claim_of_a_launched_run_says_so(tmp_path, monkeypatch):
    from gradwire.errors import ConfigError
    from gradwire.report.run_folder import claim

    told = tmp_path / "claimed"
    monkeypatch.setenv("GRADWIRE_LAUNCH_CLAIMED", str(told))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run"):
        claim(tmp_path / "old", overwrite=False, resume=False)
    assert not told.exists()  # refused: not claimed
    claim(tmp_path / "new", overwrite=False, resume=False).release()
    assert told.exists()
