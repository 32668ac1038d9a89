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


def test_dagc_calibration_with_no_informative_worker_asks_for_tau():
    """Every worker's k-th largest |g| is 0: there is no scale; τ0 = 0 would keep every element, zeros
    included, for the whole run (calibration happens once), so set-up says what to give instead."""
    with pytest.raises(ValueError, match=r"mode=absolute: no worker's initial gradient has its k_i-th largest "
                                         r"\|g\| above 0.*give tau="):
        _calibrated({0: torch.zeros(1000), 1: torch.zeros(1000)}, keep=100)


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


def test_float16_values_that_decode_within_range_still_travel(device):
    """The refusal bounds what the values really decode to (scale · the level the bucket's largest
    |x| rounds up to / s), not the scale: qsgd:levels=4 on float16 3,000s has an L2 scale of 67,882
    but decodes to at most 16,976 (it was refused)."""
    from gradwire.compress import build

    x = torch.full((8192,), 3000.0, device=device).half()
    for spec in ("qsgd:levels=4", "qsgd", "qsgd:levels=16"):
        c = build(spec)
        y = c.decode(c.encode(x, generator=torch.Generator(device).manual_seed(0)))
        # unbiased: levels=4 decodes each to 0 or 16,976, the mean of 8,192 within 6 sd (430)
        assert bool(torch.isfinite(y).all()) and float(y.float().mean()) == pytest.approx(3000, rel=0.15), spec


def test_an_all_zero_bucket_is_not_a_reason_to_measure_every_bucket_again(monkeypatch, device):
    """Only the buckets whose L2 norm may have underflowed are measured again in float64 (a zero
    bucket is common: a frozen layer), and a subnormal one gets its true norm."""
    import gradwire.compress.levels as levels
    from gradwire.compress import build

    calls = []  # the norms wire_scales computes again (it measured every bucket in float64)
    original = levels.bucket_norms
    monkeypatch.setattr(levels, "bucket_norms", lambda *a, **k: calls.append(a[3]) or original(*a, **k))
    x = torch.cat([torch.zeros(512), torch.randn(512, generator=torch.Generator().manual_seed(0)),
                   torch.full((512,), 1e-40), torch.full((100,), 1e-40)]).to(device)
    scales = build("qsgd:bucket=512")._scales(x)
    assert calls == []  # no float64 pass over the whole tensor
    want = [float(x[a:b].double().norm()) for a, b in ((0, 512), (512, 1024), (1024, 1536), (1536, 1636))]
    assert float(scales[0]) == 0.0 and all(float(s) >= w * (1 - 1e-6) and float(s) <= w * (1 + 1e-6) + 1e-45
                                          for s, w in zip(scales[1:], want[1:], strict=True)), scales


@pytest.mark.parametrize("spec, value, remedy", [
    ("qsgd:levels=1", 3000.0, "smaller buckets"), ("pquant:p=2,block=512", 3000.0, "smaller buckets"),
    ("pquant:p=1,block=64", 2000.0, "smaller buckets"), ("randk:ratio=0.01", 1000.0, "larger ratio")])
def test_half_precision_input_whose_decode_would_overflow_is_refused(spec, value, remedy, device):
    """Finite float16 values whose decoded form passes 65,504 (a bucket's L2 or L1 norm, rand-k's n/k
    scaling) are refused at encode, as the dense casts refuse what they cannot carry (they decoded to
    inf, and the DDP hook passed the infs on); the same values in float32, and smaller float16 ones,
    travel."""
    from gradwire.compress import build

    x = torch.full((2048,), value, device=device)
    refusal = rf"beyond torch.float16's range \(65504\); send float32 gradients, or .*{remedy}"
    with pytest.raises(ValueError, match=refusal):
        build(spec).encode(x.half(), generator=torch.Generator(device).manual_seed(0))
    for ok in (x, (x / 100).half()):
        c = build(spec)
        y = c.decode(c.encode(ok, generator=torch.Generator(device).manual_seed(0)))
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


@pytest.mark.parametrize("magnitude", [1e20, 1e37, 1e-30])
def test_newton_schulz_orthogonalises_matrices_whose_float32_norm_leaves_the_range(magnitude, device):
    """Muon's step is scale-free: Newton-Schulz of s·U is Newton-Schulz of U. At |U| ~ 1e20 the plain
    float32 sum of squares is inf, at 1e37 the norm itself, and the step was all zeros; at 1e-30 the
    sum of squares underflows (the matrix then meets Muon's own eps, as in the reference, and the step
    stays tiny: as in float64). In range, the normalisation is the plain formula's, bit for bit."""
    from gradwire.algorithms.muloco import frobenius_normalized, newton_schulz

    u = torch.randn(3, 6, 10, generator=torch.Generator().manual_seed(0)).to(device)
    big = u * magnitude
    plain = u / (torch.linalg.matrix_norm(u, keepdim=True) * 1.02 + 1e-7)
    assert torch.equal(frobenius_normalized(u, 1.02, 1e-7), plain)
    float64 = newton_schulz(big.double()).float()  # no overflow nor underflow there
    torch.testing.assert_close(newton_schulz(big), float64, rtol=1e-4, atol=1e-5 * float(float64.abs().max()))
    if magnitude > 1:
        torch.testing.assert_close(newton_schulz(big), newton_schulz(u), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("magnitude", [1e20, 1e-25])
def test_powersgd_gram_schmidt_is_scale_free_past_float32s_sum_of_squares(magnitude, device):
    """Gram-Schmidt's result does not depend on a column's scale. A float32 column of 1e20 (norm inf)
    or 1e-25 (its squares underflow, norm 0) came out all zeros; now it is the column of 1 scaled."""
    from gradwire.averaging.powersgd import orthogonalized

    m = torch.randn(3, 40, 2, generator=torch.Generator().manual_seed(1)).to(device)
    m[1, :, 1] = 0  # an exactly zero column stays zero
    (ours,), (unit,) = orthogonalized([m * magnitude]), orthogonalized([m])
    torch.testing.assert_close(ours, unit, rtol=1e-5, atol=1e-6)
    gram = unit.mT @ unit
    torch.testing.assert_close(gram[[0, 2]], torch.eye(2, device=device).expand(2, 2, 2), rtol=0, atol=1e-5)
    assert float(unit[1, :, 1].abs().max()) == 0.0
