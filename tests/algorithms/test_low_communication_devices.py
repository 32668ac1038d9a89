"""SparseLoCo, DeMo and MuLoCo keep every tensor on the run's device (the DCT matrices, the
accumulators, the optimizer states, the byte payloads), and resume there."""

import pytest
import torch

from gradwire.algorithms.optim import AdamW
from gradwire.run.loop import Run
from tests.helpers import through_bytes


def adamw_state(name: str, opt) -> dict[str, torch.Tensor]:
    assert isinstance(opt, AdamW), f"{name} is {type(opt).__name__}, not the inner AdamW"
    return {f"{name}.exp_avg": opt.exp_avg, f"{name}.exp_avg_sq": opt.exp_avg_sq}


def optimizer_memory(algorithm: str, alg) -> dict[str, torch.Tensor]:
    """Where each algorithm keeps its optimizer state, named per algorithm (read from its source), so
    that a state that moved or vanished fails here instead of leaving nothing to check:
    - sparseloco: the error-feedback accumulators e_r and each replica's inner AdamW (m, v);
    - demo: each worker's momentum and the DCT matrices (full chunks and the shorter tail);
    - muloco: each replica's Muon buffers (matrices) and AdamW moments (biases), the outer Nesterov
      velocity and the error-feedback residuals of the outer deltas."""
    memory = {}
    if algorithm == "sparseloco":
        memory |= {f"accumulators[{r}]": e for r, e in alg.accumulators.items()}
        for r, opt in alg.replicas.opt.items():
            memory |= adamw_state(f"inner[{r}]", opt)
    elif algorithm == "demo":
        memory |= {f"momentum[{r}]": m for r, m in alg.momentum.items()}
        memory |= {"dct.d": alg.dct.d, "dct.d_tail": alg.dct.d_tail}
    elif algorithm == "muloco":
        for r, opt in alg.replicas.opt.items():
            for i, entry in opt.state_dict().items():  # per tensor: Muon's buffer or AdamW's moments
                memory |= {f"inner[{r}].{'muon' if key == 'buffer' else 'adamw'}[{i}].{key}": t
                           for key, t in entry.items() if torch.is_tensor(t)}
        memory["outer.velocity"] = alg.outer[0].velocity
        memory |= {f"ef[{r}].{key}": t for r, ef in alg.averager.ef.items() for key, t in ef.residuals.items()}
    return memory


WORKERS = 4  # make_config's
EXPECTED = {  # algorithm -> the states that must be there, non-empty and not all zero after a round ({r}: every worker)
    "sparseloco": ("accumulators[{r}]", "inner[{r}].exp_avg", "inner[{r}].exp_avg_sq"),
    "demo": ("momentum[{r}]", "dct.d", "dct.d_tail"),  # digits-mlp's 4810 = 150 chunks of 32 and a tail of 10
    "muloco": ("inner[{r}].muon[0].buffer", "inner[{r}].adamw[1].exp_avg", "inner[{r}].adamw[1].exp_avg_sq",
               "inner[{r}].muon[2].buffer", "inner[{r}].adamw[3].exp_avg", "inner[{r}].adamw[3].exp_avg_sq",
               "outer.velocity", "ef[{r}].fragment0"),
}


@pytest.mark.parametrize("spec", ["sparseloco:inner_steps=2,chunk=64,k=4", "demo:chunk=32,k=2", "muloco:inner_steps=2"])
def test_runs_on_the_device(make_config, device, spec):
    algorithm = spec.partition(":")[0]
    r = Run(make_config(algorithm=spec, task="digits-mlp", lr=0.01, device=device.type, steps=4))
    for _ in range(3):  # an outer round (step 2) and a step after it
        r.train_step()
    alg = r.algorithm
    assert alg.eval_params().device.type == device.type
    memory = optimizer_memory(algorithm, alg)
    expected = {pattern.format(r=w) for pattern in EXPECTED[algorithm] for w in range(WORKERS)}
    assert expected <= memory.keys(), f"{spec}: missing optimizer state {sorted(expected - memory.keys())}"
    for name in expected:
        t = memory[name]
        assert isinstance(t, torch.Tensor) and t.numel() > 0, f"{spec}: {name} is empty"
        assert bool(t.ne(0).any()), f"{spec}: {name} is all zeros after a round"
    for name, t in memory.items():
        assert t.device.type == device.type, f"{spec}: {name} on {t.device}"
    resumed = Run(r.cfg)
    resumed.load_state_dict(through_bytes(r.state_dict()))
    assert resumed.train_step() == r.train_step()
    for name, t in optimizer_memory(algorithm, resumed.algorithm).items():
        assert t.device.type == device.type, f"{spec} resumed: {name} on {t.device}"
