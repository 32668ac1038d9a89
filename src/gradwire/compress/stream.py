"""Symbol streams in the float domain: packing floored float symbols into bytes, and decoding bytes
straight to float values through a 256-entry table.

Same layouts as ``bitpack`` (``bits`` bits per symbol LSB first, or base-3 trits five per byte).
When a byte holds several whole symbols (base 3, or ``bits`` in 1, 2, 4) packing is one matrix-vector
product of the symbols, viewed as rows of one byte's worth, with the place values (exact: the
sums are integers below 256), and decoding is one row gather from a table ``byte -> values``;
both are several times faster than shuffling uint8 symbols. Other widths fall back to ``bitpack``.

A third layout packs ``per_field`` symbols of radix ``count`` into one ``bits``-bit field,
``v = q_0 + count*q_1 + count^2*q_2 + ...`` (requires ``count^per_field <= 2^bits``), and the
fields into the same LSB-first bit stream as ``bitpack.pack_uint``: for a symbol count that does
not fill a power of two (QSGD's ``2s + 1``), ``bits/per_field`` comes close to ``log2(count)``.
The base-3 layout is its case ``count=3, per_field=5, bits=8``; fixed-width symbols its case
``per_field=1``. A stream of ``n`` symbols takes ``ceil(ceil(n/per_field) * bits/8)`` bytes.
"""

from __future__ import annotations

import functools

import torch

from gradwire.compress import bitpack
from gradwire.compress.base import CorruptPayload
from gradwire.compress.wire import chunk_size


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


@functools.lru_cache(maxsize=16)
def _field_table(count: int, per_field: int, bits: int, a: float, b: float, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """Rows ``field value -> a*q + b of its per_field radix-count digits q``; NaN rows for values
    at or above ``count**per_field``."""
    value = torch.arange(1 << bits, dtype=torch.int64, device=device)
    table = torch.stack([(value // count**j % count).to(dtype) * a + b for j in range(per_field)], dim=1)
    table[count**per_field:] = float("nan")
    return table


class SymbolStream:
    """A stream of symbols ``q`` in ``0..count-1`` that decode to ``a*q + b`` in ``dtype`` on
    ``device`` (``bits=None``: base-3 trits)."""

    def __init__(self, bits: int | None, count: int, a: float, b: float, dtype: torch.dtype,
                 device: torch.device, per_field: int = 1):
        self.bits, self.count, self.a, self.b, self.dtype = bits, count, a, b, dtype
        self.per_field = per_field
        if per_field > 1:  # radix fields: eight fields make a whole number (bits) of bytes
            if bits is None or count**per_field > 1 << bits:
                raise ValueError(f"{per_field} symbols of radix {count} do not fit {bits} bits")
            self.group, self.per_byte = 8 * per_field, 0
            self.powers = torch.tensor([count**j for j in range(per_field)], dtype=torch.int64, device=device)
            # field values by one matrix-vector product, exact in float32 below 2^24
            self.field_dtype = torch.float32 if bits <= 24 else torch.float64
            self.place = self.powers.to(self.field_dtype)
            # decoding: fields of up to 16 bits through a table field -> values (NaN: invalid field)
            self.field_table = _field_table(count, per_field, bits, a, b, dtype, torch.device(device)) \
                if bits <= 16 else None
            return
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
        if self.bits is None:
            return -(-n // 5)
        return bitpack.packed_bytes(-(-n // self.per_field), self.bits)

    def chunk(self, n: int, device: torch.device) -> int:
        """Symbols per pass: ``wire.chunk_size`` rounded to whole groups."""
        size = chunk_size(n, device)
        return max(self.group, size // self.group * self.group if device.type == "cpu"
                   else -(-size // self.group) * self.group)

    def span(self, lo: int, count: int) -> tuple[int, int]:
        """Byte range of ``count`` symbols (a whole number of groups) starting at symbol ``lo``."""
        if self.bits is None:
            return lo // 5, (lo + count) // 5
        return lo * self.bits // (8 * self.per_field), (lo + count) * self.bits // (8 * self.per_field)

    def pack(self, t: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor, sym: torch.Tensor) -> None:
        """Pack the non-negative float symbols ``t`` (floored here; a whole number of groups) into
        ``out``. ``scratch`` (float, >= len/per_byte) and ``sym`` (uint8, >= len) are work space."""
        if self.per_field > 1:
            q = t.floor_().view(-1, self.per_field).to(self.field_dtype)
            bitpack.pack_fields(torch.mv(q, self.place).to(torch.int64), self.bits, out)
            return
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
        if self.per_field > 1:
            values = bitpack.unpack_fields(src, self.bits)
            if self.field_table is not None:
                torch.index_select(self.field_table, 0, values, out=dst.view(-1, self.per_field))
                if bool(torch.isnan(dst.sum())):
                    raise CorruptPayload(f"{name}: invalid symbol in the payload")
                return
            if int(values.amax()) >= self.count**self.per_field:
                raise CorruptPayload(f"{name}: invalid symbol in the payload")
            rows = dst.view(-1, self.per_field)
            for j in range(self.per_field):  # digit j of each field, exact in float: small integers
                rows[:, j].copy_(values // self.powers[j] % self.count)
            dst.mul_(self.a).add_(self.b)
            return
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
