"""TernGrad: stochastic ternarization against the tensor's largest magnitude.

Wen, Xu, Yan, Wu, Wang, Chen, Li (2017), "TernGrad: Ternary gradients to reduce communication in
distributed deep learning", NeurIPS. The gradient ``g`` is sent as ``s_t * sign(g) * b`` with the
scaler ``s_t = max_j |g_j|`` and ``b_j ~ Bernoulli(|g_j| / s_t)``: unbiased. Their gradient
clipping first limits each ``|g_j|`` to ``c * sigma`` (``sigma``: standard deviation of the
elements of ``g``; ``c = 2.5`` in the paper), which shrinks the scaler and hence the variance, at
the price of a bias. ``clip=0`` disables clipping: TernGrad is then exactly DIANA's ``pquant``
with p = inf and one block of ``n`` elements (same bytes on the wire), with
``omega = (1 + sqrt(n))/2 - 1``.

Clipping needs no clipped copy of ``g``: with scaler ``min(max|g|, c*sigma)`` the rounding
probability of a clipped element is 1, which the grid core's clamp gives for free.

Wire format: ``[float32 scaler][n trits, base-3, 5 per byte]``: ``4 + ceil(n/5)`` bytes (1.6 bits
per element; an empty tensor still sends its 4-byte scaler, 0).
"""

from __future__ import annotations

import math

import torch

from gradwire.compress.base import REGISTRY, raise_non_finite
from gradwire.compress.levels import GridCompressor
from gradwire.compress.wire import centred_l2sq, reduce_f64, to_f32_up
from gradwire.spec import require


@REGISTRY.register(
    "terngrad",
    help="TernGrad (Wen et al. 2017): ternary {-1,0,1} times the max |x|, after optional clipping",
    params={"clip": "clip |x| at clip*std(x) before ternarizing (paper: 2.5); 0 disables clipping"},
)
class TernGrad(GridCompressor):
    """TernGrad; unbiased with ``omega = (sqrt(n) - 1)/2`` when ``clip=0``, biased (omega None)
    when clipping."""

    name = "terngrad"

    def __init__(self, *, clip: float = 2.5):
        require(math.isfinite(clip) and clip >= 0, f"clip must be a finite number >= 0, got {clip}")
        self.clip = clip
        self.unbiased = clip == 0

    def omega(self, numel: int) -> float | None:
        if self.clip:
            return None
        return (math.sqrt(numel) - 1) / 2 if numel else 0.0

    def _bucket(self, n: int) -> int:
        return max(n, 1)

    def _num_buckets(self, n: int) -> int:
        return 1

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        if n == 0:
            return torch.zeros(1, device=x.device)
        lo, hi = torch.aminmax(x)  # propagates NaN and shows +-inf: the finiteness check
        scaler = max(-float(lo), float(hi))
        if not math.isfinite(scaler):
            raise_non_finite(x, self.name)
        if self.clip > 0 and float(lo) != float(hi):  # a constant tensor has σ = 0: nothing to clip to
            sq = reduce_f64(x, "l2sq")
            if not math.isfinite(sq):  # a float32 row sum of squares overflowed
                sq = reduce_f64(x, "l2sq", torch.float64)
            mean = reduce_f64(x, "sum") / n
            variance = sq / n - mean * mean
            if mean * mean > 0.5 * sq / n:  # E[x²] - mean² cancels (x far from 0): sum (x - mean)² instead,
                mean = reduce_f64(x, "sum", torch.float64) / n  # about an exact mean (float32 rows' error would add)
                variance = centred_l2sq(x, mean) / n
            sigma = math.sqrt(max(variance, 0.0))
            if 0 < self.clip * sigma < scaler:
                scaler = self.clip * sigma
        out = to_f32_up(torch.tensor([scaler], dtype=torch.float64, device=x.device))  # it bounds every unclipped |x_j|
        if not math.isfinite(float(out)):
            raise ValueError(f"{self.name}: max |x| = {scaler:g} exceeds the float32 range of the scaler")
        return out
