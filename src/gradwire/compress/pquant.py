"""DIANA's p-norm quantization: random ternarization of each block against its p-norm.

Mishchenko, Gorbunov, Takac, Richtarik (2019), "Distributed learning with compressed gradient
differences". Per block ``x`` of ``d`` elements: ``Q(x)_j = ||x||_p * sign(x_j) * xi_j`` with
``xi_j ~ Bernoulli(|x_j| / ||x||_p)``, p in {1, 2, inf}. It is unbiased, and
``E||Q(x)||^2 = sum_j ||x||_p^2 |x_j| / ||x||_p = ||x||_1 ||x||_p``, so
``E||Q(x) - x||^2 = ||x||_1 ||x||_p - ||x||_2^2 <= (1/alpha_p(d) - 1) ||x||_2^2`` where
``alpha_p(d) = inf ||x||_2^2 / (||x||_1 ||x||_p)`` is the paper's constant:
``alpha_1 = 1/d``, ``alpha_2 = 1/sqrt(d)``, ``alpha_inf = 2/(1 + sqrt(d))``. Summing over blocks
gives ``omega = 1/alpha_p(B) - 1`` (``B`` capped by ``n``).

Wire format: ``[ceil(n/B) float32 block norms][n trits q = 1 + sign*xi, base-3, 5 per byte]``:
``4*ceil(n/B) + ceil(n/5)`` bytes, i.e. 1.6 bits per element plus 32 bits per block (the ternary
symbols make base-3 packing 20% smaller than 2-bit fields). Same core and format as TernGrad.
"""

from __future__ import annotations

import math

import torch

from gradwire.compress.base import REGISTRY
from gradwire.compress.levels import GridCompressor, bucket_norms, wire_scales
from gradwire.compress.wire import work_dtype
from gradwire.spec import require


def alpha(p: float, d: int) -> float:
    """DIANA's alpha_p(d) = inf over nonzero x in R^d of ||x||_2^2 / (||x||_1 ||x||_p)."""
    if p == 1:
        return 1 / d
    if p == 2:
        return 1 / math.sqrt(d)
    return 2 / (1 + math.sqrt(d))


@REGISTRY.register(
    "pquant",
    help="DIANA p-norm quantization (Mishchenko et al. 2019): ternary, one p-norm per block",
    params={"p": "norm: 1, 2 or inf", "block": "elements per block B; one float32 norm per block"},
)
class PQuant(GridCompressor):
    """p-norm ternary quantization per block; unbiased, ``omega = 1/alpha_p(min(B, n)) - 1``."""

    name = "pquant"

    def __init__(self, *, p: float = math.inf, block: int = 512):
        require(p in (1, 2, math.inf), f"p must be one of 1, 2, inf; got {p:g}")
        require(block >= 1, f"block must be >= 1, got {block}")
        self.p, self.block = float(p), block

    def omega(self, numel: int) -> float:
        d = min(self.block, numel)
        return 1 / alpha(self.p, d) - 1 if d else 0.0

    def _bucket(self, n: int) -> int:
        return self.block

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        norms = bucket_norms(x, self.block, self.p, work_dtype(x.dtype))
        return wire_scales(x, norms, self.block, self.p, self.name)
