"""Checkpoints resume exactly on real processes too: PowerSGD (Q memories, error buffers), signSGD
(rank 0's residual) and Streaming DiLoCo (replicas, outer momentum, a round in flight at the
checkpoint, compressed outer gradients with error feedback, averaged by all-gather or by chunk
owners) on 2 gloo processes (``gradwire launch``) stopped after step 7, then resumed from the
checkpoint of step 5, give the same metrics, bit for bit, as the run that never stopped, and the same
final checkpoint. A round in flight at the checkpoint is sent again after the resume and counted once
(``Transport.restart``), as on the simulator (tests/algorithms/test_diloco.py): the same bytes as
never stopping."""

import json

import pytest
import torch

from tests.backends.processes import ranks
from tests.helpers import read_jsonl

COMMON = ["--task", "digits-mlp", "--steps", "12", "--eval-every", "1", "--batch-size", "16", "--lr", "0.05",
          "--momentum", "0.9", "--seed", "3", "--checkpoint-every", "5"]


def _metrics(folder) -> tuple[list[dict], list[int]]:
    """(the records less elapsed seconds, which differ between any two runs on real processes, and
    less bytes sent; the bytes sent, step by step)."""
    rows = read_jsonl(folder / "metrics.jsonl")
    timing = ("wall_time_s", "eval_time_s", "sim_time_s", "bytes_sent")
    return ([{k: v for k, v in r.items() if k not in timing} for r in rows],
            [r["bytes_sent"] for r in rows])


def _final_state(folder, rank: int) -> dict:
    """The rank's last checkpoint, less what measures elapsed seconds (the run's clock, the time spent
    communicating, the local-update algorithms' pace: when each worker's step ended): the two runs
    took different times, and nothing else may differ."""
    step = (folder / "checkpoint" / "latest").read_text().strip()
    state = torch.load(folder / "checkpoint" / step / f"rank{rank}.pt", weights_only=True)["state"]
    assert state.pop("clock")["now"] > 0 and state["transport"].pop("comm_time_s") > 0
    if "pace" in state["algorithm"]:
        assert all(t > 0 for t in state["algorithm"].pop("pace")["ready"].values())
    return state


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.timeout(400)
@pytest.mark.parametrize("extra", [
    ["--algorithm", "sync", "--compressor", "powersgd:rank=2"],
    # fragment 0 sends after step 4 and merges after step 6: in flight at the checkpoint of step 5,
    # started again after the resume and counted once (Transport.restart): the same bytes as never stopping
    ["--algorithm", "streaming-diloco:inner_steps=4,fragments=2,overlap=2,inner=sgd",
     "--compressor", "qsgd:levels=8,bucket=128", "--error-feedback"],
    # the same round by chunk owners: restarted on the transport's own thread, the owners' residuals and
    # random streams kept at delivery only, so the resumed round repeats the one that never stopped
    ["--algorithm", "streaming-diloco:inner_steps=4,fragments=2,overlap=2,inner=sgd",
     "--compressor", "qsgd:levels=8,bucket=128", "--error-feedback", "--compressed-mean", "scatter"],
    # rank 0's residual of the error-fed reply, in rank 0's checkpoint only (the process that tallies the votes)
    ["--algorithm", "signsgd", "--momentum", "0", "--lr", "0.01", "--lr-schedule", "constant"],
], ids=["powersgd", "streaming-diloco", "streaming-diloco-scatter", "signsgd"])
def test_resumed_run_on_gloo_equals_the_run_that_never_stopped(tmp_path, data_dir, extra):
    whole, split = tmp_path / "whole", tmp_path / "split"
    p = ranks(2, COMMON + extra, whole, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    p = ranks(2, [*COMMON, *extra, "--steps", "7"], split, data_dir)  # "crashes" after step 7
    assert p.returncode == 0, p.stderr[-3000:]
    p = ranks(2, [*COMMON, *extra, "--resume"], split, data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert read_jsonl(split / "metrics.jsonl")[-1]["step"] == 12
    assert json.loads((split / "summary.json").read_text())["resumed"]
    (a, sent_a), (b, sent_b) = _metrics(whole), _metrics(split)
    assert [r["step"] for r in a] == list(range(13)) and [r["step"] for r in b] == list(range(13))
    assert a == b  # steps 6-12 came from the checkpoint of step 5, steps 6-7 computed twice alike
    assert sent_a == sent_b  # every byte counted once, a round in flight at the checkpoint included
    if extra[1] == "signsgd":
        assert [("residual" in _final_state(whole, rank)["algorithm"]) for rank in (0, 1)] == [True, False]
    for rank in (0, 1):
        whole_state, split_state = _final_state(whole, rank), _final_state(split, rank)
        assert split_state["transport"].pop("bytes_sent") == whole_state["transport"].pop("bytes_sent")
        assert _equal(whole_state, split_state), rank
