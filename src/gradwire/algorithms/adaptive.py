"""What the data-aware algorithms (``dagc``, ``dqsgd``) share.

* :func:`data_shares`: each worker's share p_i = n_i / Σ n_j of the training samples, computed from
  ``ctx.shard_sizes``, which every rank knows, so all ranks derive the same numbers without talking.
* :func:`weighted_gather`: the FedAvg aggregate Σ_i p_i · decode(buffer_i) (McMahan, Moore, Ramage,
  Hampson, Agüera y Arcas 2017, "Communication-efficient learning of deep networks from
  decentralized data", Algorithm 1, where client updates are weighted by n_k/n). ``Averager.mean`` takes
  the plain mean, which over-weights small workers when volumes differ; the p-weighted sum is the
  gradient of the loss averaged over all samples.
* :func:`budgeted_counts`: integers proportional to weights, each within [lo, hi], summing exactly to
  a total (DAGC's per-worker top-k counts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from gradwire.spec import require


def data_shares(shard_sizes: Sequence[int], world_size: int, who: str) -> np.ndarray:
    """p_i = n_i / Σ n_j (float64). ValueError when the sizes are missing or a worker has no data:
    a data-aware algorithm cannot weight a worker that holds nothing."""
    sizes = [int(n) for n in shard_sizes]
    require(len(sizes) == world_size,
            f"{who} weights workers by their data, but the run gave {len(sizes)} shard sizes for "
            f"{world_size} workers")
    empty = [r for r, n in enumerate(sizes) if n <= 0]
    require(not empty, f"{who}: worker {empty[0] if empty else -1} holds no training data "
            f"(shard sizes {sizes}); use a partition that gives every worker samples")
    total = float(sum(sizes))
    return np.array([n / total for n in sizes], dtype=np.float64)


Buffers = dict[int, torch.Tensor]


def weighted_gather(ctx, buffers: Buffers, decode: Callable[[int, torch.Tensor], torch.Tensor],
                    shares: np.ndarray, like: torch.Tensor, size: int | None = None) -> tuple[torch.Tensor, Buffers]:
    """Allgather the local workers' uint8 buffers; return Σ_i p_i · decode(i, buffer_i) over all
    workers, summed in rank order (so every rank, on either backend, computes the same tensor), and
    the gathered buffers. ``size``: every buffer's length, when all are equal and known in advance."""
    gathered = ctx.transport.allgather(buffers, size=size)
    total = torch.zeros_like(like)
    for r in sorted(gathered):
        total.add_(decode(r, gathered[r]), alpha=float(shares[r]))
    return total, gathered


def budgeted_counts(weights: np.ndarray, total: int, lo: int, hi: int) -> np.ndarray:
    """Integers k_i with lo <= k_i <= hi and Σ k_i == total, as near as possible to clip(c·w_i, lo, hi)
    with c chosen so that the real-valued sum is ``total`` (water-filling: a capped worker's excess
    is shared by the others in proportion to their weights).

    The real solution is rounded by the largest-remainder rule (floors, then +1 in order of the
    largest fractional parts, ties by rank), which keeps the order of the weights: w_i > w_j implies
    k_i >= k_j. Needs positive weights and len(w)*lo <= total <= len(w)*hi.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    require(n >= 1 and bool((w > 0).all() and np.isfinite(w).all()), f"weights must be positive, got {w}")
    require(n * lo <= total <= n * hi, f"total {total} outside [{n * lo}, {n * hi}] for {n} workers")
    ideal = np.clip(_water_level(w, total, lo, hi) * w, lo, hi)
    k = np.floor(ideal).astype(np.int64)
    while k.sum() != total:  # float error leaves |deficit| < n: one pass, rarely two
        up = k.sum() < total
        order = np.argsort(-(ideal - k) if up else (ideal - k), kind="stable")
        for r in order:
            if k.sum() == total:
                break
            if up and k[r] < hi:
                k[r] += 1
            elif not up and k[r] > lo:
                k[r] -= 1
    return k


def _water_level(w: np.ndarray, total: float, lo: float, hi: float) -> float:
    """The c with Σ clip(c·w_i, lo, hi) = total. The sum is continuous, nondecreasing and linear
    between the breakpoints lo/w_i and hi/w_i, so interpolate between the two that bracket total."""
    points = np.unique(np.concatenate([lo / w, hi / w]))
    sums = np.array([np.clip(c * w, lo, hi).sum() for c in points])
    j = int(np.searchsorted(sums, total))
    if j == 0:
        return float(points[0])
    if j == len(points):
        return float(points[-1])
    c0, c1, s0, s1 = points[j - 1], points[j], sums[j - 1], sums[j]
    return float(c0 + (c1 - c0) * (total - s0) / (s1 - s0))
