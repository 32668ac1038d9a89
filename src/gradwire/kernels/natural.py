"""Natural compression in one pass: exponent bytes and sign bits out, and back.

Horvath et al. (2019): ``|x| = 2^a (1 + m/2^23)`` rounds up to ``2^(a+1)`` with probability
``m/2^23``. As in the reference, a uniform 23-bit integer is added to the low bits of ``|x|``'s
float32 pattern: the carry into the exponent happens with exactly that probability. The integer
is the low 23 bits of the element's Philox word.

References (tests/kernels compares them): :meth:`gradwire.compress.natural.Natural.encode`
(other random numbers: compared in distribution, and byte for byte on powers of two, whose
rounding is certain) and :meth:`gradwire.compress.natural.Natural.decode` (bit for bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradwire.kernels.common import output_view, store_rounded

BYTES = 128  # sign bytes (8 elements each) per program


@triton.jit
def _encode(x_ptr, seed_ptr, out_ptr, bad_ptr, n, limit, BYTES: tl.constexpr):
    byte = tl.program_id(0) * BYTES + tl.arange(0, BYTES)
    bit = tl.arange(0, 8)
    elem = byte[:, None] * 8 + bit[None, :]
    valid = elem < n
    x = tl.load(x_ptr + elem, mask=valid, other=0.0).to(tl.float32)
    magnitude = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    r = tl.randint(tl.load(seed_ptr), elem).to(tl.int32, bitcast=True) & 0x7FFFFF
    exponent = (magnitude + r) >> 23  # the carry is the round up
    tl.store(out_ptr + elem, exponent.to(tl.uint8), mask=valid)
    signs = tl.sum((x < 0).to(tl.int32) << bit[None, :], axis=1)
    tl.store(out_ptr + n + byte, signs.to(tl.uint8), mask=byte * 8 < n)
    # 1: a non-finite input; 2: a value rounding up beyond the output's range (the reference names it)
    bad = tl.where(magnitude >= 0x7F800000, 1, tl.where(exponent > limit, 2, 0))
    tl.store(bad_ptr + tl.program_id(0), tl.max(tl.where(valid, bad, 0)))


@triton.jit
def _decode(data_ptr, out_ptr, bad_ptr, n, limit, BYTES: tl.constexpr, BF16: tl.constexpr):
    byte = tl.program_id(0) * BYTES + tl.arange(0, BYTES)
    bit = tl.arange(0, 8)
    elem = byte[:, None] * 8 + bit[None, :]
    valid = elem < n
    exponent = tl.load(data_ptr + elem, mask=valid, other=0).to(tl.int32)
    signs = tl.load(data_ptr + n + byte, mask=byte * 8 < n, other=0).to(tl.int32)
    negative = (signs[:, None] >> bit[None, :]) & 1
    value = ((negative << 31) | (exponent << 23)).to(tl.float32, bitcast=True)
    store_rounded(out_ptr, elem, value, valid, BF16)
    tl.store(bad_ptr + tl.program_id(0), tl.max(tl.where(valid & (exponent > limit), 1, 0)))


def encode(x: torch.Tensor, out: torch.Tensor, limit: int, seed: torch.Tensor) -> int:
    """Write the payload of the contiguous 1-D ``x`` into ``out`` (``n + ceil(n/8)`` bytes);
    returns 0, or 1 for non-finite input, 2 for a value beyond the range (one host read)."""
    n = x.numel()
    grid = (max(1, triton.cdiv(n, 8 * BYTES)),)
    bad = torch.zeros(grid[0], dtype=torch.int32, device=x.device)
    _encode[grid](x, seed, out, bad, n, limit, BYTES=BYTES)
    return int(bad.amax())


def decode(data: torch.Tensor, n: int, out: torch.Tensor, limit: int) -> bool:
    """Decode the payload ``data`` of ``n`` elements into ``out``; returns whether an exponent
    byte was above ``limit`` (a corrupt payload; one host read)."""
    grid = (max(1, triton.cdiv(n, 8 * BYTES)),)
    bad = torch.zeros(grid[0], dtype=torch.int32, device=data.device)
    view, bf16 = output_view(out)
    _decode[grid](data, view, bad, n, limit, BYTES=BYTES, BF16=bf16)
    return bool(bad.any())
