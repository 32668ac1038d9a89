"""Helpers shared by tests: the command line in a subprocess, metrics files, state comparison, the
configurations that several layers share (for ``make_config`` in conftest.py), and a checkpoint
round trip through bytes."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gradwire.config import RunConfig

# Presets for ``make_config`` (tests/conftest.py); a test's own keywords override them.
# Algorithms that train locally between exchanges (LSGD, EASGD, local SGD, DaSGD): momentum, and
# lognormal step times so that the asynchronous variants see workers at different speeds.
LOCAL_UPDATES = dict(momentum=0.9, stragglers="lognormal:sigma=0.5,compute_s=0.05")
# Adaptive compression (DAGC, DQ-SGD): workers holding different amounts of data.
ADAPTIVE = dict(task="digits-mlp", partition="volumes:skew=8", eval_every=6, momentum=0.9, seed=3)


def gw(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m gradwire ARGS`` in a subprocess, output captured as text (``env=None``: this
    process's environment)."""
    return subprocess.run([sys.executable, "-m", "gradwire", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def load_script(path: Path, name: str):
    """A script that is not in a package (``benchmarks/``, ``scripts/``) imported as module ``name``
    (registered in ``sys.modules`` first: dataclasses look their module up while the class is built)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (metrics.jsonl, steps.jsonl), in order."""
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def states_equal(a, b) -> bool:
    """Bitwise equality of nested state dicts (tensors compared with torch.equal)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b


def final_checkpoint(folder: Path) -> dict:
    """The simulator's checkpoint that ``folder/checkpoint/latest`` names, as loaded on resume."""
    stepdir = Path(folder) / "checkpoint" / (Path(folder) / "checkpoint" / "latest").read_text().strip()
    return torch.load(stepdir / "sim.pt", weights_only=True)


def through_bytes(state):
    """What a checkpoint file gives back: a deep copy, loadable with weights_only=True."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resume_matches(cfg: RunConfig, first: int, then: int) -> None:
    """Stopping after ``first`` steps, saving, and resuming in a fresh Run gives bit-identical
    parameters and step figures to running ``first + then`` steps without stopping."""
    from gradwire.run.loop import Run

    straight = Run(cfg)
    infos = [straight.train_step() for _ in range(first + then)]
    a = Run(cfg)
    for _ in range(first):
        a.train_step()
    saved = through_bytes({"algorithm": a.algorithm.state_dict(), "data": a.oracle.state_dict()})
    b = Run(cfg)
    b.algorithm.load_state_dict(saved["algorithm"])
    b.oracle.load_state_dict(saved["data"])
    b.step = first
    resumed = [b.train_step() for _ in range(then)]
    assert torch.equal(b.algorithm.eval_params(), straight.algorithm.eval_params())
    assert resumed == infos[first:]


def torch_on_mean_gradient(r, steps: int, make_opt, factor=None) -> torch.Tensor:
    """The flat parameters after ``steps`` steps of a torch.optim optimizer (``make_opt(params)``) on
    the nn.Module of run ``r``'s task, from the same initial model (seed 0) and the same batches as its
    workers (batch 16), stepping with the workers' mean gradient (what sync averages exactly);
    ``factor(k)``, when given, scales the rate of update k through LambdaLR."""
    from gradwire.seeding import hash_seed
    from gradwire.tasks.oracle import WorkerData

    module = r.task.model_fn(torch.Generator().manual_seed(hash_seed(0, "model")))
    opt = make_opt(module.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor) if factor is not None else None
    replays = [WorkerData(w.x, w.y, batch_size=16, seed=0, rank=k) for k, w in sorted(r.oracle.workers.items())]
    for _ in range(steps):
        grads = []
        for replay in replays:
            x, y = replay.next_batch()
            module.zero_grad()
            r.task.loss_fn(module(x), y).backward()
            grads.append([p.grad.clone() for p in module.parameters()])
        for i, p in enumerate(module.parameters()):
            p.grad = torch.stack([g[i] for g in grads]).mean(0)
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def record_inner_steps(alg) -> dict:
    """Every replica's parameters after its latest inner step (before any outer step touches them)."""
    after_inner, inner_step = {}, alg.replicas.sgd_step

    def recorded(ctx, rank):
        loss = inner_step(ctx, rank)
        after_inner[rank] = alg.replicas.x[rank].clone()
        return loss

    alg.replicas.sgd_step = recorded
    return after_inner


def record_gradients(r) -> dict:
    """Each worker's latest minibatch gradient, as ``r.ctx.gradient`` returns it to the algorithm."""
    grads, gradient = {}, r.ctx.gradient

    def recorded(rank, params, on_ready=None):
        loss, g = gradient(rank, params)
        grads[rank] = g.clone()
        return loss, g

    r.ctx.gradient = recorded
    return grads


class AsyncServerSide:
    """What a ``RealServer`` asks of its algorithm in the tests that drive it without one
    (tests/backends/test_server_modes.py, tests/cli/test_resume.py): an asynchronous algorithm that
    needs one worker, notes the workers it is told are lost, and answers a HELLO with a bare JOIN."""

    name = "async"

    def __init__(self):
        self.told = []

    def on_lost(self, w):
        self.told.append(w)

    def workers_needed(self):
        return 1

    def server_summary(self):
        return {}

    def join_reply(self, w):
        from gradwire.algorithms.protocol import JOIN, Message

        return Message(JOIN, w)
