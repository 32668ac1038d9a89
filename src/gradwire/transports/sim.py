"""The simulated transport: all workers in one process, costs from a network model.

Collectives compute their exact result (the mean is summed in rank order, as a fixed-order
reduction would) and advance the simulated clock by the network model's time.

The non-blocking ``allreduce_mean_start`` (and ``allgather_start``) computes the result and counts
its bytes and ``comm_time_s`` at the call, but does not advance the clock: the collective is taken
to run from the call's ``clock.now`` (the time its last contribution is ready) to ``finish_s = clock.now + time``, while
the workers go on computing. ``wait()`` advances the clock to ``max(clock.now, finish_s)``: only
the part of the communication that computation did not cover is paid. Overlapping collectives
are priced independently (no contention between them, or with computation, is modelled).

Point-to-point messages wait in a mailbox until ``recv`` takes them; ``send`` returns their duration
alone (``network.send``: latency plus bytes over the bandwidth), and the server-mode driver
(gradwire/servers/simulated.py) times them, with the queue on a star's server link
(``network.ServerLink``); ``recv`` counts them (a message is counted when it arrives, as on a real
backend's server).
"""

from __future__ import annotations

import collections

import torch

from gradwire.report.timeline import COMM, OVERLAP, sim_shares
from gradwire.transports.base import Handle, PeerLost, Sent, Transport
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import Cost, Network


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
        self.mailbox: dict[tuple[int, int, int], collections.deque] = {}  # (src, dst, tag) -> buffers

    def _charge(self, cost: Cost, *, advance: bool = True, ranks: list[int] | None = None,
                sizes: list[int] | None = None, after_s: float = 0.0) -> float:
        """Count ``cost``; ``advance``: a blocking call (the clock moves on). ``ranks``: a
        collective's participants, whose timelines get the interval (``OVERLAP`` when it does not
        block; ``after_s`` after now, for the second collective of a chain) and each its share of
        the bytes (by payload ``sizes``, else equal)."""
        if ranks is not None:
            now = self.clock.now + after_s
            shares = sim_shares(int(cost.bytes), sizes or [0] * len(ranks))
            self.timeline.add_many(ranks, COMM if advance else OVERLAP, now, now + cost.time_s, shares)
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
        self._charge(self.network.allreduce(first.numel() * first.element_size(), len(ranks)), ranks=ranks)
        return total.div_(len(ranks))

    def allgather(self, buffers, ranks=None, *, size=None):
        ranks = self.participants(ranks)
        self._check(buffers, ranks)
        sizes = [int(buffers[r].numel()) for r in ranks]
        self._charge(self.network.allgather(sizes), ranks=ranks, sizes=sizes)
        return {r: buffers[r] for r in ranks}

    def gather(self, buffers, dst, ranks=None, *, size=None):
        ranks = self.participants(ranks)
        self._check(buffers, ranks)
        sizes = [int(buffers[r].numel() * buffers[r].element_size()) for r in ranks]
        self._charge(self.network.gather(sizes, ranks.index(dst)), ranks=ranks, sizes=sizes)
        return {r: buffers[r] for r in ranks}

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        ranks = self.participants(ranks)
        self._charge(self.network.broadcast(int(buffer.numel() * buffer.element_size()), len(ranks)), ranks=ranks,
                     sizes=[int(r == src) for r in ranks])
        return buffer

    def _exchange(self, buffers, ranks: list[int], size: int) -> dict[int, dict[int, torch.Tensor]]:
        """The all-to-all's result (nothing charged): slot j of each buffer to the j-th participant."""
        self._check(buffers, ranks)
        for r in ranks:
            if buffers[r].numel() != size * len(ranks):
                raise ValueError(f"all-to-all: rank {r}'s buffer has {buffers[r].numel()} bytes, expected "
                                 f"{len(ranks)} slots of {size}")
        return {dst: {src: buffers[src][j * size:(j + 1) * size].clone() for src in ranks}
                for j, dst in enumerate(ranks)}

    def alltoall(self, buffers, ranks=None, *, size):
        ranks = self.participants(ranks)
        out = self._exchange(buffers, ranks, size)
        self._charge(self.network.alltoall(size, len(ranks)), ranks=ranks)
        return out

    def exchange_reduce_start(self, buffers, reduce, ranks=None, *, size, reduced_size=None):
        """Both exchanges computed and priced at the call, the second from the first's finish; the
        clock is paid only by ``wait()``, as for ``allgather_start``."""
        ranks = self.participants(ranks)
        n, reduced_size = len(ranks), reduced_size or size
        owned = {r: reduce(r, got) for r, got in self._exchange(buffers, ranks, size).items()}
        gathered = self._exchange({r: b.repeat(n) for r, b in owned.items()}, ranks, reduced_size)[ranks[0]]
        first = self._charge(self.network.alltoall(size, n), advance=False, ranks=ranks)
        second = self._charge(self.network.alltoall(reduced_size, n), advance=False, ranks=ranks, after_s=first)
        return SimHandle(gathered, self.clock.now + first + second, self.clock)

    def send(self, buffer, src, dst, *, tag=0):
        cost = self.network.send(int(buffer.numel() * buffer.element_size()))
        self.mailbox.setdefault((src, dst, tag), collections.deque()).append(buffer)
        return Sent(cost.time_s)

    def recv(self, nbytes, src, dst, *, tag=0, timeout_s=0.0, count=True):
        box = self.mailbox.get((src, dst, tag))
        if not box:  # in one process nothing can arrive later: an empty mailbox is a protocol error
            raise PeerLost(f"no message from {src} to {dst} (tag {tag}) on the simulated cluster")
        buffer = box.popleft()
        if buffer.numel() != nbytes:
            raise PeerLost(f"message from {src} to {dst} has {buffer.numel()} bytes, expected {nbytes}")
        if count:  # counted on arrival, as the server of a real backend counts what it handles
            self._charge(self.network.send(nbytes), advance=False)
        return buffer

    def state_dict(self):
        return super().state_dict() | {"mailbox": [{"src": s, "dst": d, "tag": g, "buffers": list(box)}
                                                   for (s, d, g), box in self.mailbox.items() if box]}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.mailbox = {(int(m["src"]), int(m["dst"]), int(m["tag"])):
                        collections.deque(b.clone() for b in m["buffers"]) for m in state.get("mailbox", [])}

    def allreduce_mean_start(self, tensors, ranks=None):
        ranks = self.participants(ranks)
        self._check(tensors, ranks)
        first = tensors[ranks[0]]
        acc_dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        total = first.to(acc_dtype, copy=True)  # a copy: the caller may change its tensors now
        for r in ranks[1:]:
            total += tensors[r]
        cost = self.network.allreduce(first.numel() * first.element_size(), len(ranks))
        seconds = self._charge(cost, advance=False, ranks=ranks)
        return SimHandle(total.div_(len(ranks)), self.clock.now + seconds, self.clock)

    def allgather_start(self, buffers, ranks=None, *, size=None):
        """As ``allreduce_mean_start``: priced at the call, the clock paid only by ``wait()``."""
        ranks = self.participants(ranks)
        self._check(buffers, ranks)
        sizes = [int(buffers[r].numel()) for r in ranks]
        seconds = self._charge(self.network.allgather(sizes), advance=False, ranks=ranks, sizes=sizes)
        return SimHandle({r: buffers[r].clone() for r in ranks}, self.clock.now + seconds, self.clock)
