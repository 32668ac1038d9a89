"""Counted collectives on a process group, and the two autograd operators tensor parallelism needs.

Bytes are counted as gradwire's torch transport counts them, by the byte ledger
(transports/ledger.py: ring / pipelined collectives, every message once, summed over the group):
broadcast and reduce of n bytes over g ranks (g-1)·n, all-reduce 2·(g-1)·n, gather (g-1)·n. Each
group's first rank adds its group's bytes to its :class:`ByteCounter`, under the label of the layer
that made the call, so the sum of every process's counter is the run's total, with no communication
to count.

Gradient conventions (Megatron-LM, Shoeybi et al. 2019): a tensor replicated over a group carries
its *full* gradient on every member. Hence

* :func:`copy_to` (Megatron's f): identity forward; backward all-reduces the gradient, because
  each member's uses of a replicated value contribute part of its gradient (a replicated input
  of a column-parallel layer, a replicated bias or weight block, layer-norm statistics).
* :func:`reduce_from` (Megatron's g): all-reduce forward; backward passes the gradient through,
  because the sum is replicated and so is its (full) gradient.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from gradwire.transports import ledger


class ByteCounter:
    """Bytes of tensor-parallel collectives this process accounts for, per layer label."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = defaultdict(int)

    def add(self, label: str, nbytes: int) -> None:
        self.bytes[label] += int(nbytes)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def state_dict(self) -> dict:
        return {"bytes": dict(self.bytes)}

    def load_state_dict(self, state: dict) -> None:
        self.bytes = defaultdict(int, {str(k): int(v) for k, v in state["bytes"].items()})


class Group:
    """One process group: its global ``ranks``, this process's ``index`` in it, counted collectives.
    A group of one is no communication at all (``pg`` None)."""

    def __init__(self, pg, ranks: list[int], index: int, counter: ByteCounter):
        self.pg, self.ranks, self.index, self.counter = pg, list(ranks), index, counter
        self.size = len(ranks)

    def _count(self, label: str, nbytes: int) -> None:
        if self.index == 0:
            self.counter.add(label, nbytes)

    def broadcast(self, t: torch.Tensor, src: int, label: str) -> torch.Tensor:
        """``t`` of member ``src`` (an index into ``ranks``) at every member, in place."""
        if self.size > 1:
            dist.broadcast(t, src=self.ranks[src], group=self.pg)
            self._count(label, ledger.broadcast(t.numel() * t.element_size(), self.size))
        return t

    def reduce(self, t: torch.Tensor, dst: int, label: str) -> torch.Tensor:
        """The members' sum at member ``dst``, in place (elsewhere ``t`` is left undefined)."""
        if self.size > 1:
            dist.reduce(t, dst=self.ranks[dst], op=dist.ReduceOp.SUM, group=self.pg)
            self._count(label, ledger.reduce(t.numel() * t.element_size(), self.size))
        return t

    def gather(self, t: torch.Tensor, dst: int, label: str | None) -> list[torch.Tensor] | None:
        """Every member's ``t`` (all of one shape) at member ``dst``, in member order (None at the
        others). ``label`` None: not counted (evaluation's gathers are not training traffic)."""
        if self.size == 1:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.size)] if self.index == dst else None
        dist.gather(t, out, dst=self.ranks[dst], group=self.pg)
        if label is not None:
            self._count(label, ledger.gather([t.numel() * t.element_size()] * self.size, dst))
        return out

    def all_reduce(self, t: torch.Tensor, label: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(t, op=op, group=self.pg)
            self._count(label, ledger.allreduce(t.numel() * t.element_size(), self.size))
        return t


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group: Group, label: str):
        ctx.group, ctx.label = group, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.group.all_reduce(grad.contiguous().clone(), ctx.label), None, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group: Group, label: str):
        return group.all_reduce(x.contiguous().clone(), label)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to(x: torch.Tensor, group: Group | None, label: str) -> torch.Tensor:
    """Identity forward, all-reduce of the gradient backward (see the module docstring)."""
    return x if group is None or group.size == 1 else _CopyTo.apply(x, group, label)


def reduce_from(x: torch.Tensor, group: Group | None, label: str) -> torch.Tensor:
    """All-reduce (sum) forward, identity backward (see the module docstring)."""
    return x if group is None or group.size == 1 else _ReduceFrom.apply(x, group, label)


def replicated(param: torch.Tensor, groups: list[Group | None], label: str) -> torch.Tensor:
    """A parameter replicated over ``groups`` whose members each use it on their own data: its
    gradient is the sum over them (copy_to over each group in turn)."""
    for group in groups:
        param = copy_to(param, group, label)
    return param
