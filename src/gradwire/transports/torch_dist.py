"""The torch.distributed transport: one worker per process, gloo on CPU, NCCL on GPU.

The device decides the backend, never the hardware present: ``--device cpu`` is gloo even on a
machine with GPUs, and ``--device cuda`` puts local rank r on GPU r with the process group
``cpu:gloo,cuda:nccl``: collectives of the algorithms' (CUDA) tensors go through NCCL, and the
few small CPU tensors (size exchanges, byte counters) through gloo. Point-to-point messages (the
server modes) travel through gloo from a host copy, because they rely on tags and on waits with
a timeout, which NCCL's send and receive do not offer; what ``recv`` returns is on the device.

The same collectives as the simulator, carried by torch.distributed; payloads are the real uint8
buffers (variable sizes are padded to the largest, as gloo and NCCL need equal sizes). Every call
is bounded by the process group's timeout, so a missing peer raises instead of hanging.

Bytes are counted as the ring algorithms that gloo and NCCL use send them, the byte ledger's
formulas (transports/ledger.py) that the simulator's ``ring`` network uses too: allreduce 2·(N-1)·B, allgather
(N-1)·N·max n (padded), gather (N-1)·max n (the non-root buffers, padded), broadcast (N-1)·n, plus (N-1)·N·8 for a
size exchange when the sizes are not known in advance. Every rank knows every size, so every
rank holds the same global ``bytes_sent``, with no extra communication. Collectives over a subset
of workers (multi-leader LSGD's groups) run on process groups that their members create on first
use (``new_group(..., use_local_synchronization=True)``, so non-members need not take part); their
bytes are accounted by each group's lowest rank and summed over ranks at evaluation steps
(``sync_counters``; the part not yet summed is in each rank's checkpoint), so the global count
still equals the simulator's. 16-bit tensors (the fp16/bf16 casts, PowerSGD's fp16 factors) are
summed by gloo and NCCL in their own dtype, where the simulator and the threads backend add in
float32: a sum beyond fp16's range is inf here only, and bf16 means may differ in the last bits.

Point-to-point (``send`` / ``recv``, the server modes): worker w lives in process
``w + first_worker_process`` and ``SERVER`` is process 0. Each message is counted by the process
that sends it and by the one that receives it (the server's process thus counts every message of
a server mode once). ``recv`` may be called from several threads at once (the server's inbox has
one per worker: gloo's receive from any source fails once any peer has died, so each worker is
listened to on its own); the inbox counts each message when the server handles it.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch
import torch.distributed as dist

from gradwire.errors import CommunicationError, ConfigError
from gradwire.report.timeline import COMM, OVERLAP, WAIT
from gradwire.transports import ledger
from gradwire.transports.base import SERVER, Handle, PeerLost, Sent, Transport


def process_group_backend(device: torch.device) -> str:
    """gloo for CPU tensors; for CUDA ones NCCL, with gloo beside it for CPU tensors."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def local_device(device_type: str) -> torch.device:
    """This process's device: the CPU, or GPU ``LOCAL_RANK`` (one GPU per local rank)."""
    if device_type != "cuda":
        return torch.device("cpu")
    local_rank, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if local_rank >= count:
        raise CommunicationError(f"--device cuda: local rank {local_rank} needs GPU {local_rank}, but this node has "
                                 f"{count}; start at most {count} processes per node (--nproc-per-node)")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_from_env(timeout_s: float, device: torch.device | None = None) -> None:
    """Join the process group that torchrun (or the caller) described in the environment, with the
    backend that ``device``'s tensors need (gloo for the CPU, the default)."""
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"--backend torch needs torchrun's environment ({', '.join(missing)} unset): start it "
                          "with `gradwire launch --nproc-per-node N -- run ...` or torchrun (--backend)")
    backend = process_group_backend(device or torch.device("cpu"))
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            # Under torchrun the agent's store outlives a failed attempt, and with it the killed
            # processes' addresses: keep each attempt's keys apart so a restarted group never
            # dials a dead peer.
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                  is_master=not agent_store and rank == 0, timeout=timeout)
            dist.init_process_group(backend, store=dist.PrefixStore(f"gradwire/attempt-{attempt}", store),
                                    rank=rank, world_size=world, timeout=timeout)
    except (RuntimeError, dist.DistError) as e:  # the store reports missing peers after the timeout
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raise CommunicationError(f"rank {os.environ['RANK']}: could not form the process group of "
                                 f"{os.environ['WORLD_SIZE']} at {where} "
                                 f"within {timeout_s:g} s: {str(e).splitlines()[0]}") from None


class _TorchHandle(Handle):
    """A collective started with ``async_op=True``: ``wait()`` waits for ``work`` (bounded by the
    group's timeout), records the interval in flight, and returns ``finish()``, once."""

    def __init__(self, work, finish, transport: TorchTransport, what: str):
        super().__init__(None)
        self.work, self.finish, self.transport, self.what = work, finish, transport, what
        self.done = False
        self.started = transport.timeline.now() if transport.timeline.enabled else 0.0
        self.began = time.perf_counter()  # an error's message counts from the start, not from wait()

    def wait(self):
        if not self.done:
            self.transport._guard(self.work.wait, f"{self.what} (async)", kind=WAIT,  # what computing did not cover
                                  since=self.began)
            timeline = self.transport.timeline
            timeline.add_many(self.transport.local_ranks, OVERLAP, self.started, timeline.now() if timeline.enabled
                              else 0.0)  # in flight from the start until this wait returned
            self._result = self.finish()
            self.done = True
        return self._result


class _FutureWork:
    """A thread's result in the shape of a torch.distributed work (``exchange_reduce_start``), for
    :class:`_TorchHandle`: ``wait()`` is bounded (twice the group's timeout: one per collective) and
    fails as gloo does, with a RuntimeError; ``result`` is the thread's."""

    def __init__(self, future, timeout_s: float):
        self.future, self.timeout_s, self.result = future, timeout_s, None

    def wait(self) -> None:
        try:
            self.result = self.future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise RuntimeError(f"no result within {self.timeout_s:g} s") from None


class _TorchSent(Sent):
    def __init__(self, work, buffer: torch.Tensor):
        super().__init__()
        self.work, self.buffer = work, buffer  # the buffer must live until the send completes

    def wait(self, timeout_s: float) -> None:
        try:
            self.work.wait(timeout=datetime.timedelta(seconds=max(0.05, timeout_s)))
        except RuntimeError as e:
            raise PeerLost(str(e).splitlines()[0][:160]) from None


class TorchTransport(Transport):
    """``workers``: (process group, its global ranks) when the workers are a sub-group of the
    processes (data parallel across tensor-parallel groups, gradwire/parallel): worker w is process
    ``members[w]``, and the collectives run on that group; None: every process is a worker."""

    concurrent = True

    def __init__(self, timeout_s: float = 120.0, device: torch.device | str = "cpu", workers=None):
        super().__init__()
        self.device = torch.device(device)
        init_from_env(timeout_s, self.device)
        self._world, self._global = workers if workers is not None else (None, list(range(dist.get_world_size())))
        self.rank = self._global.index(dist.get_rank())
        self.world_size = len(self._global)
        self.local_ranks = (self.rank,)
        self.timeout_s = timeout_s
        self._groups: dict[tuple[int, ...], object] = {}
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        # exchange_reduce_start's collectives: a group and a thread of their own, made at its first call
        self._chain: tuple[object, ThreadPoolExecutor] | None = None

    def _all(self, ranks: Sequence[int] | None, what: str) -> list[int]:
        ranks = self.participants(ranks)
        if ranks != list(range(self.world_size)):
            raise NotImplementedError(f"{what} over a subset of workers {ranks} is not supported on the torch "
                                      "backend yet")
        return ranks

    def _group(self, ranks: Sequence[int] | None, what: str):
        """(process group (None: every process) or the workers' group, sorted participants)."""
        ranks = self.participants(ranks)
        if ranks == list(range(self.world_size)):
            return self._world, ranks
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not among the participants {ranks} of a {what}")
        key = tuple(ranks)
        if key not in self._groups:
            members = [self._global[r] for r in key]
            self._groups[key] = self._guard(lambda: dist.new_group(members, use_local_synchronization=True),
                                            f"creating the group {list(key)}", kind=None)
        return self._groups[key], ranks

    def _count(self, nbytes: int, group, ranks: list[int]) -> None:
        if group is self._world:
            self.bytes_sent += nbytes
        elif self.rank == ranks[0]:
            self.group_bytes += nbytes

    def sync_counters(self) -> None:
        """Make ``bytes_sent`` global again after subgroup collectives: every rank must call this at
        the same points (the run loop does at evaluation steps)."""
        t = torch.tensor([self.group_bytes], dtype=torch.int64)
        self._guard(lambda: dist.all_reduce(t), "byte counters", kind=None)
        self.bytes_sent += int(t)
        self.group_bytes = 0

    def sum_step_counters(self, before: int, others: Sequence[int]) -> list[int]:
        """Make ``bytes_sent`` the whole run's after a step that began at ``before``, when the
        workers are a sub-group of the processes (gradwire/parallel) and the processes also count
        ``others`` (tensor-parallel collectives, each group's counts in one process): this
        transport's bytes (counted in full by worker 0's process, plus subgroup bytes) and
        ``others`` summed over every process. Every process calls it at the same points; its
        all-reduce of 1 + len(others) int64 counters (a tensor of 8·(2 + L) bytes with tensor
        parallelism's unlabelled count and L layer labels: 152 for SUMMA's 17 labels at 2 layers)
        is bookkeeping, not training traffic, and not counted. Returns the sums,
        ``[this transport's bytes, *others]``."""
        own = (self.bytes_sent - before if self.rank == 0 else 0) + self.group_bytes
        t = torch.tensor([own, *others], dtype=torch.int64)
        try:  # not through _guard: its time is not communication time either
            dist.all_reduce(t)
        except RuntimeError as e:  # a dead peer, as in _guard: one line, not gloo's traceback
            raise CommunicationError(f"rank {self.rank}: the step's byte counters failed (timeout {self.timeout_s:g} "
                                     f"s; a peer is missing or died): {str(e).splitlines()[0]}") from None
        self.group_bytes = 0
        sums = t.tolist()
        self.bytes_sent = before + sum(sums)
        return sums

    first_worker_process = 0  # 1 when process 0 is a parameter server or coordinator

    def node_of(self, rank: int) -> int:
        """torchrun starts LOCAL_WORLD_SIZE processes per node, ranked node by node; worker ``rank``
        runs in process ``rank + first_worker_process``."""
        return (self._global[rank] + self.first_worker_process) // self.local_world

    def _guard(self, fn, what: str, kind: int | None = COMM, since: float | None = None):
        """Run a collective call; ``kind``: how the local workers' timelines record it (None: not);
        ``since``: when the collective started (``time.perf_counter()``), where that was before this
        call (a wait for one started earlier), for the error's message."""
        start = time.perf_counter()
        began = self.timeline.now() if self.timeline.enabled else 0.0
        try:
            return fn()
        except RuntimeError as e:  # gloo/NCCL report timeouts and dead peers as RuntimeError
            first = start if since is None else since
            raise CommunicationError(f"rank {self.rank}: {what} failed after {time.perf_counter() - first:.1f} s "
                                     f"(timeout {self.timeout_s:g} s; a peer is missing or died): "
                                     f"{str(e).splitlines()[0]}") from None
        finally:
            elapsed = time.perf_counter() - start
            self.comm_time_s += elapsed
            if kind is not None:
                self.timeline.add_many(self.local_ranks, kind, began, began + elapsed)

    def _sizes(self, mine: int, size: int | None) -> list[int]:
        if size is not None:
            if mine != size:
                raise ValueError(f"rank {self.rank}: buffer of {mine} bytes, announced size {size}")
            return [size] * self.world_size
        t = torch.tensor([mine], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._guard(lambda: dist.all_gather(out, t, group=self._world), "size exchange")
        self.bytes_sent += ledger.size_exchange(self.world_size)
        return [int(x) for x in out]

    def allreduce_mean(self, tensors, ranks=None):
        group, ranks = self._group(ranks, "allreduce")
        mine = tensors[self.rank]
        acc = mine.clone()
        self._guard(lambda: dist.all_reduce(acc, group=group), "allreduce")
        n = len(ranks)
        self._count(ledger.allreduce(mine.numel() * mine.element_size(), n), group, ranks)
        return acc.div_(n)

    def allreduce_mean_start(self, tensors, ranks=None):
        ranks = self._all(ranks, "allreduce")
        mine = tensors[self.rank]
        acc = mine.clone()
        work = self._guard(lambda: dist.all_reduce(acc, group=self._world, async_op=True), "allreduce (start)",
                           kind=None)
        n = len(ranks)
        self.bytes_sent += ledger.allreduce(mine.numel() * mine.element_size(), n)
        return _TorchHandle(work, lambda: acc.div_(n).to(mine.dtype), self, "allreduce")

    def _gather_buffers(self, mine: torch.Tensor, size: int | None, count: int):
        """An all-gather's buffers: (every rank's size, this rank's payload padded to the longest, a
        buffer of that length per participant). The padded copy lets the caller change ``mine``."""
        sizes = self._sizes(int(mine.numel()), size)
        m = max(sizes)
        padded = torch.zeros(m, dtype=torch.uint8, device=self.device)
        padded[: mine.numel()] = mine
        return sizes, padded, [torch.empty(m, dtype=torch.uint8, device=self.device) for _ in range(count)]

    def allgather_start(self, buffers, ranks=None, *, size=None):
        """As :meth:`allgather`, the payloads' all-gather left in flight (``async_op``) so that the
        caller computes meanwhile (Streaming DiLoCo's compressed outer gradients); without ``size``
        the sizes are exchanged first, blocking (8 bytes each)."""
        ranks = self._all(ranks, "allgather")
        sizes, padded, out = self._gather_buffers(buffers[self.rank], size, len(ranks))
        work = self._guard(lambda: dist.all_gather(out, padded, group=self._world, async_op=True),
                           "allgather (start)", kind=None)
        n = len(ranks)
        self.bytes_sent += ledger.padded_allgather(padded.numel(), n)
        return _TorchHandle(work, lambda: {r: out[i][: sizes[r]] for i, r in enumerate(ranks)}, self, "allgather")

    def allgather(self, buffers, ranks=None, *, size=None):
        group, ranks = self._group(ranks, "allgather")
        if group is not self._world and size is None:
            raise NotImplementedError("a subgroup allgather needs the buffer size announced (size=)")
        sizes, padded, out = self._gather_buffers(buffers[self.rank], size, len(ranks))
        self._guard(lambda: dist.all_gather(out, padded, group=group), "allgather")
        n = len(ranks)
        self._count(ledger.padded_allgather(padded.numel(), n), group, ranks)
        return {r: out[i][: sizes[r] if group is self._world else size] for i, r in enumerate(ranks)}

    def _exchange_slots(self, mine: torch.Tensor, ranks: list[int], size: int, group) -> dict[int, torch.Tensor]:
        n = len(ranks)
        if mine.numel() != n * size:
            raise ValueError(f"rank {self.rank}: all-to-all buffer of {mine.numel()} bytes, expected {n} slots "
                             f"of {size}")
        out = self._empty(n * size)
        dist.all_to_all_single(out, self._on_device(mine), group=group)
        return {r: out[i * size:(i + 1) * size] for i, r in enumerate(ranks)}

    def alltoall(self, buffers, ranks=None, *, size):
        ranks = self._all(ranks, "alltoall")
        got = self._guard(lambda: self._exchange_slots(buffers[self.rank], ranks, size, self._world), "alltoall")
        self.bytes_sent += ledger.alltoall(size, len(ranks))
        return {self.rank: got}

    def exchange_reduce_start(self, buffers, reduce, ranks=None, *, size, reduced_size=None):
        """Both all-to-alls and the reduction between them run on this transport's own thread and
        process group (made at the first call, in the same order in every process), so that the
        caller computes meanwhile and its own collectives never interleave with them."""
        ranks = self._all(ranks, "exchange and reduce")
        if self._chain is None:
            group = self._guard(lambda: dist.new_group(self._global, use_local_synchronization=True),
                                "creating the exchange group", kind=None)
            self._chain = group, ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradwire-exchange")
        group, executor = self._chain
        mine, n, reduced_size = buffers[self.rank].clone(), len(ranks), reduced_size or size

        def chain():
            owned = reduce(self.rank, self._exchange_slots(mine, ranks, size, group))
            return self._exchange_slots(owned.repeat(n), ranks, reduced_size, group)

        self.bytes_sent += ledger.alltoall(size, n) + ledger.alltoall(reduced_size, n)
        work = _FutureWork(executor.submit(chain), 2 * self.timeout_s)
        return _TorchHandle(work, lambda: work.result, self, "exchange and reduce")

    def gather(self, buffers, dst, ranks=None, *, size=None):
        ranks = self._all(ranks, "gather")
        mine = buffers[self.rank]
        sizes = self._sizes(int(mine.numel()), size)
        m = max(sizes)
        padded = torch.zeros(m, dtype=torch.uint8, device=self.device)
        padded[: mine.numel()] = mine
        out = [torch.empty(m, dtype=torch.uint8, device=self.device) for _ in ranks] if self.rank == dst else None
        self._guard(lambda: dist.gather(padded, out, dst=self._global[dst], group=self._world), "gather")
        self.bytes_sent += ledger.gather([m] * len(ranks), ranks.index(dst))  # padded to the longest
        return None if out is None else {r: out[r][: sizes[r]] for r in ranks}

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        group, ranks = self._group(ranks, "broadcast")
        if group is not self._world:
            if size is None:
                raise NotImplementedError("a subgroup broadcast needs the buffer size announced (size=)")
            self._check_announced(buffer, src, size)
            out = self._on_device(buffer) if self.rank == src else self._empty(size)
            self._guard(lambda: dist.broadcast(out, src=self._global[src], group=group), "broadcast")
            self._count(ledger.broadcast(size, len(ranks)), group, ranks)
            return out
        if size is None:
            n = torch.tensor([buffer.numel() if self.rank == src else 0], dtype=torch.int64)
            self._guard(lambda: dist.broadcast(n, src=self._global[src], group=self._world), "size broadcast")
            self.bytes_sent += ledger.broadcast(ledger.SIZE_BYTES, len(ranks))
            size = int(n)
        self._check_announced(buffer, src, size)
        out = self._on_device(buffer) if self.rank == src else self._empty(size)
        self._guard(lambda: dist.broadcast(out, src=self._global[src], group=self._world), "broadcast")
        self.bytes_sent += ledger.broadcast(size, len(ranks))
        return out

    def _check_announced(self, buffer, src: int, size: int) -> None:
        """The source's buffer has the announced size: gloo aborts the receiving process (no Python
        error) when the sizes differ, so the sender refuses first, naming both."""
        if self.rank == src and buffer.numel() != size:
            raise ValueError(f"rank {self.rank}: broadcast of {buffer.numel()} bytes announced as {size} bytes")

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` contiguous on this process's device (NCCL carries device tensors only)."""
        return t.to(self.device).contiguous()

    def _empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def process_of(self, address: int) -> int:
        """The process that hosts worker ``address`` (or the server, ``SERVER``)."""
        return 0 if address == SERVER else address + self.first_worker_process

    def send(self, buffer, src, dst, *, tag=0):
        buffer = buffer.cpu()  # point-to-point goes through gloo (see the module docstring)
        try:  # gloo refuses a send to a peer that has gone at once
            work = dist.isend(buffer, dst=self.process_of(dst), tag=tag)
        except RuntimeError as e:
            raise PeerLost(f"rank {self.rank}: send to {self.process_of(dst)} refused: "
                           f"{str(e).splitlines()[0][:160]}") from None
        self.count(ledger.point_to_point(int(buffer.numel() * buffer.element_size())))
        return _TorchSent(work, buffer)

    def recv(self, nbytes, src, dst, *, tag=0, timeout_s, count=True):
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        start = time.perf_counter()
        try:
            dist.irecv(buffer, src=self.process_of(src), tag=tag).wait(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as e:  # a dead peer or the timeout
            raise PeerLost(str(e).splitlines()[0][:160]) from None
        if count:
            self.count(ledger.point_to_point(nbytes), time.perf_counter() - start)
        return buffer.to(self.device)

    def barrier(self) -> None:
        self._guard(dist.barrier, "barrier")

    def close(self) -> None:
        if self._chain is not None:
            self._chain[1].shutdown(wait=False, cancel_futures=True)
            self._chain = None
        if dist.is_initialized():
            dist.destroy_process_group()
