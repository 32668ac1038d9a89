"""The torchft transport: this process is one replica of a fault-tolerant job, and its collectives
run on torchft's reconfigurable gloo process group, rebuilt by torchft's ``Manager`` whenever the
Lighthouse forms a new quorum (docs/fault_tolerance.md).

The algorithms see the same contract as on every transport (transports/base.py): one
contribution per local worker (this replica's rank, fixed for the run: its ``replica`` index),
results keyed by worker rank. Only the workers of the step's quorum take part (``participants``,
set by the step driver, gradwire/fault/replica.py): the mean is over them, an all-gather returns
their buffers, and the bytes are counted for them with the torch backend's ring formulas
(transports/torch_dist.py): allreduce 2·(n-1)·B, allgather (n-1)·n·max size (+ (n-1)·n·8 for the
size exchange when sizes are not announced), n the participants. Every replica counts the same
global figure.

A collective that fails (a peer died mid-step) does not raise: it reports the error to the
Manager, which then votes against committing the step, and later collectives of that step return
this replica's own contribution without communicating (the step is discarded and retried).
Point-to-point messages, gather and broadcast from a chosen worker are not offered: the server
modes need a fixed process 0, which a quorum does not have.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
from torch.distributed import ReduceOp
from torch.distributed.distributed_c10d import AllgatherOptions, AllreduceOptions

from gradwire.report.timeline import COMM
from gradwire.transports import ledger
from gradwire.transports.base import Transport
from gradwire.transports.ft_spec import FaultTolerance


class FtTransport(Transport):
    def __init__(self, ft: FaultTolerance, workers: int):
        super().__init__()
        from torch.distributed import TCPStore
        from torchft.process_group import ProcessGroupGloo

        self.ft = ft
        self.device = torch.device("cpu")
        self.rank, self.world_size, self.local_ranks = ft.replica, workers, (ft.replica,)
        self.timeout_s = ft.timeout_s
        self.pg = ProcessGroupGloo(timeout=timedelta(seconds=ft.timeout_s))
        # the replica group's own store (a group of one process): torchft's Manager publishes its
        # server's address there, and the quorum's process groups rendezvous on the primary's
        self.store = TCPStore(ft.host, 0, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=ft.timeout_s))
        self.participants: list[int] = [self.rank]  # the quorum's workers, in its process group's rank order
        self.manager = None  # torchft's Manager, made by the step driver with the state functions

    def errored(self) -> bool:
        return self.manager is not None and self.manager.errored() is not None

    def _run(self, start, what: str) -> bool:
        """Run one collective of the quorum's group; False (the error reported to the Manager) when
        it failed or an earlier one of this step did."""
        if self.errored():
            return False
        began = self.timeline.now() if self.timeline.enabled else 0.0
        t0 = time.perf_counter()
        try:
            start().wait(timedelta(seconds=self.timeout_s))
            return True
        except Exception as e:  # noqa: BLE001 - gloo reports a dead peer or a timeout as RuntimeError
            self.manager.report_error(RuntimeError(f"{what}: {str(e).splitlines()[0][:200]}"))
            return False
        finally:
            elapsed = time.perf_counter() - t0
            self.comm_time_s += elapsed
            self.timeline.add_many(self.local_ranks, COMM, began, began + elapsed)

    def _check(self, ranks, what: str) -> None:
        if ranks is not None and sorted(ranks) != sorted(self.participants):
            raise NotImplementedError(f"{what} over chosen workers {sorted(ranks)} is not supported with "
                                      "--fault-tolerance (the step's quorum decides who takes part)")

    def allreduce_mean(self, tensors, ranks=None):
        self._check(ranks, "allreduce")
        mine = tensors[self.rank]
        acc = mine.clone()
        n = len(self.participants)
        if n > 1:
            opts = AllreduceOptions()
            opts.reduceOp = ReduceOp.SUM
            self._run(lambda: self.pg.allreduce([acc], opts), "allreduce")
            self.bytes_sent += ledger.allreduce(mine.numel() * mine.element_size(), n)
        return acc.div_(n)

    def _allgather(self, mine: torch.Tensor, what: str) -> list[torch.Tensor]:
        out = [torch.empty_like(mine) for _ in self.participants]
        self._run(lambda: self.pg.allgather([out], [mine], AllgatherOptions()), what)
        return out

    def allgather(self, buffers, ranks=None, *, size=None):
        self._check(ranks, "allgather")
        mine, n = buffers[self.rank], len(self.participants)
        if n == 1:
            return {self.rank: mine.clone()}
        if size is None:
            sizes = [int(s) for s in self._allgather(torch.tensor([mine.numel()], dtype=torch.int64), "size exchange")]
            self.bytes_sent += ledger.size_exchange(n)
        else:
            sizes = [size] * n
        if self.errored():  # a discarded step: the shapes only need to be right
            sizes = [mine.numel()] * n
        m = max(sizes)
        padded = torch.zeros(m, dtype=torch.uint8)
        padded[: mine.numel()] = mine
        out = self._allgather(padded, "allgather")
        self.bytes_sent += ledger.padded_allgather(m, n)
        if self.errored():
            return {r: padded[: mine.numel()].clone() for r in self.participants}
        return {r: out[i][: sizes[i]] for i, r in enumerate(self.participants)}

    def gather(self, buffers, dst, ranks=None, *, size=None):
        raise NotImplementedError("gather is not supported with --fault-tolerance (no fixed root in a quorum)")

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        raise NotImplementedError("broadcast is not supported with --fault-tolerance (no fixed root in a quorum)")

    def send(self, buffer, src, dst, *, tag=0):
        raise NotImplementedError("point-to-point messages (server modes) are not supported with --fault-tolerance")

    def recv(self, nbytes, src, dst, *, tag=0, timeout_s, count=True):
        raise NotImplementedError("point-to-point messages (server modes) are not supported with --fault-tolerance")

    def close(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
