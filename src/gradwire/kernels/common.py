"""Pieces shared by the kernel families."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def store_rounded(ptr, offsets, value, mask, BF16: tl.constexpr):
    """Store the float32 ``value`` in the element type of ``ptr``, rounding to nearest even as
    torch's casts do. For bfloat16 ``ptr`` points at int16 (see :func:`output_view`) and the
    rounding is done on the bits: Triton's interpreter truncates float32 to bfloat16."""
    if BF16:
        bits = value.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # finite values only: the codecs make no NaN
        tl.store(ptr + offsets, (bits >> 16).to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=mask)


def output_view(out: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``out`` as the kernels write it: bfloat16 as its int16 bits (see :func:`store_rounded`)."""
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16), True
    return out, False
