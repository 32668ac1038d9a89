"""Sign kernels: the bytes and values of the torch reference, bit for bit."""

import pytest
import torch

from gradwire.compress import Packet, build
from gradwire.kernels import use

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 8, 9, 2053]


def inputs(n, dtype, device):
    x = torch.randn(2 * n, generator=torch.Generator().manual_seed(n)).to(dtype).to(device)
    x[::7] = 0  # zero sends +1, as in the reference
    return x[::2]  # non-contiguous: the codec flattens it


def both(spec, x, generator_seed=0):
    """The packets of the reference and of the kernels, and each decoded by both paths."""
    c = build(spec)
    ref = c.encode(x, generator=torch.Generator(x.device).manual_seed(generator_seed))
    use("triton")
    try:
        fused = c.encode(x, generator=torch.Generator(x.device).manual_seed(generator_seed))
        fused_decodes = [c.decode(ref), c.decode(fused)]
    finally:
        use(None)
    return ref, fused, [c.decode(ref), c.decode(fused)], fused_decodes


@pytest.mark.parametrize("spec", ["sign", "sign:scaled=true"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sign_bytes_and_values_equal_the_reference(spec, dtype, device, kernel_calls):
    calls = kernel_calls("sign")
    for n in SIZES:
        x = inputs(n, dtype, device)
        ref, fused, ref_decodes, fused_decodes = both(spec, x)
        assert torch.equal(ref.buffer, fused.buffer), n
        for a, b in zip(ref_decodes, fused_decodes, strict=True):
            assert a.dtype == dtype and torch.equal(a, b), n
    assert calls == {"pack_signs": len(SIZES) - 1, "unpack_signs": 2 * (len(SIZES) - 1)}  # n = 0: no launch


def test_sign_kernel_finds_non_finite_input(device, triton_kernels):
    x = torch.randn(100, device=device)
    x[37] = float("inf")
    with pytest.raises(ValueError, match="non-finite value \\(inf\\) at flat index 37"):
        build("sign").encode(x)


def test_sign_of_a_2d_tensor_round_trips(device, triton_kernels):
    x = torch.randn(5, 13, device=device).t()  # non-contiguous 2-D
    out = build("sign").decode(build("sign").encode(x))
    assert out.shape == x.shape and torch.equal(out, torch.where(x < 0, -1.0, 1.0))
    packet = build("sign").encode(x)
    assert isinstance(packet, Packet) and packet.nbytes == 9
