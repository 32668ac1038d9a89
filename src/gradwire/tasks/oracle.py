"""What one worker computes: a minibatch gradient of the task's loss at given flat parameters.

Algorithms hold parameters as one flat vector (so compressors, memories and collectives work on
one buffer). :class:`FlatModel` re-seats the module's parameters as views into one flat buffer,
and their ``.grad`` as views into one flat gradient buffer, so evaluating a worker at any flat
vector is one copy in, a plain forward/backward, and the gradient is already flat: no per-call
parameter swapping and no concatenation. Several workers (or replicas) share one FlatModel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from gradwire.errors import ConfigError, DivergenceError
from gradwire.seeding import hash_seed

GradientReady = Callable[[int, torch.Tensor], None]  # (tensor index, its gradient) during backward


def parameter_roles(module: nn.Module) -> tuple[str, ...]:
    """Each parameter's part in ``module``, in ``module.parameters()`` order, as Muon's authors divide a
    network (Jordan et al. 2024: Muon for the hidden layers, AdamW for the input embedding, the output
    layer, gains and biases): ``hidden``, the weight of a linear or convolutional layer other than the
    last one registered (and ``nn.MultiheadAttention``'s packed input projections); ``output``, that
    last layer's weight (a classifier's or an LM's head: the last registered, which is the last applied
    in every model of gradwire's tasks); ``embedding``, any other parameter of two dimensions or more
    (an ``nn.Embedding``'s table, a learnt position table); ``vector``, the rest (biases, a norm's gain)."""
    layers = [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]
    weights = {id(m.weight): "output" if m is layers[-1] else "hidden" for m in layers}
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention):
            weights.update({id(w): "hidden" for w in (m.in_proj_weight, m.q_proj_weight, m.k_proj_weight,
                                                        m.v_proj_weight) if w is not None})
    return tuple(weights.get(id(p), "embedding" if p.dim() >= 2 else "vector") for p in module.parameters())


class FlatModel:
    """``module`` as a function of one flat parameter vector; ``roles``: each tensor's part in it
    (``parameter_roles``)."""

    def __init__(self, module: nn.Module):
        if list(module.buffers()):
            raise ValueError("gradwire models must not have buffers (e.g. BatchNorm statistics)")
        self.module = module
        params = list(module.parameters())
        self.shapes = [p.shape for p in params]
        self.roles = parameter_roles(module)
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.dtype = params[0].dtype
        self.flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.flat_grad = torch.zeros_like(self.flat)
        self._hooked, self._ready, self._announced = False, None, set()
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        offset = 0
        for p, n, shape in zip(params, self.numels, self.shapes):
            p.data = self.flat[offset : offset + n].view(shape)
            p.grad = self.flat_grad[offset : offset + n].view(shape)
            offset += n

    def flatten(self) -> torch.Tensor:
        """The module's current parameters as a new flat vector."""
        return self.flat.clone()

    def load(self, flat: torch.Tensor) -> nn.Module:
        """Seat ``flat`` as the module's parameters (a copy, skipped when it is the buffer itself)."""
        if flat.data_ptr() != self.flat.data_ptr():
            self.flat.copy_(flat)
        return self.module

    def forward(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.load(flat)(x)

    def loss_and_grad(self, flat: torch.Tensor, loss_fn, x, y, l2: float = 0.0,
                      on_ready: GradientReady | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss at ``flat`` and its gradient as a new flat tensor. ``on_ready(i, grad_i)``, where
        given, is called during the backward pass as soon as tensor i's gradient is complete (L2
        term included), with a view of it that stays valid until the next call; tensors that get
        no gradient are never announced."""
        module = self.load(flat)
        self.flat_grad.zero_()  # backward accumulates into the .grad views, i.e. into flat_grad
        loss = loss_fn(module(x), y)
        if on_ready is None:
            loss.backward()
            grad = self.flat_grad.clone()
            if l2:
                grad.add_(self.flat, alpha=l2)
        else:
            self._install_hooks()
            self._ready, self._announced = (on_ready, l2), set()
            try:
                loss.backward()
            finally:
                self._ready = None
            if l2:  # the hooks added the L2 term to the tensors they announced; the others get it here
                for i in set(range(len(self.numels))) - self._announced:
                    self.flat_grad[self.offsets[i]:self.offsets[i + 1]].add_(
                        self.flat[self.offsets[i]:self.offsets[i + 1]], alpha=l2)
            grad = self.flat_grad.clone()
        if l2:
            loss = loss.detach() + 0.5 * l2 * self.flat.square().sum()
        return loss.detach(), grad

    def _install_hooks(self) -> None:
        """Once: a post-accumulate-grad hook on every parameter, calling the current ``on_ready``."""
        if self._hooked:
            return
        for index, p in enumerate(self.module.parameters()):
            p.register_post_accumulate_grad_hook(lambda p, index=index: self._announce(index, p))
        self._hooked = True

    def _announce(self, index: int, param: torch.Tensor) -> None:
        if self._ready is None:  # a backward pass outside loss_and_grad(on_ready=...)
            return
        on_ready, l2 = self._ready
        self._announced.add(index)
        if l2:  # the same sum, element by element, as grad.add_(flat, alpha=l2) on the whole vector
            param.grad.add_(param.detach(), alpha=l2)
        on_ready(index, param.grad)


class WorkerData:
    """One worker's shard, sampled without replacement in seeded epochs.

    The batch for a worker is a function of (seed, rank, epoch, position) only, so the simulator
    and the torch backend draw identical batches, and a checkpoint needs just two integers.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int | None, seed: int, rank: int):
        if len(x) == 0:
            raise ValueError(f"worker {rank} has no training data")
        if batch_size is not None and batch_size > len(x):  # never shrunk silently: say so
            raise ConfigError(f"batch_size={batch_size} is larger than worker {rank}'s shard of {len(x)} samples: "
                              "--batch-size can be at most the smallest worker's shard, or pass --batch-size full")
        self.x, self.y = x, y
        self.batch_size = batch_size
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


def check_batch_size(batch_size: int | None, shard_sizes: list[int]) -> None:
    """ConfigError when ``batch_size`` exceeds a worker's shard, naming the smallest shard (the
    largest batch every worker can draw); ``None`` is the full local batch, always fine."""
    if batch_size is None or not shard_sizes:
        return
    smallest = min(range(len(shard_sizes)), key=lambda r: shard_sizes[r])
    if batch_size > shard_sizes[smallest]:
        raise ConfigError(f"batch_size={batch_size} is larger than the smallest shard, worker {smallest}'s "
                          f"{shard_sizes[smallest]} samples; pass --batch-size {shard_sizes[smallest]} or less, "
                          "or --batch-size full")


class GradientOracle:
    """Minibatch loss and gradient of every worker: the only place the task's model is run."""

    def __init__(self, flat_model: FlatModel, loss_fn, workers: dict[int, WorkerData], *, l2: float = 0.0):
        self.model, self.loss_fn, self.workers, self.l2 = flat_model, loss_fn, workers, l2
        self.step = 0  # set by the run loop, for error messages

    def __call__(self, rank: int, params: torch.Tensor,
                 on_ready: GradientReady | None = None) -> tuple[float, torch.Tensor]:
        """``on_ready``: see :meth:`FlatModel.loss_and_grad` (the check for non-finite values comes
        after the backward pass, so announced tensors may hold them)."""
        x, y = self.workers[rank].next_batch()
        loss, grad = self.model.loss_and_grad(params, self.loss_fn, x, y, self.l2, on_ready)
        value = float(loss)
        # one reduction instead of an isfinite() mask: a sum is finite only if every term is
        if not math.isfinite(value) or not math.isfinite(float(grad.sum())):
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
