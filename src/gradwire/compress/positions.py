"""What the sparsifiers (``topk``, ``threshold``, ``randk``) share: the wire form of positions.

Kept values travel bit for bit in the input's dtype (``itemsize`` bytes each), in increasing index
order. Their positions (``topk``, ``threshold``) travel as Golomb-coded gaps, or as a bitmap where
that is no larger: see ``gapcode``. The position section's size depends on where the kept elements
are, so those payloads are variable-size (``nbytes`` is None).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import torch

from gradwire.compress import gapcode
from gradwire.compress.base import CorruptPayload, raise_non_finite
from gradwire.compress.wire import work_dtype
from gradwire.spec import require


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def keep_count(ratio: float, n: int) -> int:
    """k = ceil(ratio * n), with ratio read as the decimal it was written as (so 0.07 * 100 gives 7,
    not 8 as float rounding would)."""
    return min(n, math.ceil(Fraction(repr(ratio)) * n))


def check_ratio(ratio: float) -> float:
    """``ratio`` as a Python float (a numpy scalar's repr would enter the spec and ``keep_count``),
    checked to lie in (0, 1]."""
    require(isinstance(ratio, numbers.Real) and not isinstance(ratio, bool),
            f"ratio must be a number in (0, 1], got {ratio!r}")
    ratio = float(ratio)
    require(0 < ratio <= 1, f"ratio must be in (0, 1], got {ratio}")
    return ratio


def check_finite(x: torch.Tensor, name: str) -> None:
    """One cheap pass (aminmax propagates NaN and shows +-inf) before any element is dropped."""
    if x.numel():
        lo, hi = torch.aminmax(x)
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            raise_non_finite(x, name)


def encode_positions(n: int, index: torch.Tensor) -> torch.Tensor:
    """The position section for the ascending int64 ``index`` into ``n`` elements."""
    return gapcode.encode(n, index)


def decode_positions(buf: torch.Tensor, n: int, k: int, name: str) -> torch.Tensor:
    """Ascending int64 indices, or a bool mask, from a position section, checked against n and k."""
    return gapcode.decode(buf, n, k, name)


def positions_bytes(n: int, index: torch.Tensor) -> int:
    """Bytes of the position section for the ascending ``index`` into n (without encoding it)."""
    return gapcode.section_bytes(n, index.numel(), gapcode.quotient_sum(n, index))


def scatter(n: int, index: torch.Tensor, values: torch.Tensor, dtype: torch.dtype, name: str,
            factor: float = 1.0) -> torch.Tensor:
    """A dense tensor of ``n`` zeros with ``values`` (times ``factor``) at ``index`` (or a mask)."""
    if values.numel() and not bool(torch.isfinite(values).all()):
        raise CorruptPayload(f"{name}: non-finite value in the payload")
    out = torch.zeros(n, dtype=dtype, device=values.device)
    if factor != 1.0:
        values = (values.to(work_dtype(dtype)) * factor).to(dtype)
    if index.dtype == torch.bool:
        return out.masked_scatter_(index, values)
    out[index] = values
    return out
