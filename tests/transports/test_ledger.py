"""The byte ledger (transports/ledger.py): each formula equals the bytes of the messages that the
collective's algorithm sends, counted one by one in a small message-level model of it; and the
simulator charges what the ledger says."""

from __future__ import annotations

import pytest
import torch

from gradwire.transports import ledger
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import HalvingDoublingNetwork, PSNetwork, RingNetwork
from gradwire.transports.sim import SimTransport

SIZES = [1, 2, 3, 5, 8]


def ring_reduce_scatter_messages(nbytes: int, n: int) -> list[int]:
    """Ring reduce-scatter (Patarasuk & Yuan 2009): n-1 rounds, each participant passes one of n
    blocks to its neighbour."""
    blocks = [len(b) for b in torch.arange(nbytes).tensor_split(n)]
    return [blocks[(i - step) % n] for step in range(n - 1) for i in range(n)]


def ring_allgather_messages(sizes: list[int]) -> list[int]:
    """Ring all-gather: n-1 rounds, each participant forwards the buffer it received last round."""
    n = len(sizes)
    return [sizes[(i - step) % n] for step in range(n - 1) for i in range(n)]


def chain_broadcast_messages(nbytes: int, n: int) -> list[int]:
    """Pipelined broadcast along a chain: each of the n-1 others receives the buffer once."""
    return [nbytes] * (n - 1)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("nbytes", [0, 1, 7, 24])
def test_allreduce_is_a_reduce_scatter_then_an_allgather(nbytes, n):
    blocks = [len(b) for b in torch.arange(nbytes).tensor_split(n)]
    messages = ring_reduce_scatter_messages(nbytes, n) + ring_allgather_messages(blocks)
    assert ledger.reduce_scatter(nbytes, n) == sum(ring_reduce_scatter_messages(nbytes, n))
    assert ledger.allreduce(nbytes, n) == sum(messages) == 2 * (n - 1) * nbytes


@pytest.mark.parametrize("sizes", [[5], [3, 0], [1, 2, 3], [4, 4, 4, 9], [0, 7, 1, 1, 2]])
def test_allgather_forwards_every_buffer_to_every_other(sizes):
    n = len(sizes)
    assert ledger.allgather(sizes) == sum(ring_allgather_messages(sizes))
    assert ledger.padded_allgather(max(sizes), n) == sum(ring_allgather_messages([max(sizes)] * n))
    assert ledger.size_exchange(n) == ledger.padded_allgather(8, n) == (n - 1) * n * 8
    # through one server: every buffer in, then each participant's n-1 others out
    assert ledger.star_allgather(sizes) == (sum(sizes) + sum(sum(sizes) - s for s in sizes) if n > 1 else 0)


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_reduce_gather_and_point_to_point(n):
    assert ledger.broadcast(11, n) == sum(chain_broadcast_messages(11, n))
    assert ledger.reduce(11, n) == ledger.broadcast(11, n)  # the same chain, reversed
    sizes = [3 * i + 1 for i in range(n)]
    for root in range(n):
        assert ledger.gather(sizes, root) == sum(s for i, s in enumerate(sizes) if i != root)
    assert ledger.point_to_point(13) == 13
    assert ledger.star_allreduce(6, n) == (2 * n * 6 if n > 1 else 0)  # every tensor in, the mean out


def test_the_simulator_charges_the_ledger():
    """Each collective of the simulator, on every network, adds the ledger's bytes."""
    for network, (reduce_all, gather_all) in [(RingNetwork(), (ledger.allreduce, ledger.allgather)),
                                              (HalvingDoublingNetwork(), (ledger.allreduce, ledger.allgather)),
                                              (PSNetwork(), (ledger.star_allreduce, ledger.star_allgather))]:
        t = SimTransport(3, network, SimClock())
        before = t.bytes_sent
        t.allreduce_mean({r: torch.ones(5) for r in range(3)})
        assert t.bytes_sent - before == reduce_all(20, 3)
        sizes = [4, 9, 1]
        buffers = {r: torch.zeros(s, dtype=torch.uint8) for r, s in enumerate(sizes)}
        before = t.bytes_sent
        t.allgather(buffers)
        assert t.bytes_sent - before == gather_all(sizes)
        before = t.bytes_sent
        t.gather(buffers, 1)
        assert t.bytes_sent - before == ledger.gather(sizes, 1)
        before = t.bytes_sent
        t.broadcast(torch.zeros(6, dtype=torch.uint8), 0)
        assert t.bytes_sent - before == ledger.broadcast(6, 3)


def test_waiting_on_a_collective_in_flight_moves_the_clock_to_its_end_never_back():
    """An allreduce started at t finishes at t + its price; a wait before then moves the simulated
    clock to the finish, a wait after it (the computation took longer) leaves the clock alone."""
    clock = SimClock()
    t = SimTransport(2, RingNetwork(mbps=8, latency_ms=0), clock)  # 1 MB/s: a ring allreduce of 1 MB takes 1 s
    h = t.allreduce_mean_start({r: torch.ones(250_000) for r in range(2)})
    assert h.finish_s == pytest.approx(1.0)
    h.wait()
    assert clock.now == pytest.approx(1.0)
    late = t.allreduce_mean_start({r: torch.ones(250_000) for r in range(2)})
    clock.advance(5.0)  # the backward pass went on past the collective's end
    late.wait()
    late.wait()
    assert clock.now == pytest.approx(6.0)


def test_uncounted_restores_the_counters():
    t = SimTransport(2, RingNetwork(), SimClock())
    t.allreduce_mean({r: torch.ones(3) for r in range(2)})
    counted = t.bytes_sent, t.comm_time_s
    with t.uncounted():
        t.allreduce_mean({r: torch.ones(3) for r in range(2)})
        assert t.bytes_sent > counted[0]
    assert (t.bytes_sent, t.comm_time_s) == counted



def test_a_live_state_transfer_is_its_payload_once_per_recipient():
    assert ledger.state_transfer([]) == 0
    assert ledger.state_transfer([3774433]) == 3774433
    assert ledger.state_transfer([100, 250]) == ledger.point_to_point(100) + ledger.point_to_point(250) == 350


def test_a_message_received_on_the_simulator_is_counted_without_moving_the_clock():
    """The server counts a message when it handles it (as a real backend's server does); the
    message's travel is priced by the driver's links, so counting it does not move the clock."""
    clock = SimClock()
    t = SimTransport(2, RingNetwork(mbps=8, latency_ms=1), clock)
    t.send(torch.zeros(1000, dtype=torch.uint8), 0, 1)
    assert t.bytes_sent == 0 and clock.now == 0.0  # counted on arrival, not on sending
    t.recv(1000, 0, 1)
    assert t.bytes_sent == ledger.point_to_point(1000) and clock.now == 0.0
    t.send(torch.zeros(24, dtype=torch.uint8), 1, 0)
    t.recv(24, 1, 0, count=False)
    assert t.bytes_sent == ledger.point_to_point(1000)


def test_a_runs_summary_holds_the_ledgers_totals(make_config):
    """summary.json's bytes_sent and comm_time_s are the transport's: sync's allreduce of the gradient
    every step, priced by the ring (12 steps of 4 workers, digits-logreg's 650 float32)."""
    from gradwire.run.loop import run

    cfg = make_config(network="ring:mbps=100,latency_ms=1")
    summary = run(cfg)
    each = RingNetwork(mbps=100, latency_ms=1).allreduce(650 * 4, 4)
    assert summary["bytes_sent"] == 12 * each.bytes
    assert summary["comm_time_s"] == pytest.approx(12 * each.time_s, rel=1e-12)
