"""The network model's edges that the formula tests leave open: a collective among one participant
sends nothing and takes no time on every topology (network.py: "a single participant sends
nothing"), and every collective's price is the documented formula term by term, with numbers
chosen so each term is distinct (8 Mbit/s is 1e6 bytes/s, 1 ms of latency).

Float times: each is a handful of float64 operations on values near 1e-3, so the relative error is a
few ulps; ``rel=1e-12`` leaves a wide margin and still tells apart any change of one term."""

from __future__ import annotations

import pytest

from gradwire.transports.network import NETWORKS

SPECS = ["ps", "ring", "halving-doubling"]
LAT, BW = 1e-3, 1e6  # latency_ms=1, mbps=8
REL = 1e-12


def build(spec: str):
    return NETWORKS.build(f"{spec}:mbps=8,latency_ms=1")


@pytest.mark.parametrize("spec", SPECS)
def test_a_single_participant_sends_nothing_and_waits_for_nothing(spec):
    """One participant: no byte and no second for an allreduce, an all-gather or a broadcast, on
    every topology (kills `n > 1` -> `n > 0` on the allreduce and the broadcast: the star would
    still price 2·(lat + B/bw) and the ring lat + B/bw for a collective with no peer)."""
    net = build(spec)
    for cost in (net.allreduce(4000, 1), net.allgather([4000]), net.broadcast(4000, 1)):
        assert (cost.bytes, cost.time_s) == (0, 0.0)


def test_the_stars_allreduce_is_a_gather_then_a_scatter_of_every_tensor():
    """ps, N = 3, B = 1000: all 3 tensors into the server and the mean back out to each, over the one
    link: 2·N·B = 6000 bytes, 2·(lat + N·B/bw) = 2·(0.001 + 0.003) = 0.008 s."""
    c = build("ps").allreduce(1000, 3)
    assert c.bytes == 6000
    assert c.time_s == pytest.approx(0.008, rel=REL)


def test_ring_allgather_costs_n_minus_1_latencies_and_the_largest_buffer_each_round():
    """ring, buffers of 1000, 3000, 2000 bytes: each of the n-1 = 2 rounds forwards one buffer per link,
    priced at the largest (a padded all-gather): bytes (n-1)·Σn = 12000, time 2·(0.001 + 0.003)."""
    c = build("ring").allgather([1000, 3000, 2000])
    assert c.bytes == 12000
    assert c.time_s == pytest.approx(0.008, rel=REL)


def test_ring_broadcast_pays_every_hops_latency_and_the_bytes_once():
    """ring, N = 5, 2000 bytes pipelined along the chain: (N-1)·lat + n/bw = 0.004 + 0.002 s,
    (N-1)·n = 8000 bytes."""
    c = build("ring").broadcast(2000, 5)
    assert c.bytes == 8000
    assert c.time_s == pytest.approx(0.006, rel=REL)


@pytest.mark.parametrize("spec", SPECS)
def test_a_point_to_point_message_costs_one_latency_and_its_bytes(spec):
    c = build(spec).send(3000)
    assert c.bytes == 3000
    assert c.time_s == pytest.approx(LAT + 3000 / BW, rel=REL)


@pytest.mark.parametrize("spec", SPECS)
def test_a_gather_is_the_others_buffers_over_the_roots_link(spec):
    """Buffers 1000, 3000, 2000 gathered at participant 2: 4000 bytes in one message's time."""
    c = build(spec).gather([1000, 3000, 2000], 2)
    assert c.bytes == 4000
    assert c.time_s == pytest.approx(LAT + 4000 / BW, rel=REL)


@pytest.mark.parametrize("spec", SPECS)
def test_a_gather_among_one_participant_sends_nothing_and_waits_for_nothing(spec):
    """A root gathering from no one sends no message: no byte and no latency, as every other
    collective among one participant (it used to charge one latency: a 1-worker signsgd run reported
    1 ms of communication a step, with 0 bytes)."""
    c = build(spec).gather([4000], 0)
    assert (c.bytes, c.time_s) == (0, 0.0)
