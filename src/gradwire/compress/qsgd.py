"""QSGD: stochastic quantization of each bucket to ``s`` levels of its L2 norm.

Alistarh, Grubic, Li, Tomioka, Vojnovic (2017), "QSGD: Communication-efficient SGD via gradient
quantization and encoding", NeurIPS. Eq. (1)-(2) define
``Q_s(v)_i = ||v||_2 * sign(v_i) * xi_i``, with ``xi_i`` the stochastic rounding of ``s|v_i|/||v||_2``
to one of its two neighbouring integers, divided by ``s``. Lemma 3.1: ``Q_s`` is unbiased and
``E||Q_s(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2`` for ``v`` in R^d. Bucketing (Sec. 3 of the
paper) applies ``Q_s`` to buckets of ``B`` consecutive elements, so the bound holds with d = B
(or d = n when the whole tensor is smaller than one bucket).

Wire format ``[ceil(n/B) float32 bucket norms][symbol stream]``; the symbols are ``q = s + level``
in 0..2s (fixed width instead of the paper's Elias coding, so that encoding is a few vectorised
passes). Two versions, chosen by the ``format`` key:

* ``format=2`` (default): ``k`` symbols per ``w``-bit field, ``v = q_0 + (2s+1) q_1 + ...``, the
  fields packed LSB first (see ``stream``), ``(k, w)`` from :func:`field_layout`: within 5 % of the
  information limit ``log2(2s+1)`` bits per symbol for every s. Levels whose fixed width is already
  within 5 % (s = 7, 14-15, 26-31, 51-63 and 98-127) keep ``k = 1``, so their bytes equal format 1's; s = 1
  is base-3, five symbols per byte (pquant's layout).
* ``format=1``: every symbol in ``b = ceil(log2(2s + 1))`` bits, LSB first (``bitpack``), as
  gradwire sent before format 2 (19-26 % over the limit for s = 1, 4, 16): decodes old payloads.

Size: ``4*ceil(n/B) + ceil(ceil(n/k) * w/8)`` bytes (``k = 1, w = b`` for format 1).
"""

from __future__ import annotations

import math

import torch

from gradwire.compress.base import REGISTRY
from gradwire.compress.levels import GridCompressor, bucket_norms, wire_scales
from gradwire.compress.wire import work_dtype
from gradwire.spec import require

FORMATS = (1, 2)


def field_layout(levels: int) -> tuple[int, int]:
    """``(k, w)``: format 2 packs ``k`` radix-(2s+1) symbols in a ``w``-bit field. The fixed width
    ``(1, b)`` where it is within 5 % of ``log2(2s+1)``; else the smallest ``k`` within 3 %
    (w <= 36 for every s <= 127; a test checks every s)."""
    count = 2 * levels + 1
    limit = math.log2(count)
    bits = (count - 1).bit_length()
    if bits <= 1.05 * limit:
        return 1, bits
    k = next(k for k in range(2, 64) if (count**k - 1).bit_length() <= 1.03 * limit * k)
    return k, (count**k - 1).bit_length()


@REGISTRY.register(
    "qsgd",
    help="QSGD (Alistarh et al. 2017): per-bucket L2 norm + stochastic rounding to s levels",
    params={
        "levels": "number of levels s per sign, 1..127; a symbol takes about log2(2s+1) bits (ceil of it with "
                  "format=1)",
        "bucket": "elements per bucket B; one float32 norm per bucket (variance grows with B)",
        "format": "wire format: 2 (default) packs several symbols per field, within 5% of log2(2s+1) "
                  "bits; 1 = ceil(log2(2s+1)) bits per symbol (payloads of gradwire before format 2)",
    },
)
class QSGD(GridCompressor):
    """QSGD with ``levels`` = s and buckets of ``bucket`` = B elements; unbiased,
    ``omega = min(d/s^2, sqrt(d)/s)`` with ``d = min(B, n)``.

    The default s = 7 uses all but one of the 16 codes of a 4-bit symbol (same bytes in both formats).
    """

    name = "qsgd"

    def __init__(self, *, levels: int = 7, bucket: int = 512, format: int = 2):  # noqa: A002 - the spec key
        require(1 <= levels <= 127, f"levels must be in 1..127 (2*levels+1 symbols fit a byte), got {levels}")
        require(bucket >= 1, f"bucket must be >= 1, got {bucket}")
        require(format in FORMATS, f"format must be one of {', '.join(map(str, FORMATS))}, got {format}")
        self.levels, self.bucket, self.format = levels, bucket, format
        self.per_field, self.bits = field_layout(levels) if format == 2 else (1, (2 * levels).bit_length())
        if (self.per_field, self.bits) == (5, 8):  # s = 1: the base-3 layout, by its faster path
            self.per_field, self.bits = 1, None

    def omega(self, numel: int) -> float:
        d = min(self.bucket, numel)
        return min(d / self.levels**2, math.sqrt(d) / self.levels)

    def _bucket(self, n: int) -> int:
        return self.bucket

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        norms = bucket_norms(x, self.bucket, 2, work_dtype(x.dtype))
        return wire_scales(x, norms, self.bucket, 2, self.name)
