"""How a data set is split between workers: iid, label skew, volume skew, or both.

Every partition returns one sorted int64 index tensor per worker; together they are disjoint and
cover every sample, and no worker is left empty (ConfigError naming the worker otherwise). The one
exception is ``shared``: every worker gets every sample (each still draws its own minibatch order).
Randomness comes from ``numpy.random.default_rng(seed)`` only, so a partition is a function of
(spec, labels, num_workers, seed). Built without a context (``PARTITIONS.build(spec)``, as the
config's validation does before a run folder is claimed), a partition checks its parameters and
returns None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gradwire.errors import ConfigError
from gradwire.spec import Registry, require

PARTITIONS = Registry("partition")


@dataclass(frozen=True)
class PartitionContext:
    labels: np.ndarray  # (n,) class label of every sample
    num_workers: int
    seed: int


def round_sizes(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to ``total`` nearest to ``total * weights / sum(weights)`` (largest remainder:
    each size is the ideal one rounded down or up, so ratios are exact up to one sample)."""
    ideal = total * np.asarray(weights, np.float64) / np.sum(weights)
    sizes = np.floor(ideal).astype(np.int64)
    order = np.argsort(-(ideal - sizes), kind="stable")
    sizes[order[: total - sizes.sum()]] += 1
    return sizes


def geometric_volumes(num_workers: int, skew: float) -> np.ndarray:
    """Relative volumes skew**(k / (K-1)), k = 0..K-1: geometric, largest/smallest = skew."""
    if num_workers == 1:
        return np.ones(1)
    return skew ** (np.arange(num_workers) / (num_workers - 1))


def _finish(parts: list[np.ndarray], n: int, remedy: str) -> list[torch.Tensor]:
    for k, part in enumerate(parts):
        if len(part) == 0:
            raise ValueError(f"worker {k} of {len(parts)} would get no data (of {n} samples); {remedy}")
    return [torch.from_numpy(np.sort(part).astype(np.int64)) for part in parts]


def _split(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(indices, np.cumsum(sizes)[:-1])


@PARTITIONS.register("iid", help="uniformly random split into nearly equal parts (sizes differ by <= 1)")
def iid(*, _ctx: PartitionContext | None = None) -> list[torch.Tensor] | None:
    if _ctx is None:  # built to validate the spec: no parameters to check
        return None
    n, k = len(_ctx.labels), _ctx.num_workers
    perm = np.random.default_rng(_ctx.seed).permutation(n)
    return _finish(np.array_split(perm, k), n, "use fewer workers")


@PARTITIONS.register("shared", help="no split: every worker samples the whole training set in its own order")
def shared(*, _ctx: PartitionContext | None = None) -> list[torch.Tensor] | None:
    """The setting of data-parallel training from one data set, as in the experiments of the EASGD
    and LSGD papers (each worker draws minibatches from all the data). A worker's running loss
    then measures the same objective as everyone's, which is what LSGD's leader election assumes."""
    if _ctx is None:
        return None
    everything = torch.arange(len(_ctx.labels), dtype=torch.int64)
    return [everything.clone() for _ in range(_ctx.num_workers)]


@PARTITIONS.register(
    "volumes",
    help="iid labels, geometric data volumes with largest/smallest = skew",
    params={"skew": "ratio of the largest to the smallest worker's sample count (>= 1; 1 = equal)"},
)
def volumes(*, skew: float = 10.0, _ctx: PartitionContext | None = None) -> list[torch.Tensor] | None:
    """Quantity skew: worker k gets a share proportional to skew**(k/(K-1)), rounded to integers
    that sum to the data set size (so largest/smallest = skew up to one sample of rounding)."""
    require(skew >= 1 and math.isfinite(skew), f"skew must be >= 1, got {skew}")
    if _ctx is None:
        return None
    n, k = len(_ctx.labels), _ctx.num_workers
    perm = np.random.default_rng(_ctx.seed).permutation(n)
    sizes = round_sizes(geometric_volumes(k, skew), n)
    return _finish(_split(perm, sizes), n, "use fewer workers or a smaller skew")


@PARTITIONS.register(
    "dirichlet",
    help="label skew: each class split over workers in Dir(alpha) proportions; optional volume skew",
    params={
        "alpha": "Dirichlet concentration (> 0): small = each worker sees few classes, large = iid",
        "skew": "largest/smallest volume ratio (>= 1), met exactly as in 'volumes'; 1 = as the label draws fall",
    },
)
def dirichlet(*, alpha: float = 0.5, skew: float = 1.0,
              _ctx: PartitionContext | None = None) -> list[torch.Tensor] | None:
    """Label-skewed split. For each class c, draw q_c ~ Dir(alpha * 1_K) and give worker k a share
    of class c's samples proportional to q_c[k].

    With skew = 1 this is the per-class Dirichlet split of Yurochkin et al. (2019, "Bayesian
    nonparametric federated learning of neural networks") and Wang et al. (2020, FedMA), the usual
    implementation of the label skew studied by Hsu et al. (2019, "Measuring the effects of
    non-identical data distribution", who draw a class distribution per client instead); the
    workers' volumes are then whatever the draws give.

    With skew > 1 the volumes are fixed first, exactly as in 'volumes' (worker k gets
    round(n · v_k / sum(v)) samples, largest/smallest = skew up to a sample of rounding, whatever
    alpha), and the Dirichlet draws set the label mixture within them: the class-by-worker table
    q_c[k] · |c| is scaled to the class sizes and the worker sizes by iterative proportional fitting
    (Deming and Stephan, "On a least squares adjustment of a sampled frequency table when the
    expected marginal totals are known", Ann. Math. Statist. 1940), which keeps its cross-product
    ratios, the label skew, and changes only the margins; it is rounded class by class and the few
    samples rounding leaves over are moved where the fitted table wants them. A worker the draws
    give less than one sample (tiny alpha) is refused, as with skew = 1. (Weighting q_c by the
    volumes, as before, met the volumes only on average over the draws, and not as alpha -> 0: with
    skew 10, largest/smallest came out 6.4 at alpha = 1 and 2.0 at alpha = 0.1, 200 seeds.)
    Every sample goes to exactly one worker in both cases.
    """
    require(alpha > 0 and math.isfinite(alpha), f"alpha must be > 0, got {alpha}")
    require(skew >= 1 and math.isfinite(skew), f"skew must be >= 1, got {skew}")
    if _ctx is None:
        return None
    labels, k = _ctx.labels, _ctx.num_workers
    rng = np.random.default_rng(_ctx.seed)
    classes = np.unique(labels)
    members, shares = [], []
    for c in classes:
        members.append(rng.permutation(np.flatnonzero(labels == c)))
        share = rng.dirichlet(np.full(k, alpha))
        if not np.isfinite(share).all() or share.sum() <= 0:  # all gammas underflowed (tiny alpha)
            share = np.eye(k)[rng.integers(k)]
        shares.append(share)
    remedy = "use fewer workers, a larger alpha" + (" or a smaller skew" if skew > 1 else "")
    if skew == 1:  # the standard split: volumes free
        counts = [round_sizes(q, len(idx)) for q, idx in zip(shares, members, strict=True)]
    else:
        sizes = round_sizes(geometric_volumes(k, skew), len(labels))
        # a worker the label draws give less than one sample has no label mixture to scale up: refused
        # as with skew = 1 (it would get no data there), as is a volume that rounds to nothing
        drawn = np.array(shares).T @ np.array([len(m) for m in members])
        empty = np.flatnonzero((sizes == 0) | (drawn < 0.5))
        if len(empty):
            raise ValueError(f"worker {int(empty[0])} of {k} would get no data (of {len(labels)} samples); {remedy}")
        counts = _fit_table(np.array(shares), np.array([len(m) for m in members]), sizes)
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for idx, cnt in zip(members, counts, strict=True):
        for part, chunk in zip(parts, _split(idx, np.asarray(cnt)), strict=True):
            part.append(chunk)
    return _finish([np.concatenate(p) for p in parts], len(labels), remedy)


def _fit_table(shares: np.ndarray, class_sizes: np.ndarray, worker_sizes: np.ndarray) -> np.ndarray:
    """Integer class-by-worker counts with row sums ``class_sizes`` and column sums ``worker_sizes``
    nearest (in the sense of iterative proportional fitting) to ``shares[c] * class_sizes[c]``."""
    table = shares * class_sizes[:, None] + 1e-300  # > 0 everywhere: IPF divides by the sums
    for _ in range(10_000):
        table *= (class_sizes / table.sum(axis=1))[:, None]
        col = table.sum(axis=0)
        table *= worker_sizes / col
        if np.abs(table.sum(axis=1) - class_sizes).max() < 1e-6:
            break
    counts = np.array([round_sizes(row, int(n)) if n else np.zeros(len(row), np.int64)
                       for row, n in zip(table, class_sizes, strict=True)])
    while True:  # rounding by rows leaves columns off by a few samples: move them where table wants them
        excess = counts.sum(axis=0) - worker_sizes
        if not excess.any():
            return counts
        over, under = int(np.argmax(excess)), int(np.argmin(excess))
        gain = (counts[:, over] - table[:, over]) - (counts[:, under] - table[:, under])
        gain[counts[:, over] == 0] = -np.inf
        c = int(np.argmax(gain))
        counts[c, over] -= 1
        counts[c, under] += 1


def build_partition(spec: str, *, labels: torch.Tensor, num_workers: int, seed: int) -> list[torch.Tensor]:
    """Split the samples with class ``labels`` between ``num_workers`` workers as ``spec`` says.

    Returns one int64 index tensor per worker (sorted, disjoint, covering all samples). Raises
    ConfigError for bad parameters or when a worker would get no data.
    """
    if num_workers < 1:
        raise ConfigError(f"num_workers must be >= 1, got {num_workers}")
    if not 0 <= seed < 2**63:  # numpy's default_rng would blame the partition spec for it
        raise ConfigError(f"seed={seed} must be an integer in [0, 2**63) (--seed)")
    labels_np = torch.as_tensor(labels).detach().cpu().numpy()
    if labels_np.ndim != 1:
        raise ConfigError(f"partition needs a 1-D tensor of labels, got shape {tuple(labels_np.shape)}")
    ctx = PartitionContext(labels=labels_np, num_workers=num_workers, seed=seed)
    return PARTITIONS.build(spec, _ctx=ctx)
