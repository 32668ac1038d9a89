"""Asynchronous LSGD and EASGD on real processes (coordinator mode): every worker steps at its own
pace, the exchanges and rounds follow each worker's own step counts, and the bytes are exactly
what the protocol must send for the events the run recorded."""

import json
import signal

import pytest
import torch

from gradwire.algorithms.protocol import HEADER_BYTES, REPORT, Message
from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.run.loop import Run
from tests.backends.processes import launch, ranks, spawn
from tests.helpers import read_jsonl

BASE = ["--task", "digits-logreg", "--batch-size", "16", "--lr", "0.2", "--eval-every", "5", "--seed", "5",
        "--steps", "20"]
SLOW = ["--stragglers", "slow:count=1,slowdown=10,compute_s=0.01"]  # worker 0 takes 10x as long per step
MODEL = (64 * 10 + 10) * 4  # digits-logreg parameters, float32
HEADER, RELEASE = HEADER_BYTES, 8  # every message's header; the release that lets a worker leave


def lsgd_bytes(summary, log, workers_said_bye):
    """Every local step: a report and its answer; every round whose parameters arrived: the upload
    (header + model, answered by a header); every pull: one model behind the answer's header."""
    reports = sum(summary["local_steps"].values())
    uploads = (sum(s.get("rounds", 0) + s.get("uploads_superseded", 0) for s in log)
               + summary["uploads_after_last_step"])
    pulls = sum(s.get("pulls", 0) for s in log)
    return (2 * HEADER * reports + uploads * (2 * HEADER + MODEL) + pulls * MODEL
            + workers_said_bye * (HEADER + RELEASE) - summary["answers_refused_bytes"])


@pytest.mark.timeout(300)
def test_async_easgd_on_real_processes(tmp_path, data_dir):
    out = tmp_path / "easgd"
    p = ranks(4, BASE + SLOW + ["--algorithm", "easgd:async=true,period=3"], out, data_dir)  # coordinator + 3
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = {int(w): n for w, n in summary["local_steps"].items()}
    assert summary["lost_workers"] == []
    assert steps[0] < min(steps[1], steps[2])  # the slow worker takes fewer local steps
    # x_i up and e down exactly after every 3rd step of each worker's own, a header each way otherwise
    expected = sum(2 * HEADER * n + 2 * MODEL * (n // 3) for n in steps.values()) + 3 * (HEADER + RELEASE)
    assert summary["bytes_sent"] + summary["finish_bytes"] == expected
    metrics = read_jsonl(out / "metrics.jsonl")
    assert json.loads((out / "config.json").read_text())["evaluates"] == "center"
    assert metrics[-1]["train_loss"] < 0.8 * metrics[0]["train_loss"]  # the center learns


@pytest.mark.timeout(300)
def test_async_lsgd_on_real_processes(tmp_path, data_dir):
    out = tmp_path / "lsgd"
    p = ranks(4, BASE + SLOW + ["--algorithm", "lsgd:async=true,period=2,pull=0.5"], out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary, log = json.loads((out / "summary.json").read_text()), read_jsonl(out / "steps.jsonl")
    steps = {int(w): n for w, n in summary["local_steps"].items()}
    assert summary["lost_workers"] == [] and steps[0] < min(steps[1], steps[2])
    # a round per period·n = 6 reports in total: 10 in 20 steps (the last ones may end with the run)
    assert summary["rounds_triggered"] == {"global": 10, "group": 0}
    assert sum(s.get("rounds", 0) for s in log) >= 1
    assert summary["bytes_sent"] + summary["finish_bytes"] == lsgd_bytes(summary, log, 3)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[-1]["train_loss"] < 0.8 * metrics[0]["train_loss"]  # the leader learns


@pytest.mark.timeout(300)
def test_async_multi_leader_on_real_processes(tmp_path, data_dir):
    out = tmp_path / "multi"
    spec = "lsgd:async=true,groups=2,period=1,pull=0.5,global_period=3,global_pull=0.5"
    p = ranks(5, BASE + ["--algorithm", spec, "--stragglers", "lognormal:sigma=0.5,compute_s=0.005"],
               out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary, log = json.loads((out / "summary.json").read_text()), read_jsonl(out / "steps.jsonl")
    assert json.loads((out / "algorithm.json").read_text())["groups"] == [[0, 1], [2, 3]]
    # global: one per 3·4 = 12 reports of 80; a group's: one per 1·2 of its own reports (r0 + r1 = 80)
    triggered = summary["rounds_triggered"]
    assert triggered["global"] == 6 and triggered["group"] in (39, 40)
    assert sum("leader_loss" in s for s in log) >= 1 and sum(s.get("rounds", 0) for s in log) > 10
    assert summary["bytes_sent"] + summary["finish_bytes"] == lsgd_bytes(summary, log, 4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["", ":sent"])  # after its 5th answer, or with its 5th report unanswered
def test_async_lsgd_survives_a_killed_worker(tmp_path, data_dir, when):
    out = tmp_path / "dead"
    args = BASE + SLOW + ["--algorithm", "lsgd:async=true,period=1,pull=0.5"]
    results = spawn(4, args, out, data_dir, {"GRADWIRE_KILL_AT": "1:5" + when})
    codes = [c for c, _ in results]
    assert codes[2] == -signal.SIGKILL                    # process 2 hosts worker 1
    assert codes[0] == codes[1] == codes[3] == 0, [e[-1500:] for _, e in results]
    summary, log = json.loads((out / "summary.json").read_text()), read_jsonl(out / "steps.jsonl")
    assert summary["status"] == "finished" and summary["steps"] == 20 and summary["lost_workers"] == [1]
    # its 5th report was processed either way (with ":sent", answering it found the worker gone)
    assert summary["local_steps"]["1"] == 5 and summary["lost_reasons"]["1"]
    assert all(s["leader"] != 1 for s in log[-10:])  # a lost worker is no longer elected
    assert summary["bytes_sent"] + summary["finish_bytes"] == lsgd_bytes(summary, log, 2)


def _easgd_bytes(local_steps, workers_said_bye, checkpoints):
    """As in the test above, plus a SAVE answer and an ACK per worker for every checkpoint taken."""
    return (sum(2 * HEADER * n + 2 * MODEL * (n // 3) for n in local_steps.values())
            + workers_said_bye * (HEADER + RELEASE) + checkpoints * 3 * 2 * HEADER)


@pytest.mark.timeout(300)
def test_checkpoint_is_a_consistent_cut_and_resumes(tmp_path, data_dir):
    out = tmp_path / "ckpt"
    args = [a if a != "20" else "10" for a in BASE] + SLOW + ["--algorithm", "easgd:async=true,period=3",
                                                               "--checkpoint-every", "5", "--resume-or-start"]
    p = ranks(4, args, out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    latest = out / "checkpoint" / (out / "checkpoint" / "latest").read_text().strip()
    assert latest.name == "step-00000010"
    coord = torch.load(latest / "rank0.pt", weights_only=True)["state"]
    assert coord["step"] == 10 and len(coord["server"]["held"]) == 3
    for held in coord["server"]["held"]:
        msg = Message.from_state(held)
        w = msg.worker
        worker = torch.load(latest / f"rank{w + 1}.pt", weights_only=True)["state"]
        count = worker["worker_position"]["count"]
        # the worker saved its state right after the step whose report the coordinator holds unprocessed
        assert msg.kind == REPORT and msg.count == count
        assert coord["server"]["counts"][str(w)] == count - 1
        assert held["body"].numel() == (MODEL if count % 3 == 0 else 0)  # x_i travels with every 3rd
    assert sum(coord["server"]["counts"].values()) == 30 - 3 + 3  # 30 reports processed, 3 held

    p = ranks(4, BASE + SLOW + ["--algorithm", "easgd:async=true,period=3", "--checkpoint-every", "5",
                                 "--resume"], out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] and summary["steps"] == 20 and summary["lost_workers"] == []
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 5, 10, 15, 20]
    assert [s["step"] for s in read_jsonl(out / "steps.jsonl")] == list(range(1, 21))
    steps = {int(w): n for w, n in summary["local_steps"].items()}
    # bytes continue from the checkpoint: everything the protocol sent on the resumed timeline,
    # with the SAVE/ACK pairs of all four checkpoints (a checkpoint's own are in its saved count)
    assert summary["bytes_sent"] + summary["finish_bytes"] == _easgd_bytes(steps, 3, 4)


@pytest.mark.timeout(300)
def test_a_cut_whose_member_dies_before_acknowledging_is_not_committed(tmp_path, data_dir):
    out = tmp_path / "unacked"
    args = [a if a != "20" else "10" for a in BASE] + SLOW + ["--algorithm", "easgd:async=true,period=3",
                                                               "--checkpoint-every", "5"]
    # worker 1 saves its part of the cut of step 10 (the run's last) and dies before its ACK
    results = spawn(4, args, out, data_dir, {"GRADWIRE_KILL_AT": "1:10:unacked"})
    codes = [c for c, _ in results]
    assert codes[2] == -signal.SIGKILL and codes[0] == codes[1] == codes[3] == 0, [e[-1500:] for _, e in results]
    assert "checkpoint of step 10 not committed: worker(s) 1 lost before the cut was complete" in results[0][1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 10 and summary["lost_workers"] == [1]
    # latest stays at the cut before, whole: a resume would not find worker 1 both lost and present
    assert (out / "checkpoint" / "latest").read_text().strip() == "step-00000005"
    assert sorted(f.name for f in (out / "checkpoint" / "step-00000005").glob("*.pt")) == \
        ["rank0.pt", "rank1.pt", "rank2.pt", "rank3.pt"]


@pytest.mark.timeout(300)
def test_async_lsgd_restarts_from_its_checkpoint_after_a_crash(tmp_path, data_dir):
    out = tmp_path / "crash"
    args = BASE + SLOW + ["--algorithm", "lsgd:async=true,period=2,pull=0.5", "--checkpoint-every", "5",
                          "--resume-or-start"]
    # worker 1 dies at its step 12 or the first after a committed checkpoint (on a loaded machine the
    # slow worker 0 can hold back the first cut past step 12); torchrun notices the death within
    # 10 ms (PET_MONITOR_INTERVAL) and restarts the group. Usually that is before the survivors
    # commit a later cut; on a loaded machine they sometimes do, and that cut records worker 1 lost
    # with no state of its own. Either way the restarted group resumes the latest committed cut:
    p = launch(4, args, out, data_dir, extra_env={"GRADWIRE_KILL_AT": "1:12:saved", "PET_MONITOR_INTERVAL": "0.01"},
               launch_args=["--max-restarts", "1"])
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    seen = ({k: summary.get(k) for k in ("resumed_from_step", "steps", "lost_workers", "rejoined_workers",
                                         "local_steps")}, p.stderr[-3000:])
    assert summary["resumed"] and summary["steps"] == 20, seen
    resumed_from = summary["resumed_from_step"]
    assert resumed_from in (5, 10, 15) and f"from its checkpoint at step {resumed_from}" in p.stderr, seen
    # a cut before the death: nobody lost in the resumed history; a cut after it: worker 1 named lost,
    # and it rejoined from the server's parameters (HELLO), so the run ends with all three workers
    assert summary["lost_workers"] == summary["rejoined_workers"] and summary["lost_workers"] in ([], [1]), seen
    assert all(n > 0 for n in summary["local_steps"].values()), seen
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 5, 10, 15, 20]
    assert [s["step"] for s in read_jsonl(out / "steps.jsonl")] == list(range(1, 21))
    latest = out / "checkpoint" / (out / "checkpoint" / "latest").read_text().strip()
    assert latest.name == "step-00000020"
    assert sorted(f.name for f in latest.glob("*.pt")) == ["rank0.pt", "rank1.pt", "rank2.pt", "rank3.pt"]
    coord = torch.load(latest / "rank0.pt", weights_only=True)["state"]
    assert len(coord["server"]["held"]) == 3  # the cut after the restart is as consistent as the first
    for held in coord["server"]["held"]:
        msg = Message.from_state(held)
        worker = torch.load(latest / f"rank{msg.worker + 1}.pt", weights_only=True)["state"]
        assert msg.count == worker["worker_position"]["count"]


@pytest.mark.timeout(300)
def test_worker_missing_from_checkpoint_rejoins_from_the_center(tmp_path, data_dir):
    out = tmp_path / "rejoin"
    args = SLOW + ["--algorithm", "easgd:async=true,period=3", "--checkpoint-every", "5", "--resume-or-start"]
    p = ranks(4, [a if a != "20" else "10" for a in BASE] + args, out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    latest = out / "checkpoint" / (out / "checkpoint" / "latest").read_text().strip()
    before = torch.load(latest / "rank0.pt", weights_only=True)["state"]["server"]["counts"]["1"]
    (latest / "rank2.pt").unlink()  # as if worker 1 had been lost before this checkpoint
    p = ranks(4, BASE + args, out, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] and summary["steps"] == 20 and summary["lost_workers"] == []
    assert summary["resumed_from_step"] == 10 and summary["rejoined_workers"] == [1]
    # it rejoined and kept stepping: the last cut (step 20) holds its state, past where it was lost
    last = out / "checkpoint" / "step-00000020" / "rank2.pt"
    assert torch.load(last, weights_only=True)["state"]["worker_position"]["count"] > before


def test_bad_checkpoint_state_is_named(tmp_path, data_dir):
    cfg = RunConfig(task="digits-logreg", workers=2, algorithm="easgd:async=true", backend="sim",
                    out=str(tmp_path / "x"), data_dir=str(data_dir))
    r = Run(cfg)
    state = r.state_dict()
    del state["algorithm"]["center"]
    fits = "checkpoint does not fit this run \\(its state has no 'center'\\).*another --out"
    with pytest.raises(ConfigError, match=fits):
        r.load_state_dict(state)


def test_workers_map_to_nodes_past_the_coordinator_process():
    from gradwire.transports.torch_dist import TorchTransport

    t = TorchTransport.__new__(TorchTransport)  # node_of needs no process group
    t.local_world, t._global = 3, list(range(6))  # worker r is process r (no tensor parallelism)
    assert [t.node_of(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    t.first_worker_process = 1  # process 0 (on node 0) coordinates: worker r runs in process r + 1
    assert [t.node_of(r) for r in range(5)] == [0, 0, 1, 1, 1]
    # --tensor-parallel 1d:p=2: data-parallel worker r is the group led by process 2r
    t.local_world, t._global, t.first_worker_process = 4, [0, 2, 4, 6], 0
    assert [t.node_of(r) for r in range(4)] == [0, 0, 1, 1]
