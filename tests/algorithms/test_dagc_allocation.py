"""DAGC's per-worker top-k counts: the budget exactly, monotone in data share, the 2/3-power law."""

import math

import numpy as np
import pytest

from gradwire.algorithms import ALGORITHMS
from gradwire.algorithms.adaptive import budgeted_counts, data_shares
from gradwire.compress.positions import keep_count
from gradwire.errors import ConfigError


def allocation(shares, budget, d):
    """DAGC-R's counts: Σ k_i = N·ceil(r·d) (uniform top-k's total), k_i ∝ p_i^(2/3) in [1, d]."""
    shares = np.asarray(shares, dtype=np.float64)
    total = len(shares) * keep_count(budget, d)
    return budgeted_counts(shares ** (2 / 3), total, 1, d), total


def random_shares(rng, n, skew):
    sizes = np.maximum(1, np.round(rng.uniform(1, skew, n) ** 1.5 * 50)).astype(int)
    return data_shares(sizes, n, "test")


@pytest.mark.parametrize("budget", [0.001, 0.01, 0.07, 0.3, 0.8, 1.0])
def test_counts_sum_to_the_budget_exactly(budget):
    rng = np.random.default_rng(0)
    for n, d in [(2, 100), (10, 15210), (7, 999), (16, 4096)]:
        for _ in range(20):
            k, total = allocation(random_shares(rng, n, 30), budget, d)
            assert k.sum() == total == n * math.ceil(round(budget * d, 9))
            assert k.min() >= 1 and k.max() <= d


def test_counts_grow_with_data_share():
    rng = np.random.default_rng(1)
    for _ in range(50):
        shares = random_shares(rng, 10, 20)
        k, _ = allocation(shares, 0.02, 15210)
        order = np.argsort(shares, kind="stable")
        assert (np.diff(k[order]) >= 0).all()
    # strictly, for geometric volumes whose ratios differ by more than rounding
    vol = 20 ** (np.arange(10) / 9)
    k, _ = allocation(vol / vol.sum(), 0.01, 15210)
    assert (np.diff(k) > 0).all()


def test_equal_volumes_give_equal_counts():
    for n, d, budget in [(10, 15210, 0.01), (3, 7, 0.5), (8, 1000, 0.001), (5, 64, 1.0)]:
        k, _ = allocation(np.full(n, 1 / n), budget, d)
        assert (k == keep_count(budget, d)).all()


def test_two_thirds_power_law():
    vol = 20 ** (np.arange(10) / 9)
    shares = vol / vol.sum()
    d = 15210
    k, total = allocation(shares, 0.01, d)
    c = total / (shares ** (2 / 3)).sum()       # nothing is capped at this budget
    assert np.abs(k - c * shares ** (2 / 3)).max() < 1   # within rounding of c·p^(2/3)
    slope = np.polyfit(np.log(shares), np.log(k), 1)[0]
    assert slope == pytest.approx(2 / 3, abs=0.01)
    # a 20x larger share keeps 20^(2/3) = 7.4x more, where uniform top-k keeps the same
    assert k[-1] / k[0] == pytest.approx(20 ** (2 / 3), rel=0.02)


def test_capped_workers_excess_is_redistributed():
    shares = np.array([0.7, 0.1, 0.1, 0.05, 0.05])
    d = 1000
    k, total = allocation(shares, 0.5, d)
    assert k[0] == d and k.sum() == total == 2500
    rest = shares[1:] ** (2 / 3)
    c = (total - d) / rest.sum()                 # the others share the remainder by p^(2/3)
    assert np.abs(k[1:] - c * rest).max() < 1


def test_floor_of_one_element():
    shares = np.array([1e-9, 1 - 1e-9])
    k, total = allocation(shares, 0.001, 1000)
    assert k.tolist() == [1, 1] and total == 2


@pytest.mark.parametrize("spec, needle", [
    ("dagc:budget=0", "budget must be in (0, 1]"),
    ("dagc:budget=1.5", "budget must be in (0, 1]"),
    ("dagc:budget=-0.1", "budget must be in (0, 1]"),
    ("dagc:mode=fixed", "mode must be one of relative, absolute, uniform"),
    ("dagc:local_steps=0", "local_steps must be >= 1"),
    ("dagc:tau=0.1", "tau applies to mode=absolute only"),
])
def test_bad_spec_is_a_config_error(spec, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ALGORITHMS.build(spec)


def test_empty_worker_and_missing_sizes_are_named():
    with pytest.raises(ValueError, match="worker 2 holds no training data"):
        data_shares([5, 3, 0, 1], 4, "dagc")
    with pytest.raises(ValueError, match="gave 0 shard sizes for 4 workers"):
        data_shares((), 4, "dagc")
