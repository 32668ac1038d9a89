"""Positions of kept elements near the information limit: Golomb-coded gaps in two sections.

A sorted k-subset of range(n) carries log2 C(n, k) bits. For top-k at ratio 1% that is 8.08 bits
per kept element, against the 22-25 of a fixed-width index list. Following Golomb (1966),
"Run-length encodings", IEEE Trans. Inf. Theory 12(3), the gaps ``g_i = idx_i - idx_{i-1} - 1``
(``idx_{-1} = -1``) of a random subset are close to geometric with p = k/n, and a Golomb code with
parameter b splits each gap into a quotient ``q_i = g_i // b`` sent in unary and a remainder
``r_i = g_i % b``. As in Elias (1974) and Fano (1971) the two parts travel in separate sections,
so that both decode with whole-tensor operations (no sequential bit parsing):

* remainders in mixed radix: groups of G remainders are one integer ``sum_j r_j b**j < b**G``,
  written as a W-bit field with ``W = bit_length(b**G - 1)`` (the last group, of k mod G
  remainders, in ``bit_length(b**(k mod G) - 1)`` bits). G <= 62/log2 b is the one with the fewest
  bits per remainder, so a remainder costs about log2 b bits, not ceil(log2 b);
* quotients in unary: a bit stream with one 1 per kept element, preceded by q_i zeros. The i-th
  one sits at ``i + q_0 + ... + q_i``, so one ``nonzero()`` recovers every running quotient sum.

The section is one LSB-first bit stream (bit j of the stream is bit j % 8 of byte j // 8):
remainder bits first, then the unary bits, zero-padded to a whole byte. Its length depends on the
data, ``ceil((R + k + sum q) / 8)`` bytes, and needs no header: the unary bits run to the end of the
section, whose last byte holds the k-th one (the receiver knows the section's size from the
payload's). b is a function of n and k alone (:func:`golomb_parameter`), so both ends derive it.

With b = 1 there are no remainders and the unary stream is the bitmap cut after its last one. A
full bitmap of ceil(n/8) bytes is sent instead whenever the gap code would not be strictly smaller
(clustered positions); a section of exactly ceil(n/8) bytes therefore is a bitmap, any shorter one
the gap code, and the decoder refuses a bitmap whose positions the gap code would have sent in fewer
bytes (so one encoding per set: a gap code padded with zero bytes is not read as a bitmap). So
positions never cost more than a bitmap. Random positions cost within 0.1% of
log2 C(n, k) bits at ratios 1% and 0.1% (docs/compressors.md); the worst case is
``R + k + (n - k) / b`` bits, since the gaps sum to at most n - k.

Everything runs as vectorised torch ops on the index's (encode) or buffer's (decode) device; the
host reads a handful of scalars (the quotient sum to size the output, and one validity flag; a
full-size bitmap under b > 1 costs two more, to check the gap code would not have been smaller).
"""

from __future__ import annotations

import functools
import math

import torch

from gradwire.compress.base import CorruptPayload

_FIELD = 62  # a group of remainders is one non-negative int64 below 2**62
_SPREAD = 0x0101010101010101  # bit 0 of each of the 8 bytes of an int64


@functools.lru_cache(maxsize=4096)
def radix_group(b: int) -> tuple[int, int]:
    """(G, W): G remainders base b per W-bit field, W = bit_length(b**G - 1) <= 62, the G with the
    fewest bits per remainder (ties: the larger G)."""
    best, g = (1, (b - 1).bit_length()), 1
    while b ** (g + 1) <= 1 << _FIELD and b > 1:
        g += 1
        w = (b**g - 1).bit_length()
        if w * best[0] <= best[1] * g:
            best = (g, w)
    return best


@functools.lru_cache(maxsize=256)
def radix_powers(base: int, count: int, device: torch.device) -> torch.Tensor:
    """``[base**0, ..., base**(count-1)]`` as int64 on ``device``, made once per (base, count, device):
    building it from a Python list on every call makes a GPU wait for a host-to-device copy.
    Shared: callers read it, never write it."""
    return torch.tensor([base**j for j in range(count)], dtype=torch.int64, device=device)


def remainder_bits(k: int, b: int) -> int:
    """Bits of the remainder section for k remainders base b."""
    if b == 1:
        return 0
    g, w = radix_group(b)
    return (k // g) * w + (b ** (k % g) - 1).bit_length()


def _expected_bits(p: float, b: int) -> float:
    """Bits per gap for geometric gaps, P(g) = p (1-p)**g: the unary part 1 + E[q], E[q] = t/(1-t)
    with t = (1-p)**b, plus the remainder's share of its field."""
    g, w = radix_group(b)
    return w / g + 1 / (1 - (1 - p) ** b)


@functools.lru_cache(maxsize=4096)
def golomb_parameter(n: int, k: int) -> int:
    """The Golomb parameter b for k positions among n, from n and k alone (both ends call it).

    Start from the optimum for geometric gaps, ``b0 = ceil(log(2-p) / -log(1-p))`` with p = k/n
    (Gallager, Van Voorhis 1975, "Optimal source codes for geometrically distributed integer
    alphabets"), which is 1 for p >= 0.382; then, since our remainders cost W/G bits (not the
    truncated binary code that formula assumes), take the b within 25% of b0 with the fewest
    expected bits (at most about 256 candidates, evenly spaced).

    Both ends evaluate the same float expressions (Python's math, IEEE doubles), so they agree; a
    platform whose libm rounded log or pow differently could in principle flip a near-tie between
    two candidates, which the receiver would see as a CorruptPayload, not as wrong positions in
    most cases.
    """
    if k == 0 or 2 * k >= n:
        return 1
    p = k / n
    b0 = max(1, math.ceil(math.log(2 - p) / -math.log1p(-p)))
    lo, hi = max(1, b0 - b0 // 4), b0 + b0 // 4 + 1
    step = max(1, (hi - lo) // 256)
    return min(range(lo, hi, step), key=lambda b: (_expected_bits(p, b), b))


def bitmap_bytes(n: int) -> int:
    return (n + 7) // 8


def section_bytes(n: int, k: int, quotient_sum: int) -> int:
    """Bytes of the position section: the gap code if strictly smaller than a bitmap, else a bitmap."""
    if k == 0:
        return 0
    gap = (remainder_bits(k, golomb_parameter(n, k)) + k + quotient_sum + 7) // 8
    return min(gap, bitmap_bytes(n))


def max_section_bytes(n: int, k: int) -> int:
    """The most bytes a section of k positions into n can take, whatever the positions: the gaps
    sum to at most n - k, so the unary quotients to at most (n - k) // b (module docstring)."""
    return section_bytes(n, k, (n - k) // golomb_parameter(n, k)) if k else 0


def quotient_sum(n: int, index: torch.Tensor) -> int:
    """sum of gap // b for the ascending ``index`` (for sizes computed outside the encoder)."""
    k = index.numel()
    if k == 0:
        return 0
    return int((_gaps(index) // golomb_parameter(n, k)).sum())


# --- bit streams: uint8 tensors of 0/1 ("bits") <-> packed bytes, LSB first -----------------------

def bits_to_bytes(bits: torch.Tensor) -> torch.Tensor:
    """Pack a uint8 0/1 tensor (length a multiple of 8, 8-byte aligned; used as scratch) into bytes."""
    w = bits.view(torch.int64)  # byte j of a word holds stream bit j, as bit 0 (bits: overwritten)
    w.bitwise_or_(w >> 7)  # byte j: bits 0,1 = stream bits j, j+1
    w.bitwise_or_(w >> 14)  # byte j: bits 0..3 = stream bits j..j+3
    w.bitwise_or_(w >> 28)  # byte 0: bits 0..7 = stream bits 0..7 (bit 63 is never set: no sign)
    return w.bitwise_and_(0xFF).to(torch.uint8)


def bytes_to_bits(buf: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`bits_to_bytes`: 8 uint8 0/1 per byte."""
    w = buf.to(torch.int64)
    w.bitwise_or_(w << 28)  # the mirror image of bits_to_bytes' three steps
    w.bitwise_or_(w << 14)
    w.bitwise_or_(w << 7)
    return w.bitwise_and_(_SPREAD).view(torch.uint8)


def _write_fields(bits: torch.Tensor, values: torch.Tensor, width: int) -> None:
    """bits[i*width + j] = bit j of values[i] (non-negative int64 below 2**width)."""
    if values.numel() and width:
        planes = bytes_to_bits(values.contiguous().view(torch.uint8)).view(-1, 64)  # little-endian
        bits.view(-1, width).copy_(planes[:, :width])


def _read_fields(bits: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`_write_fields`: each field padded to 64 bits and packed is its int64."""
    planes = torch.zeros(bits.numel() // width if width else 0, 64, dtype=torch.uint8, device=bits.device)
    if planes.numel():
        planes[:, :width] = bits.view(-1, width)
    return bits_to_bytes(planes.view(-1)).view(torch.int64)


def _gaps(index: torch.Tensor) -> torch.Tensor:
    return index.diff(prepend=index.new_full((1,), -1)).sub_(1)


# --- the position section ---------------------------------------------------------------------------

def encode_mask(n: int, mask: torch.Tensor) -> torch.Tensor:
    """The section for a bool mask of n elements, when golomb_parameter(n, count) == 1: the bitmap,
    cut after its last nonzero byte (the b = 1 gap code, or the bitmap itself)."""
    bits = torch.zeros(bitmap_bytes(n) * 8, dtype=torch.uint8, device=mask.device)
    bits[:n] = mask.view(torch.uint8)
    packed = bits_to_bytes(bits)
    nonzero = packed.nonzero()
    return packed[: int(nonzero[-1]) + 1] if nonzero.numel() else packed[:0]


def encode(n: int, index: torch.Tensor) -> torch.Tensor:
    """The position section (uint8, on index's device) for the ascending int64 ``index`` into n."""
    k, device = index.numel(), index.device
    b = golomb_parameter(n, k)
    if k == 0:
        return torch.zeros(0, dtype=torch.uint8, device=device)
    if b == 1:
        mask = torch.zeros(n, dtype=torch.bool, device=device)
        return encode_mask(n, mask.index_fill_(0, index, True))
    gaps = _gaps(index)
    q = torch.div(gaps, b, rounding_mode="floor")
    total_q = int(q.sum())  # the one host read: the output's size
    rbits = remainder_bits(k, b)
    size = (rbits + k + total_q + 7) // 8
    if size >= bitmap_bytes(n):  # clustered positions: the bitmap is no larger
        bits = torch.zeros(bitmap_bytes(n) * 8, dtype=torch.uint8, device=device)
        bits[index] = 1
        return bits_to_bytes(bits)
    bits = torch.zeros(size * 8, dtype=torch.uint8, device=device)
    g, w = radix_group(b)
    digits = torch.zeros(-(-k // g) * g, dtype=torch.int64, device=device)
    digits[:k] = gaps - q * b
    powers = radix_powers(b, g, torch.device(device))
    fields = (digits.view(-1, g) * powers).sum(1)  # < b**g <= 2**62: no overflow
    full = k // g
    _write_fields(bits[: full * w], fields[:full], w)
    _write_fields(bits[full * w: rbits], fields[full:], rbits - full * w)
    ones = q.cumsum(0).add_(torch.arange(rbits, rbits + k, device=device))
    bits[ones] = 1
    return bits_to_bytes(bits)


def decode(buf: torch.Tensor, n: int, k: int, name: str) -> torch.Tensor:
    """Ascending int64 indices, or a bool mask of n (bitmap), from a section of k positions in n.
    Raises CorruptPayload unless the section is exactly what :func:`encode` writes for them."""
    size, full_map = buf.numel(), bitmap_bytes(n)
    b = golomb_parameter(n, k)
    if size > full_map or (k == 0 and size):
        raise CorruptPayload(f"{name}: position section of {size} bytes for {k} of {n} elements "
                             f"(at most {full_map if k else 0})")
    if b == 1:
        return _decode_bitmap(buf, n, k, cut=True, name=name)
    if size == full_map:
        mask = _decode_bitmap(buf, n, k, cut=False, name=name)
        # the encoder sends a bitmap only when the gap code is no smaller, so a bitmap whose gap code
        # would be smaller is not its output (e.g. a shorter gap code with zero bytes appended)
        smallest = section_bytes(n, k, quotient_sum(n, mask.nonzero().view(-1)))
        if smallest < full_map:
            raise CorruptPayload(f"{name}: bitmap section of {size} bytes for positions whose gap code "
                                 f"takes {smallest}; the encoder would have sent the gap code")
        return mask
    bits = bytes_to_bits(buf)
    rbits = remainder_bits(k, b)
    if 8 * size < rbits + k:
        raise CorruptPayload(f"{name}: position section of {size} bytes is shorter than the "
                             f"{rbits + k} bits of {k} positions")
    g, w = radix_group(b)
    full = k // g
    fields = torch.cat([_read_fields(bits[: full * w], w),
                        _read_fields(bits[full * w: rbits], rbits - full * w)])
    limits = torch.full_like(fields, b**g)
    limits[full:] = b ** (k % g)
    powers = radix_powers(b, g, buf.device)
    r = (torch.div(fields.unsqueeze(1), powers, rounding_mode="floor") % b).view(-1)[:k]
    ones = bits[rbits:].nonzero().view(-1)
    if ones.numel() != k:
        raise CorruptPayload(f"{name}: unary section holds {ones.numel()} ones for {k} positions")
    sums = ones - torch.arange(k, device=buf.device)  # running quotient sums
    q = sums.diff(prepend=sums.new_zeros(1))
    index = (q * b).add_(r).add_(1).cumsum(0).sub_(1)
    ok = (fields < limits).all() & (index[-1] < n) & (rbits + ones[-1] >= 8 * (size - 1))
    if not bool(ok):
        raise CorruptPayload(f"{name}: gap-coded positions out of range, a remainder field of b={b} "
                             f"too large, or padding after the last position (n={n}, k={k})")
    return index


def _decode_bitmap(buf: torch.Tensor, n: int, k: int, cut: bool, name: str) -> torch.Tensor:
    size = buf.numel()
    if cut and size and int(buf[-1]) == 0:
        raise CorruptPayload(f"{name}: bitmap section ends in a zero byte (not cut after its last one)")
    bits = torch.zeros(bitmap_bytes(n) * 8, dtype=torch.uint8, device=buf.device)
    bits[: 8 * size] = bytes_to_bits(buf)
    mask = bits[:n].view(torch.bool)
    counts = torch.stack([bits[n:].sum(), mask.sum()]).tolist()  # one host read
    if counts[0]:
        raise CorruptPayload(f"{name}: bitmap has bits set beyond its {n} elements")
    if counts[1] != k:
        raise CorruptPayload(f"{name}: bitmap marks {counts[1]} elements, the header says {k}")
    return mask
