"""Asynchronous LSGD and EASGD on real processes (coordinator mode): every worker steps at its own
pace, the exchanges and rounds follow each worker's own step counts, and the bytes are exactly
what the protocol must send for the events the run recorded."""

import json
import signal

import pytest

from gradwire.errors import ConfigError
from gradwire.run.config import RunConfig
from gradwire.run.loop import Run
from tests.torch.test_backend_equality import launch
from tests.torch.test_ps import _spawn

BASE = ["--task", "digits-logreg", "--batch-size", "16", "--lr", "0.2", "--eval-every", "5", "--seed", "5",
        "--steps", "20"]
SLOW = ["--stragglers", "slow:count=1,slowdown=4,compute_s=0.01"]  # worker 0 takes 4x as long per step
MODEL = (64 * 10 + 10) * 4  # digits-logreg parameters, float32
HEADER, RELEASE = 48, 8


def rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def lsgd_bytes(summary, log, workers_said_bye):
    """Every local step: a report and its answer; every round whose parameters arrived: the upload
    (header + model, answered by a header); every pull: one model behind the answer's header."""
    reports = sum(summary["local_steps"].values())
    uploads = sum(s.get("rounds", 0) for s in log) + summary["uploads_after_last_step"]
    pulls = sum(s.get("pulls", 0) for s in log)
    return (2 * HEADER * reports + uploads * (2 * HEADER + MODEL) + pulls * MODEL
            + workers_said_bye * (HEADER + RELEASE))


@pytest.mark.timeout(300)
def test_async_easgd_on_real_processes(tmp_path, data_dir):
    out = tmp_path / "easgd"
    p = launch(4, BASE + SLOW + ["--algorithm", "easgd:async=true,period=3"], out, data_dir)  # coordinator + 3
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = {int(w): n for w, n in summary["local_steps"].items()}
    assert summary["lost_workers"] == [] and sum(steps.values()) >= 60
    assert steps[0] < min(steps[1], steps[2])  # the slow worker takes fewer local steps
    # x_i up and e down exactly after every 3rd step of each worker's own, a header each way otherwise
    expected = sum(2 * HEADER * n + 2 * MODEL * (n // 3) for n in steps.values()) + 3 * (HEADER + RELEASE)
    assert summary["bytes_sent"] == expected
    log = rows(out / "steps.jsonl")
    assert [s["gradients"] for s in log] == [3] * 20
    assert 0 < sum(s["exchanges"] for s in log) <= sum(n // 3 for n in steps.values())
    metrics = rows(out / "metrics.jsonl")
    assert json.loads((out / "config.json").read_text())["evaluates"] == "center"
    assert metrics[-1]["train_loss"] < 0.8 * metrics[0]["train_loss"]  # the center learns


@pytest.mark.timeout(300)
def test_async_lsgd_on_real_processes(tmp_path, data_dir):
    out = tmp_path / "lsgd"
    p = launch(4, BASE + SLOW + ["--algorithm", "lsgd:async=true,period=2,pull=0.5"], out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary, log = json.loads((out / "summary.json").read_text()), rows(out / "steps.jsonl")
    steps = {int(w): n for w, n in summary["local_steps"].items()}
    assert summary["lost_workers"] == [] and steps[0] < min(steps[1], steps[2])
    # a round per period·n = 6 reports in total: 10 in 20 steps, the last maybe ending with the run
    triggered = sum(s.get("rounds", 0) for s in log) + summary["uploads_after_last_step"]
    assert triggered in (9, 10)
    assert sum(s.get("pulls", 0) for s in log) <= 2 * triggered  # only the leader's parameters move
    assert all(s["leader"] in (0, 1, 2) for s in log)
    assert summary["bytes_sent"] == lsgd_bytes(summary, log, 3)
    metrics = rows(out / "metrics.jsonl")
    assert metrics[-1]["train_loss"] < 0.8 * metrics[0]["train_loss"]  # the leader learns


@pytest.mark.timeout(300)
def test_async_multi_leader_on_real_processes(tmp_path, data_dir):
    out = tmp_path / "multi"
    spec = "lsgd:async=true,groups=2,period=1,pull=0.5,global_period=3,global_pull=0.5"
    p = launch(5, BASE + ["--algorithm", spec, "--stragglers", "lognormal:sigma=0.5,compute_s=0.005"],
               out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary, log = json.loads((out / "summary.json").read_text()), rows(out / "steps.jsonl")
    assert json.loads((out / "algorithm.json").read_text())["groups"] == [[0, 1], [2, 3]]
    assert all(s["group_leaders"][0] in (0, 1) and s["group_leaders"][1] in (2, 3) for s in log)
    global_rounds = sum("leader_loss" in s for s in log)
    assert global_rounds >= 5 and sum(s.get("rounds", 0) for s in log) > 3 * global_rounds  # group rounds too
    assert summary["bytes_sent"] == lsgd_bytes(summary, log, 4)


@pytest.mark.timeout(300)
def test_async_lsgd_survives_a_killed_worker(tmp_path, data_dir):
    out = tmp_path / "dead"
    args = BASE + SLOW + ["--algorithm", "lsgd:async=true,period=1,pull=0.5"]
    results = _spawn(4, args, out, data_dir, {"GRADWIRE_KILL_AT": "1:5"})
    codes = [c for c, _ in results]
    assert codes[2] == -signal.SIGKILL                    # process 2 hosts worker 1
    assert codes[0] == codes[1] == codes[3] == 0, [e[-1500:] for _, e in results]
    summary, log = json.loads((out / "summary.json").read_text()), rows(out / "steps.jsonl")
    assert summary["status"] == "finished" and summary["steps"] == 20 and summary["lost_workers"] == [1]
    assert summary["local_steps"]["1"] == 5
    assert all(s["leader"] != 1 for s in log[-10:])  # a lost worker is no longer elected
    assert summary["bytes_sent"] == lsgd_bytes(summary, log, 2)


def test_checkpoints_are_refused_in_coordinator_mode(tmp_path, data_dir):
    for spec in ("lsgd:async=true", "easgd:async=true"):
        cfg = RunConfig(task="digits-logreg", workers=2, algorithm=spec, backend="torch", checkpoint_every=5,
                        out=str(tmp_path / "x"), data_dir=str(data_dir))
        with pytest.raises(ConfigError, match="coordinator process, which does not take checkpoints"):
            Run(cfg)


def test_workers_map_to_nodes_past_the_coordinator_process():
    from gradwire.transports.torch_dist import TorchTransport

    t = TorchTransport.__new__(TorchTransport)  # node_of needs no process group
    t.local_world = 3
    assert [t.node_of(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    t.first_worker_process = 1  # process 0 (on node 0) coordinates: worker r runs in process r + 1
    assert [t.node_of(r) for r in range(5)] == [0, 0, 1, 1, 1]
