import re

import numpy as np
import pytest

from gradwire.errors import ConfigError
from gradwire.transports.network import NETWORKS
from gradwire.transports.stragglers import STRAGGLERS

BW = 100e6 / 8  # 100 Mbit/s in bytes/s


def test_ps_costs_follow_formulas():
    net = NETWORKS.build("ps:mbps=100,latency_ms=2")
    c = net.allreduce(1000, 4)
    assert c.bytes == 2 * 4 * 1000 and c.time_s == pytest.approx(2 * (0.002 + 4 * 1000 / BW))
    c = net.allgather([10, 20, 30])
    assert c.bytes == 3 * 60 and c.time_s == pytest.approx(2 * 0.002 + 3 * 60 / BW)
    c = net.gather([10, 20, 30], root_index=0)
    assert c.bytes == 50 and c.time_s == pytest.approx(0.002 + 50 / BW)
    c = net.broadcast(100, 5)
    assert c.bytes == 400 and c.time_s == pytest.approx(0.002 + 400 / BW)
    assert net.send(123).bytes == 123


def test_a_stars_server_link_carries_one_message_at_a_time():
    """n uploads of B bytes ready together reach the server over lat + n·B/bw, the allreduce's gather
    half; one ready after the link has emptied pays only its own lat + B/bw. On the ring, each message
    is priced on its own."""
    from gradwire.transports.network import ServerLink

    net = NETWORKS.build("ps:mbps=100,latency_ms=2")
    link = ServerLink(net)
    arrivals = [link.arrival(1.0, 1000) for _ in range(4)]
    assert arrivals[-1] == pytest.approx(1.0 + net.allreduce(1000, 4).time_s / 2)
    assert np.diff(arrivals) == pytest.approx([1000 / BW] * 3)
    assert link.arrival(5.0, 1000) == pytest.approx(5.0 + net.send(1000).time_s)
    ring = ServerLink(NETWORKS.build("ring:mbps=100,latency_ms=2"))
    assert [ring.arrival(1.0, 1000) for _ in range(3)] == [1.0 + net.send(1000).time_s] * 3


def test_ring_costs_follow_formulas():
    net = NETWORKS.build("ring:mbps=100,latency_ms=1")
    c = net.allreduce(8000, 8)
    assert c.bytes == 14 * 8000 and c.time_s == pytest.approx(14 * (0.001 + 1000 / BW))
    c = net.allgather([5, 50, 7])
    assert c.bytes == 2 * 62 and c.time_s == pytest.approx(2 * (0.001 + 50 / BW))
    c = net.broadcast(100, 5)  # pipelined along the ring: every hop's latency, the bytes once
    assert c.bytes == 4 * 100 and c.time_s == pytest.approx(4 * 0.001 + 100 / BW)
    c = net.gather([5, 50, 7], 1)  # the root receives the others' buffers over its link
    assert c.bytes == 12 and c.time_s == pytest.approx(0.001 + 12 / BW)


def test_single_participant_costs_nothing():
    for spec in ("ps", "ring"):
        net = NETWORKS.build(spec)
        assert net.allreduce(100, 1).bytes == 0 and net.allgather([100]).time_s == 0.0


@pytest.mark.parametrize("bad, match", [("ps:mbps=0", "mbps must be > 0, got 0.0"),
                                        ("ring:latency_ms=-1", "latency_ms must be >= 0, got -1.0"),
                                        ("star", "unknown network 'star'; valid networks: halving-doubling, ps, ring"),
                                        ("ps:bw=3", "no parameter 'bw'; valid parameters: mbps, latency_ms")])
def test_bad_network_specs(bad, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        NETWORKS.build(bad)


def test_stragglers_are_deterministic_and_order_free():
    a = STRAGGLERS.build("lognormal:sigma=0.5,compute_s=0.1", seed=3)
    b = STRAGGLERS.build("lognormal:sigma=0.5,compute_s=0.1", seed=3)
    t1 = [a.time(w, s) for s in range(5) for w in range(4)]
    t2 = [b.time(w, s) for s in reversed(range(5)) for w in reversed(range(4))][::-1]
    assert t1 == t2
    c = STRAGGLERS.build("lognormal:sigma=0.5,compute_s=0.1", seed=4)
    assert c.time(0, 0) != a.time(0, 0)


def test_lognormal_mean_is_compute_s():
    m = STRAGGLERS.build("lognormal:sigma=0.5,compute_s=0.2", seed=0)
    draws = np.array([m.time(w, s) for w in range(50) for s in range(200)])
    # mean of 10k draws of a mean-0.2 log-normal with sigma 0.5: standard error ~0.001
    assert draws.mean() == pytest.approx(0.2, abs=0.005)
    assert np.log(draws).std() == pytest.approx(0.5, abs=0.02)


def test_tail_slow_fraction():
    m = STRAGGLERS.build("tail:p=0.1,slowdown=10,compute_s=1", seed=0)
    draws = np.array([m.time(w, s) for w in range(20) for s in range(500)])
    assert set(np.unique(draws)) == {1.0, 10.0}
    assert (draws == 10).mean() == pytest.approx(0.1, abs=0.01)


def test_slow_workers_are_always_slow():
    m = STRAGGLERS.build("slow:count=2,slowdown=3,compute_s=0.5", seed=0)
    assert m.times(4, 1).tolist() == m.times(4, 99).tolist() == [1.5, 1.5, 0.5, 0.5]
    assert STRAGGLERS.build(m.spec()).times(4, 7).tolist() == [1.5, 1.5, 0.5, 0.5]


@pytest.mark.parametrize("bad, match", [("tail:p=2", "p must be in [0, 1], got 2.0"),
                                        ("tail:slowdown=0.5", "slowdown must be >= 1, got 0.5"),
                                        ("lognormal:sigma=-1", "sigma must be >= 0, got -1.0"),
                                        ("none:compute_s=0", "compute_s must be > 0, got 0.0"),
                                        ("slow:slowdown=0.5", "slowdown must be >= 1, got 0.5"),
                                        ("slow:count=-1", "count must be >= 0, got -1")])
def test_bad_straggler_specs(bad, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        STRAGGLERS.build(bad)


# -- halving-doubling: the formulas against a message-by-message model of each algorithm ------------
# A round lets every worker send one message at once (links in parallel); it lasts the latency plus
# its longest message. Thakur, Rabenseifner & Gropp (2005): Rabenseifner's allreduce (recursive
# halving, then recursive doubling; workers beyond the largest power of two P fold in first and
# take the result back last), Bruck's allgather, the binomial-tree broadcast.

def rounds_cost(rounds, lat, bw):
    """(bytes, seconds) of a list of rounds, each a list of message sizes."""
    return sum(sum(r) for r in rounds), sum(lat + max(r) / bw for r in rounds if r)


def rabenseifner_rounds(nbytes, n):
    """Rabenseifner's allreduce, segment by segment: the N-P workers beyond the largest power of two
    P hand their vector to a partner; among the P, recursive halving (each pair swaps the half of
    its current segments the other keeps, and adds what it receives), then recursive doubling (each
    pair swaps the segments it holds); then the N-P get the result back. Tracks which workers'
    contributions each held segment sums, and checks every worker ends with every segment summed
    over all N."""
    p = 1 << (n.bit_length() - 1)
    seg = nbytes / p
    held = {w: {s: {w} for s in range(p)} for w in range(n)}  # worker -> segment -> contributors summed
    rounds = []
    if n > p:  # fold in
        rounds.append([nbytes] * (n - p))
        for extra in range(p, n):
            for s in range(p):
                held[extra - p][s] |= held[extra][s]
    ranges = {w: (0, p) for w in range(p)}
    d = p // 2
    while d >= 1:  # recursive halving: reduce-scatter
        msgs, new = [], {}
        for w in range(p):
            lo, hi = ranges[w]
            mid = (lo + hi) // 2
            keep = (lo, mid) if w & d == 0 else (mid, hi)
            msgs.append((hi - lo - (keep[1] - keep[0])) * seg)
            partner = w ^ d
            new[w] = (keep, {s: held[w][s] | held[partner][s] for s in range(*keep)})
        for w, (keep, sums) in new.items():
            ranges[w], held[w] = keep, sums
        rounds.append(msgs)
        d //= 2
    assert all(held[w] == {ranges[w][0]: set(range(n))} for w in range(p))  # each owns one summed segment
    d = 1
    while d < p:  # recursive doubling: allgather
        msgs, new = [], {}
        for w in range(p):
            partner = w ^ d
            msgs.append((ranges[w][1] - ranges[w][0]) * seg)
            new[w] = ((min(ranges[w][0], ranges[partner][0]), max(ranges[w][1], ranges[partner][1])),
                      held[w] | held[partner])
        for w, (span, sums) in new.items():
            ranges[w], held[w] = span, sums
        rounds.append(msgs)
        d *= 2
    if n > p:  # the result back out
        rounds.append([nbytes] * (n - p))
        for extra in range(p, n):
            held[extra] = dict(held[extra - p])
    assert all(held[w] == {s: set(range(n)) for s in range(p)} for w in range(n))
    return rounds


def bruck_rounds(sizes):
    """Worker i holds blocks i..i+h-1 (mod n) after a round; it sends the first min(h, n-h) of them to
    worker i-h; each worker ends with every other's block once."""
    n, rounds, h = len(sizes), [], 1
    have = [{i} for i in range(n)]
    while h < n:
        count = min(h, n - h)
        msgs, new = [], [set(s) for s in have]
        for i in range(n):
            blocks = [(i + b) % n for b in range(count)]
            new[(i - h) % n].update(blocks)
            msgs.append(sum(sizes[b] for b in blocks))
        rounds.append(msgs)
        have, h = new, h * 2
    assert all(s == set(range(n)) for s in have)
    return rounds


def binomial_broadcast_rounds(nbytes, n):
    rounds, holders = [], 1
    while holders < n:
        rounds.append([nbytes] * min(holders, n - holders))
        holders *= 2
    return rounds


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 8, 13, 16, 64])
def test_halving_doubling_costs_are_its_algorithms_message_by_message(n):
    net = NETWORKS.build("halving-doubling:mbps=100,latency_ms=1")
    nbytes = 64 * 1024  # divisible by every power of two up to 64
    want = rounds_cost(rabenseifner_rounds(nbytes, n), 0.001, BW)
    c = net.allreduce(nbytes, n)
    assert c.bytes == want[0] == 2 * (n - 1) * nbytes  # the ring's bytes
    assert c.time_s == pytest.approx(want[1])
    sizes = [(7 * i) % 11 + 1 for i in range(n)]
    rounds = bruck_rounds(sizes)
    c = net.allgather(sizes)
    # the bytes of the real buffers; the time of buffers padded to the longest, as the ring's
    assert c.bytes == rounds_cost(rounds, 0.001, BW)[0] == (n - 1) * sum(sizes)
    assert c.time_s == pytest.approx(rounds_cost(bruck_rounds([max(sizes)] * n), 0.001, BW)[1])
    want = rounds_cost(binomial_broadcast_rounds(500, n), 0.001, BW)
    c = net.broadcast(500, n)
    assert (c.bytes, c.time_s) == (want[0], pytest.approx(want[1]))


def test_halving_doubling_saves_the_rings_latencies_not_its_bytes():
    """16 workers, 274 KB (MuLoCo's fp16 round, docs/time_to_accuracy.md): the ring pays 30 latencies,
    halving-doubling 8; both send the same bytes, at the same bandwidth cost for a power of two."""
    ring, hd = NETWORKS.build("ring:mbps=100,latency_ms=1"), NETWORKS.build("halving-doubling:mbps=100,latency_ms=1")
    a, b = ring.allreduce(274_000, 16), hd.allreduce(274_000, 16)
    assert a.bytes == b.bytes
    assert a.time_s - b.time_s == pytest.approx((30 - 8) * 0.001)
    assert hd.allreduce(274_000, 1).bytes == 0 and hd.allgather([9]).time_s == 0.0


def test_a_run_on_halving_doubling_learns_the_same_sends_the_same_and_waits_less(make_config):
    """The topology prices the collectives; it changes no number a worker computes and no byte."""
    from gradwire.run.loop import run

    ring = run(make_config(workers=8, network="ring:mbps=100,latency_ms=1", out="ring"), progress=False)
    hd = run(make_config(workers=8, network="halving-doubling:mbps=100,latency_ms=1", out="hd"), progress=False)
    assert hd["final"]["train_loss"] == ring["final"]["train_loss"] and hd["bytes_sent"] == ring["bytes_sent"]
    assert hd["comm_time_s"] < ring["comm_time_s"]  # 2·3 latencies per allreduce instead of 2·7
