"""Grid quantisers (qsgd, terngrad, pquant) and natural compression on the Triton path.

What is compared with the torch reference (gradwire.compress):
* decoding is deterministic: a payload decodes to the same values bit for bit on both paths,
  whichever path encoded it (so the wire format is one);
* encoding is stochastic and the two paths draw different random numbers (Philox in the kernel,
  torch's generator in the reference): on inputs whose rounding is certain (grid points, powers of
  two) the bytes are equal; on others, both paths' decoded values are unbiased and their mean
  squared error matches the exact variance of the rounding, within sampling error.
"""

import math

import pytest
import torch

from gradwire.compress import build
from gradwire.kernels import use

GRID = ["qsgd:levels=7,bucket=5", "qsgd:levels=4,bucket=9", "qsgd:levels=16,bucket=5", "qsgd:levels=1,bucket=4",
        "qsgd:levels=2,bucket=7,format=1", "qsgd:levels=64,bucket=3", "qsgd:levels=127,bucket=3",
        "terngrad", "terngrad:clip=0", "pquant:p=1,block=5", "pquant:p=2,block=16"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [1, 7, 41, 1003]


def encode(spec, x, seed, fused):
    use("triton" if fused else None)
    try:
        return build(spec).encode(x, generator=torch.Generator(x.device).manual_seed(seed))
    finally:
        use(None)


def decode(spec, packet, fused):
    use("triton" if fused else None)
    try:
        return build(spec).decode(packet)
    finally:
        use(None)


@pytest.mark.parametrize("spec", [*GRID, "natural"])
def test_decoding_is_bit_for_bit_the_reference(spec, device, kernel_calls):
    calls = kernel_calls("natural" if spec == "natural" else "grid")
    for dtype in DTYPES:
        for n in SIZES:
            x = torch.randn(2 * n, generator=torch.Generator().manual_seed(n)).to(dtype).to(device)[1::2]
            for fused_encode in (False, True):
                packet = encode(spec, x, 3, fused_encode)
                assert packet.nbytes == build(spec).nbytes(n)
                ref, fused = decode(spec, packet, False), decode(spec, packet, True)
                assert fused.dtype == dtype and torch.equal(ref, fused), (dtype, n, fused_encode)
    assert calls == {"encode": len(DTYPES) * len(SIZES), "decode": 2 * len(DTYPES) * len(SIZES)}


def certain_input(spec, n, dtype, device):
    """Inputs whose rounding has probability 0 or 1: powers of two, one per bucket (so that a
    bucket's norm is that power and x*s/r an integer), zeros elsewhere."""
    g = torch.Generator().manual_seed(n)
    bucket = n if spec == "natural" else build(spec)._bucket(n)
    x = torch.zeros(n)
    for a in range(0, n, bucket):
        i = a + int(torch.randint(0, min(bucket, n - a), (1,), generator=g))
        sign = 1 - 2 * int(torch.randint(0, 2, (1,), generator=g))
        x[i] = sign * 2.0 ** int(torch.randint(-3, 4, (1,), generator=g))
    if spec == "natural":
        x = torch.where(torch.rand(n, generator=g) < 0.5, x, 2.0 ** torch.randint(-10, 10, (n,), generator=g).float())
    return x.to(dtype).to(device)


@pytest.mark.parametrize("spec", [*GRID, "natural"])
def test_certain_rounding_sends_the_reference_bytes(spec, device):
    for dtype in DTYPES:
        for n in SIZES:
            x = certain_input(spec, n, dtype, device)
            ref, fused = encode(spec, x, 1, False), encode(spec, x, 2, True)
            assert torch.equal(ref.buffer, fused.buffer), (dtype, n)


def exact_variance(spec, x):
    """E(C(x) - x)^2 per element, from the codec's law (the scales as the reference computes them)."""
    c = build(spec)
    if spec == "natural":
        a = torch.floor(torch.log2(x.abs()))
        f = x.abs() / 2**a - 1
        return 4**a * f * (1 - f)
    n = x.numel()
    scales = c._scales(x.float()).double().repeat_interleave(c._bucket(n))[:n]
    step = scales / c.levels
    y = x.double() / step
    frac = y - torch.floor(y)
    return step**2 * frac * (1 - frac)


@pytest.mark.parametrize("spec", ["qsgd:levels=4,bucket=9", "qsgd:levels=16,bucket=5", "qsgd:levels=1,bucket=4",
                                  "terngrad:clip=0", "pquant:p=2,block=16", "natural"])
def test_both_paths_are_unbiased_with_the_exact_variance(spec, device):
    """One tensor of R copies of a base vector whole buckets long: every copy gets the same scales
    and its own random numbers, so the R decoded copies are R independent draws."""
    copies = 1500
    width = 16 if spec in ("terngrad:clip=0", "natural") else build(spec)._bucket(16)
    base = torch.randn(width, generator=torch.Generator().manual_seed(7)) * 2.0 ** torch.arange(width).remainder(5)
    x = base.repeat(copies).to(device)
    variance = exact_variance(spec, base.repeat(copies))[:width].double()
    for fused in (False, True):
        draws = decode(spec, encode(spec, x, 11, fused), False).double().view(copies, width).cpu()
        mean_error = draws.mean(0) - base.double()
        assert bool((mean_error.abs() <= 5 * (variance / copies).sqrt() + 1e-6).all()), (fused, mean_error)
        mse = (draws - base.double()).pow(2).mean(0).sum()
        assert abs(float(mse) / float(variance.sum()) - 1) < 0.1, (fused, float(mse), float(variance.sum()))


@pytest.mark.parametrize("spec", ["qsgd:levels=4,bucket=9", "natural"])
def test_payload_is_reproducible_from_the_generator_seed(spec, device):
    x = torch.randn(999, device=device)
    a, b, c = encode(spec, x, 5, True), encode(spec, x, 5, True), encode(spec, x, 6, True)
    assert torch.equal(a.buffer, b.buffer) and not torch.equal(a.buffer, c.buffer)


def test_float64_and_empty_take_the_reference(device, kernel_calls):
    calls = kernel_calls("grid")
    x = torch.randn(100, dtype=torch.float64, device=device)
    assert torch.equal(encode("qsgd", x, 1, True).buffer, encode("qsgd", x, 1, False).buffer)
    assert decode("qsgd", encode("qsgd", torch.zeros(0, device=device), 1, True), True).numel() == 0
    assert calls == {}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # NaN to uint8, interpreter
def test_errors_match_the_reference(device, triton_kernels):
    x = torch.randn(50, device=device)
    x[3] = math.nan
    for spec in ("qsgd", "natural", "terngrad"):
        with pytest.raises(ValueError, match="non-finite value \\(nan\\) at flat index 3"):
            build(spec).encode(x)
    with pytest.raises(ValueError, match="rounds up to 2\\^16, beyond the range of torch.float16"):
        build("natural").encode(torch.full((9,), 65504.0, dtype=torch.float16, device=device))
    packet = build("natural").encode(torch.ones(9, device=device, dtype=torch.float16))
    packet.buffer[2] = 250
    with pytest.raises(ValueError, match="exponent byte above 142"):
        build("natural").decode(packet)


@pytest.mark.parametrize("spec, patch", [
    ("qsgd:levels=7", lambda last: (last & 0x0F) | 0xF0),  # the padding field holds 15 > 2s
    ("qsgd:levels=4,format=1", lambda last: (last & 0x0F) | 0xF0),
    ("terngrad", lambda last: 243),  # a byte of five trits holds at most 242
], ids=["qsgd-7", "qsgd-4-format-1", "terngrad"])
def test_a_symbol_out_of_range_in_the_padding_is_refused_on_both_paths(spec, patch, device):
    """One element: every later symbol of its group is padding, which both decoders read."""
    from gradwire.compress import CorruptPayload

    packet = encode(spec, torch.tensor([0.5], device=device), 0, False)
    packet.buffer[-1] = patch(int(packet.buffer[-1]))
    for fused in (False, True):
        with pytest.raises(CorruptPayload, match="symbol"):
            decode(spec, packet, fused)
