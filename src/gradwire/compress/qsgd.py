"""QSGD: stochastic quantization of each bucket to ``s`` levels of its L2 norm.

Alistarh, Grubic, Li, Tomioka, Vojnovic (2017), "QSGD: Communication-efficient SGD via gradient
quantization and encoding", NeurIPS. Eq. (1)-(2) define
``Q_s(v)_i = ||v||_2 * sign(v_i) * xi_i``, with ``xi_i`` the stochastic rounding of ``s|v_i|/||v||_2``
to one of its two neighbouring integers, divided by ``s``. Lemma 3.1: ``Q_s`` is unbiased and
``E||Q_s(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2`` for ``v`` in R^d. Bucketing (Sec. 3 of the
paper) applies ``Q_s`` to buckets of ``B`` consecutive elements, so the bound holds with d = B
(or d = n when the whole tensor is smaller than one bucket).

Wire format (fixed width instead of the paper's Elias coding, so that encoding is a few vectorised
passes): ``[ceil(n/B) float32 bucket norms][n symbols q = s + level in 0..2s, b bits each]`` with
``b = ceil(log2(2s + 1))``, packed LSB first (see ``bitpack``). Size:
``4*ceil(n/B) + ceil(n*b/8)`` bytes.
"""

from __future__ import annotations

import math

import torch

from gradwire.compress.base import REGISTRY
from gradwire.compress.levels import GridCompressor, bucket_norms, wire_scales
from gradwire.compress.wire import work_dtype
from gradwire.spec import require


@REGISTRY.register(
    "qsgd",
    help="QSGD (Alistarh et al. 2017): per-bucket L2 norm + stochastic rounding to s levels",
    params={
        "levels": "number of levels s per sign, 1..127; a symbol takes ceil(log2(2s+1)) bits",
        "bucket": "elements per bucket B; one float32 norm per bucket (variance grows with B)",
    },
)
class QSGD(GridCompressor):
    """QSGD with ``levels`` = s and buckets of ``bucket`` = B elements; unbiased,
    ``omega = min(d/s^2, sqrt(d)/s)`` with ``d = min(B, n)``.

    The default s = 7 uses all but one of the 16 codes of a 4-bit symbol.
    """

    name = "qsgd"

    def __init__(self, *, levels: int = 7, bucket: int = 512):
        require(1 <= levels <= 127, f"levels must be in 1..127 (2*levels+1 symbols fit a byte), got {levels}")
        require(bucket >= 1, f"bucket must be >= 1, got {bucket}")
        self.levels, self.bucket = levels, bucket
        self.bits = (2 * levels).bit_length()  # = ceil(log2(2s + 1))

    def omega(self, numel: int) -> float:
        d = min(self.bucket, numel)
        return min(d / self.levels**2, math.sqrt(d) / self.levels)

    def _bucket(self, n: int) -> int:
        return self.bucket

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        norms = bucket_norms(x, self.bucket, 2, work_dtype(x.dtype))
        return wire_scales(x, norms, self.bucket, 2, self.name)
