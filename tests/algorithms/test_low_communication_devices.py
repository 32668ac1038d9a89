"""SparseLoCo, DeMo and MuLoCo keep every tensor on the run's device (the DCT matrices, the
accumulators, the byte payloads), and resume there."""

import pytest

from gradwire.run.loop import Run
from tests.helpers import through_bytes


@pytest.mark.parametrize("spec", ["sparseloco:inner_steps=2,chunk=64,k=4", "demo:chunk=32,k=2", "muloco:inner_steps=2"])
def test_runs_on_the_device(make_config, device, spec):
    r = Run(make_config(algorithm=spec, task="digits-mlp", lr=0.01, device=device.type, steps=4))
    for _ in range(3):
        r.train_step()
    alg = r.algorithm
    assert alg.eval_params().device.type == device.type
    for memory in (getattr(alg, "accumulators", {}), getattr(alg, "momentum", {})):
        assert all(t.device.type == device.type for t in memory.values())
    resumed = Run(r.cfg)
    resumed.load_state_dict(through_bytes(r.state_dict()))
    assert resumed.train_step() == r.train_step()
