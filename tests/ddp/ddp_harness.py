"""Run a function on 2 gloo processes and bring their results back to the test.

``launch(scenario, tmp_path, *args)`` starts one process per rank (forked from ``tests.forked``'s
preloaded server; a fresh interpreter for NCCL), joined
through a FileStore in ``tmp_path`` (no port at all). Each child calls ``scenario(rank, world_size,
*args)`` and saves what it returns to ``tmp_path/result-<rank>.pt``; ``launch`` joins every child
with a timeout, checks every exit code and loads the results (``weights_only=True``), so that the
parent does the comparing. Scenarios must be module-level functions (pickled by name).
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def _child(scenario, rank: int, world_size: int, folder: str, args: tuple, backend: str) -> None:
    torch.set_num_threads(1)  # 2 cores, 2 ranks
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank
    store = dist.FileStore(os.path.join(folder, "store"), world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    try:
        result = scenario(rank, world_size, *args)
        torch.save(result, os.path.join(folder, f"result-{rank}.pt"))
    except BaseException:
        Path(folder, f"error-{rank}.txt").write_text(traceback.format_exc())
        os._exit(1)
    # Leave without tearing the group down: a scenario may break it on purpose (a peer that timed
    # out), and gloo calls std::terminate when a group is destroyed, or its peer vanishes, with a
    # collective still in flight. What the test compares is on disk by now.
    os._exit(0)


def launch(scenario, tmp_path: Path, *args, world_size: int = 2, timeout_s: float = 60.0,
           backend: str = "gloo") -> list:
    from tests.forked import CONTEXT

    # gloo: forked from the tests' server, which imported torch once; NCCL: a fresh interpreter per
    # rank (CUDA is initialised by the rank, never in a process it was forked from)
    ctx = mp.get_context("spawn") if backend == "nccl" else CONTEXT
    procs = [ctx.Process(target=_child, args=(scenario, rank, world_size, str(tmp_path), args, backend))
             for rank in range(world_size)]
    hung = []
    try:  # however the wait ends (pytest-timeout's exception included), no rank is left running
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = "".join(f"\n--- rank {r} ---\n{f.read_text()}" for r in range(world_size)
                     if (f := tmp_path / f"error-{r}.txt").exists())
    assert not hung, f"ranks {hung} still running after {timeout_s} s{errors}"
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world_size, f"exit codes {codes}{errors}"
    return [torch.load(tmp_path / f"result-{rank}.pt", weights_only=True, map_location="cpu")
            for rank in range(world_size)]


def run_scenarios(scenarios) -> dict:
    """Run ``(name, thunk)`` scenarios in order in one child, the ones that break the process group
    last; a failure is recorded (and reported by the test that reads that part) and ends the list,
    since the group may be unusable after it."""
    out = {}
    for name, run in scenarios:
        try:
            out[name] = run()
        except Exception:  # noqa: BLE001 - reported by the test that reads this part
            out[name] = {"error": traceback.format_exc()}
            break
    return out


def part(results: list, name: str) -> list:
    """Every rank's result of scenario ``name``, failing the test with the child's traceback."""
    for rank, out in enumerate(results):
        if name not in out:
            pytest.fail(f"{name} did not run on rank {rank} (an earlier scenario failed)")
        if isinstance(out[name], dict) and "error" in out[name]:
            pytest.fail(f"{name} failed on rank {rank}:\n{out[name]['error']}")
    return [out[name] for out in results]


# --- what the scenarios share: a small MLP and a synthetic regression, sharded by rank ----------

def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 1))


def make_data(rank: int, world_size: int, n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed teacher y = tanh(x w1) w2 + noise; every rank gets its own slice of the samples."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    w1, w2 = torch.randn(16, 8, generator=g) / 4, torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(n, 1, generator=g)
    return x[rank::world_size], y[rank::world_size]


def batch(x: torch.Tensor, y: torch.Tensor, step: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The minibatch of ``step``: a function of the step alone, so a resumed run sees the same ones."""
    index = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(step))[:size]
    return x[index], y[index]


def train(model, x, y, first: int, steps: int, opt=None, lr: float = 0.05):
    """``steps`` SGD steps (momentum 0.9) on the batches of steps ``first``... of the MSE loss."""
    opt = opt or torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(first, first + steps):
        xb, yb = batch(x, y, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    return opt


def poison(model, rank: int) -> None:
    """Rank 1's gradient of layer 2 turns NaN at its step 2 (its third backward)."""
    calls = {"n": 0}

    def hook(grad):
        calls["n"] += 1
        if rank == 1 and calls["n"] == 3:
            grad = grad.clone()
            grad[3, 5] = float("nan")
        return grad

    model.module[2].weight.register_hook(hook)


def resume_twice(path: str, fresh, x, y, first: int, then: int) -> dict:
    """Continue the checkpoint at ``path`` (model, optimiser, hook state) for ``then`` steps, as a
    new process would (``fresh(seed=...)``: a new model with another init, a new DDP with its first
    bucket layout again): once loading the hook's state, once without it. Parameters of each."""
    resumed = {}
    for load_hook in (True, False):
        model, state = fresh(seed=99)
        ckpt = torch.load(path, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        opt.load_state_dict(ckpt["opt"])
        if load_hook:
            state.load_state_dict(ckpt["hook"])
        train(model, x, y, first, then, opt)
        resumed[load_hook] = params(model)
    return resumed


def full_loss(model, x, y) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(model.module(x), y))


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]
