"""The transport contract: the only way an algorithm talks to other workers.

A process hosts one or more workers (``local_ranks``): the simulator hosts all of them, a
torch.distributed process hosts one. Every collective takes one contribution per *local
participating* worker, keyed by rank, and returns what those workers receive, which is the same
for all of them (so the simulator keeps one copy, not one per worker). ``ranks`` names the
participants (all workers when omitted): with backup workers only the first N take part.

Every call counts the bytes that cross the wire (``bytes_sent``, every message both ways) and
``comm_time_s``; a simulated transport also advances the simulated clock. Payloads are real
buffers (``torch.uint8`` for compressed data, dense tensors for summable ones): no Python object
is ever sent.

``allreduce_mean_start`` and ``allgather_start`` are the non-blocking collectives: each returns a
:class:`Handle` whose ``wait()`` gives the result, so an algorithm (DaSGD, Streaming DiLoCo) can
compute while the average (or the compressed payloads) travels.

Point-to-point messages (``send`` / ``recv``) carry the server modes (gradwire/servers/): a worker
talks to ``SERVER``, the parameter server or coordinator (process 0 on a real backend), which
answers each worker alone. ``send`` does not block; ``recv`` waits at most ``timeout_s`` and raises
:class:`PeerLost` when the peer has gone or stayed silent. Bytes are counted by the transport
alone: the simulator counts each message once, when it is received; a real transport counts every
message its process sends or receives, so the server's process counts every message of a server
mode exactly once.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

import torch

from gradwire.errors import CommunicationError
from gradwire.report.timeline import NULL_TIMELINE

SERVER = -1  # the address of the parameter server or coordinator in send / recv


class PeerLost(CommunicationError):
    """A point-to-point peer died, refused a message, or stayed silent past the timeout."""


class Sent:
    """A point-to-point message on its way. ``duration_s``: how long it takes on the transport's
    clock where the transport knows (the simulator's network model), else None. ``wait`` returns
    once the message has left (its buffer may then be reused)."""

    def __init__(self, duration_s: float | None = None):
        self.duration_s = duration_s

    def wait(self, timeout_s: float) -> None:
        return None


class Handle:
    """A collective in flight (see :meth:`Transport.allreduce_mean_start`): ``wait()`` blocks until it
    has finished and returns what the blocking call would have returned; later calls return the
    same result at no cost. ``finish_s`` is when it finishes on the transport's clock, where the
    transport knows it in advance (the simulator), else None."""

    def __init__(self, result: torch.Tensor, finish_s: float | None = None):
        self._result, self.finish_s = result, finish_s

    def wait(self) -> torch.Tensor:
        return self._result

    def reschedule(self, finish_s: float) -> None:
        """Finish at ``finish_s`` instead (a collective restarted after a resume keeps its first finish)."""
        self.finish_s = finish_s

    def finish_state(self) -> dict:
        """``{"finish_s": ...}`` for a checkpoint entry, where the transport knows it (the simulator),
        else nothing: what :meth:`Transport.restart` takes back through :meth:`finish_of`."""
        return {} if self.finish_s is None else {"finish_s": torch.tensor(self.finish_s, dtype=torch.float64)}

    @staticmethod
    def finish_of(state: dict) -> float | None:
        """The finish time a checkpoint entry saved (None: unknown, or a checkpoint from before it was)."""
        return float(state["finish_s"]) if "finish_s" in state else None


class Transport(ABC):
    world_size: int
    local_ranks: tuple[int, ...]
    timeline = NULL_TIMELINE  # the run's recorder (report/timeline.py): collectives record their intervals
    # whether a second thread may run this process's collectives while the first computes (a real
    # backend with one worker per process: sync:overlap's communication thread); the simulator's
    # clock and collectives belong to the one thread that runs every worker
    concurrent = False
    timeout_s: float | None = None  # how long a collective may wait for its peers, where bounded
    # Optional capabilities, declared here with what a single-process transport (the simulator)
    # means by them, so that callers never probe with getattr:
    rank = 0  # this process's worker rank among the processes (one process: 0)
    device: torch.device | None = None  # where this process's tensors live when the transport decides
    # (torch.distributed: the local rank's GPU); None: wherever the run's --device says
    first_worker_process = 0  # the process that hosts worker 0 (1 once process 0 serves)

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.comm_time_s = 0.0
        # bytes of subgroup collectives this process accounts for and has not yet summed into the
        # global ``bytes_sent`` (``sync_counters``; 0 where one process counts every collective):
        # checkpointed, so that a resume between two syncs loses none of them
        self.group_bytes = 0
        self._lock = threading.Lock()  # a server's inbox receives on several threads

    def count(self, nbytes: int, seconds: float = 0.0) -> None:
        """Add a message to the counters; a transport calls it for what it sends and receives, and
        a server that receives ahead on threads (``recv(..., count=False)``) calls it when it
        handles the message, so the counts at the end of a step are exact."""
        with self._lock:
            self.bytes_sent += int(nbytes)
            self.comm_time_s += seconds

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Collectives inside the block are not charged (counters restored, timeline paused):
        evaluation's communication, kept out of what a run reports as its training cost."""
        saved = self.bytes_sent, self.comm_time_s, self.group_bytes
        try:
            with self.timeline.paused():
                yield
        finally:
            self.bytes_sent, self.comm_time_s, self.group_bytes = saved

    def restart(self, start: Callable[[], Handle], finish_s: float | None) -> Handle:
        """A collective that was in flight when a checkpoint was taken, started again after the resume
        by ``start()`` (it must give the same result: the same payloads): its bytes, time and timeline
        interval were counted when it first started, before the checkpoint, so none is counted again,
        and on the simulator it finishes when it first would have (``finish_s``, saved with it)."""
        with self.uncounted():
            handle = start()
        if finish_s is not None and handle.finish_s is not None:
            handle.reschedule(finish_s)
        return handle

    def serve_from_process_zero(self) -> None:
        """Server mode on a real backend: process 0 is the server and hosts no worker; process p
        hosts worker p - 1."""
        self.local_ranks = () if self.rank == 0 else (self.rank - 1,)
        self.first_worker_process = 1

    @property
    def holds_server(self) -> bool:
        """Whether this process holds a server-mode algorithm's server part (its θ, outer state and
        answers): the simulator's one process, or process 0 once it serves; a process that hosts only
        a worker needs none of it."""
        return self.first_worker_process == 0 or self.rank == 0

    def barrier(self) -> None:  # noqa: B027 - one process has no peers to wait for
        """Wait until every process has called it (a real backend); nothing to do in one process."""

    def sync_counters(self) -> None:  # noqa: B027 - one process counts every collective itself
        """Make ``bytes_sent`` global after subgroup collectives, where each process counts only
        some of them (a real backend); every process calls it at the same points. One process
        already holds the global count."""

    def participants(self, ranks: Sequence[int] | None) -> list[int]:
        return list(range(self.world_size)) if ranks is None else sorted(ranks)

    @abstractmethod
    def allreduce_mean(self, tensors: dict[int, torch.Tensor], ranks: Sequence[int] | None = None) -> torch.Tensor:
        """Mean over the participants of a dense tensor (summed in rank order, then divided)."""

    @abstractmethod
    def allgather(self, buffers: dict[int, torch.Tensor], ranks: Sequence[int] | None = None, *,
                  size: int | None = None) -> dict[int, torch.Tensor]:
        """Every participant's uint8 buffer (sizes may differ), keyed by rank. ``size``: every
        buffer's length when all know it in advance (fixed-size compressors), which spares a
        transport that needs sizes first (torch.distributed) the round of exchanging them."""

    @abstractmethod
    def gather(self, buffers: dict[int, torch.Tensor], dst: int,
               ranks: Sequence[int] | None = None, *, size: int | None = None) -> dict[int, torch.Tensor] | None:
        """Participants' buffers at ``dst`` (None in processes that do not host ``dst``)."""

    @abstractmethod
    def broadcast(self, buffer: torch.Tensor | None, src: int, ranks: Sequence[int] | None = None, *,
                  size: int | None = None) -> torch.Tensor:
        """``src``'s uint8 buffer at every participant (``buffer`` is ignored where src is not
        local); ``size`` as for allgather."""

    def allreduce_mean_start(self, tensors: dict[int, torch.Tensor],
                             ranks: Sequence[int] | None = None) -> Handle:
        """Start ``allreduce_mean`` without blocking; ``handle.wait()`` returns the mean.

        The contributions are read during this call: the caller may change them afterwards (a
        transport that reduces in place works on its own copy). Every participant must start the
        same collectives in the same order, as for the blocking calls. Bytes are counted when the
        collective starts. This default runs the blocking collective, so nothing overlaps; the
        simulator and the torch backend override it to overlap communication with computation."""
        return Handle(self.allreduce_mean(tensors, ranks))

    def allgather_start(self, buffers: dict[int, torch.Tensor], ranks: Sequence[int] | None = None, *,
                        size: int | None = None) -> Handle:
        """Start ``allgather`` without blocking, as ``allreduce_mean_start``; ``handle.wait()``
        returns the buffers. This default runs the blocking collective (the threads backend does:
        the same numbers, no overlap); the simulator and the torch backend overlap it with
        computation."""
        return Handle(self.allgather(buffers, ranks, size=size))

    def alltoall(self, buffers: dict[int, torch.Tensor], ranks: Sequence[int] | None = None, *,
                 size: int) -> dict[int, dict[int, torch.Tensor]]:
        """Each participant's uint8 buffer is n slots of ``size`` bytes, slot j addressed to the j-th
        participant in rank order (its own slot stays home); for each local participant, the slots
        addressed to it, keyed by the sender's rank. Every message is posted at once, as gloo's
        alltoall does. A transport without one says so here."""
        raise NotImplementedError(f"an all-to-all (--compressed-mean scatter) is not supported on "
                                  f"{type(self).__name__}")

    def exchange_reduce_start(self, buffers: dict[int, torch.Tensor],
                              reduce: Callable[[int, dict[int, torch.Tensor]], torch.Tensor],
                              ranks: Sequence[int] | None = None, *, size: int,
                              reduced_size: int | None = None) -> Handle:
        """Start a reduction done by its owners (1-bit Adam's compressed allreduce, Tang et al. 2021):
        slot j of each participant's buffer goes to the j-th participant (:meth:`alltoall`), which
        turns what it received into one buffer of ``reduced_size`` bytes (default ``size``: the owners
        may encode in another codec), ``reduce(its rank, {sender: slot})``; then every owner's buffer
        goes to every other participant (an all-gather by direct exchange: an all-to-all with that
        buffer in every slot, one latency instead of the ring's n - 1). ``wait()`` gives the owners'
        buffers keyed by rank, the same at every participant. ``reduce`` runs once per local
        participant and round (again after :meth:`restart`). This default runs both exchanges at the
        call, blocking (the threads backend); the simulator prices them one after the other from the
        call, and the torch backend runs them on a thread of its own."""
        n = len(self.participants(ranks))
        received = self.alltoall(buffers, ranks, size=size)
        owned = {r: reduce(r, got) for r, got in received.items()}
        gathered = self.alltoall({r: b.repeat(n) for r, b in owned.items()}, ranks, size=reduced_size or size)
        return Handle(next(iter(gathered.values())))

    @abstractmethod
    def send(self, buffer: torch.Tensor, src: int, dst: int, *, tag: int = 0) -> Sent:
        """Send a uint8 ``buffer`` from ``src`` (a local worker, or ``SERVER``) to ``dst``; does not
        block. Raises :class:`PeerLost` when the transport already knows ``dst`` is gone."""

    @abstractmethod
    def recv(self, nbytes: int, src: int, dst: int, *, tag: int = 0, timeout_s: float,
             count: bool = True) -> torch.Tensor:
        """The next uint8 message of ``nbytes`` bytes from ``src`` to ``dst`` (local) with ``tag``,
        waiting at most ``timeout_s``; :class:`PeerLost` otherwise. ``count=False``: the caller
        counts it later (``count``)."""

    def close(self) -> None:  # noqa: B027 - only a real backend has a group to leave
        """Leave the process group (a real backend); nothing to do in one process."""

    def state_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "comm_time_s": self.comm_time_s, "group_bytes": self.group_bytes}

    def load_state_dict(self, state: dict) -> None:
        self.bytes_sent = int(state["bytes_sent"])
        self.comm_time_s = float(state["comm_time_s"])
        self.group_bytes = int(state.get("group_bytes", 0))  # checkpoints from before it was saved: 0

    def node_of(self, rank: int) -> int:
        """The machine (node) that hosts ``rank``, numbered 0, 1, ...; algorithms that group the
        workers of a node (multi-leader LSGD) use it. Default: one node hosts every worker."""
        return 0
