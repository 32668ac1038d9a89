"""The system model: time per iteration against the number of workers m (Ernest).

Venkataraman, Yang, Franklin, Recht, Stoica, "Ernest: Efficient Performance Prediction for
Large-Scale Advanced Analytics", NSDI 2016, section 3.1: the time of an iteration is a
non-negative combination of terms that each describe one kind of cost,

    f(m) = θ0 + θ1·(s/m) + θ2·log m + θ3·m,        θ ≥ 0,

θ0 a fixed cost (serial work, per-step latency that does not grow with m), θ1·s/m work s shared
by m workers, θ2·log m a tree-shaped aggregation or the expected maximum of m workers' times (the
straggler tail: the maximum of m i.i.d. light-tailed times grows like log m), θ3·m all-to-one
communication (a parameter server's link, per-peer latency). θ is fitted by non-negative least
squares (``scipy.optimize.nnls``), which keeps every term a cost and so extrapolates to large m
without the sign flips an unconstrained fit makes.

One worker exchanges nothing: at m = 1 no collective runs (on the simulator, and a process group
of one on a real backend), so its step is compute alone and the times at m = 1, 2, 4 form a step
(e.g. 0.01, 0.41, 0.41 s on a slow ps network) that no θ ≥ 0 fits; fitted with it, the model
missed m = 8 by +78 %. So where at least 3 distinct m >= 2 were measured, m = 1 is left out of the
fit and its measured time is used as it is (``measured``); with fewer it stays in, and the fit's
relative error says how well the form holds (the planner warns beyond its target).

On gradwire's simulator ``--batch-size`` is per worker (weak scaling) and a worker's compute time
is the straggler model's ``compute_s`` whatever its batch, so s is constant and θ1·s/m only
matters when the work per worker really shrinks with m (the caller passes s, default 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

TERMS = ("1", "s/m", "log m", "m")


def features(workers, work: float = 1.0) -> np.ndarray:
    """The design matrix of Ernest's model: one row [1, s/m, log m, m] per worker count."""
    m = np.asarray(workers, dtype=np.float64).reshape(-1)
    return np.stack([np.ones_like(m), work / m, np.log(m), m], axis=1)


@dataclass(frozen=True)
class SystemModel:
    """f(m) = θ·[1, s/m, log m, m] with θ ≥ 0 (Ernest, NSDI 2016, eq. 1)."""

    theta: tuple[float, float, float, float]
    work: float = 1.0
    residual_rel: float = 0.0  # root-mean-square relative error of the fit on its own points
    measured: tuple[tuple[int, float], ...] = ()  # (m, seconds) left out of the fit, predicted as measured

    @classmethod
    def fit(cls, workers, seconds, work: float = 1.0, *, single_apart: bool = True) -> SystemModel:
        """NNLS on the measured seconds per iteration. Each row is divided by its measured time,
        so the fit minimises relative errors: a 10 ms step matters as much as a 10 s one, as a
        planner comparing ratios of times needs. Columns are scaled to unit norm for the solver's
        conditioning and θ is scaled back. ``single_apart``: m = 1 (no communication) is left out
        of the fit and kept as measured where 3 distinct m >= 2 remain (module docstring)."""
        workers = np.asarray(workers, dtype=np.float64).reshape(-1)
        y = np.asarray(seconds, dtype=np.float64).reshape(-1)
        if len(y) != len(workers) or not np.all(np.isfinite(y)) or np.any(y <= 0):
            raise ValueError(f"need one positive time per worker count, got {list(y)} for {list(workers)}")
        single = workers == 1
        if single_apart and single.any() and distinct_enough(workers[~single]):
            apart = ((1, float(np.mean(y[single]))),)
            return cls.fit(workers[~single], y[~single], work, single_apart=False).with_measured(apart)
        x = features(workers, work)
        a = x / y[:, None]
        norms = np.linalg.norm(a, axis=0)
        norms[norms == 0] = 1.0
        coef, _ = nnls(a / norms, np.ones_like(y))
        theta = coef / norms
        rel = float(np.sqrt(np.mean((x @ theta / y - 1.0) ** 2)))
        return cls(tuple(float(t) for t in theta), work, rel)

    def with_measured(self, measured) -> SystemModel:
        return SystemModel(self.theta, self.work, self.residual_rel, tuple(measured))

    def predict(self, workers) -> np.ndarray:
        out = features(workers, self.work) @ np.asarray(self.theta)
        m = np.asarray(workers, dtype=np.float64).reshape(-1)
        for w, t in self.measured:
            out[m == w] = t
        return out

    def __call__(self, m: float) -> float:
        return float(self.predict([m])[0])

    def describe(self) -> str:
        t0, t1, t2, t3 = self.theta
        text = f"f(m) = {t0:.4g} + {t1:.4g}·{self.work:g}/m + {t2:.4g}·log m + {t3:.4g}·m  (s)"
        if self.measured:
            text += "; " + ", ".join(f"m={w}: {t:.4g} s measured" for w, t in self.measured)
        return text

    def to_dict(self) -> dict:
        return {"theta": list(self.theta), "terms": list(TERMS), "work": self.work,
                "fit_rms_relative_error": self.residual_rel, "formula": self.describe(),
                "measured": {str(w): t for w, t in self.measured}}


def distinct_enough(workers) -> bool:
    """Whether the worker counts can pin down a fit: at least 3 distinct values (4 terms, θ ≥ 0;
    with 3 points NNLS picks one non-negative solution, with 4 or more the fit is determined)."""
    return len({int(m) for m in workers}) >= 3


def log2_grid(largest: int, extra=()) -> list[int]:
    """1, 2, 4, ... up to ``largest``, with ``largest`` itself and ``extra`` added."""
    grid = {2**k for k in range(int(math.log2(max(largest, 1))) + 1)} | {int(largest)} | {int(e) for e in extra}
    return sorted(m for m in grid if 1 <= m <= largest)
