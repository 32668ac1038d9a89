"""gradwire launch with --fault-tolerance: replicas and a Lighthouse instead of a torchrun group;
a replica that dies is restarted and recovers from a peer while the others train."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import gw, read_jsonl

pytest.importorskip("torchft")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(660)
def test_launch_starts_a_lighthouse_and_restarts_a_killed_replica(tmp_path, data_dir):
    # step 12 waits for the restarted replica: up to quorum_timeout_s, for on a loaded machine (the
    # suite on 2 cores beside other work) a replica's start alone was seen to take over a minute
    env = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG="warn", GRADWIRE_KILL_AT="2:4", GRADWIRE_FT_FULL_AT="12")
    p = gw("launch", "--nproc-per-node", "3", "--max-restarts", "1", "--", "run", "--task", "synthetic-logreg",
           "--steps", "12", "--eval-every", "12", "--batch-size", "8", "--fault-tolerance",
           "torchft:min_replicas=2,timeout_s=10,quorum_timeout_s=180", "--out", str(tmp_path / "run"),
           "--data-dir", str(data_dir), env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "gradwire launch: Lighthouse at 127.0.0.1:" in p.stderr
    assert "replica 2 ended with -9; restarting it (1 of 1); it recovers from a peer" in p.stderr
    # each replica process says it is up, its imports done (benchmarks/ft_recovery.py times from it)
    assert p.stderr.count("gradwire run: replica starting (torchft:") == 4  # 3, and the restarted one
    records = {k: read_jsonl(tmp_path / "run" / f"replica-{k}" / "steps.jsonl") for k in range(3)}
    steps = [r["step"] for r in records[0]]
    assert steps == sorted(set(steps)) and steps[-1] == 12  # (a replica left out of one quorum heals past it)
    # the restarted replica's folder may still hold its records from before the kill (steps 1-4)
    healed = [r for r in records[2] if "healed" in r["ft"]]
    assert healed, records[2]
    first = healed[0]
    assert first["ft"]["healed"]["at_step"] == first["step"] - 1 > 4
    assert records[2][-1]["ft"]["participants"] == [0, 1, 2]


@pytest.mark.multiprocess
def test_launch_refuses_a_replica_index_in_the_spec(tmp_path):
    p = gw("launch", "--nproc-per-node", "2", "--", "run", "--fault-tolerance", "torchft:replica=1",
           "--out", str(tmp_path / "run"), timeout=120)
    assert p.returncode != 0 and "drop replica= from --fault-tolerance" in p.stderr


@pytest.mark.multiprocess
def test_launch_checks_the_run_with_the_replica_count_before_starting_anything(tmp_path):
    p = gw("launch", "--nproc-per-node", "3", "--max-restarts", "2", "--", "run", "--task", "synthetic-logreg",
           "--fault-tolerance", "torchft:min_replicas=4", "--out", str(tmp_path / "run"), timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == ("gradwire launch: error: fault_tolerance min_replicas=4 must be in "
                                                 "[1, --workers 3] (--fault-tolerance)")
    assert "Lighthouse at" not in p.stderr and not (tmp_path / "run").exists()


@pytest.mark.multiprocess
def test_launch_refuses_a_replica_folder_holding_a_run_before_starting_anything(tmp_path, data_dir):
    """Replica 1's folder holds a run: one replica used to refuse it after the others had started."""
    out = tmp_path / "run"
    first = gw("run", "--task", "synthetic-logreg", "--steps", "2", "--out", str(out / "replica-1"),
               "--data-dir", str(data_dir), timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    before = (out / "replica-1" / "summary.json").read_bytes()
    p = gw("launch", "--nproc-per-node", "2", "--", "run", "--task", "synthetic-logreg", "--steps", "2",
           "--fault-tolerance", "torchft:min_replicas=1", "--out", str(out), "--data-dir", str(data_dir), timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"run folder {out / 'replica-1'} already holds a run" in p.stderr.strip().splitlines()[-1]
    assert "Lighthouse at" not in p.stderr and not (out / "replica-0").exists()
    assert (out / "replica-1" / "summary.json").read_bytes() == before


@pytest.mark.multiprocess
@pytest.mark.timeout(660)
def test_launch_does_not_restart_a_replica_that_exits_with_a_configuration_error(tmp_path, data_dir):
    """A batch larger than a replica's shard is found only when the replica loads its data: each
    exits 2, and a restart would only say it again."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG="warn")
    p = gw("launch", "--nproc-per-node", "2", "--max-restarts", "2", "--", "run", "--task", "synthetic-logreg",
           "--batch-size", "100000", "--fault-tolerance", "torchft:min_replicas=2,timeout_s=10",
           "--out", str(tmp_path / "run"), "--data-dir", str(data_dir), env=env, timeout=600)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "restarting it" not in p.stderr
    assert all(f"replica {k} exited with 2 (bad input, its message is above); not restarted" in p.stderr
               for k in range(2))
    assert p.stderr.count("batch_size=100000 is larger than the smallest shard") == 2  # once a replica, none restarted


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_killing_the_launcher_ends_its_replicas(tmp_path, data_dir):
    """SIGKILL to `gradwire launch --fault-tolerance` (it cannot pass anything on): its replicas, left
    with a Lighthouse that is gone, used to retry for quorum_timeout_s; each now ends with SIGTERM
    when its launcher dies (GRADWIRE_DIE_WITH), saying so in its summary."""
    import signal
    import subprocess
    import sys

    from tests.backends.test_launch_faults import processes_with, wait_until

    out = tmp_path / "run"
    log = (tmp_path / "launch.log").open("w")
    p = subprocess.Popen([sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", "2", "--", "run",
                          "--task", "synthetic-logreg", "--steps", "1000000", "--eval-every", "1000000",
                          "--batch-size", "8", "--fault-tolerance", "torchft:min_replicas=2,timeout_s=10,"
                          "quorum_timeout_s=180", "--out", str(out), "--data-dir", str(data_dir)],
                         stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                        RUST_LOG="warn"))
    try:
        steps = [out / f"replica-{k}" / "steps.jsonl" for k in range(2)]
        wait_until(lambda: p.poll() is not None or all(s.exists() and s.stat().st_size for s in steps), 200,
                   "both replicas trained")
        assert p.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
        assert len(processes_with(str(out))) == 3  # the launcher and two replicas
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        wait_until(lambda: not processes_with(str(out)), 60, "both replicas of the killed launcher ended")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        for pid in processes_with(str(out)):
            os.kill(pid, signal.SIGKILL)
    for k in range(2):
        summary = json.loads((out / f"replica-{k}" / "summary.json").read_text())
        assert summary["status"] == "stopped" and summary["steps"] > 0, summary
    assert (tmp_path / "launch.log").read_text().count("stopped by SIGTERM") == 2


@pytest.mark.multiprocess
def test_a_replica_whose_launcher_is_already_gone_ends_at_once(tmp_path):
    """A launcher that died before its replica could ask to die with it: the replica finds another
    parent, ends with SIGTERM at once and writes nothing."""
    import signal

    from gradwire.fault.launch import DIE_WITH_ENV

    p = gw("run", "--steps", "2", "--out", str(tmp_path / "run"), env={**os.environ, DIE_WITH_ENV: "1"}, timeout=60)
    assert p.returncode == -signal.SIGTERM, p.stderr[-2000:]
    assert not (tmp_path / "run").exists()
