"""Shared cases for the compressor tests, and the wire sizes written out independently of the code."""

from __future__ import annotations

import math
from fractions import Fraction

import torch

SPECS = [
    "none", "fp16", "bf16",
    "qsgd", "qsgd:levels=1,bucket=4", "qsgd:levels=2,bucket=7", "qsgd:levels=127,bucket=3",
    "qsgd:levels=4,bucket=9", "qsgd:levels=16,bucket=5", "qsgd:levels=4,bucket=7,format=1",
    "terngrad", "terngrad:clip=0",
    "sign", "sign:scaled=true", "sign:scaled=true,ratio=0.5", "sign:ratio=0.3",
    "topk:ratio=0.1", "topk:ratio=1",
    "randk:ratio=0.3", "randk:ratio=1",
    "pquant:p=1,block=5", "pquant:p=2", "pquant:p=inf,block=8",
    "threshold:tau=0.5", "threshold:tau=0",
    "natural",
    "chunked-topk:chunk=64,k=4,values=raw", "chunked-topk:chunk=7,k=3,values=raw",
]
STOCHASTIC = ["qsgd", "qsgd:levels=1,bucket=4", "qsgd:levels=2,bucket=7", "qsgd:levels=16,bucket=5", "terngrad",
              "terngrad:clip=0",
              "randk:ratio=0.3", "pquant:p=1,block=5", "pquant:p=2", "pquant:p=inf,block=8", "natural"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SHAPES = [(), (0,), (1,), (7,), (1000,), (3, 5, 7)]
ITEMSIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8}


# qsgd format 2: (symbols per field k, field bits w) by levels s, worked out by hand:
# (2s+1)^k <= 2^w, w/k within 5 % of log2(2s+1); s = 1 is base 3, five trits per byte
QSGD_FIELDS = {1: (5, 8), 2: (3, 7), 4: (4, 13), 7: (1, 4), 16: (6, 31), 127: (1, 8)}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def params(spec: str) -> tuple[str, dict[str, str]]:
    name, _, rest = spec.partition(":")
    return name, dict(item.split("=") for item in rest.split(",")) if rest else {}


def keep(kw: dict[str, str], n: int) -> int:
    return math.ceil(Fraction(kw.get("ratio", "0.01")) * n)


def radix_group(b: int) -> tuple[int, int]:
    """G remainders base b per W-bit field (b**G <= 2**62), the fewest bits per remainder; ties: larger G."""
    groups = [(g, (b**g - 1).bit_length()) for g in range(1, 63) if b**g <= 2**62]
    return min(groups, key=lambda gw: (Fraction(gw[1], gw[0]), -gw[0]))


def positions(n: int, kept: list[int]) -> int:
    """Bytes of the position section for the ascending ``kept`` indices: the Golomb code (remainder
    fields, then k ones and sum(gap // b) zeros) when smaller than the n-bit bitmap, else the bitmap.
    b is the library's (a function of n and k it documents); the rest is written out here."""
    from gradwire.compress.gapcode import golomb_parameter

    k = len(kept)
    if k == 0:
        return 0
    b = golomb_parameter(n, k)
    gaps = [kept[0]] + [kept[i] - kept[i - 1] - 1 for i in range(1, k)]
    remainder_bits = 0
    if b > 1:
        g, w = radix_group(b)
        remainder_bits = k // g * w + (b ** (k % g) - 1).bit_length()
    return min(ceil_div(remainder_bits + k + sum(gap // b for gap in gaps), 8), ceil_div(n, 8))


def expected_nbytes(spec: str, n: int, dtype: torch.dtype, kept: list[int] | None = None) -> int:
    """The wire size each compressor documents, for ``n`` elements (``kept``: the ascending kept
    positions, for topk and threshold)."""
    name, kw = params(spec)
    size = ITEMSIZE[dtype]
    if name == "none":
        return n * size
    if name in ("fp16", "bf16"):
        return 2 * n
    if name == "qsgd":
        s, bucket = int(kw.get("levels", 7)), int(kw.get("bucket", 512))
        k, w = QSGD_FIELDS[s] if kw.get("format", "2") == "2" else (1, math.ceil(math.log2(2 * s + 1)))
        return 4 * ceil_div(n, bucket) + ceil_div(ceil_div(n, k) * w, 8)
    if name == "terngrad":
        return 4 + ceil_div(n, 5)
    if name == "pquant":
        return 4 * ceil_div(n, int(kw.get("block", 512))) + ceil_div(n, 5)
    if name == "sign":  # a random subset: its 64-bit seed, then the scale, then k sign bits
        head = 4 if kw.get("scaled") == "true" else 0
        return 8 + head + ceil_div(keep(kw, n), 8) if "ratio" in kw else ceil_div(n, 8) + head
    if name == "topk":
        assert len(kept) == keep(kw, n)
        return len(kept) * size + positions(n, kept)
    if name == "randk":
        return 8 + keep(kw, n) * size
    if name == "threshold":
        return 4 + len(kept) * size + positions(n, kept)
    if name == "natural":
        return n + ceil_div(n, 8)
    if name == "chunked-topk":  # k of every chunk of C, the last (L < C elements) ceil(k L / C)
        chunk, k = int(kw["chunk"]), int(kw["k"])
        tail = n % chunk
        assert len(kept) == n // chunk * k + min(tail, ceil_div(k * tail, chunk))
        assert kw.get("values") == "raw"
        return len(kept) * size + positions(n, kept)
    raise KeyError(spec)
