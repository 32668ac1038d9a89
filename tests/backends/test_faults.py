"""Checkpoints and faults on real processes: resume is bitwise exact on the torch backend, and a
worker killed with SIGKILL makes torchrun restart the group, which resumes from the last
checkpoint and ends exactly where the uninterrupted run ends."""

import json

import pytest
import torch

from tests.backends.processes import launch
from tests.helpers import read_jsonl, states_equal

ARGS = ["--task", "digits-mlp", "--steps", "30", "--eval-every", "5", "--batch-size", "16", "--lr", "0.05",
        "--momentum", "0.9", "--algorithm", "diana", "--compressor", "pquant:p=2,block=64", "--checkpoint-every", "10",
        "--seed", "1"]


def final_states(folder, nproc):
    stepdir = folder / "checkpoint" / (folder / "checkpoint" / "latest").read_text().strip()
    out = {}
    for r in range(nproc):
        st = torch.load(stepdir / f"rank{r}.pt", weights_only=True)["state"]
        st.pop("clock"), st["transport"].pop("comm_time_s")  # wall-clock figures differ between runs
        out[r] = st
    return stepdir.name, out


def losses(folder):
    return [(r["step"], r["train_loss"], r["bytes_sent"]) for r in read_jsonl(folder / "metrics.jsonl")]


@pytest.mark.timeout(400)
def test_killed_worker_restarts_group_and_resumes_exactly(tmp_path, data_dir):
    p = launch(2, ARGS, tmp_path / "whole", data_dir)
    assert p.returncode == 0, p.stderr[-2000:]
    p = launch(2, ARGS + ["--resume-or-start"], tmp_path / "killed", data_dir, extra_env={"GRADWIRE_KILL_AT": "1:15"},
               launch_args=["--max-restarts", "1"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Signals.SIGKILL" in p.stderr or "SIGKILL" in p.stderr or "exitcode: -9" in p.stderr
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["resumed"] and summary["steps"] == 30
    name_a, a = final_states(tmp_path / "whole", 2)
    name_b, b = final_states(tmp_path / "killed", 2)
    assert name_a == name_b == "step-00000030"
    assert states_equal(a, b)
    assert losses(tmp_path / "whole") == losses(tmp_path / "killed")


@pytest.mark.timeout(300)
def test_kill_without_restarts_fails_cleanly(tmp_path, data_dir):
    p = launch(2, ARGS, tmp_path / "dead", data_dir, extra_env={"GRADWIRE_KILL_AT": "0:12"})
    assert p.returncode == 1
    assert "gradwire launch: error: worker processes failed" in p.stderr
    assert (tmp_path / "dead" / "checkpoint" / "latest").read_text().strip() == "step-00000010"
