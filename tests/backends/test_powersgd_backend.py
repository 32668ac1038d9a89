"""PowerSGD is one implementation on two backends: ``sync --compressor powersgd`` gives the same
numbers and bytes on the simulator and on 2 gloo processes (torchrun through ``gradwire launch``),
its two allreduces going through ``Transport.allreduce_mean`` on both."""

import pytest
import torch

from gradwire.cli import main
from tests.backends.processes import ranks
from tests.helpers import read_jsonl

COMMON = ["--task", "digits-mlp", "--steps", "12", "--eval-every", "1", "--batch-size", "16", "--lr", "0.1",
          "--momentum", "0.9", "--network", "ring:mbps=100,latency_ms=1", "--seed", "3",
          "--algorithm", "sync", "--compressor", "powersgd:rank=2"]


@pytest.mark.timeout(300)
def test_sim_and_torch_backends_agree(tmp_path, data_dir):
    p = ranks(2, COMMON, tmp_path / "torch", data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    real = read_jsonl(tmp_path / "torch" / "metrics.jsonl")
    assert main(["run", *COMMON, "--workers", "2", "--out", str(tmp_path / "sim"), "--data-dir", str(data_dir)]) == 0
    sim = read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    assert [r["step"] for r in real] == [r["step"] for r in sim] == list(range(13))
    # two ranks: gloo's sum of two numbers is the simulator's, so the losses agree to the last bit
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=0, atol=0)
    assert [r["test_acc"] for r in real] == [r["test_acc"] for r in sim]
    # the ring formula, 2 (n - 1) bytes per byte contributed, on both; 478 floats a step at rank 2
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim] == [2 * 478 * 4 * s for s in range(13)]
    assert real[-1]["train_loss"] < real[0]["train_loss"]


@pytest.mark.timeout(300)
def test_fp16_factors_agree_across_backends(tmp_path, data_dir):
    """dtype=fp16: gloo sums the half-precision factors, the simulator sums them in fp32 and rounds
    nothing; two ranks' sum of two fp16 numbers is exact in fp32, so only the final rounding of the
    mean differs: the losses agree closely, the bytes exactly (2 bytes a float)."""
    args = [*COMMON[:-1], "powersgd:rank=2,dtype=fp16"]
    p = ranks(2, args, tmp_path / "torch", data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    real = read_jsonl(tmp_path / "torch" / "metrics.jsonl")
    assert main(["run", *args, "--workers", "2", "--out", str(tmp_path / "sim"), "--data-dir", str(data_dir)]) == 0
    sim = read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-3, atol=0)
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim] == [2 * 478 * 2 * s for s in range(13)]
    assert real[-1]["train_loss"] < real[0]["train_loss"]


@pytest.mark.timeout(300)
def test_overlapped_buckets_on_gloo_agree_with_the_simulator(tmp_path, data_dir):
    """``sync:overlap=true`` on 2 gloo processes: each rank's buckets go to its communication thread
    while its backward pass goes on (3 buckets here: 700 floats a bucket at most). Same losses, to
    the bit, and same bytes as the simulator without overlap."""
    args = [*COMMON[:-4], "--algorithm", f"sync:overlap=true,bucket_mb={700 * 4 / 2**20}", "--compressor",
            "powersgd:rank=2,start_step=2"]
    p = ranks(2, args, tmp_path / "torch", data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    real = read_jsonl(tmp_path / "torch" / "metrics.jsonl")
    plain = [*COMMON[:-1], "powersgd:rank=2,start_step=2"]
    assert main(["run", *plain, "--workers", "2", "--out", str(tmp_path / "sim"), "--data-dir", str(data_dir)]) == 0
    sim = read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=0, atol=0)
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim]
    assert real[-1]["train_loss"] < real[0]["train_loss"]
