"""--device: where the workers compute, and which torch.distributed backend carries their tensors.

The backend follows --device, never the hardware present: a machine with GPUs runs --device cpu
on gloo (before, NCCL was picked whenever CUDA was visible, then handed CPU tensors). The cuda
cases need a GPU and skip on CI with the reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gradwire.cli import main
from gradwire.transports import torch_dist
from tests.backends.processes import launch
from tests.helpers import gw, read_jsonl

COMMON = ["--task", "digits-mlp", "--steps", "8", "--eval-every", "4", "--batch-size", "16", "--lr", "0.1",
          "--seed", "5"]
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here (CI has none): runs on a machine with a GPU")


def test_a_bad_device_is_one_line_naming_the_choices(tmp_path):
    p = gw("run", "--device", "gpu", "--out", str(tmp_path / "r"))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "gradwire run: error: device='gpu': valid choices are cpu, cuda (--device)"]
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: --device cuda is valid here")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    p = gw("run", "--device", "cuda", "--out", str(tmp_path / "r"))
    assert p.returncode == 2
    [line] = p.stderr.strip().splitlines()
    assert "device='cuda'" in line and "sees no CUDA device" in line and "--device cpu" in line


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("cuda", "cpu:gloo,cuda:nccl")])
def test_the_device_decides_the_process_group_backend_whatever_the_hardware(monkeypatch, device, backend):
    """With CUDA visible (faked here), --device cpu still asks for gloo."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    asked = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: asked.append(backend))
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    torch_dist.init_from_env(5.0, torch.device(device))
    assert asked == [backend]


def test_more_local_ranks_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(torch_dist.CommunicationError, match="local rank 1 needs GPU 1, but this node has 1"):
        torch_dist.local_device("cuda")
    assert torch_dist.local_device("cpu") == torch.device("cpu")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", [
    ["--algorithm", "sync", "--compressor", "topk:ratio=0.1", "--error-feedback"],
    ["--algorithm", "sync", "--compressor", "sign:scaled=true", "--error-feedback"],
    ["--algorithm", "local-sgd:local_steps=2"],
    # the mean by chunk owners, the owners' codec a cast; Muon's batched Newton-Schulz and in-place step
    ["--algorithm", "sync", "--compressor", "sign:scaled=true", "--error-feedback", "--compressed-mean", "scatter",
     "--owner-compressor", "fp16"],
    ["--algorithm", "muloco:inner_steps=2", "--lr", "0.003", "--compressed-mean", "scatter"],
    # signSGD's votes up and rank 0's error-fed scaled sign down (its residual on the parameters' device)
    ["--algorithm", "signsgd", "--lr", "0.01"],
])
@NEEDS_CUDA
def test_simulator_on_cuda_follows_the_cpu_run(tmp_path, data_dir, extra):
    """Deterministic codecs: the same bytes on both devices; the losses differ only by the GPU's
    floating-point order of summation."""
    runs = {}
    for device in ("cpu", "cuda"):
        assert main(["run", *COMMON, *extra, "--workers", "3", "--device", device,
                     "--out", str(tmp_path / device), "--data-dir", str(data_dir)]) == 0
        runs[device] = read_jsonl(tmp_path / device / "metrics.jsonl")
    cpu, cuda = runs["cpu"], runs["cuda"]
    assert [r["bytes_sent"] for r in cuda] == [r["bytes_sent"] for r in cpu]
    torch.testing.assert_close([r["train_loss"] for r in cuda], [r["train_loss"] for r in cpu],
                               rtol=1e-3, atol=1e-4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", [
    ["--algorithm", "sync", "--compressor", "qsgd:levels=4,bucket=128", "--network", "ring:mbps=100"],
    # the scatter route's all-to-alls on NCCL, from the transport's own thread and group
    ["--algorithm", "sync", "--compressor", "sign:scaled=true", "--error-feedback", "--compressed-mean", "scatter",
     "--owner-compressor", "pquant:p=inf,block=32", "--network", "ring:mbps=100"],
])
@NEEDS_CUDA
def test_torch_backend_on_cuda_uses_nccl_and_matches_the_simulator(tmp_path, data_dir, extra):
    nproc = min(2, torch.cuda.device_count())
    p = launch(nproc, [*COMMON, *extra, "--device", "cuda"], tmp_path / "torch", data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert main(["run", *COMMON, *extra, "--workers", str(nproc), "--device", "cuda",
                 "--out", str(tmp_path / "sim"), "--data-dir", str(data_dir)]) == 0
    real, sim = read_jsonl(tmp_path / "torch" / "metrics.jsonl"), read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim]
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim],
                               rtol=1e-4, atol=1e-5)
