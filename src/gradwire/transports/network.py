"""Network cost models for the simulated cluster: what a collective sends, and how long it takes.

Every message of n bytes costs ``latency_s + n / bandwidth`` on the link it crosses; the topology
decides who sends what and which transfers share a link. Formulas (N participants, B bytes per
worker for a dense allreduce, n_i bytes from worker i otherwise; L = ceil(log2 N)):

=============  ===================================  =============================================
collective     ``ps`` (all traffic via one server   ``ring`` (neighbour links, all in parallel)
               link, which serialises it)
=============  ===================================  =============================================
allreduce      bytes 2·N·B;                         bytes 2·(N-1)·B;
               time 2·(lat + N·B/bw)                time 2·(N-1)·(lat + B/(N·bw))  (Patarasuk 2009)
allgather      bytes N·Σn; time 2·lat + N·Σn/bw     bytes (N-1)·Σn; time (N-1)·(lat + max n/bw)
gather (to r)  bytes Σ_{i≠r} n_i; time lat + that/bw  (same: the root's link takes it all)
all-to-all     bytes 2·N·(N-1)·s;                   bytes N·(N-1)·s; time lat + (N-1)·s/bw
(slots of s)   time 2·lat + N·(N-1)·s/bw            (every message posted at once, each worker's
                                                    own link carrying its N-1: gloo's alltoall)
broadcast      bytes (N-1)·n; time lat + (N-1)·n/bw  bytes (N-1)·n; time (N-1)·lat + n/bw (pipelined)
send           bytes n; time lat + n/bw             (same)
=============  ===================================  =============================================

On ``ps`` the server-mode messages (gradwire/servers/simulated.py) queue on the server's link, one
at a time in each direction in the order they are ready (``ServerLink``): n uploads of B bytes
ready together arrive over lat + n·B/bw, as the allreduce's gather half does; on the other networks
each message costs lat + n/bw on its own.

The ring allgather is priced by the largest buffer, as a padded allgather (what gloo and NCCL
do with variable sizes) would be. Bytes count every message both ways; they are the byte ledger's
(transports/ledger.py), where every counter in gradwire takes its figures.

``halving-doubling`` sends the ring's bytes in logarithmically many rounds (Thakur, Rabenseifner &
Gropp 2005, "Optimization of collective communication operations in MPICH", IJHPCA 19(1)): the
latency class of NCCL's trees and of MPI's large-scale collectives, where the ring's 2(N-1)
latencies dominate a small message among many workers. gloo, which the torch backend's CPU runs
use, has only the ring, so this model is not validated on the test bed (docs/time_to_accuracy.md).

=============  ==============================================================================
allreduce      Rabenseifner: reduce-scatter by recursive halving, allgather by recursive doubling;
               bytes 2·(N-1)·B (the ring's); with P = 2^floor(log2 N):
               time 2·log2(P)·lat + 2·(P-1)/P·B/bw, plus 2·(lat + B/bw) when N > P (the N-P extra
               workers first hand their tensor to a partner and get the result back)
allgather      Bruck: bytes (N-1)·Σn; time L·lat + (N-1)·max n/bw
broadcast      binomial tree: bytes (N-1)·n; time L·(lat + n/bw)
=============  ==============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from gradwire.spec import Registry, Specced, require
from gradwire.transports import ledger

NETWORKS = Registry("network")


@dataclass(frozen=True)
class Cost:
    bytes: int
    time_s: float


class ServerLink:
    """One direction of the server's link: a message ready at ``ready`` starts when the link is free,
    holds it for its bytes over the bandwidth, and arrives a latency after it has gone out. On a
    network whose server link is not shared, a message arrives lat + n/bw after it is ready. Calls must
    come in the order the messages are ready (the simulator's event order)."""

    def __init__(self, network: Network):
        self.network, self.free_s = network, 0.0

    def arrival(self, ready: float, nbytes: int) -> float:
        net = self.network
        if not net.server_link_shared:
            return ready + net.send(nbytes).time_s
        self.free_s = max(ready, self.free_s) + nbytes / net.bytes_per_s
        return self.free_s + net.latency_s


class Network(Specced):
    """A topology: the seconds each collective takes (``allreduce_s``, ``allgather_s``,
    ``broadcast_s``, for two participants or more); the bytes are the byte ledger's, and a single
    participant sends nothing."""

    name = "?"
    # point-to-point messages to and from a server share the server's one link (a star), each direction
    # carrying one message at a time; otherwise each message is priced on its own (no contention)
    server_link_shared = False
    allreduce_bytes = staticmethod(ledger.allreduce)  # the ledger's count (a star's differs: PSNetwork)
    allgather_bytes = staticmethod(ledger.allgather)
    alltoall_bytes = staticmethod(ledger.alltoall)

    def __init__(self, *, mbps: float = 100.0, latency_ms: float = 1.0):
        require(mbps > 0, f"mbps must be > 0, got {mbps}")
        require(latency_ms >= 0, f"latency_ms must be >= 0, got {latency_ms}")
        self.mbps, self.latency_ms = mbps, latency_ms
        self.bytes_per_s = mbps * 1e6 / 8
        self.latency_s = latency_ms / 1e3

    def allreduce(self, nbytes: int, n: int) -> Cost:
        return Cost(self.allreduce_bytes(nbytes, n), self.allreduce_s(nbytes, n)) if n > 1 else Cost(0, 0.0)

    def allgather(self, sizes: list[int]) -> Cost:
        return Cost(self.allgather_bytes(sizes), self.allgather_s(sizes)) if len(sizes) > 1 else Cost(0, 0.0)

    def alltoall(self, slot: int, n: int) -> Cost:
        """An all-to-all of ``slot`` bytes from every participant to every other one."""
        return Cost(self.alltoall_bytes(slot, n), self.alltoall_s(slot, n)) if n > 1 else Cost(0, 0.0)

    def alltoall_s(self, slot: int, n: int) -> float:
        """Every message posted at once (gloo's alltoall), each worker's link carrying its n - 1:
        one latency, then the link's bytes; the ring's and halving-doubling's links alike."""
        return self.latency_s + (n - 1) * slot / self.bytes_per_s

    def broadcast(self, nbytes: int, n: int) -> Cost:
        return Cost(ledger.broadcast(nbytes, n), self.broadcast_s(nbytes, n)) if n > 1 else Cost(0, 0.0)

    def send(self, n: int) -> Cost:
        return Cost(ledger.point_to_point(n), self.latency_s + n / self.bytes_per_s)

    def gather(self, sizes: list[int], root_index: int) -> Cost:
        if len(sizes) < 2:  # the root alone: no message, no latency
            return Cost(0, 0.0)
        total = ledger.gather(sizes, root_index)
        return Cost(total, self.latency_s + total / self.bytes_per_s)


@NETWORKS.register("ps", help="star through a parameter server whose link serialises all traffic",
                   params={"mbps": "server link bandwidth in Mbit/s", "latency_ms": "one-way latency"})
class PSNetwork(Network):
    name = "ps"
    server_link_shared = True
    allreduce_bytes = staticmethod(ledger.star_allreduce)
    allgather_bytes = staticmethod(ledger.star_allgather)
    alltoall_bytes = staticmethod(ledger.star_alltoall)

    def allreduce_s(self, nbytes: int, n: int) -> float:
        return 2 * (self.latency_s + n * nbytes / self.bytes_per_s)

    def allgather_s(self, sizes: list[int]) -> float:
        return 2 * self.latency_s + len(sizes) * sum(sizes) / self.bytes_per_s

    def broadcast_s(self, nbytes: int, n: int) -> float:
        return self.latency_s + (n - 1) * nbytes / self.bytes_per_s

    def alltoall_s(self, slot: int, n: int) -> float:
        return 2 * self.latency_s + n * (n - 1) * slot / self.bytes_per_s


@NETWORKS.register("ring", help="ring collectives over neighbour links that transmit in parallel",
                   params={"mbps": "per-link bandwidth in Mbit/s", "latency_ms": "one-way latency"})
class RingNetwork(Network):
    name = "ring"

    def allreduce_s(self, nbytes: int, n: int) -> float:
        return 2 * (n - 1) * (self.latency_s + nbytes / (n * self.bytes_per_s))

    def allgather_s(self, sizes: list[int]) -> float:
        return (len(sizes) - 1) * (self.latency_s + max(sizes) / self.bytes_per_s)

    def broadcast_s(self, nbytes: int, n: int) -> float:
        return (n - 1) * self.latency_s + nbytes / self.bytes_per_s


@NETWORKS.register("halving-doubling",
                   help="logarithmic-latency collectives: Rabenseifner's allreduce (2·log2 P rounds, P the "
                        "largest power of two <= N, plus 2 otherwise), Bruck's allgather and a binomial broadcast "
                        "(ceil(log2 N) rounds each), the ring's bytes; NCCL's tree regime, not validated on gloo",
                   params={"mbps": "per-link bandwidth in Mbit/s", "latency_ms": "one-way latency"})
class HalvingDoublingNetwork(Network):
    name = "halving-doubling"

    def allreduce_s(self, nbytes: int, n: int) -> float:
        p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
        rounds = p.bit_length() - 1
        time = 2 * rounds * self.latency_s + 2 * (p - 1) / p * nbytes / self.bytes_per_s
        if n > p:  # the extra workers' tensors in, the results back out
            time += 2 * (self.latency_s + nbytes / self.bytes_per_s)
        return time

    def allgather_s(self, sizes: list[int]) -> float:
        rounds = (len(sizes) - 1).bit_length()  # ceil(log2 n)
        return rounds * self.latency_s + (len(sizes) - 1) * max(sizes) / self.bytes_per_s

    def broadcast_s(self, nbytes: int, n: int) -> float:
        return (n - 1).bit_length() * (self.latency_s + nbytes / self.bytes_per_s)
