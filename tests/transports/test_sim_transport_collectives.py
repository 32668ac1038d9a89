"""The simulated transport (transports/sim.py) prices what its callers ask for: a collective among a
subset of the workers is priced for that subset (backup workers, groups), a non-blocking collective
runs from the clock's *current* time, a message's duration is the network's, and a collective's
bytes land on the timeline of the workers whose payload they are.

Networks are built at 8 Mbit/s = 1e6 bytes/s with 0 or 1 ms of latency; times are a few float64
operations, checked to ``rel=1e-12`` (a few ulps would do; any changed term is far outside)."""

from __future__ import annotations

import pytest
import torch

from gradwire.report.timeline import COMM, OVERLAP, Timeline
from gradwire.transports import ledger
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import NETWORKS
from gradwire.transports.sim import SimTransport

REL = 1e-12


def sim(world: int, spec: str = "ring:mbps=8,latency_ms=1", tmp_path=None) -> tuple[SimTransport, SimClock]:
    clock = SimClock()
    t = SimTransport(world, NETWORKS.build(spec), clock)
    if tmp_path is not None:
        t.timeline = Timeline(tmp_path / "timeline", "sim", clock=clock)
    return t, clock


def u8(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.uint8)


def test_an_allreduce_among_some_workers_is_priced_for_those_workers():
    """Ranks 0 and 2 of 4 average 250 float32 (B = 1000 bytes): a ring of 2, 2·(2-1)·B = 2000 bytes in
    2·(lat + B/(2·bw)) = 0.003 s, not the price of all 4 (kills len(ranks) -> world_size)."""
    t, clock = sim(4)
    mean = t.allreduce_mean({0: torch.full((250,), 1.0), 2: torch.full((250,), 3.0)}, ranks=[0, 2])
    assert torch.equal(mean, torch.full((250,), 2.0))
    assert t.bytes_sent == 2000 == ledger.allreduce(1000, 2)
    assert t.comm_time_s == pytest.approx(0.003, rel=REL) and clock.now == pytest.approx(0.003, rel=REL)


def test_a_gather_among_some_workers_counts_every_buffer_but_the_roots():
    """Ranks 1, 2, 3 of 4 with buffers of 10, 20 and 40 bytes: at root 2 the others' 10 + 40 bytes
    arrive, at root 3 the 10 + 20 (the root is found among the participants, not by its rank)."""
    t, clock = sim(4)
    buffers = {1: u8(10), 2: u8(20), 3: u8(40)}
    t.gather(buffers, 2, ranks=[1, 2, 3])
    assert t.bytes_sent == 50
    assert clock.now == pytest.approx(0.001 + 50 / 1e6, rel=REL)
    t.gather(buffers, 3, ranks=[1, 2, 3])
    assert t.bytes_sent == 50 + 30


def test_a_broadcast_among_some_workers_reaches_only_the_others_among_them():
    """Rank 1 broadcasts 500 bytes to rank 3 alone (ranks 1 and 3 of 4): 500 bytes in one hop,
    lat + 500/bw on the ring."""
    t, clock = sim(4)
    t.broadcast(u8(500), 1, ranks=[1, 3])
    assert t.bytes_sent == 500
    assert clock.now == pytest.approx(0.0015, rel=REL)


def test_an_allreduce_started_later_finishes_its_price_after_the_start():
    """Started at 2 s, a 1 MB ring allreduce of 2 workers (1 s at 1e6 bytes/s, no latency) finishes at
    3 s: the start does not move the clock, the wait moves it to 3 s (kills finish_s = price alone)."""
    t, clock = sim(2, "ring:mbps=8,latency_ms=0")
    clock.advance(2.0)
    h = t.allreduce_mean_start({r: torch.ones(250_000) for r in range(2)})
    assert clock.now == 2.0 and h.finish_s == pytest.approx(3.0, rel=REL)
    assert t.bytes_sent == ledger.allreduce(1_000_000, 2)
    h.wait()
    assert clock.now == pytest.approx(3.0, rel=REL)


def test_an_allgather_in_flight_leaves_the_clock_until_waited_on():
    """Started at 2 s, a ring all-gather of 1 000 000 and 500 000 bytes (one round priced at the
    largest buffer: 1 s) counts its (n-1)·Σn bytes at once, leaves the clock at 2 s while in flight and
    finishes at 3 s (kills a blocking charge at the start and finish_s = price alone)."""
    t, clock = sim(2, "ring:mbps=8,latency_ms=0")
    clock.advance(2.0)
    buffers = {0: u8(1_000_000), 1: u8(500_000)}
    h = t.allgather_start(buffers)
    assert clock.now == 2.0
    assert t.bytes_sent == 1_500_000 and t.comm_time_s == pytest.approx(1.0, rel=REL)
    assert h.finish_s == pytest.approx(3.0, rel=REL)
    buffers[0][0] = 7  # the caller may reuse its buffers once the call returns
    got = h.wait()
    assert clock.now == pytest.approx(3.0, rel=REL) and int(got[0][0]) == 0
    h.wait()
    assert clock.now == pytest.approx(3.0, rel=REL)


@pytest.mark.parametrize("spec", ["ps:mbps=8,latency_ms=1", "ring:mbps=8,latency_ms=1"])
def test_a_sent_messages_duration_is_one_latency_and_its_bytes(spec):
    """``send`` returns the network's price of the message, lat + n/bw = 0.001 + 0.001 s for 1000
    bytes; nothing is counted or paid until it is received."""
    t, clock = sim(2, spec)
    sent = t.send(u8(1000), 0, 1)
    assert sent.duration_s == pytest.approx(0.002, rel=REL)
    assert (t.bytes_sent, t.comm_time_s, clock.now) == (0, 0.0, 0.0)


def records(t: SimTransport) -> list[tuple]:
    """(worker, kind, start, end, bytes) of every interval recorded so far."""
    return [(w, kind, start, end, nbytes) for w, _step, kind, _flags, start, end, nbytes, _v in t.timeline.pending]


def test_a_broadcasts_bytes_are_on_its_sources_timeline(tmp_path):
    """Rank 2 broadcasts 500 bytes to ranks 0 and 1: the 1000 bytes are its own (a COMM interval for
    all three over the ring's 2·lat + 500/bw)."""
    t, clock = sim(3, tmp_path=tmp_path)
    t.broadcast(u8(500), 2)
    end = 0.002 + 500 / 1e6
    assert [(w, kind, start, nbytes) for w, kind, start, _e, nbytes in records(t)] == [
        (0, COMM, 0.0, 0), (1, COMM, 0.0, 0), (2, COMM, 0.0, 1000)]
    assert [e for *_, e, _b in records(t)] == pytest.approx([end] * 3, rel=REL)


def test_an_allgathers_bytes_are_shared_by_payload_size(tmp_path):
    """Buffers of 4, 9 and 1 bytes: the ring sends (n-1)·Σn = 28 bytes, each worker's share in
    proportion to its own payload: 8, 18 and 2."""
    t, clock = sim(3, tmp_path=tmp_path)
    t.allgather({0: u8(4), 1: u8(9), 2: u8(1)})
    assert [(w, kind, nbytes) for w, kind, _s, _e, nbytes in records(t)] == [(0, COMM, 8), (1, COMM, 18),
                                                                            (2, COMM, 2)]
    assert t.bytes_sent == 28


def test_a_collective_in_flight_is_recorded_as_overlap_a_blocking_one_as_communication(tmp_path):
    """The non-blocking allreduce's interval is OVERLAP (the workers compute meanwhile) from the call to
    its finish; a blocking one is COMM."""
    t, clock = sim(2, "ring:mbps=8,latency_ms=0", tmp_path=tmp_path)
    h = t.allreduce_mean_start({r: torch.ones(250_000) for r in range(2)})
    assert {(w, kind) for w, kind, *_ in records(t)} == {(0, OVERLAP), (1, OVERLAP)}
    h.wait()
    t.timeline.pending.clear()
    t.allreduce_mean({r: torch.ones(250_000) for r in range(2)})
    assert [(w, kind) for w, kind, *_ in records(t)] == [(0, COMM), (1, COMM)]
    assert [x for _w, _k, s, e, _b in records(t) for x in (s, e)] == pytest.approx([1.0, 2.0] * 2, rel=REL)


def test_every_collective_of_a_one_worker_simulator_is_free():
    """One worker: an allreduce, an all-gather, a gather and a broadcast move neither the counters nor
    the clock, on every topology."""
    for spec in ("ps", "ring", "halving-doubling"):
        t, clock = sim(1, f"{spec}:mbps=8,latency_ms=1")
        t.allreduce_mean({0: torch.ones(3)})
        t.allgather({0: u8(10)})
        t.gather({0: u8(10)}, 0)
        t.broadcast(u8(10), 0)
        assert (t.bytes_sent, t.comm_time_s, clock.now) == (0, 0.0, 0.0)


def test_a_one_worker_signsgd_run_reports_no_communication(make_config):
    """signsgd gathers the signs at worker 0 and broadcasts the vote: with one worker neither sends a
    byte, and the run's comm_time_s is 0 as sync's is."""
    from gradwire.run.loop import run

    summary = run(make_config(workers=1, steps=3, eval_every=3, algorithm="signsgd",
                              network="ring:mbps=100,latency_ms=1"), progress=False)
    assert (summary["bytes_sent"], summary["comm_time_s"]) == (0, 0.0)
