"""gradwire.ddp on GPUs with NCCL: one process per GPU (two where the machine has two, else one),
fp32 and 16-bit gradients. Skipped with the reason where there is no GPU (CI); the ranks' agreement
needs two GPUs and is skipped, with its reason, on a machine with one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire import ddp as gwddp
from tests.ddp.ddp_harness import batch, launch, make_data, make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here (CI has none): runs on a machine with a GPU")

SPECS = [("none", False), ("fp16", False), ("bf16", False), ("qsgd:levels=4", False),
         ("sign:scaled=true", True), ("topk:ratio=0.1", True),
         ("powersgd:rank=2", False)]  # its own collectives on the communication thread, its errors from a callback


def cuda_scenario(rank, world_size, dtype_name):
    dtype = getattr(torch, dtype_name)
    device = torch.device("cuda", rank)
    x, y = make_data(rank, world_size)
    x, y = x.to(device, dtype), y.to(device, dtype)
    out = {}
    for spec, ef in [("plain", False), *SPECS]:
        model = DDP(make_model().to(device, dtype), device_ids=[rank])
        state = None if spec == "plain" else gwddp.register(model, spec, error_feedback=ef, min_compress_numel=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        first = None
        for step in range(30):
            xb, yb = batch(x.cpu(), y.cpu(), step)
            opt.zero_grad()
            loss = F.mse_loss(model(xb.to(device)), yb.to(device))
            loss.backward()
            opt.step()
            first = float(loss) if first is None else first
        out[spec] = {"params": [p.detach().float().cpu() for p in model.parameters()],
                     "first": first, "last": float(loss),
                     "bytes": 0 if state is None else state.bytes_sent,
                     "residual_devices": [] if state is None or not state.error_feedback else
                     sorted({str(r.device) for r in state.error_feedback.residuals.values()})}
    return out


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def results(request, tmp_path_factory):
    world = min(2, torch.cuda.device_count())
    folder = tmp_path_factory.mktemp(f"ddp-cuda-{request.param}")
    return launch(cuda_scenario, folder, request.param, world_size=world, timeout_s=240, backend="nccl")


def test_none_on_nccl_equals_plain_ddp(results):
    for rank_result in results:
        for a, b in zip(rank_result["none"]["params"], rank_result["plain"]["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("spec", [s for s, _ in SPECS])
def test_every_codec_trains_on_the_gpu(results, spec):
    for rank_result in results:
        assert rank_result[spec]["last"] < rank_result[spec]["first"]
        if rank_result[spec]["residual_devices"]:
            assert all(d.startswith("cuda") for d in rank_result[spec]["residual_devices"])


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="ranks agreeing needs two ranks, one per GPU: this machine has fewer than 2 GPUs")
@pytest.mark.parametrize("spec", [s for s, _ in SPECS])
def test_every_codec_ranks_agree(results, spec):
    assert len(results) == 2
    first, second = results[0][spec], results[1][spec]
    for a, b in zip(first["params"], second["params"], strict=True):  # the same averaged gradient
        torch.testing.assert_close(a, b, rtol=0, atol=0)
