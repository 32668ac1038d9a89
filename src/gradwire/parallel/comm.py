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

A parameter that several members use whole (1-D: embeddings, norms, the read-out, row-parallel
biases; SUMMA: biases, norms and embedding blocks over the column and the depth, weight blocks over
the depth) is *held* once: its rows are split over those members (:class:`Partitioned`), each
stores its piece as its parameter, and the forward assembles the whole tensor (a broadcast of each
piece). Every element of the model thus belongs to one process of a worker, so whatever the
data-parallel algorithm does to a process's flat shard (a compressor that looks at the whole shard:
QSGD's bucket norms, top-k) changes every element in one place only, and the members can never
disagree on a value they share. Backward, the piece's gradient is its rows of the whole tensor's:
taken as they are when every member computed the same whole gradient (1-D), or summed over the
members first when each computed its own part (SUMMA: each works on its own sequences), by one
reduce of each piece to its holder.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

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


def _split(rows: int, size: int, index: int) -> tuple[int, int]:
    return index * rows // size, (index + 1) * rows // size


def piece_rows(rows: int, sizes: Sequence[int], indices: Sequence[int]) -> tuple[int, int]:
    """Rows [start, stop) of a tensor of ``rows`` rows that the member at ``indices`` of nested
    groups of ``sizes`` (innermost first) holds: the outermost group splits the rows, each group
    inside it splits its member's part again (uneven parts differ by one row; some may be empty)."""
    start, length = 0, rows
    for size, index in zip(reversed(sizes), reversed(indices), strict=True):
        a, b = _split(length, size, index)
        start, length = start + a, b - a
    return start, start + length


def _part_rows(rows: int, groups: Sequence[Group], level: int) -> int:
    """Rows of the part that the members of ``groups[: level + 1]`` hold together (this process's)."""
    outer = groups[level + 1:]
    a, b = piece_rows(rows, [g.size for g in outer], [g.index for g in outer])
    return b - a


class _Assemble(torch.autograd.Function):
    @staticmethod
    def forward(ctx, piece, rows: int, groups: Sequence[Group], partial_grads: bool, label: str):
        ctx.rows, ctx.groups, ctx.partial_grads, ctx.label = rows, groups, partial_grads, label
        part = piece.contiguous()
        for level, g in enumerate(groups):  # innermost first: each level's part from its members' pieces
            whole = part.new_empty((_part_rows(rows, groups, level), *part.shape[1:]))
            for t in range(g.size):
                a, b = _split(whole.shape[0], g.size, t)
                if t == g.index:
                    whole[a:b].copy_(part)
                if b > a:
                    g.broadcast(whole[a:b], t, label)  # a row range of a contiguous tensor: contiguous
            part = whole
        return part

    @staticmethod
    def backward(ctx, grad):
        groups = ctx.groups
        if not ctx.partial_grads:  # every member holds the whole gradient: its own rows of it
            a, b = piece_rows(ctx.rows, [g.size for g in groups], [g.index for g in groups])
            return grad[a:b].clone(), None, None, None, None
        part = grad.contiguous().clone()
        for g in reversed(groups):  # outermost first: each member's rows summed over the group, at the member
            for t in range(g.size):
                a, b = _split(part.shape[0], g.size, t)
                if b > a:
                    g.reduce(part[a:b], t, ctx.label)
            a, b = _split(part.shape[0], g.size, g.index)
            part = part[a:b]
        return part.clone(), None, None, None, None


class Partitioned:
    """How a module holds a tensor of ``shape`` that every member of ``groups`` (innermost first,
    e.g. [column, depth]) uses whole: its rows split over them, this process's piece its parameter
    (see the module docstring). ``partial_grads``: each member's gradient of the whole tensor is its
    own part of the sum (SUMMA) rather than the whole gradient (1-D: every member computes the same)."""

    def __init__(self, shape: Sequence[int], groups: Sequence[Group], *, partial_grads: bool):
        self.shape, self.groups, self.partial_grads = tuple(shape), list(groups), partial_grads

    def parameter(self, dtype: torch.dtype) -> nn.Parameter:
        """This process's piece, uninitialised (the model copies the dense model's rows into it)."""
        a, b = piece_rows(self.shape[0], [g.size for g in self.groups], [g.index for g in self.groups])
        return nn.Parameter(torch.empty(b - a, *self.shape[1:], dtype=dtype))

    def whole(self, piece: torch.Tensor, label: str) -> torch.Tensor:
        """The whole tensor from every member's piece (counted under ``label``)."""
        if all(g.size == 1 for g in self.groups):
            return piece
        return _Assemble.apply(piece, self.shape[0], self.groups, self.partial_grads, label)
