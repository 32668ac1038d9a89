"""Sign bits in one pass: ``x < 0`` packed eight to a byte, and back to ``scale * (1 - 2*bit)``.

References (the torch code each kernel must equal byte for byte, tested in tests/kernels):
:func:`gradwire.compress.sign.pack_signs` and :func:`gradwire.compress.sign.unpack_signs`.
The encode kernel also reports non-finite input, so plain ``sign`` needs no separate pass for its
finiteness check (the torch path reads the data once more for ``aminmax``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradwire.kernels.common import output_view, store_rounded

BYTES = 256  # bytes (groups of 8 elements) per program


@triton.jit
def _pack_signs(x_ptr, out_ptr, bad_ptr, n, BYTES: tl.constexpr):
    byte = tl.program_id(0) * BYTES + tl.arange(0, BYTES)
    bit = tl.arange(0, 8)
    elem = byte[:, None] * 8 + bit[None, :]
    valid = elem < n
    x = tl.load(x_ptr + elem, mask=valid, other=0.0).to(tl.float32)
    neg = (x < 0).to(tl.int32)
    packed = tl.sum(neg << bit[None, :], axis=1)  # distinct bits: the sum is the OR
    tl.store(out_ptr + byte, packed.to(tl.uint8), mask=byte * 8 < n)
    finite = (x == x) & (tl.abs(x) < float("inf"))
    tl.store(bad_ptr + tl.program_id(0), tl.max(tl.where(finite & valid, 0, 1) * valid.to(tl.int32)))


@triton.jit
def _unpack_signs(data_ptr, out_ptr, n, scale, BYTES: tl.constexpr, BF16: tl.constexpr):
    byte = tl.program_id(0) * BYTES + tl.arange(0, BYTES)
    bit = tl.arange(0, 8)
    elem = byte[:, None] * 8 + bit[None, :]
    valid = elem < n
    packed = tl.load(data_ptr + byte, mask=byte * 8 < n, other=0).to(tl.int32)
    b = (packed[:, None] >> bit[None, :]) & 1
    value = (1.0 - 2.0 * b.to(tl.float32)) * scale
    store_rounded(out_ptr, elem, value, valid, BF16)


def pack_signs(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Write the sign bits of the contiguous 1-D ``x`` into ``out`` (``ceil(n/8)`` bytes); returns
    whether ``x`` held a non-finite value (one host read)."""
    n = x.numel()
    grid = (triton.cdiv(n, 8 * BYTES),)
    bad = torch.zeros(grid[0], dtype=torch.int32, device=x.device)
    _pack_signs[grid](x, out, bad, n, BYTES=BYTES)
    return bool(bad.any())


def unpack_signs(data: torch.Tensor, n: int, out: torch.Tensor, scale: float) -> None:
    """``out[i] = scale * (1 - 2*bit_i)`` for the ``n`` bits of ``data`` (computed in float32)."""
    view, bf16 = output_view(out)
    _unpack_signs[(triton.cdiv(n, 8 * BYTES),)](data, view, n, float(scale), BYTES=BYTES, BF16=bf16)
