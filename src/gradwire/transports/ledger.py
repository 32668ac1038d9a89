"""The byte ledger: what each collective puts on the wire, as pure functions of its sizes.

Every counter in gradwire takes its figures from here: the torch transport, the simulator's network
models (transports/network.py), the tensor-parallel groups (parallel/comm.py and the per-layer
formulas of parallel/cost.py) and the DDP hook (ddp.py). Bytes count every message once, both ways
summed over all participants; ``n`` is the number of participants, ``nbytes`` one participant's
buffer.

Ring and pipelined collectives (what gloo and NCCL run; Patarasuk & Yuan 2009, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", J. Parallel Distrib. Comput. 69(2)):

* allreduce: a reduce-scatter then an all-gather, each ``(n-1)·nbytes``: ``2·(n-1)·nbytes``
* reduce-scatter, all-gather of one ``nbytes`` tensor split in n blocks: ``(n-1)·nbytes``
* all-gather of buffers of sizes n_i: every buffer reaches the n-1 others: ``(n-1)·Σ n_i``
  (a padded all-gather, as gloo and NCCL need equal sizes, is that with every n_i = max n_i)
* broadcast, reduce (pipelined along a chain): ``(n-1)·nbytes``
* gather to a root: every non-root buffer once: ``Σ_{i≠root} n_i``
* all-to-all of one ``slot`` of bytes from every participant to every other: ``n·(n-1)·slot``
  (an all-gather by direct exchange, each participant's one buffer to every other, is the same)
* point-to-point: ``nbytes``
* a live state transfer (a recovering replica fetches a healthy peer's serialised state,
  gradwire/fault/transfer.py): the payload once per recipient, ``Σ nbytes_i`` (as point-to-point;
  the HTTP headers around it are not counted, as no collective's framing is)

A star through one server (the simulator's ``ps`` network) sends everything to the server and
back: allreduce ``2·n·nbytes``, all-gather ``n·Σ n_i``, all-to-all every message in and out,
``2·n·(n-1)·slot``; broadcast, gather and point-to-point as above.
"""

from __future__ import annotations

from collections.abc import Sequence

SIZE_BYTES = 8  # one int64 length, as the torch transport exchanges sizes before a variable all-gather


def allreduce(nbytes: int, n: int) -> int:
    """Ring all-reduce of an ``nbytes`` tensor over ``n`` participants."""
    return 2 * (n - 1) * nbytes if n > 1 else 0


def reduce_scatter(nbytes: int, n: int) -> int:
    """Ring reduce-scatter of an ``nbytes`` tensor (each participant keeps one of n blocks)."""
    return (n - 1) * nbytes if n > 1 else 0


def allgather(sizes: Sequence[int]) -> int:
    """Ring all-gather of one buffer per participant, of the given sizes."""
    n = len(sizes)
    return (n - 1) * sum(sizes) if n > 1 else 0


def padded_allgather(nbytes: int, n: int) -> int:
    """All-gather of ``n`` buffers padded to the longest, ``nbytes`` (gloo and NCCL need equal sizes)."""
    return allgather([nbytes] * n)


def size_exchange(n: int) -> int:
    """The all-gather of every participant's buffer length that precedes a variable all-gather."""
    return padded_allgather(SIZE_BYTES, n)


def broadcast(nbytes: int, n: int) -> int:
    """Broadcast of ``nbytes`` from one participant to the ``n - 1`` others (pipelined or star)."""
    return (n - 1) * nbytes if n > 1 else 0


def reduce(nbytes: int, n: int) -> int:
    """Reduce of ``nbytes`` tensors to one participant (pipelined): as a broadcast, reversed."""
    return broadcast(nbytes, n)


def gather(sizes: Sequence[int], root_index: int) -> int:
    """Gather of one buffer per participant at participant ``root_index``: the others' buffers."""
    return sum(sizes) - sizes[root_index]


def alltoall(slot: int, n: int) -> int:
    """All-to-all of one ``slot``-byte message from each of ``n`` participants to each other one."""
    return n * (n - 1) * slot if n > 1 else 0


def point_to_point(nbytes: int) -> int:
    """One message."""
    return nbytes


def state_transfer(payloads: Sequence[int]) -> int:
    """Live state transfers, one serialised state of ``payloads[i]`` bytes to each recipient i."""
    return sum(point_to_point(n) for n in payloads)


def star_allreduce(nbytes: int, n: int) -> int:
    """All-reduce through one server: every tensor in, the mean back out to each."""
    return 2 * n * nbytes if n > 1 else 0


def star_alltoall(slot: int, n: int) -> int:
    """All-to-all through one server: every message in, then out to its addressee."""
    return 2 * alltoall(slot, n)


def star_allgather(sizes: Sequence[int]) -> int:
    """All-gather through one server: every buffer in, then all of them out to each participant
    (counted as the ``ps`` network always has: ``n·Σ n_i``)."""
    n = len(sizes)
    return n * sum(sizes) if n > 1 else 0
