"""The torch.distributed transport: one worker per process, gloo on CPU, NCCL on GPU.

The same collectives as the simulator, carried by torch.distributed; payloads are the real uint8
buffers (variable sizes are padded to the largest, as gloo and NCCL need equal sizes). Every call
is bounded by the process group's timeout, so a missing peer raises instead of hanging.

Bytes are counted as the ring algorithms that gloo and NCCL use send them, the same formulas as
the simulator's ``ring`` network (transports/network.py): allreduce 2·(N-1)·B, allgather
(N-1)·N·max n (padded), gather Σ of the non-root buffers, broadcast (N-1)·n, plus (N-1)·N·8 for a
size exchange when the sizes are not known in advance. Every rank knows every size, so every
rank holds the same global ``bytes_sent``, with no extra communication.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from gradwire.errors import CommunicationError
from gradwire.transports.base import Handle, Transport


class WallClock:
    """Real seconds since the run started; ``advance`` is a no-op (time passes by itself)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.offset = 0.0  # seconds already run before a resume

    @property
    def now(self) -> float:
        return self.offset + time.perf_counter() - self.start

    @now.setter
    def now(self, value: float) -> None:  # event-driven code may set it; real time wins
        pass

    def advance(self, seconds: float) -> None:
        pass

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        self.offset = float(state["now"])
        self.start = time.perf_counter()


def init_from_env(timeout_s: float) -> None:
    """Join the process group that torchrun (or the caller) described in the environment."""
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise CommunicationError(f"--backend torch needs torchrun's environment ({', '.join(missing)} unset): "
                                 "start it with `gradwire launch --nproc-per-node N -- run ...` or torchrun")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
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
    def __init__(self, work, tensor: torch.Tensor, n: int, out_dtype: torch.dtype, transport: TorchTransport):
        super().__init__(tensor)
        self.work, self.n, self.out_dtype, self.transport = work, n, out_dtype, transport
        self.done = False

    def wait(self) -> torch.Tensor:
        if not self.done:
            self.transport._guard(self.work.wait, "allreduce (async)")
            self._result = self._result.div_(self.n).to(self.out_dtype)
            self.done = True
        return self._result


class TorchTransport(Transport):
    def __init__(self, timeout_s: float = 120.0):
        super().__init__()
        init_from_env(timeout_s)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_ranks = (self.rank,)
        self.timeout_s = timeout_s

    def _all(self, ranks: Sequence[int] | None, what: str) -> list[int]:
        ranks = self.participants(ranks)
        if ranks != list(range(self.world_size)):
            raise NotImplementedError(f"{what} over a subset of workers {ranks} is not supported on the torch "
                                      "backend yet (it needs the parameter-server mode)")
        return ranks

    def _guard(self, fn, what: str):
        start = time.perf_counter()
        try:
            return fn()
        except RuntimeError as e:  # gloo/NCCL report timeouts and dead peers as RuntimeError
            raise CommunicationError(f"rank {self.rank}: {what} failed after {time.perf_counter() - start:.1f} s "
                                     f"(timeout {self.timeout_s:g} s; a peer is missing or died): "
                                     f"{str(e).splitlines()[0]}") from None
        finally:
            self.comm_time_s += time.perf_counter() - start
            self.calls += 1

    def _sizes(self, mine: int, size: int | None) -> list[int]:
        if size is not None:
            if mine != size:
                raise ValueError(f"rank {self.rank}: buffer of {mine} bytes, announced size {size}")
            return [size] * self.world_size
        t = torch.tensor([mine], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._guard(lambda: dist.all_gather(out, t), "size exchange")
        self.bytes_sent += (self.world_size - 1) * self.world_size * 8
        return [int(x) for x in out]

    def allreduce_mean(self, tensors, ranks=None):
        ranks = self._all(ranks, "allreduce")
        mine = tensors[self.rank]
        acc = mine.clone()
        self._guard(lambda: dist.all_reduce(acc), "allreduce")
        n = len(ranks)
        self.bytes_sent += 2 * (n - 1) * mine.numel() * mine.element_size()
        return acc.div_(n)

    def allreduce_mean_start(self, tensors, ranks=None):
        ranks = self._all(ranks, "allreduce")
        mine = tensors[self.rank]
        acc = mine.clone()
        work = self._guard(lambda: dist.all_reduce(acc, async_op=True), "allreduce (start)")
        n = len(ranks)
        self.bytes_sent += 2 * (n - 1) * mine.numel() * mine.element_size()
        return _TorchHandle(work, acc, n, mine.dtype, self)

    def allgather(self, buffers, ranks=None, *, size=None):
        ranks = self._all(ranks, "allgather")
        mine = buffers[self.rank]
        sizes = self._sizes(int(mine.numel()), size)
        m = max(sizes)
        padded = torch.zeros(m, dtype=torch.uint8)
        padded[: mine.numel()] = mine
        out = [torch.empty(m, dtype=torch.uint8) for _ in ranks]
        self._guard(lambda: dist.all_gather(out, padded), "allgather")
        n = len(ranks)
        self.bytes_sent += (n - 1) * n * m
        return {r: out[r][: sizes[r]] for r in ranks}

    def gather(self, buffers, dst, ranks=None, *, size=None):
        ranks = self._all(ranks, "gather")
        mine = buffers[self.rank]
        sizes = self._sizes(int(mine.numel()), size)
        m = max(sizes)
        padded = torch.zeros(m, dtype=torch.uint8)
        padded[: mine.numel()] = mine
        out = [torch.empty(m, dtype=torch.uint8) for _ in ranks] if self.rank == dst else None
        self._guard(lambda: dist.gather(padded, out, dst=dst), "gather")
        self.bytes_sent += m * (len(ranks) - 1)
        return None if out is None else {r: out[r][: sizes[r]] for r in ranks}

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        ranks = self._all(ranks, "broadcast")
        if size is None:
            n = torch.tensor([buffer.numel() if self.rank == src else 0], dtype=torch.int64)
            self._guard(lambda: dist.broadcast(n, src=src), "size broadcast")
            self.bytes_sent += (len(ranks) - 1) * 8
            size = int(n)
        out = buffer.contiguous() if self.rank == src else torch.empty(size, dtype=torch.uint8)
        self._guard(lambda: dist.broadcast(out, src=src), "broadcast")
        self.bytes_sent += (len(ranks) - 1) * size
        return out

    def post(self, nbytes, src, dst):
        raise NotImplementedError("event-driven (asynchronous) algorithms need the parameter-server mode, "
                                  "which the torch backend does not have yet")

    def barrier(self) -> None:
        self._guard(dist.barrier, "barrier")

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
