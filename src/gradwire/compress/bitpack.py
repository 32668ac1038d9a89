"""Packing small integer symbols into bytes with vectorised torch ops.

Every packer writes one little-endian bit stream: symbol ``i`` of width ``b`` bits occupies stream
bits ``[b*i, b*i + b)``, and stream bit ``k`` is bit ``k % 8`` of byte ``k // 8``. A stream of ``n``
symbols takes ``ceil(n*b/8)`` bytes; unused high bits of the last byte are zero.

Trits (symbols 0, 1, 2) can instead be packed five to a byte in base 3,
``byte = t0 + 3*t1 + 9*t2 + 27*t3 + 81*t4`` (at most 242), i.e. ``ceil(n/5)`` bytes: 1.6 bits per
trit instead of 2. A short last group is padded with zero trits.

The word-level tricks view eight uint8 symbols as one int64, so they assume a little-endian host.
Every buffer is made on the input's device; on the CPU the whole-tensor packers work in
cache-sized passes, on a GPU in one pass (there, each pass costs a kernel launch).
"""

from __future__ import annotations

import functools
import sys

import torch

if sys.byteorder != "little":  # pragma: no cover - every platform torch ships wheels for
    raise ImportError("gradwire.compress.bitpack assumes a little-endian host")

_M64 = (1 << 64) - 1


def _lanes(width: int, lo: int, hi: int) -> int:
    """An int64 constant with bits ``[lo, hi)`` set in every ``width``-bit lane (as a signed value)."""
    mask = 0
    for k in range(64 // width):
        mask |= (((1 << hi) - 1) ^ ((1 << lo) - 1)) << (k * width)
    mask &= _M64
    return mask - (1 << 64) if mask >= 1 << 63 else mask


# For b-bit symbols, packing merges neighbouring lanes three times (8 -> 16 -> 32 -> 64-bit lanes),
# each time moving the upper half's `used` bits right next to the lower half's. Masking both halves
# keeps stray bits of widths above 4 from landing on their neighbours (a "SWAR" shuffle).
_STAGES = {
    b: [
        (lane, used, _lanes(2 * lane, 0, used), _lanes(2 * lane, used, 2 * used),
         _lanes(2 * lane, lane, lane + used))
        for lane, used in ((8, b), (16, 2 * b), (32, 4 * b))
    ]
    for b in range(1, 8)
}


# One-bit symbols: eight 0/1 bytes b0..b7 viewed as an int64 word (b_i at bit 8i), times this
# constant (bits 56 - 7i set), put b_i at bit 56 + i and no carry in between: the top byte is then
# the packed byte, LSB first. One multiply and one shift per eight symbols.
_GATHER_BITS = sum(1 << (56 - 7 * i) for i in range(8))


def packed_bytes(n: int, bits: int) -> int:
    """Bytes of a stream of ``n`` symbols of ``bits`` bits each."""
    return (n * bits + 7) // 8


def pack_bits(symbols: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    """Pack ``symbols`` (uint8, length a multiple of 8, each < 2**bits) into ``out`` (len*bits/8 bytes).

    ``symbols`` is used as scratch and overwritten.
    """
    if bits == 8:
        out.copy_(symbols)
        return
    w = symbols.view(torch.int64)
    if bits == 1:
        w.mul_(_GATHER_BITS).bitwise_right_shift_(56).bitwise_and_(0xFF)  # bits 56..63, as 0..255
        out.copy_(w)
        return
    tmp = torch.empty_like(w)
    for lane, used, low, high, _ in _STAGES[bits]:
        torch.bitwise_right_shift(w, lane - used, out=tmp)
        tmp.bitwise_and_(high)
        w.bitwise_and_(low).bitwise_or_(tmp)
    # each word now holds its 8 symbols in its low `bits` bytes
    out.view(-1, bits).copy_(w.view(torch.uint8).view(-1, 8)[:, :bits])


def unpack_bits(packed: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    """Inverse of :func:`pack_bits`: ``out`` (uint8, length a multiple of 8) receives the symbols."""
    if bits == 8:
        out.copy_(packed)
        return
    words = out.view(-1, 8)
    words[:, bits:] = 0
    words[:, :bits] = packed.view(-1, bits)
    w = out.view(torch.int64)
    tmp = torch.empty_like(w)
    for lane, used, low, _, upper in reversed(_STAGES[bits]):
        torch.bitwise_left_shift(w, lane - used, out=tmp)
        tmp.bitwise_and_(upper)
        w.bitwise_and_(low).bitwise_or_(tmp)


def pack_trits(trits: torch.Tensor, out: torch.Tensor) -> None:
    """Base-3 pack ``trits`` (uint8 in {0,1,2}, length a multiple of 5) into ``out`` (len/5 bytes)."""
    t = trits.view(-1, 5)
    torch.mul(t[:, 4], 3, out=out)  # Horner's rule in uint8: the largest partial value is 242
    for j in (3, 2, 1):
        out.add_(t[:, j]).mul_(3)
    out.add_(t[:, 0])


@functools.lru_cache(maxsize=8)
def _trit_table(device: torch.device) -> torch.Tensor:
    """byte -> its five trits, stored in the low five bytes of an int64 (so one gather per byte)."""
    value = torch.arange(243, dtype=torch.int64, device=device)
    table = torch.zeros(256, 8, dtype=torch.uint8, device=device)
    for j in range(5):
        table[:243, j] = (value // 3**j % 3).to(torch.uint8)
    return table.view(torch.int64).view(-1)


def unpack_trits(packed: torch.Tensor, out: torch.Tensor) -> None:
    """Inverse of :func:`pack_trits`; bytes above 242 must have been rejected by the caller."""
    words = _trit_table(packed.device)[packed.long()]
    out.view(-1, 5).copy_(words.view(torch.uint8).view(-1, 8)[:, :5])


_GROUPS = 1 << 13  # groups of 8 symbols per pass of the whole-tensor packers (scratch stays in cache)


def groups_per_pass(groups: int, device: torch.device) -> int:
    """Groups of 8 symbols per pass: cache-sized on the CPU, all of them at once elsewhere."""
    return max(1, min(_GROUPS, groups) if device.type == "cpu" else groups)


def pack(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a whole 1-D uint8 tensor of ``bits``-bit symbols into ``packed_bytes(n, bits)`` bytes."""
    n = symbols.numel()
    per_pass = groups_per_pass((n + 7) // 8, symbols.device)
    out = torch.empty((n + 7) // 8 * bits, dtype=torch.uint8, device=symbols.device)
    scratch = torch.empty(min(per_pass, (n + 7) // 8) * 8, dtype=torch.uint8, device=symbols.device)
    for lo in range(0, n, 8 * per_pass):
        hi = min(n, lo + 8 * per_pass)
        padded = (hi - lo + 7) // 8 * 8
        scratch[hi - lo: padded] = 0
        scratch[: hi - lo] = symbols[lo:hi]  # pack_bits works in place: never on the caller's tensor
        pack_bits(scratch[:padded], bits, out[lo // 8 * bits: (lo + padded) // 8 * bits])
    return out[: packed_bytes(n, bits)]


def unpack(packed: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`; returns ``n`` uint8 symbols (the padding symbols are dropped)."""
    groups = (n + 7) // 8
    per_pass = groups_per_pass(groups, packed.device)
    out = torch.empty(groups * 8, dtype=torch.uint8, device=packed.device)
    for g in range(0, groups, per_pass):
        h = min(groups, g + per_pass)
        src = packed[g * bits: h * bits]
        if src.numel() < (h - g) * bits:  # the stream's last group is cut short: pad with zeros
            src = torch.cat([src, src.new_zeros((h - g) * bits - src.numel())])
        unpack_bits(src, bits, out[g * 8: h * 8])
    return out[:n]


def pack_uint(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack non-negative int64 ``values`` (each < 2**width, width 0..63) as ``width``-bit fields.

    Used for the sparse compressors' indices, where ``count * width`` is below the tensor size, so
    the bit-plane scratch of ``count * width`` bytes stays small.
    """
    k, device = values.numel(), values.device
    if k * width == 0:
        return torch.zeros(0, dtype=torch.uint8, device=device)
    planes = torch.empty(k * width, dtype=torch.uint8, device=device)  # bit j of value i at i*width + j
    shifts = torch.arange(width, dtype=torch.int64, device=device)
    step = max(1, (1 << 16) // max(width, 1)) if device.type == "cpu" else k
    for lo in range(0, k, step):
        v = values[lo: lo + step].unsqueeze(1)
        planes[lo * width: (lo + step) * width].view(-1, width).copy_((v >> shifts).bitwise_and_(1))
    return pack(planes, 1)


def unpack_uint(packed: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_uint`: ``count`` int64 values."""
    device = packed.device
    values = torch.zeros(count, dtype=torch.int64, device=device)
    if count * width == 0:
        return values
    planes = unpack(packed, count * width, 1).view(count, width)
    shifts = torch.arange(width, dtype=torch.int64, device=device)
    step = max(1, (1 << 16) // max(width, 1)) if device.type == "cpu" else count
    for lo in range(0, count, step):
        values[lo: lo + step] = (planes[lo: lo + step].long() << shifts).sum(1)  # distinct bits: sum = or
    return values



def _unit_width(width: int) -> int:
    """Eight ``width``-bit fields are merged pairwise into units of this width (at most 63 bits)."""
    u = width
    while 2 * u <= 63 and u < 8 * width:
        u *= 2
    return u


def pack_fields(values: torch.Tensor, width: int, out: torch.Tensor) -> None:
    """Pack non-negative int64 ``values`` (length a multiple of 8, each < 2**width, width <= 56) as
    ``width``-bit fields in the LSB-first stream ``out`` (len*width/8 bytes). Eight fields make
    ``width`` bytes: neighbours are merged into units as wide as int64 holds, the units ORed into
    64-bit words, and the words' low ``width`` bytes copied out (a few passes per group)."""
    v = values.view(-1, 8)
    u = width
    while u < _unit_width(width):
        v = v[:, 0::2] | (v[:, 1::2] << u)
        u *= 2
    words = torch.zeros(v.shape[0], -(-width // 8), dtype=torch.int64, device=values.device)
    for i in range(v.shape[1]):
        a, shift = divmod(i * u, 64)
        words[:, a] |= v[:, i] << shift  # the bits beyond 64 wrap away: the next word gets them
        if shift + u > 64:
            words[:, a + 1] |= v[:, i] >> (64 - shift)
    out.view(-1, width).copy_(words.view(torch.uint8).view(v.shape[0], -1)[:, :width])


def unpack_fields(packed: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_fields`: the int64 fields of ``packed`` (a multiple of ``width`` bytes)."""
    groups, nwords = packed.numel() // width, -(-width // 8)
    raw = torch.zeros(groups, 8 * nwords, dtype=torch.uint8, device=packed.device)
    raw[:, :width] = packed.view(groups, width)
    words = raw.view(torch.int64)
    u = _unit_width(width)
    units = torch.empty(groups, 8 * width // u, dtype=torch.int64, device=packed.device)
    for i in range(units.shape[1]):
        a, shift = divmod(i * u, 64)
        part = words[:, a] >> shift
        if shift:  # an arithmetic shift: drop the copies of the sign bit
            part &= (1 << (64 - shift)) - 1
        if shift + u > 64:
            part |= words[:, a + 1] << (64 - shift)
        units[:, i] = part & ((1 << u) - 1)
    while u > width:  # split each unit into its two halves, low first
        u //= 2
        halves = torch.empty(groups, 2 * units.shape[1], dtype=torch.int64, device=packed.device)
        halves[:, 0::2] = units & ((1 << u) - 1)
        halves[:, 1::2] = units >> u
        units = halves
    return units.view(-1)
