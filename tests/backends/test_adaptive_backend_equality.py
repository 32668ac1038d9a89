"""DAGC and DQ-SGD run unchanged on torch.distributed (gloo processes via `gradwire launch`) and give
the simulator's numbers: everything global is derived from shard sizes, seeds and collectives."""

import json

import pytest
import torch

from gradwire.cli import main
from tests.backends.processes import ranks
from tests.helpers import read_jsonl

COMMON = ["--task", "digits-mlp", "--steps", "6", "--eval-every", "1", "--batch-size", "16", "--lr", "0.1",
          "--momentum", "0.9", "--network", "ring:mbps=100,latency_ms=1", "--seed", "3",
          "--partition", "volumes:skew=4"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc, extra", [
    (3, ["--algorithm", "dagc:budget=0.05,mode=absolute", "--error-feedback"]),
    (2, ["--algorithm", "dagc:budget=0.05,local_steps=3", "--error-feedback"]),
    (3, ["--algorithm", "dqsgd:bits_budget=3"]),
])
def test_torch_backend_matches_the_simulator(tmp_path, data_dir, nproc, extra):
    p = ranks(nproc, [*COMMON, *extra], tmp_path / "torch", data_dir, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert main(["run", *COMMON, *extra, "--workers", str(nproc), "--out", str(tmp_path / "sim"),
                 "--data-dir", str(data_dir)]) == 0
    real, sim = read_jsonl(tmp_path / "torch" / "metrics.jsonl"), read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    assert [r["step"] for r in real] == [r["step"] for r in sim] == list(range(7))
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-5, atol=1e-6)
    for key in ("levels", "kept"):  # the adaptive choices agree too
        assert [r.get(key) for r in real] == [r.get(key) for r in sim]
    info = [json.loads((tmp_path / d / "algorithm.json").read_text()) for d in ("torch", "sim")]
    assert info[0] == info[1]
