"""Symbol streams in the float domain: packing floored float symbols into bytes, and decoding bytes
straight to float values through a 256-entry table.

Same layouts as ``bitpack`` (``bits`` bits per symbol LSB first, or base-3 trits five per byte).
When a byte holds several whole symbols (base 3, or ``bits`` in 1, 2, 4) packing is one matrix-vector
product of the symbols, viewed as rows of one byte's worth, with the place values (exact: the
sums are integers below 256), and decoding is one row gather from a table ``byte -> values``;
both are several times faster than shuffling uint8 symbols. Other widths fall back to ``bitpack``.
"""

from __future__ import annotations

import functools

import torch

from gradwire.compress import bitpack
from gradwire.compress.base import CorruptPayload


@functools.lru_cache(maxsize=64)
def _table(bits: int | None, count: int, a: float, b: float, dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """Rows ``byte -> values a*q + b of its symbols q``; NaN marks bytes holding a symbol >= count."""
    base, per_byte = (3, 5) if bits is None else (1 << bits, 8 // bits)
    q = torch.arange(base, dtype=dtype, device=device)
    lookup = torch.where(q < count, a * q + b, float("nan"))
    byte = torch.arange(256, device=device)
    table = torch.stack([lookup[byte // base**j % base] for j in range(per_byte)], dim=1)
    if bits is None:
        table[243:] = float("nan")  # 3^5 = 243 values fit a byte
    return table


class SymbolStream:
    """A stream of symbols ``q`` in ``0..count-1`` that decode to ``a*q + b`` in ``dtype`` on
    ``device`` (``bits=None``: base-3 trits)."""

    def __init__(self, bits: int | None, count: int, a: float, b: float, dtype: torch.dtype,
                 device: torch.device):
        self.bits, self.count, self.a, self.b, self.dtype = bits, count, a, b, dtype
        self.group = 5 if bits is None else 8  # symbols per packing group (a whole number of bytes)
        # symbols per byte for the float fast path; 0: widths 3, 5, 6, 7 and 8 go through bitpack
        self.per_byte = 5 if bits is None else (8 // bits if bits in (1, 2, 4) else 0)
        if self.per_byte:
            base = 3 if bits is None else 1 << bits
            self.weights = torch.tensor([float(base**j) for j in range(self.per_byte)], dtype=dtype,
                                        device=device)
            self.table = _table(bits, count, a, b, dtype, torch.device(device))
            narrow = self.per_byte * self.table.element_size() == 8  # e.g. two float32 per byte
            self.words = self.table.view(torch.int64).view(-1) if narrow else None
            self.checked = bits is None or count < base  # the table holds NaN rows: check decodes

    def nbytes(self, n: int) -> int:
        return -(-n // 5) if self.bits is None else bitpack.packed_bytes(n, self.bits)

    def span(self, lo: int, count: int) -> tuple[int, int]:
        """Byte range of ``count`` symbols (a whole number of groups) starting at symbol ``lo``."""
        if self.bits is None:
            return lo // 5, (lo + count) // 5
        return lo * self.bits // 8, (lo + count) * self.bits // 8

    def pack(self, t: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor, sym: torch.Tensor) -> None:
        """Pack the non-negative float symbols ``t`` (floored here; a whole number of groups) into
        ``out``. ``scratch`` (float, >= len/per_byte) and ``sym`` (uint8, >= len) are work space."""
        if self.per_byte:
            rows = scratch[: out.numel()]
            torch.mv(t.floor_().view(-1, self.per_byte), self.weights, out=rows)
            out.copy_(rows)
        else:
            s = out if self.bits == 8 else sym[: t.numel()]
            s.copy_(t)  # float -> uint8 truncates: floors the non-negative values
            if self.bits != 8:
                bitpack.pack_bits(s, self.bits, out)

    def unpack(self, src: torch.Tensor, dst: torch.Tensor, sym: torch.Tensor, index: torch.Tensor,
               name: str) -> None:
        """Decode the bytes ``src`` into values in ``dst`` (a whole number of groups).
        ``sym`` (uint8) and ``index`` (int64) are work space."""
        if self.per_byte:
            idx = index[: src.numel()]
            idx.copy_(src)
            if self.words is not None:  # rows of 8 bytes: one int64 gather is 3x faster than rows
                torch.index_select(self.words, 0, idx, out=dst.view(torch.int64))
            else:
                torch.index_select(self.table, 0, idx, out=dst.view(-1, self.per_byte))
            if self.checked and bool(torch.isnan(dst.sum())):
                raise CorruptPayload(f"{name}: invalid symbol in the payload")
            return
        s = src if self.bits == 8 else sym[: dst.numel()]
        if self.bits != 8:
            bitpack.unpack_bits(src, self.bits, s)
        if int(s.amax()) >= self.count:
            raise CorruptPayload(f"{name}: symbol above {self.count - 1} in the payload")
        dst.copy_(s).mul_(self.a).add_(self.b)  # exact: small integers
