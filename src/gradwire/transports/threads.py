"""A dry-run backend: every process of a real run as a thread of one process (``--backend threads``).

Each thread hosts what one torch.distributed process would host (one worker, or the server of a
server-mode algorithm), holds only that one's state, and meets the others through a :class:`Hub`:
collectives (subgroups included) and point-to-point messages, each wait bounded by the timeout.
So the code path of a real backend (one worker per process, the real server driver with its inbox,
checkpoints as a quiescent cut) runs and can be debugged in one process, without torchrun, a
network or a GPU. Bytes are counted with the ring formulas of the byte ledger (transports/ledger.py;
every rank the global count; point-to-point messages at both ends), as the torch transport counts
equal-size buffers whose size is announced; unannounced sizes (``size=None``) cost the torch
transport a size exchange that a thread does not need, so there the counts differ by it. A
collective's payloads are dropped once every member has read them. Time is real time (``WallClock``).
"""

from __future__ import annotations

import collections
import threading

import torch

from gradwire.report.timeline import COMM
from gradwire.transports import ledger
from gradwire.transports.base import SERVER, PeerLost, Sent, Transport


class Hub:
    """Where the threads meet. A collective is keyed by its participants and by how many
    collectives over those participants the calling rank has entered before; a point-to-point
    message waits in a mailbox keyed by (source process, destination process, tag)."""

    def __init__(self, timeout_s: float):
        self.cond, self.slots, self.timeout_s = threading.Condition(), {}, timeout_s
        self.readers: dict = {}  # key -> the ranks that have read a collective's slot (dropped when all have)
        self.mail: dict[tuple[int, int, int], collections.deque] = {}
        self.dead: dict[int, str] = {}  # process -> why its thread ended with an error

    def died(self, process: int, reason: str) -> None:
        """Process ``process``'s thread ended with an error: as when a gloo peer's connection closes, a
        wait on it fails at once (not after the timeout, when its silent waiting peers would also look
        dead)."""
        with self.cond:
            self.dead[process] = reason
            self.cond.notify_all()

    def meet(self, key, rank: int, payload, needed: list[int], members: int) -> dict:
        """``members``: how many ranks take part (each calls once); the slot is dropped once all have read it."""
        with self.cond:
            self.slots.setdefault(key, {})[rank] = payload
            self.cond.notify_all()
            complete = lambda: all(r in self.slots[key] for r in needed)  # noqa: E731
            dead = lambda: [r for r in needed if r in self.dead and r not in self.slots[key]]  # noqa: E731
            if not self.cond.wait_for(lambda: complete() or dead(), self.timeout_s) or not complete():
                gone = dead()
                why = f"rank {gone[0]} died ({self.dead[gone[0]]})" if gone else \
                    f"did not complete within {self.timeout_s:g} s"
                raise PeerLost(f"rank {rank}: collective {key[0]} over {list(key[1])} {why} "
                               f"(have {sorted(self.slots[key])})")
            got = dict(self.slots[key])
            readers = self.readers.setdefault(key, set())
            readers.add(rank)
            if len(readers) == members:  # every member has its copy: the payloads are no longer held
                del self.slots[key], self.readers[key]
            return got

    def post(self, src: int, dst: int, tag: int, buffer: torch.Tensor) -> None:
        with self.cond:
            self.mail.setdefault((src, dst, tag), collections.deque()).append(buffer.clone())
            self.cond.notify_all()

    def take(self, src: int, dst: int, tag: int, timeout_s: float) -> torch.Tensor:
        with self.cond:
            box = self.mail.setdefault((src, dst, tag), collections.deque())
            if not self.cond.wait_for(lambda: len(box) > 0 or src in self.dead, timeout_s):
                raise PeerLost(f"no message from process {src} to process {dst} within {timeout_s:g} s")
            if not box:
                raise PeerLost(f"process {src} died ({self.dead[src]})")
            return box.popleft()


class ThreadTransport(Transport):
    """Process ``rank``'s view of the hub (as ``TorchTransport``: ``rank``, ``world_size`` count
    processes; ``local_ranks`` and ``first_worker_process`` are set by the run for server mode)."""

    first_worker_process = 0
    concurrent = True

    def __init__(self, hub: Hub, world_size: int, rank: int):
        super().__init__()
        self.hub, self.world_size, self.rank, self.local_ranks = hub, world_size, rank, (rank,)
        self.timeout_s = hub.timeout_s
        self.seq: dict = {}

    def _meet(self, op: str, ranks, payload, needed=None) -> dict:
        ranks = self.participants(ranks)
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not among the participants {ranks} of a {op}")
        key = (op, tuple(ranks))
        n = self.seq[key] = self.seq.get(key, -1) + 1
        began = self.timeline.now() if self.timeline.enabled else 0.0
        got = self.hub.meet(key + (n,), self.rank, payload, ranks if needed is None else needed, len(ranks))
        if op != "sync_counters":  # bookkeeping, not training
            self.timeline.add_many(self.local_ranks, COMM, began, self.timeline.now() if self.timeline.enabled else 0.0)
        return got

    def _count(self, nbytes: int, ranks=None) -> None:
        """Every rank counts every collective (the global count), as the torch transport does; a
        subgroup's collective is counted by its lowest rank until ``sync_counters``."""
        ranks = self.participants(ranks)
        with self._lock:
            if ranks == list(range(self.world_size)):
                self.bytes_sent += int(nbytes)
            elif self.rank == ranks[0]:
                self.group_bytes += int(nbytes)

    def sync_counters(self) -> None:
        """As ``TorchTransport.sync_counters``: every rank calls it at the same points."""
        got = self._meet("sync_counters", None, self.group_bytes)
        self.bytes_sent += sum(got.values())
        self.group_bytes = 0

    def allreduce_mean(self, tensors, ranks=None):
        got = self._meet("allreduce", ranks, tensors[self.rank].clone())
        order = sorted(got)
        first = got[order[0]]
        total = first.to(torch.float64 if first.dtype == torch.float64 else torch.float32, copy=True)
        for r in order[1:]:
            total += got[r]
        self._count(ledger.allreduce(first.numel() * first.element_size(), len(order)), ranks)
        return total.div_(len(order))

    def allgather(self, buffers, ranks=None, *, size=None):
        got = self._meet("allgather", ranks, buffers[self.rank].clone())
        self._count(ledger.allgather([int(got[r].numel()) for r in sorted(got)]), ranks)
        return {r: b.clone() for r, b in sorted(got.items())}

    def alltoall(self, buffers, ranks=None, *, size):
        got = self._meet("alltoall", ranks, buffers[self.rank].clone())
        order = sorted(got)
        j = order.index(self.rank)
        self._count(ledger.alltoall(size, len(order)), ranks)
        return {self.rank: {r: got[r][j * size:(j + 1) * size].clone() for r in order}}

    def gather(self, buffers, dst, ranks=None, *, size=None):
        got = self._meet("gather", ranks, buffers[self.rank].clone())
        order = sorted(got)
        self._count(ledger.gather([int(got[r].numel()) for r in order], order.index(dst)), ranks)
        return dict(sorted(got.items())) if self.rank == dst else None

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        mine = buffer.clone() if self.rank == src else None
        got = self._meet("broadcast", ranks, mine, needed=[src])[src]
        self._count(ledger.broadcast(int(got.numel()), len(self.participants(ranks))), ranks)
        return got.clone()

    def process_of(self, address: int) -> int:
        return 0 if address == SERVER else address + self.first_worker_process

    def send(self, buffer, src, dst, *, tag=0):
        self.hub.post(self.rank, self.process_of(dst), tag, buffer)
        self.count(buffer.numel() * buffer.element_size())
        return Sent()

    def recv(self, nbytes, src, dst, *, tag=0, timeout_s, count=True):
        buffer = self.hub.take(self.process_of(src), self.rank, tag, timeout_s)
        if buffer.numel() != nbytes:
            raise PeerLost(f"message from process {self.process_of(src)} has {buffer.numel()} bytes, "
                           f"expected {nbytes}")
        if count:
            self.count(nbytes)
        return buffer

    def barrier(self) -> None:
        self._meet("barrier", None, None)
