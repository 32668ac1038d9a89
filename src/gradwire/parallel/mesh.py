"""The tensor-parallel layout (``1d:p=4``, ``2d:q=2``, ``2.5d:q=2,d=2``) and its process groups.

A run of ``world_size`` processes is ``dp`` data-parallel groups of ``P`` tensor-parallel ranks:
global rank ``g = dp_index * P + tp_rank``, so the ranks of one tensor-parallel group are
consecutive (on one node where they fit). Inside a group:

* ``1d:p=P`` (Megatron-LM, Shoeybi et al. 2019): one group of P ranks.
* ``2.5d:q=Q,d=D`` (SUMMA2.5-LM, Wang et al. 2021): P = Q·Q·D on a [D, Q, Q] mesh; tensor-parallel
  rank ``i + Q·(j + Q·k)``. Row groups vary ``i`` (fixed j, k), column groups vary ``j`` (fixed i,
  k), depth groups vary ``k`` (fixed i, j) -- the layout of Colossal-AI's 2.5-D code. Rank (i, j, k)
  holds block (row j, column i) of each matrix of depth layer k.
* ``2d:q=Q`` (SUMMA, Optimus: Xu et al. 2021) is ``2.5d:q=Q,d=1``: one code path for both.

Data-parallel groups join the ranks with the same tensor-parallel rank across the ``dp`` groups.
:mod:`gradwire.parallel.layout` validates everything before any process group exists (it imports
no torch.distributed, so the config can use it); :class:`Mesh` then creates the groups (every
process calls ``new_group`` for every group, in the same order, as torch.distributed requires).
"""

from __future__ import annotations

from gradwire.errors import ConfigError
from gradwire.parallel.comm import ByteCounter, Group
from gradwire.parallel.layout import Layout, parse_layout  # noqa: F401  (parse_layout: re-exported)


class Mesh:
    """This process's place in a dp x tp layout, and its process groups (see the module docstring).

    ``counter`` counts the bytes of the tensor-parallel collectives (:mod:`gradwire.parallel.comm`).
    ``i, j, k``: the SUMMA coordinates (1d: ``i`` = tp_rank, j = k = 0).
    """

    def __init__(self, layout: Layout, *, world_size: int, rank: int, timeout_s: float | None = None):
        from gradwire.transports.groups import new_group

        if world_size % layout.size:  # check_layout says it with the model's sizes; this guards direct use
            raise ConfigError(f"tensor_parallel={layout.spec()}: {world_size} processes are not a multiple of "
                              f"P={layout.size}")
        self.layout, self.world_size, self.rank = layout, world_size, rank
        P = layout.size
        self.dp = world_size // P
        self.dp_rank, self.tp_rank = divmod(rank, P)
        q, d = layout.q, layout.d
        if layout.summa:
            self.i, self.j, self.k = self.tp_rank % q, (self.tp_rank // q) % q, self.tp_rank // (q * q)
        else:
            self.i, self.j, self.k = self.tp_rank, 0, 0
        self.counter = ByteCounter()

        def g(every: list[list[int]], mine: list[int], singletons: bool = False) -> Group:
            """Create every group (all processes call new_group for each); keep this process's.
            A group of one has no process group unless ``singletons`` (the data-parallel group: the
            transport's collectives need a group of their own, None would be every process)."""
            kept = None
            for members in every:
                pg = new_group(members, timeout_s) if len(members) > 1 or singletons else None
                if rank in members:
                    kept = Group(pg, members, members.index(rank), self.counter)
            assert kept is not None and kept.ranks == mine
            return kept

        base = self.dp_rank * P
        tp_all = [[b * P + t for t in range(P)] for b in range(self.dp)]
        self.tp = g(tp_all, tp_all[self.dp_rank])
        dp_all = [[b * P + t for b in range(self.dp)] for t in range(P)]
        self.dp_group = g(dp_all, dp_all[self.tp_rank], singletons=True)
        if layout.summa:
            def at(i: int, j: int, k: int) -> int:
                return i + q * (j + q * k)

            rows, cols, depths = [], [], []
            for b in range(self.dp):
                o = b * P
                rows += [[o + at(i, j, k) for i in range(q)] for k in range(d) for j in range(q)]
                cols += [[o + at(i, j, k) for j in range(q)] for k in range(d) for i in range(q)]
                depths += [[o + at(i, j, k) for k in range(d)] for j in range(q) for i in range(q)]
            self.row = g(rows, [base + at(i, self.j, self.k) for i in range(q)])
            self.col = g(cols, [base + at(self.i, j, self.k) for j in range(q)])
            self.depth = g(depths, [base + at(self.i, self.j, k) for k in range(d)])
        else:
            self.row = self.col = self.depth = None

    def describe(self) -> str:
        return (f"rank {self.rank}: dp {self.dp_rank}/{self.dp}, tp {self.tp_rank}/{self.layout.size} "
                f"({self.layout.spec()}, i={self.i} j={self.j} k={self.k})")
