"""Codecs are device-generic: the input's device decides where every buffer lives.

Two checks that need no GPU: under ``torch.device("meta")`` as the default device, a factory call
that forgot ``device=`` makes a meta tensor, which fails (or shows in the output) as soon as it
meets the CPU input; and encoding with a generator on the input's device works. Where CUDA is
present, the ``device`` fixture adds the same tests on it, and the deterministic codecs must give
the same bytes on CUDA as on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from gradwire.compress import ErrorFeedback, build
from gradwire.compress.wire import CHUNK
from tests.compress.compress_cases import SPECS

# sizes: empty, one element, not a multiple of 8 or 5, and more than one CPU chunk
SIZES = [0, 1, 13, 1000, CHUNK + 77]
# what the codec says of itself (compress_cases.STOCHASTIC is the statistics tests' shorter list)
DETERMINISTIC = [s for s in SPECS if not build(s).stochastic]


def encode_decode(spec: str, x: torch.Tensor, seed: int = 0):
    c = build(spec)
    g = torch.Generator(device=x.device).manual_seed(seed)
    packet = c.encode(x, generator=g)
    return packet.buffer, c.decode(packet)


@pytest.mark.parametrize("spec", SPECS)
def test_no_tensor_is_made_on_the_default_device(spec):
    x = torch.randn(CHUNK + 77, generator=torch.Generator().manual_seed(1))
    want_bytes, want = encode_decode(spec, x)
    with torch.device("meta"):  # any factory call without device= now makes a meta tensor
        buffer, y = encode_decode(spec, x)
        ef = ErrorFeedback(build(spec))
        ef_packet = ef.encode(x, key="w", generator=torch.Generator().manual_seed(0))
    assert buffer.device.type == y.device.type == ef_packet.buffer.device.type == "cpu"
    assert torch.equal(buffer, want_bytes) and torch.equal(y, want)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_payload_and_output_stay_on_the_device(spec, dtype, device):
    for n in SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype).to(device)
        buffer, y = encode_decode(spec, x)
        assert buffer.device == y.device == x.device and buffer.dtype == torch.uint8, n
        assert y.dtype == dtype and y.shape == x.shape


@pytest.mark.parametrize("spec", SPECS)
def test_same_seed_same_device_same_bytes(spec, device):
    x = torch.randn(5000, generator=torch.Generator().manual_seed(3)).to(device)
    assert torch.equal(encode_decode(spec, x, seed=7)[0], encode_decode(spec, x, seed=7)[0])


@pytest.mark.parametrize("spec", DETERMINISTIC)
def test_deterministic_codecs_ignore_the_generator(spec):
    """The CPU-CUDA comparison below may compare bytes only where no random draw enters them: two
    generators of different seeds must give the same bytes on one device."""
    x = torch.randn(CHUNK + 77, generator=torch.Generator().manual_seed(5))
    assert torch.equal(encode_decode(spec, x, seed=0)[0], encode_decode(spec, x, seed=12345)[0])


def test_the_stochastic_codecs_are_left_out_of_the_cpu_cuda_comparison():
    """A random codec's bytes depend on the generator, and a CUDA generator's stream is not the
    CPU's: every spec the comparison leaves out does draw (its bytes move with the seed)."""
    left_out = [s for s in SPECS if s not in DETERMINISTIC]
    assert left_out
    x = torch.randn(CHUNK + 77, generator=torch.Generator().manual_seed(5))
    for spec in left_out:
        assert not torch.equal(encode_decode(spec, x, seed=0)[0], encode_decode(spec, x, seed=12345)[0]), spec


# where a deterministic codec's bytes still depend on the device: a float reduction (its order differs
# between the CPU's and CUDA's kernels), or a selection among ties (half-precision inputs tie at the k-th
# magnitude by the dozen, and the two devices' top-k break ties differently)
SUMS = {"sign:scaled=true"}  # the scale: the mean |g| of each row of 4096
SELECTS = {"topk:ratio=0.1", "chunked-topk:chunk=64,k=4,values=raw", "chunked-topk:chunk=7,k=3,values=raw"}
HALF = (torch.float16, torch.bfloat16)


def test_the_device_dependent_codecs_are_named_in_the_list():
    assert SUMS | SELECTS <= set(DETERMINISTIC)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (CI has none)")
@pytest.mark.parametrize("spec", DETERMINISTIC)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_deterministic_codecs_give_the_same_bytes_on_cpu_and_cuda(spec, dtype):
    """The same bytes where nothing is summed and no tie is broken; where a scale is a sum, the same
    signs and a scale within float32's rounding of the sum; among tied top-k magnitudes (half
    precision) only float32 and float64 inputs, where random values do not tie."""
    if spec in SELECTS and dtype in HALF:
        pytest.skip("half-precision inputs tie at the k-th magnitude; the devices break ties differently")
    for n in SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
        cpu_bytes, cpu_out = encode_decode(spec, x)
        cuda_bytes, cuda_out = encode_decode(spec, x.cuda())
        if spec in SUMS:
            assert torch.equal(torch.sign(cuda_out.cpu()), torch.sign(cpu_out)), n
            # one rounding of the float32 sum, then (half precision) one step of the output's dtype
            rtol = max(1e-5, torch.finfo(dtype).eps)
            torch.testing.assert_close(cuda_out.cpu().double(), cpu_out.double(), rtol=rtol, atol=0)
            continue
        assert torch.equal(cuda_bytes.cpu(), cpu_bytes), n
        assert torch.equal(cuda_out.cpu(), cpu_out), n


@pytest.mark.parametrize("spec", ["qsgd", "natural", "sign:scaled=true", "topk:ratio=0.05"])
def test_error_feedback_keeps_its_residual_on_the_device(spec, device):
    ef = ErrorFeedback(build(spec))
    x = torch.randn(999, generator=torch.Generator().manual_seed(0)).to(device)
    packet = ef.encode(x, key="w", generator=torch.Generator(device=device).manual_seed(0))
    residual = ef.residual("w")
    assert residual.device == x.device
    # the error-feedback identity: what was sent plus what is kept is the input
    torch.testing.assert_close(ef.decode(packet) + residual, x)


@pytest.mark.parametrize("spec", ["sign", "natural"])
def test_sign_bits_across_the_long_sign_passes(spec, device):
    """The sign packer's passes are 4 chunks long on the CPU: cross two of them, end mid-byte."""
    n = 2 * 4 * CHUNK + 77
    x = torch.randn(n, generator=torch.Generator().manual_seed(9)).to(device)
    _, y = encode_decode(spec, x)
    assert torch.equal(y < 0, x < 0)
