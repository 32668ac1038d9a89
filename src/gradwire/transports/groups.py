"""Counted collectives on torch.distributed process groups that are not the data-parallel workers'
(tensor parallelism's groups, gradwire/parallel): broadcast, reduce, gather and all-reduce of one
tensor, each counted by the byte ledger (transports/ledger.py) into a :class:`ByteCounter`, under
the label of the layer that made the call. Each group's first member counts its group's bytes, so
the sum of every process's counter is the run's total, with no communication to count it.
"""

from __future__ import annotations

import datetime
from collections import defaultdict

import torch
import torch.distributed as dist

from gradwire.transports import ledger

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def process_rank() -> int:
    """This process's rank in the default process group."""
    return dist.get_rank()


def new_group(members: list[int], timeout_s: float | None = None):
    """A process group of ``members`` (global ranks); every process must call it, in the same order."""
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    return dist.new_group(members, timeout=timeout)


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

    def all_reduce(self, t: torch.Tensor, label: str, op: str = "sum") -> torch.Tensor:
        """The members' sum (``op="max"``: maximum) at every member, in place."""
        if self.size > 1:
            dist.all_reduce(t, op=_OPS[op], group=self.pg)
            self._count(label, ledger.allreduce(t.numel() * t.element_size(), self.size))
        return t
