"""SparseLoCo and DeMo: one implementation, the same numbers with one worker per thread (bitwise)
and on real gloo processes (``gradwire launch``; close, and the same bytes: the top-k messages travel
framed at their codec's bound, so no backend exchanges sizes first). DiLoCo with backup
replicas and asynchronous DiLoCo: their server-mode protocol on gloo processes (the threads
backend runs the same real driver in tests/algorithms/test_{backup,async}_diloco.py)."""

import pytest
import torch

from gradwire.cli import main
from gradwire.run.loop import Run
from tests.backends.processes import ranks, sim_and_torch
from tests.backends.threads import run_one_worker_per_thread
from tests.helpers import read_jsonl

SPECS = ["sparseloco:inner_steps=3,chunk=64,k=4", "sparseloco:inner_steps=3,chunk=64,k=4,aggregate=senders_mean,"
         "clip=median_norm", "demo:chunk=32,k=2", "muloco:inner_steps=3"]


@pytest.mark.parametrize("spec", SPECS)
def test_one_thread_per_rank_matches_the_simulator(make_config, spec):
    cfg = make_config(algorithm=spec, lr=0.01, workers=3, task="digits-mlp" if "muloco" in spec else "digits-logreg")
    sim = Run(cfg)
    sim_infos = [sim.train_step() for _ in range(7)]
    threads = run_one_worker_per_thread(cfg, 7)
    for rank, got in threads.items():
        assert torch.equal(got["eval"], sim.algorithm.eval_params()), rank
        if not spec.startswith("demo"):
            assert torch.equal(got["x"], sim.algorithm.replicas.x[rank]), rank
        assert [i.get("merged") for i in got["infos"]] == [i.get("merged") for i in sim_infos]


COMMON = ["--task", "digits-mlp", "--steps", "8", "--eval-every", "4", "--batch-size", "16", "--lr", "0.01",
          "--network", "ring:mbps=100,latency_ms=1", "--seed", "3"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", ["sparseloco:inner_steps=2,chunk=256,k=8", "demo:chunk=64,k=2",
                                  "sparseloco:inner_steps=2,chunk=256,k=8,aggregate=senders_mean,clip=median_norm"])
def test_sim_and_torch_backends_agree(tmp_path, data_dir, spec):
    real, sim = sim_and_torch(tmp_path, data_dir, 2, COMMON + ["--algorithm", spec])
    assert [r["step"] for r in real] == [r["step"] for r in sim] == [0, 4, 8]
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-5, atol=1e-6)
    # every message framed at the codec's bound: no exchange of sizes, no padding to the longest; the same ledger
    assert real[-1]["bytes_sent"] == sim[-1]["bytes_sent"] > 0
    assert real[-1]["train_loss"] < real[0]["train_loss"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", ["backup-diloco:backups=0,inner_steps=2", "async-diloco:inner_steps=2",
                                  "async-diloco:inner_steps=2,dylu=true",  # DyLU: its 8-byte reports in the bytes
                                  # compressed both ways: the server's copy of the replica's θ (EF21-P)
                                  "backup-diloco:backups=0,inner_steps=2,answer=change|randk:ratio=0.1"])
def test_server_mode_diloco_runs_its_protocol_on_gloo_processes(tmp_path, data_dir, spec):
    """The server-mode protocol over torch.distributed: a server process and one replica, whose
    messages come in one order only, so every figure is the simulator's (bytes: headers and bodies)."""
    spec, _, compressor = spec.partition("|")
    args = COMMON + ["--algorithm", spec, "--steps", "4", "--eval-every", "2"] + (
        ["--compressor", compressor] if compressor else [])
    p = ranks(2, args, tmp_path / "torch", data_dir)  # 2 processes: the server and one replica
    assert p.returncode == 0, p.stderr[-3000:]
    assert main(["run", *args, "--workers", "1", "--out", str(tmp_path / "sim"), "--data-dir", str(data_dir)]) == 0
    real, sim = read_jsonl(tmp_path / "torch" / "metrics.jsonl"), read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    assert [r["step"] for r in real] == [r["step"] for r in sim] == [0, 2, 4]
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-6, atol=1e-7)
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim] and sim[-1]["bytes_sent"] > 0
