"""The two autograd operators tensor parallelism needs, over the counted group collectives of
:mod:`gradwire.transports.groups` (:class:`Group`, re-exported here with its :class:`ByteCounter`).

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

import torch

from gradwire.transports.groups import ByteCounter, Group  # noqa: F401  (ByteCounter: re-exported)


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
