"""What one worker computes: a minibatch gradient of the task's loss at given flat parameters.

Algorithms hold parameters as one flat vector (so compressors, memories and collectives work on
one buffer). :class:`FlatModel` evaluates the task's module at any flat vector with
``torch.func.functional_call`` on views of it: no copy into the module, and the gradient comes
back flat. Several workers (or replicas) share one FlatModel.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call

from gradwire.errors import DivergenceError


class FlatModel:
    """A stateless view of ``module`` as a function of one flat parameter vector."""

    def __init__(self, module: nn.Module):
        if list(module.buffers()):
            raise ValueError("gradwire models must not have buffers (e.g. BatchNorm statistics)")
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.numels = [p.numel() for _, p in module.named_parameters()]
        self.numel = sum(self.numels)
        self.dtype = next(module.parameters()).dtype

    def flatten(self) -> torch.Tensor:
        """The module's current parameters as a new flat vector."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for name, shape, n in zip(self.names, self.shapes, self.numels):
            out[name] = flat[offset : offset + n].view(shape)
            offset += n
        return out

    def forward(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, self.views(flat), (x,))

    def load_into_module(self, flat: torch.Tensor) -> nn.Module:
        """Copy ``flat`` into the module's own parameters (for users who want the nn.Module)."""
        with torch.no_grad():
            for p, v in zip(self.module.parameters(), self.views(flat).values()):
                p.copy_(v)
        return self.module


class WorkerData:
    """One worker's shard, sampled without replacement in seeded epochs.

    The batch for a worker is a function of (seed, rank, epoch, position) only, so the simulator
    and the torch backend draw identical batches, and a checkpoint needs just two integers.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int | None, seed: int, rank: int):
        if len(x) == 0:
            raise ValueError(f"worker {rank} has no training data")
        self.x, self.y = x, y
        self.batch_size = None if batch_size is None else min(batch_size, len(x))
        self.seed, self.rank = seed, rank
        self.epoch, self.position = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash_seed(self.seed, "data", self.rank, self.epoch))
        return torch.randperm(len(self.x), generator=g)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batch_size is None:  # full local gradient
            return self.x, self.y
        if self.position + self.batch_size > len(self.x):
            self.epoch, self.position = self.epoch + 1, 0
            self._perm = self._permutation()
        idx = self._perm[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return self.x[idx], self.y[idx]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation()


class GradientOracle:
    """Minibatch loss and gradient of every worker: the only place the task's model is run."""

    def __init__(self, flat_model: FlatModel, loss_fn, workers: dict[int, WorkerData], *, l2: float = 0.0):
        self.model, self.loss_fn, self.workers, self.l2 = flat_model, loss_fn, workers, l2
        self.step = 0  # set by the run loop, for error messages

    def __call__(self, rank: int, params: torch.Tensor) -> tuple[float, torch.Tensor]:
        x, y = self.workers[rank].next_batch()
        leaf = params.detach().requires_grad_(True)
        loss = self.loss_fn(self.model.forward(leaf, x), y)
        if self.l2:
            loss = loss + 0.5 * self.l2 * leaf.square().sum()
        (grad,) = torch.autograd.grad(loss, leaf)
        value = float(loss)
        if not math.isfinite(value) or not bool(torch.isfinite(grad).all()):
            raise DivergenceError(
                f"non-finite {'loss' if not math.isfinite(value) else 'gradient'} at step {self.step} "
                f"on worker {rank} (loss={value}); lower --lr or check the data",
                step=self.step, worker=rank,
            )
        return value, grad

    def state_dict(self) -> dict:
        return {str(r): w.state_dict() for r, w in self.workers.items()}

    def load_state_dict(self, state: dict) -> None:
        for r, w in self.workers.items():
            w.load_state_dict(state[str(r)])


def hash_seed(seed: int, *parts) -> int:
    """A 63-bit seed derived from ``seed`` and labels, stable across processes and runs
    (Python's hash() is salted per process, so it cannot be used)."""
    import hashlib

    h = hashlib.sha256(repr((int(seed),) + tuple(parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)
