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


def test_ring_costs_follow_formulas():
    net = NETWORKS.build("ring:mbps=100,latency_ms=1")
    c = net.allreduce(8000, 8)
    assert c.bytes == 14 * 8000 and c.time_s == pytest.approx(14 * (0.001 + 1000 / BW))
    c = net.allgather([5, 50, 7])
    assert c.bytes == 2 * 62 and c.time_s == pytest.approx(2 * (0.001 + 50 / BW))


def test_single_participant_costs_nothing():
    for spec in ("ps", "ring"):
        net = NETWORKS.build(spec)
        assert net.allreduce(100, 1).bytes == 0 and net.allgather([100]).time_s == 0.0


@pytest.mark.parametrize("bad", ["ps:mbps=0", "ring:latency_ms=-1", "star", "ps:bw=3"])
def test_bad_network_specs(bad):
    with pytest.raises(ConfigError):
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


@pytest.mark.parametrize("bad", ["tail:p=2", "tail:slowdown=0.5", "lognormal:sigma=-1", "none:compute_s=0",
                                 "slow:slowdown=0.5", "slow:count=-1"])
def test_bad_straggler_specs(bad):
    with pytest.raises(ConfigError):
        STRAGGLERS.build(bad)
