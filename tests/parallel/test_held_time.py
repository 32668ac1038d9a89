"""benchmarks/tensor_parallel.py's ``held_time``: the seconds of assembling a tensor held split over
nested groups, priced on the ring model, against the closed forms its docstring states (one
broadcast per member of each level's part, innermost level first; doubled backward with partial
gradients). The ring's broadcast of n bytes over g ranks costs (g-1)·latency + n/bandwidth."""

from pathlib import Path

import pytest

from gradwire.transports.network import RingNetwork
from tests.helpers import load_script

TP = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "tensor_parallel.py", "tensor_parallel_bench")

NET = RingNetwork(mbps=8e-6 * 1000, latency_ms=1000 * 0.25)  # 1,000 bytes a second, a quarter-second latency
BPS, LAT = NET.bytes_per_s, NET.latency_s


def test_the_network_is_the_one_the_closed_forms_assume():
    assert BPS == pytest.approx(1000.0) and LAT == pytest.approx(0.25)
    assert NET.broadcast(3000, 4).time_s == pytest.approx(3 * LAT + 3000 / BPS)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_one_level_is_p_broadcasts_of_a_piece(p):
    n = 48_000  # divisible by every p and product below
    one_way = p * ((p - 1) * LAT + (n // p) / BPS)  # p(p-1) latencies, the whole tensor's bytes once
    assert TP.held_time(n, [p], NET, partial=False) == pytest.approx(one_way)
    assert TP.held_time(n, [p], NET, partial=True) == pytest.approx(2 * one_way)


@pytest.mark.parametrize("q,d", [(2, 2), (2, 4), (4, 2), (3, 2)])
def test_nested_levels_assemble_the_inner_part_first_then_the_whole(q, d):
    n = 48_000
    inner = q * ((q - 1) * LAT + (n // (d * q)) / BPS)  # the column assembles its depth-part n/d from q pieces
    outer = d * ((d - 1) * LAT + (n // d) / BPS)        # the depth assembles the whole from d parts
    assert TP.held_time(n, [q, d], NET, partial=False) == pytest.approx(inner + outer)
    assert TP.held_time(n, [q, d], NET, partial=True) == pytest.approx(2 * (inner + outer))
    if q != d:  # the order of the groups matters: [d, q] is another holding, priced otherwise
        assert TP.held_time(n, [d, q], NET, partial=False) != pytest.approx(inner + outer)


def test_a_group_of_one_costs_nothing():
    assert TP.held_time(48_000, [1], NET, partial=True) == 0.0
    assert TP.held_time(48_000, [2, 1], NET, partial=False) == pytest.approx(2 * (LAT + 24_000 / BPS))
