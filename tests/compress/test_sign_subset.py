"""The signs of a random subset (``sign:ratio=r``): a subset named by a seed that travels, then its signs.

A random subset composed with a 1-bit quantiser is one of Qsparse-local-SGD's operators (Basu, Data,
Karakus, Diggavi 2019, NeurIPS), used there with error feedback: biased, so nothing here asks for the
mean; what is asked is the subset's law (exactly k distinct of n, each element in it with probability
k/n: systematic sampling), the message (the subset's signs, times its mean magnitude when scaled)
and its size in bits.
"""

from __future__ import annotations

import math

import pytest
import torch

from gradwire.compress import build
from gradwire.compress.sign import systematic_subset


@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.75])
def test_every_element_is_kept_with_probability_k_over_n_and_exactly_k_are(ratio):
    n, draws = 40, 3000
    c, g = build(f"sign:scaled=true,ratio={ratio}"), torch.Generator().manual_seed(3)
    x = torch.linspace(-2, 2, n, dtype=torch.float64) + 0.01  # no zeros: a kept element decodes non-zero
    kept = torch.zeros(n)
    for _ in range(draws):
        y = c.decode(c.encode(x, generator=g))
        mask = y != 0
        assert int(mask.sum()) == math.ceil(ratio * n)
        kept += mask
    p = math.ceil(ratio * n) / n
    # each element kept with probability k/n: 3000 draws put every count within 5 binomial sds
    sd = math.sqrt(draws * p * (1 - p))
    assert float((kept - draws * p).abs().max()) < 5 * sd


@pytest.mark.parametrize("n", [1, 2, 7, 100, 8576, 10_007])
def test_the_subset_is_k_distinct_indices_in_range_whatever_the_offset(n):
    for k in {1, max(1, n // 3), max(1, n // 2), max(1, n - 1)}:
        for seed in (0, 1, 2**53 - 1, -1, 12345678901234):  # u = 0, the smallest, the largest below 1
            index = systematic_subset(n, k, seed)
            assert index.numel() == k and int(index.min()) >= 0 and int(index.max()) < n, (n, k, seed)
            assert bool((index[1:] > index[:-1]).all()), (n, k, seed)  # increasing: distinct


def test_the_message_is_the_subsets_signs_times_its_mean_magnitude():
    x = torch.randn(1001, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(7)
    c = build("sign:scaled=true,ratio=0.5")
    packet = c.encode(x, generator=g)
    seed = int(packet.buffer[:8].view(torch.int64)[0])
    subset = systematic_subset(1001, 501, seed)
    expected = torch.zeros_like(x)
    expected[subset] = torch.sign(x[subset]) * x[subset].abs().double().mean().float()
    torch.testing.assert_close(c.decode(packet), expected, rtol=1e-6, atol=0)
    # unscaled: +-1 on the subset, the scale's four bytes left out
    plain = build("sign:ratio=0.5")
    packet = plain.encode(x, generator=torch.Generator().manual_seed(7))
    assert packet.nbytes == 8 + math.ceil(501 / 8)
    y = plain.decode(packet)
    assert set(y[y != 0].tolist()) <= {-1.0, 1.0}


def test_the_same_seed_names_the_same_subset_and_the_spec_round_trips():
    x = torch.randn(300, generator=torch.Generator().manual_seed(1))
    c = build("sign:scaled=true,ratio=0.75")
    a = c.encode(x, generator=torch.Generator().manual_seed(5)).buffer
    b = c.encode(x, generator=torch.Generator().manual_seed(5)).buffer
    assert torch.equal(a, b)
    assert c.spec() == "sign:scaled=true,ratio=0.75"
    assert build("sign:scaled=true").spec() == "sign:scaled=true"  # ratio 1: the old message, the old spec
    assert build("sign:scaled=true").nbytes(300) == 4 + 38


def test_a_ratio_outside_zero_to_one_is_refused_naming_it():
    with pytest.raises(Exception, match="ratio"):
        build("sign:ratio=1.5")
    with pytest.raises(Exception, match="ratio"):
        build("sign:ratio=0")
