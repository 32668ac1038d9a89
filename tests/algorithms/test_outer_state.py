"""--outer-state cpu: the DiLoCo family's outer state in (pinned) host memory, same results."""

import pytest
import torch

from gradwire.errors import ConfigError
from gradwire.run.loop import Run
from tests.helpers import through_bytes

SPECS = ["diloco:inner_steps=2,inner=sgd", "streaming-diloco:inner_steps=3,fragments=3,overlap=1"]


def same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(a, b)
    else:  # CUDA's kernels may fuse a multiply and an add where the CPU's round twice: last bits differ
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("algorithm", SPECS)
def test_outer_state_in_cpu_memory_gives_equal_results(make_config, device, algorithm):
    """The same bits on the CPU. With a GPU the outer step runs on the GPU in one placement and on the
    CPU in the other, so the codec is one that draws nothing (qsgd's draws come from the generator of
    the outer state's device, and a CUDA generator's stream is not the CPU's) and the results agree
    to float32's rounding."""
    exact = device.type == "cpu"
    codec = "qsgd:levels=4,bucket=64" if exact else "fp16"
    cfg = make_config(algorithm=algorithm, lr=0.01, compressor=codec, error_feedback=True, device=device.type)
    runs = {where: Run(cfg.replace(outer_state=where)) for where in ("device", "cpu")}
    for _ in range(7):
        for r in runs.values():
            r.train_step()
    on_device, on_cpu = runs["device"].algorithm, runs["cpu"].algorithm
    assert on_cpu.theta.device.type == "cpu" and on_device.theta.device.type == device.type
    assert on_cpu.theta.is_pinned() == torch.cuda.is_available()
    same(on_device.theta.cpu(), on_cpu.theta, exact)
    residuals = on_cpu.averager.ef[0].state_dict()
    assert residuals and all(t.device.type == "cpu" for t in residuals.values())
    for a, b in zip(runs["device"].algorithm.replicas.x.values(), on_cpu.replicas.x.values(), strict=True):
        same(a, b, exact)
        assert b.device.type == device.type  # the inner state stays on the device
    resumed = Run(cfg.replace(outer_state="cpu"))  # a checkpoint moves between placements
    resumed.load_state_dict(through_bytes(runs["device"].state_dict()))
    resumed.train_step()
    runs["device"].train_step()
    same(resumed.algorithm.theta, runs["device"].algorithm.theta.cpu(), exact)


def test_bad_outer_state_is_one_clear_error(make_config):
    with pytest.raises(ConfigError, match="outer_state='host': valid choices are device, cpu"):
        make_config(outer_state="host").validate()


def test_sparseloco_keeps_its_accumulators_where_the_outer_state_is(make_config, device):
    """SparseLoCo's error-feedback accumulators are outer state: with --outer-state cpu they live in
    host memory beside θ while the replicas stay on the device, and the results are the placement's
    alone (on the CPU both placements are one memory: bit for bit; with a GPU, float32's rounding)."""
    exact = device.type == "cpu"
    cfg = make_config(algorithm="sparseloco:inner_steps=2,chunk=64,k=4", lr=0.01, device=device.type)
    runs = {where: Run(cfg.replace(outer_state=where)) for where in ("device", "cpu")}
    for _ in range(6):
        for r in runs.values():
            r.train_step()
    on_cpu = runs["cpu"].algorithm
    assert all(e.device == on_cpu.theta.device for e in on_cpu.accumulators.values())
    assert all(x.device.type == device.type for x in on_cpu.replicas.x.values())
    same(runs["device"].algorithm.theta.cpu(), on_cpu.theta.cpu(), exact)
    for a, b in zip(runs["device"].algorithm.accumulators.values(), on_cpu.accumulators.values(), strict=True):
        same(a.cpu(), b.cpu(), exact)
