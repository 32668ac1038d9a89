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

A live state transfer (a recovering replica fetching a peer's state, fault/transfer.py) is a
point-to-point message that only its source and recipient see. So that every replica still holds
the same global figure, the first computing attempt in a newly configured group (torchft
reconfigures the group at every new quorum, and every member does so at the same quorum) starts
with an allreduce of one int64: the bytes each member received by state transfer in it
(``count_state_transfer``). Both that exchange (``ledger.allreduce(8, n)``) and the transferred
payloads (``ledger.state_transfer``) are added to ``bytes_sent``; ``state_bytes`` and
``exchange_bytes`` keep their running totals apart for the run's records.
"""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta

import torch
from torch.distributed import ReduceOp
from torch.distributed.distributed_c10d import AllgatherOptions, AllreduceOptions

from gradwire.report.timeline import COMM
from gradwire.transports import ledger
from gradwire.transports.base import Transport
from gradwire.transports.ft_spec import FaultTolerance


def rendezvous_tag(replica_ids, max_step: int) -> str:
    """A name for a quorum's gloo rendezvous that a restarted Lighthouse does not reuse.

    torchft keys the rendezvous in the primary replica's store by quorum number only
    (``torchft/<quorum_id>/<group_rank>``), and a restarted Lighthouse numbers its quorums from 1
    again: a rebuild under a number the old Lighthouse used read the addresses that the old
    quorum's members had left there, and failed. Every member of a quorum knows its members
    (replica ids, each with its process's uuid) and the quorum's step, so they name it alike; a
    later Lighthouse forms its quorum of the same number at a later step, or with other members."""
    members = ",".join(sorted(replica_ids))
    return f"gw{max_step}-{hashlib.sha1(members.encode()).hexdigest()[:12]}"


def _gloo_group(timeout: timedelta):
    """torchft's reconfigurable ``ProcessGroupGloo``, noting each reconfiguration
    (``reconfigured``, cleared by the step driver once a step of the new group commits) and
    appending ``tag()``, when set, to its rendezvous's key prefix (:func:`rendezvous_tag`)."""
    from torchft.process_group import ProcessGroupGloo

    class GlooGroup(ProcessGroupGloo):
        reconfigured = False
        tag = None  # () -> str, set by the step driver from the quorum torchft received

        def configure(self, store_addr, replica_id, rank, world_size, quorum_id=None, group_rank=None,
                      group_world_size=None, global_ranks=None) -> None:
            self.reconfigured = True
            if self.tag is not None:
                store_addr = f"{store_addr}/{self.tag()}"
            super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size,
                              global_ranks)

    return GlooGroup(timeout=timeout)


class FtTransport(Transport):
    def __init__(self, ft: FaultTolerance, workers: int):
        super().__init__()
        from torch.distributed import TCPStore

        self.ft = ft
        self.device = torch.device("cpu")
        self.rank, self.world_size, self.local_ranks = ft.replica, workers, (ft.replica,)
        self.timeout_s = ft.timeout_s
        self.pg = _gloo_group(timedelta(seconds=ft.timeout_s))
        self.state_bytes = 0     # running totals (global): payloads of live state transfers,
        self.exchange_bytes = 0  # and the allreduces that counted them (both also in bytes_sent)
        # the replica group's own store (a group of one process): torchft's Manager publishes its
        # server's address there, and the quorum's process groups rendezvous on the primary's
        self.store = TCPStore(ft.host, 0, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=ft.timeout_s))
        self.participants: list[int] = [self.rank]  # the quorum's workers, in its process group's rank order
        self.manager = None  # torchft's Manager, made by the step driver with the state functions
        self.closing = None  # () -> None: the step driver's own close (its state server), run by close()

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

    def count_state_transfer(self, received: int) -> int:
        """Add the state transferred into this new group to the ledger, the same on every member:
        ``received`` is what this replica fetched from a peer in it (0 if none); returns the sum
        over the members (0 if the exchange failed: the step is then discarded)."""
        total = torch.tensor([int(received)], dtype=torch.int64)
        n = len(self.participants)
        if n > 1:
            opts = AllreduceOptions()
            opts.reduceOp = ReduceOp.SUM
            if not self._run(lambda: self.pg.allreduce([total], opts), "state-transfer count"):
                return 0
            exchange = ledger.allreduce(ledger.SIZE_BYTES, n)
            self.exchange_bytes += exchange
            self.bytes_sent += exchange
        payload = ledger.state_transfer([int(total)])
        self.state_bytes += payload
        self.bytes_sent += payload
        return payload

    def state_dict(self) -> dict:
        return super().state_dict() | {"state_bytes": self.state_bytes, "exchange_bytes": self.exchange_bytes}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.state_bytes = int(state.get("state_bytes", 0))
        self.exchange_bytes = int(state.get("exchange_bytes", 0))

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
        if self.closing is not None:
            self.closing()
            self.closing = None
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
        self.pg.shutdown()  # lets go of its gloo group here, on the closing thread, not in a later collection
