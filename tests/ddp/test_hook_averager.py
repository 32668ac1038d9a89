"""The DDP hook takes its averager from the factory the run's algorithms use, and chooses its way
through a bucket from what the averager declares, never from which class it is.

In-process: a world of one gloo rank (FileStore, no port), destroyed after the test."""

from __future__ import annotations

import ast
import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire import ddp as gwddp
from gradwire.averaging import CompressedMean, PowerSGDMean, build_averager
from gradwire.errors import ConfigError
from tests.ddp.ddp_harness import launch, make_data, make_model, params, train

# spec, error feedback -> the averager the run's factory builds, and the hook's path for it
CASES = [("none", False, CompressedMean, gwddp._allreduce_in_place),
         ("none", True, CompressedMean, gwddp._allreduce),
         ("fp16", False, CompressedMean, gwddp._allreduce),
         ("qsgd:levels=4", True, CompressedMean, gwddp._allgather),
         ("powersgd:rank=2", False, PowerSGDMean, gwddp._averager_collectives)]


THREE_RANK_DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def none_and_plain_on_three_ranks(rank, world_size):
    """Plain DDP and the none hook, 3 steps each, in fp32, bf16 and fp64: 1/3 is inexact, so dividing
    (as allreduce_hook does) would differ from plain DDP's multiplication in the last bit, and so would
    multiplying a float64 bucket by the float32 1/3."""
    x, y = make_data(rank, world_size)
    out = {}
    for dtype in THREE_RANK_DTYPES:
        for spec in ("plain", "none"):
            model = DDP(make_model().to(dtype), bucket_cap_mb=0.004)
            if spec == "none":
                gwddp.register(model, spec)
            train(model, x.to(dtype), y.to(dtype), 0, 3)
            out[f"{spec}-{dtype}"] = params(model)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("spec", "ef", "kind", "path"), CASES)
def test_the_hook_gets_the_factorys_averager_and_the_path_it_declares(one_rank, spec, ef, kind, path):
    model = make_model()
    state = gwddp.HookState(model, spec, error_feedback=ef, seed=3)
    shapes = [p.shape for p in model.parameters()]
    run_side = build_averager(spec, workers=[0], seed=3, shapes=shapes, error_feedback=ef,
                              generator=lambda _: torch.Generator(), payloads=False)
    assert type(state.averager) is type(run_side) is kind
    assert state.averager.spec() == run_side.spec()
    assert state.path is path
    assert (state.error_feedback is not None) == (ef and kind is CompressedMean)


@pytest.mark.timeout(60)
def test_none_on_one_rank_hands_back_the_bucket_and_counts_no_bytes(one_rank):
    """World size 1: the in-place path gives DDP the bucket's own storage, and the ledger's
    broadcast to no peer counts nothing; a NaN still stops the step."""
    model = DDP(make_model(), bucket_cap_mb=0.004)
    state = gwddp.HookState(model, "none")
    pointers = []

    def recording_hook(state, bucket):
        pointer = bucket.buffer().data_ptr()
        return gwddp.hook(state, bucket).then(lambda f: pointers.append(f.value().data_ptr() == pointer) or f.value())

    model.register_comm_hook(state, recording_hook)
    x, y = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), torch.zeros(8, 1)
    F.mse_loss(model(x), y).backward()
    assert pointers and all(pointers) and state.bytes_sent == state.wire_bytes_sent == 0 and state.step == 1
    x[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match=r"bucket 0: a non-finite gradient \(nan\) in parameter .*every rank stops"):
        F.mse_loss(model(x), y).backward()


def test_ddp_never_asks_which_kind_of_averager_it_holds():
    """No isinstance on an averaging or compressor class in ddp.py: only the factory tells kinds apart."""
    tree = ast.parse(inspect.getsource(gwddp))
    kinds = {"PowerSGD", "PowerSGDMean", "CompressedMean", "Averager", "Compressor", "PowerSGDMemory"}
    named = [ast.unparse(node.args[1]) for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"]
    assert named and not [n for n in named if kinds & set(n.replace("|", " ").replace(",", " ").split())], named


def test_settings_that_contradict_the_averager_are_refused_before_any_communication():
    with pytest.raises(ConfigError, match="non_finite='propagate' does not combine with powersgd"):
        gwddp.HookState(make_model(), "powersgd:rank=1", non_finite="propagate")
    with pytest.raises(ConfigError, match="contradicts powersgd"):
        gwddp.HookState(make_model(), "powersgd:rank=1,error_feedback=false", error_feedback=True)
    with pytest.raises(RuntimeError, match="init_process_group"):  # valid settings, no process group
        gwddp.HookState(make_model(), "none")


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6])
def test_the_division_checks_finiteness_and_equals_ddps_bit_for_bit(world, device):
    """The hook's one-pass division gives what plain DDP computes as it copies a gradient into its
    bucket, ``x * (1 / world)`` (and, where 1/world is exact, ``x / world``), subnormal and huge
    values included, and flags exactly the shares with a NaN or an inf; on each device (the CUDA
    kernel of the fused op where a GPU is present)."""
    state = SimpleNamespace(world_size=world, reciprocal=torch.full((1,), 1.0 / world, device=device))
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(world)) * torch.logspace(-44, 38, 5000)).to(device)
    got = x.clone()
    assert gwddp._divide_checking(state, got) is True
    assert torch.equal(got, torch.mul(x, 1.0 / world)) and bool((x.abs() < 1e-38).any() & (x.abs() > 1e37).any())
    if device.type == "cpu":  # (CUDA's division by a scalar may itself multiply by the reciprocal)
        assert torch.equal(got, x / world) == (world & (world - 1) == 0)  # allreduce_hook's division differs
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[1234] = bad
        assert gwddp._divide_checking(state, y) is False, bad
    assert gwddp._divide_checking(state, torch.full((10,), 3e38, device=device)) is True  # finite, not their sum


@pytest.mark.parametrize("world", [1, 3, 6])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_the_division_without_the_fused_op_gives_the_same_bits(world, dtype, monkeypatch):
    """Where the fused unscale op does not take the buffer (bfloat16 on CUDA: pytorch#127176), the hook
    multiplies by the float32 reciprocal and checks finiteness separately: the same bits and the same
    verdicts as the fused op (compared here on the CPU, where both run)."""
    state = SimpleNamespace(world_size=world, reciprocal=torch.full((1,), 1.0 / world))
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(world)) * 100).to(dtype)
    fused, split = x.clone(), x.clone()
    assert gwddp._divide_checking(state, fused) is True
    monkeypatch.setattr(gwddp, "_fused_unscale_supports", lambda buffer: False)
    assert gwddp._divide_checking(state, split) is True
    assert torch.equal(fused, split)
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[17] = bad
        assert gwddp._divide_checking(state, y) is False
    monkeypatch.undo()
    on = {kind: SimpleNamespace(type=kind) for kind in ("cpu", "cuda")}
    assert [gwddp._fused_unscale_supports(SimpleNamespace(device=on["cuda"], dtype=t))
            for t in (torch.bfloat16, torch.float16, torch.float32)] == [False, True, True]
    assert gwddp._fused_unscale_supports(SimpleNamespace(device=on["cpu"], dtype=torch.bfloat16))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_none_equals_plain_ddp_bit_for_bit_on_three_ranks(tmp_path):
    for out in launch(none_and_plain_on_three_ranks, tmp_path, world_size=3, timeout_s=100):
        for dtype in THREE_RANK_DTYPES:
            for a, b in zip(out[f"none-{dtype}"], out[f"plain-{dtype}"], strict=True):
                assert torch.equal(a, b), dtype
