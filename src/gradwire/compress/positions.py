"""What the sparsifiers (``topk``, ``threshold``, ``randk``) share: the wire form of positions.

Kept values travel bit for bit in the input's dtype (``itemsize`` bytes each), in increasing index
order. Their positions travel in whichever of two forms is smaller, decided from ``n`` and the
count ``k`` alone so that the receiver knows which one it reads:

* an index list: ``k`` indices of ``w = ceil(log2 n)`` bits each, ``ceil(k*w/8)`` bytes;
* a bitmap: one bit per element, ``ceil(n/8)`` bytes;

the list when strictly smaller, else the bitmap. Bits are packed LSB first (see ``bitpack``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from gradwire.compress import bitpack
from gradwire.compress.base import CorruptPayload, raise_non_finite
from gradwire.compress.wire import work_dtype
from gradwire.spec import require


def index_width(n: int) -> int:
    """Bits of one index into ``n`` elements: ceil(log2 n) (0 for n <= 1)."""
    return (n - 1).bit_length() if n > 1 else 0


def uses_bitmap(n: int, k: int) -> bool:
    return -(-n // 8) <= -(-k * index_width(n) // 8)


def positions_bytes(n: int, k: int) -> int:
    return min(-(-n // 8), -(-k * index_width(n) // 8))


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def keep_count(ratio: float, n: int) -> int:
    """k = ceil(ratio * n), with ratio read as the decimal it was written as (so 0.07 * 100 gives 7,
    not 8 as float rounding would)."""
    return min(n, math.ceil(Fraction(repr(ratio)) * n))


def check_ratio(ratio: float) -> None:
    require(0 < ratio <= 1, f"ratio must be in (0, 1], got {ratio}")


def check_finite(x: torch.Tensor, name: str) -> None:
    """One cheap pass (aminmax propagates NaN and shows +-inf) before any element is dropped."""
    if x.numel():
        lo, hi = torch.aminmax(x)
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            raise_non_finite(x, name)


def encode_positions(n: int, index: torch.Tensor) -> torch.Tensor:
    """The position section for the ascending int64 ``index`` into ``n`` elements."""
    if uses_bitmap(n, index.numel()):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[index] = True
        return bitpack.pack(mask.view(torch.uint8), 1)
    return bitpack.pack_uint(index, index_width(n))


def decode_positions(buf: torch.Tensor, n: int, k: int, name: str) -> torch.Tensor:
    """Ascending int64 indices, or a bool mask, from a position section, checked against n and k."""
    if uses_bitmap(n, k):
        if n % 8 and int(buf[-1]) >> (n % 8):
            raise CorruptPayload(f"{name}: bitmap has bits set beyond its {n} elements")
        mask = bitpack.unpack(buf, n, 1).view(torch.bool)
        marked = int(mask.sum())
        if marked != k:
            raise CorruptPayload(f"{name}: bitmap marks {marked} elements, the header says {k}")
        return mask
    index = bitpack.unpack_uint(buf, k, index_width(n))
    if k and (int(index[-1]) >= n or (k > 1 and not bool((index[1:] > index[:-1]).all()))):
        raise CorruptPayload(f"{name}: indices out of range or not strictly increasing (n={n})")
    return index


def scatter(n: int, index: torch.Tensor, values: torch.Tensor, dtype: torch.dtype, name: str,
            factor: float = 1.0) -> torch.Tensor:
    """A dense tensor of ``n`` zeros with ``values`` (times ``factor``) at ``index`` (or a mask)."""
    if values.numel() and not bool(torch.isfinite(values).all()):
        raise CorruptPayload(f"{name}: non-finite value in the payload")
    out = torch.zeros(n, dtype=dtype)
    if factor != 1.0:
        values = (values.to(work_dtype(dtype)) * factor).to(dtype)
    if index.dtype == torch.bool:
        return out.masked_scatter_(index, values)
    out[index] = values
    return out
