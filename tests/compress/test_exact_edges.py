"""Edges where a codec's result is exact by construction, each pinned: a constant tensor through
TernGrad's clipping, the threshold's comparison, the float64 scales' upward rounding, 16-bit
outputs (the decoded values are the float32 decode rounded once), and ratios given as numpy numbers.
Each runs on the CPU and, where one is present, on CUDA (the ``device`` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradwire.compress import Packet, build


def scale_of(packet) -> float:
    return float(packet.buffer[:4].cpu().view(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [10, 1000, 100_000])
@pytest.mark.parametrize("value", [0.1, 1 / 3, -1e-3])
def test_terngrad_sends_a_constant_tensor_unclipped_and_exactly(dtype, n, value, device):
    """σ = 0: nothing to clip to (docs/compressors.md), whatever the float32 sums' rounding says."""
    x = torch.full((n,), value, dtype=dtype, device=device)
    packet = build("terngrad").encode(x, generator=torch.Generator(device).manual_seed(0))
    assert scale_of(packet) == abs(float(x[0]))
    assert torch.equal(build("terngrad").decode(packet), x)


def test_terngrad_still_clips_a_nearly_constant_tensor_at_its_own_spread(device):
    x = torch.full((100_000,), 0.1, dtype=torch.float32, device=device)
    x[0] = 0.101
    sigma = float(x.double().std(correction=0))
    assert scale_of(build("terngrad").encode(x)) == pytest.approx(2.5 * sigma, rel=1e-6)


def test_threshold_compares_exactly_with_tau_above_a_float32_number(device):
    """tau is rounded up to the compute dtype: x = float32(0.1) lies below tau = float32(0.1) + 1e-12
    and is dropped; rounded to nearest, tau would equal x and keep it."""
    x = torch.tensor([float(np.float32(0.1)), 0.5, -0.2], dtype=torch.float32, device=device)
    tau = float(np.float32(0.1)) + 1e-12
    decoded = build(f"threshold:tau={tau!r}").decode(build(f"threshold:tau={tau!r}").encode(x))
    assert decoded.tolist() == [0.0, 0.5, pytest.approx(-0.2)]


@pytest.mark.parametrize("spec", ["pquant:p=inf", "terngrad:clip=0"])
def test_a_float64_scale_is_rounded_up_to_bound_every_element(spec, device):
    """max |x| = 1 + 2^-30 rounds to 1.0 in float32 to nearest; the wire's scale must not fall below it,
    or the largest element would be clamped in every draw."""
    x = torch.tensor([1 + 2**-30, -0.25], dtype=torch.float64, device=device)
    assert scale_of(build(spec).encode(x)) >= 1 + 2**-30


@pytest.mark.parametrize("spec", ["qsgd", "qsgd:levels=127,bucket=64", "terngrad:clip=0", "pquant:p=2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_16_bit_decode_is_the_float32_decode_rounded_once(spec, dtype, device):
    """What docs/compressors.md says of 16-bit outputs: unbiased up to this one rounding."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    codec = build(spec)
    packet = codec.encode(x, generator=torch.Generator(device).manual_seed(2))
    wide = codec.decode(Packet(packet.buffer, packet.shape, torch.float32))
    assert torch.equal(codec.decode(packet), wide.to(dtype))


@pytest.mark.parametrize("name", ["topk", "randk"])
def test_a_numpy_ratio_keeps_its_decimal_and_its_spec(name):
    from gradwire.compress.randk import RandK
    from gradwire.compress.sparse import TopK

    codec = {"topk": TopK, "randk": RandK}[name](ratio=np.float64(0.07))
    assert codec.spec() == f"{name}:ratio=0.07"
    assert codec.nbytes(100, torch.float32) == build(f"{name}:ratio=0.07").nbytes(100, torch.float32)
    with pytest.raises(ValueError, match="ratio must be a number in \\(0, 1\\], got 'a'"):
        TopK(ratio="a")
