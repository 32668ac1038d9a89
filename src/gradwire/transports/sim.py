"""The simulated transport: all workers in one process, costs from a network model.

Collectives compute their exact result (the mean is summed in rank order, as a fixed-order
reduction would) and advance the simulated clock by the network model's time.

The non-blocking ``allreduce_mean_start`` computes the mean and counts its bytes and ``comm_time_s``
at the call, but does not advance the clock: the collective is taken to run from the call's
``clock.now`` (the time its last contribution is ready) to ``finish_s = clock.now + time``, while
the workers go on computing. ``wait()`` advances the clock to ``max(clock.now, finish_s)``: only
the part of the communication that computation did not cover is paid. Overlapping collectives
are priced independently (no contention between them, or with computation, is modelled).
"""

from __future__ import annotations

import torch

from gradwire.transports.base import Handle, Transport
from gradwire.transports.network import Cost, Network


class SimClock:
    """Simulated seconds since the start of the run."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += float(seconds)

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        self.now = float(state["now"])


class SimHandle(Handle):
    """An allreduce in flight on the simulated cluster: finishes at ``finish_s`` simulated seconds."""

    def __init__(self, result: torch.Tensor, finish_s: float, clock: SimClock):
        super().__init__(result, finish_s)
        self.clock = clock

    def wait(self) -> torch.Tensor:
        self.clock.advance(max(0.0, self.finish_s - self.clock.now))
        return self._result


class SimTransport(Transport):
    def __init__(self, world_size: int, network: Network, clock: SimClock):
        super().__init__()
        self.world_size = world_size
        self.local_ranks = tuple(range(world_size))
        self.network, self.clock = network, clock

    def _charge(self, cost: Cost, *, advance: bool = True) -> float:
        self.bytes_sent += int(cost.bytes)
        self.comm_time_s += cost.time_s
        if advance:
            self.clock.advance(cost.time_s)
        return cost.time_s

    def _check(self, contributions: dict, ranks: list[int]) -> None:
        if sorted(contributions) != ranks:
            raise ValueError(f"collective expected contributions from ranks {ranks}, got {sorted(contributions)}")

    def allreduce_mean(self, tensors, ranks=None):
        ranks = self.participants(ranks)
        self._check(tensors, ranks)
        first = tensors[ranks[0]]
        acc_dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        total = first.to(acc_dtype, copy=True)
        for r in ranks[1:]:
            total += tensors[r]
        self._charge(self.network.allreduce(first.numel() * first.element_size(), len(ranks)))
        return total.div_(len(ranks))

    def allgather(self, buffers, ranks=None, *, size=None):
        ranks = self.participants(ranks)
        self._check(buffers, ranks)
        self._charge(self.network.allgather([int(buffers[r].numel()) for r in ranks]))
        return {r: buffers[r] for r in ranks}

    def gather(self, buffers, dst, ranks=None, *, size=None):
        ranks = self.participants(ranks)
        self._check(buffers, ranks)
        sizes = [int(buffers[r].numel() * buffers[r].element_size()) for r in ranks]
        self._charge(self.network.gather(sizes, ranks.index(dst)))
        return {r: buffers[r] for r in ranks}

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        ranks = self.participants(ranks)
        self._charge(self.network.broadcast(int(buffer.numel() * buffer.element_size()), len(ranks)))
        return buffer

    def post(self, nbytes, src, dst):
        return self._charge(self.network.send(int(nbytes)), advance=False)

    def allreduce_mean_start(self, tensors, ranks=None):
        ranks = self.participants(ranks)
        self._check(tensors, ranks)
        first = tensors[ranks[0]]
        acc_dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        total = first.to(acc_dtype, copy=True)  # a copy: the caller may change its tensors now
        for r in ranks[1:]:
            total += tensors[r]
        cost = self.network.allreduce(first.numel() * first.element_size(), len(ranks))
        seconds = self._charge(cost, advance=False)
        return SimHandle(total.div_(len(ranks)), self.clock.now + seconds, self.clock)
