"""DiLoCo and Streaming DiLoCo: one implementation, the same numbers on the simulated cluster and on
real gloo processes (``gradwire launch``), with rounds in flight across steps and compressed outer
gradients."""

import pytest
import torch

from tests.backends.processes import sim_and_torch

COMMON = ["--steps", "12", "--eval-every", "2", "--batch-size", "16", "--lr", "0.01",
          "--network", "ring:mbps=100,latency_ms=1", "--seed", "3"]
LM = "stdlib-lm:context=16,dim=32,layers=1,heads=2,train_bytes=40000,val_bytes=4000"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nproc, extra, evaluated", [  # evaluations on round ends (Algorithm.evaluates_at)
    (2, ["--task", LM, "--algorithm", "diloco:inner_steps=3", "--lr-schedule", "cosine:warmup=2,min_ratio=0.1"],
     [0, 3, 6, 9, 12]),
    (2, ["--task", "digits-mlp", "--algorithm", "streaming-diloco:inner_steps=4,fragments=2,overlap=3"],
     list(range(0, 13, 2))),  # Streaming DiLoCo keeps --eval-every (θ changes every H/P steps)
    (3, ["--task", "digits-mlp", "--algorithm", "streaming-diloco:inner_steps=3,fragments=3,overlap=1",
         "--compressor", "qsgd:levels=8,bucket=128", "--error-feedback"], list(range(0, 13, 2))),
    (2, ["--task", "digits-mlp", "--algorithm", "streaming-diloco:inner_steps=4,fragments=2,overlap=3,eager=true",
         "--compressor", "qsgd:levels=8,bucket=128"], list(range(0, 13, 2))),  # eager updates (Kale et al. 2025)
    # MuLoCo's round carried (merge=carry: the progress while it travelled kept), its 1-bit message
    (2, ["--task", LM, "--algorithm", "muloco:inner_steps=3,overlap=2,merge=carry,outer_lr=1,outer_momentum=0",
         "--compressor", "sign:scaled=true"], [0, 2, 5, 8, 11, 12]),  # merges at 3k + τ
])
def test_sim_and_torch_backends_agree(tmp_path, data_dir, nproc, extra, evaluated):
    real, sim = sim_and_torch(tmp_path, data_dir, nproc, COMMON + extra)
    assert [r["step"] for r in real] == [r["step"] for r in sim] == evaluated
    # sums of floats in another order (gloo's ring against the simulator's rank order): close, not bitwise
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-5, atol=1e-6)
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim]
    assert real[-1]["train_loss"] < real[0]["train_loss"]


@pytest.mark.timeout(300)
def test_quantised_outer_gradients_travel_while_the_next_steps_compute(tmp_path, data_dir):
    """qsgd payloads are not summable: their all-gather is started with ``async_op`` and waited for
    only when the round merges, τ = 2 steps later. Each rank's timeline shows the all-gather in flight
    (OVERLAP, recorded only by a collective left running) across a whole inner step's compute. (That
    its bytes travel before the wait, not only that it is left running, is test_torch_allgather.py's.)"""
    from gradwire.report.timeline import COMPUTE, OVERLAP, read_timeline
    from tests.backends.processes import ranks

    args = COMMON + ["--task", "digits-mlp", "--algorithm", "streaming-diloco:inner_steps=4,fragments=2,overlap=2",
                     "--compressor", "qsgd:levels=8,bucket=128"]
    p = ranks(2, args, tmp_path / "run", data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    recs, _ = read_timeline(tmp_path / "run", overlapped=False)
    for worker in (0, 1):
        mine = recs[recs["worker"] == worker]
        flights = mine[mine["kind"] == OVERLAP]
        computes = mine[mine["kind"] == COMPUTE]
        assert len(flights) >= 4, worker  # a round per fragment every 4 steps, from step 2 on
        covered = [f for f in flights if any(f["start"] <= c["start"] and c["end"] <= f["end"] for c in computes)]
        assert len(covered) >= 4, (worker, flights[["step", "start", "end"]])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("compressor", ["topk:ratio=0.1", "threshold:tau=0.001"])
def test_variable_size_payloads_with_several_rounds_in_flight(tmp_path, data_dir, compressor):
    """Payloads that differ in size (their positions are coded). top-k's are bounded (k positions):
    every backend carries them framed at the bound, so the same bytes as the simulator. threshold's
    are not: the torch backend exchanges the sizes, gathers payloads padded to the longest and cuts
    each back, so more bytes (sizes, padding). Four fragments, τ = 3: three rounds in flight at
    once. The same losses as the simulator either way."""
    args = COMMON + ["--task", "digits-mlp", "--algorithm", "streaming-diloco:inner_steps=4,fragments=4,overlap=3",
                     "--compressor", compressor, "--error-feedback"]
    real, sim = sim_and_torch(tmp_path, data_dir, 2, args)
    assert [r["step"] for r in real] == [r["step"] for r in sim] == list(range(0, 13, 2))
    assert max(r["in_flight"] for r in real if "in_flight" in r) == 3
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-5, atol=1e-6)
    if compressor.startswith("topk"):
        assert real[-1]["bytes_sent"] == sim[-1]["bytes_sent"] > 0
    else:
        assert real[-1]["bytes_sent"] > sim[-1]["bytes_sent"] > 0
    assert real[-1]["train_loss"] < real[0]["train_loss"]
