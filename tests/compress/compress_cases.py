"""Shared cases for the compressor tests, and the wire sizes written out independently of the code."""

from __future__ import annotations

import math
from fractions import Fraction

import torch

SPECS = [
    "none", "fp16", "bf16",
    "qsgd", "qsgd:levels=1,bucket=4", "qsgd:levels=2,bucket=7", "qsgd:levels=127,bucket=3",
    "terngrad", "terngrad:clip=0",
    "sign", "sign:scaled=true",
    "topk:ratio=0.1", "topk:ratio=1",
    "randk:ratio=0.3", "randk:ratio=1",
    "pquant:p=1,block=5", "pquant:p=2", "pquant:p=inf,block=8",
    "threshold:tau=0.5", "threshold:tau=0",
    "natural",
]
STOCHASTIC = ["qsgd", "qsgd:levels=1,bucket=4", "qsgd:levels=2,bucket=7", "terngrad", "terngrad:clip=0",
              "randk:ratio=0.3", "pquant:p=1,block=5", "pquant:p=2", "pquant:p=inf,block=8", "natural"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SHAPES = [(), (0,), (1,), (7,), (1000,), (3, 5, 7)]
ITEMSIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def params(spec: str) -> tuple[str, dict[str, str]]:
    name, _, rest = spec.partition(":")
    return name, dict(item.split("=") for item in rest.split(",")) if rest else {}


def keep(kw: dict[str, str], n: int) -> int:
    return math.ceil(Fraction(kw.get("ratio", "0.01")) * n)


def positions(n: int, k: int) -> int:
    width = math.ceil(math.log2(n)) if n > 1 else 0
    return min(ceil_div(k * width, 8), ceil_div(n, 8))


def expected_nbytes(spec: str, n: int, dtype: torch.dtype, count: int | None = None) -> int:
    """The wire size each compressor documents, for ``n`` elements (``count`` kept for threshold)."""
    name, kw = params(spec)
    size = ITEMSIZE[dtype]
    if name == "none":
        return n * size
    if name in ("fp16", "bf16"):
        return 2 * n
    if name == "qsgd":
        s, bucket = int(kw.get("levels", 7)), int(kw.get("bucket", 512))
        return 4 * ceil_div(n, bucket) + ceil_div(n * math.ceil(math.log2(2 * s + 1)), 8)
    if name == "terngrad":
        return 4 + ceil_div(n, 5)
    if name == "pquant":
        return 4 * ceil_div(n, int(kw.get("block", 512))) + ceil_div(n, 5)
    if name == "sign":
        return ceil_div(n, 8) + (4 if kw.get("scaled") == "true" else 0)
    if name == "topk":
        k = keep(kw, n)
        return k * size + positions(n, k)
    if name == "randk":
        return 8 + keep(kw, n) * size
    if name == "threshold":
        return 4 + count * size + positions(n, count)
    if name == "natural":
        return n + ceil_div(n, 8)
    raise KeyError(spec)
