"""Numerical edge cases that once gave silent wrong results (a review of src, each reproduced
first): inputs of many zeros, extreme magnitudes and reduced precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradwire.algorithms.adaptive import budgeted_counts
from gradwire.algorithms.dagc import DAGC


class _Mean:
    def allreduce_mean(self, tensors):
        return sum(tensors.values()) / len(tensors)


def _calibrated(gradients: dict[int, torch.Tensor], keep: int) -> torch.Tensor:
    """DAGC's absolute-mode thresholds calibrated on these initial gradients (equal shares)."""
    d, world = next(iter(gradients.values())).numel(), len(gradients)

    class Ctx:
        local_ranks = sorted(gradients)
        transport = _Mean()

        def gradient(self, r, x):
            return 0.0, gradients[r]

    a = DAGC(budget=0.1, mode="absolute")
    a.d, a.world, a.shares = d, world, np.full(world, 1 / world)
    a.keep = budgeted_counts(np.ones(world), world * keep, 1, d)
    a.x = torch.zeros(d)
    return a._calibrate(Ctx())


def test_dagc_calibration_with_more_zeros_than_d_minus_k_keeps_about_the_budget():
    """A worker with fewer non-zeros than its k is left out of the scale: the other worker keeps
    exactly its k (a floor of 1e-30 for the k-th largest |g|, 0 there, pulled the geometric mean to
    ~1e-15: the dense worker kept 10,000 of 10,000 against 1,000)."""
    g = torch.Generator().manual_seed(0)
    sparse = torch.zeros(10_000)
    sparse[:500] = torch.randn(500, generator=g)
    dense = torch.randn(10_000, generator=g)
    th = _calibrated({0: dense, 1: sparse}, keep=1000)
    kept = [int((x.abs() >= float(t)).sum()) for x, t in zip((dense, sparse), th, strict=True)]
    assert kept[0] == 1000 and kept[1] <= 500, kept


def test_dagc_calibration_leaves_out_a_worker_whose_gradient_is_all_zero():
    """An all-zero gradient says nothing about the scale: the other workers' thresholds are what they
    would be alone (equal shares: each keeps exactly its k)."""
    g = torch.Generator().manual_seed(1)
    dense = {r: torch.randn(10_000, generator=g) for r in (0, 1)}
    alone = _calibrated(dense, keep=1000)
    with_zero = _calibrated(dense | {2: torch.zeros(10_000)}, keep=1000)
    kept = [int((dense[r].abs() >= float(with_zero[r])).sum()) for r in (0, 1)]
    assert all(500 <= k <= 2000 for k in kept), kept  # the geometric mean of the two thresholds
    # (three equal shares against two: the spread's factor (N p_i)^(2/3) is 1 in both)
    torch.testing.assert_close(with_zero[:2], alone, rtol=1e-12, atol=0)


@pytest.mark.parametrize("spec, value, remedy", [
    ("qsgd:levels=1", 3000.0, "smaller buckets"), ("pquant:p=2,block=512", 3000.0, "smaller buckets"),
    ("pquant:p=1,block=64", 2000.0, "smaller buckets"), ("randk:ratio=0.01", 1000.0, "larger ratio")])
def test_half_precision_input_whose_decode_would_overflow_is_refused(spec, value, remedy):
    """Finite float16 values whose decoded form passes 65,504 (a bucket's L2 or L1 norm, rand-k's n/k
    scaling) are refused at encode, as the dense casts refuse what they cannot carry (they decoded to
    inf, and the DDP hook passed the infs on); the same values in float32, and smaller float16 ones,
    travel."""
    from gradwire.compress import build

    x = torch.full((2048,), value)
    refusal = rf"beyond torch.float16's range \(65504\); send float32 gradients, or .*{remedy}"
    with pytest.raises(ValueError, match=refusal):
        build(spec).encode(x.half(), generator=torch.Generator().manual_seed(0))
    for ok in (x, (x / 100).half()):
        c = build(spec)
        y = c.decode(c.encode(ok, generator=torch.Generator().manual_seed(0)))
        assert y.dtype == ok.dtype and bool(torch.isfinite(y).all())


def test_adamw_steps_where_the_gradient_squared_passes_float32s_range_over_the_bias():
    """|g| = 2e19: v = (1 - β2) g² is finite, v / (1 - β2) is not; AdamW moves by lr, as
    torch.optim.AdamW does (it moved by 0: m / inf)."""
    from gradwire.algorithms.optim import AdamW

    x = torch.zeros(3)
    ours = AdamW(x, lr=0.1, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ours.apply(torch.full((3,), 2e19))
    p = torch.nn.Parameter(torch.zeros(3))
    torch_adamw = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    p.grad = torch.full((3,), 2e19)
    torch_adamw.step()
    torch.testing.assert_close(x, p.detach())
    assert float(x[0]) == pytest.approx(-0.1, rel=1e-6)
