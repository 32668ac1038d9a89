"""The convergence model: the training objective after i iterations on m workers.

Hemingway (Pan, Venkataraman, Tai, Gonzalez, 2017) fits a model g(i, m) of the loss per algorithm
from short runs and combines it with Ernest's time per iteration. Its exact form is not reproduced
here; ours comes from the standard bound of SGD with a constant step size γ on an L-smooth convex
objective, whose stochastic gradients (a mean over m workers' minibatches) have variance σ²/m
(e.g. Bottou, Curtis, Nocedal, "Optimization Methods for Large-Scale Machine Learning", SIAM
Review 2018, Theorem 4.6; Dekel et al., JMLR 2012, for the 1/m of minibatch averaging):

    E f(x̄_i) - f*  ≤  ‖x0 - x*‖² / (2γ i)  +  γσ² / (2m).

That is a transient that decays with i and a noise floor that falls like 1/m. We keep both, let
the transient decay at a fitted rate i^-p (p = 1 in the bound; linear convergence phases, momentum
and compression change it) and let the noise also slow the transient (Dekel's minibatch bound has
a σ/√(m·i) term):

    g(i, m) = a + d/m + (b + c/m) · i^-p,        a, b, c, d ≥ 0,  p > 0.

a is the loss the algorithm approaches with infinitely many workers (f* plus whatever bias a
compressor or local steps leave), d/m the noise floor. For a fixed p the model is linear in
(a, d, b, c), so the fit is a grid over p with non-negative least squares inside (variable
projection), on relative residuals (each row divided by its measured loss, so the late, small
losses that decide when a target is reached weigh as much as the first ones). Non-negativity
makes g fall with both i and m, so the iterations to a target ε have a closed form:

    i(ε, m) = ((b + c/m) / (ε - a - d/m))^(1/p)    when ε > a + d/m, else unreachable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

EXPONENTS = np.geomspace(0.05, 3.0, 81)  # the grid over p


def _design(iterations, workers, p: float) -> np.ndarray:
    i = np.asarray(iterations, dtype=np.float64)
    m = np.asarray(workers, dtype=np.float64)
    decay = i ** -p
    return np.stack([np.ones_like(i), 1.0 / m, decay, decay / m], axis=1)


@dataclass(frozen=True)
class ConvergenceModel:
    """g(i, m) = a + d/m + (b + c/m)·i^-p."""

    a: float
    d: float
    b: float
    c: float
    p: float
    residual_rel: float = 0.0  # root-mean-square relative error of the fit on its own points

    @classmethod
    def fit(cls, iterations, workers, losses) -> ConvergenceModel:
        """Fit on (iteration, workers, loss) triples with iteration >= 1 and loss > 0."""
        i = np.asarray(iterations, dtype=np.float64)
        m = np.asarray(workers, dtype=np.float64)
        y = np.asarray(losses, dtype=np.float64)
        keep = (i >= 1) & np.isfinite(y) & (y > 0)
        i, m, y = i[keep], m[keep], y[keep]
        if len(y) < 5:
            raise ValueError(f"the convergence model needs at least 5 evaluated points, got {len(y)}")
        best = None
        for p in EXPONENTS:
            x = _design(i, m, p) / y[:, None]
            norms = np.linalg.norm(x, axis=0)
            coef, res = nnls(x / norms, np.ones_like(y))
            if best is None or res < best[0]:
                best = (res, float(p), coef / norms)
        res, p, (a, d, b, c) = best
        return cls(float(a), float(d), float(b), float(c), p, float(res / math.sqrt(len(y))))

    def loss(self, i, m) -> np.ndarray:
        i = np.asarray(i, dtype=np.float64)
        return self.a + self.d / m + (self.b + self.c / m) * i ** -self.p

    def floor(self, m: float) -> float:
        """The loss approached as i grows: a + d/m."""
        return self.a + self.d / m

    def iterations_to(self, target: float, m: float) -> float:
        """Iterations (a real number, >= 1) until g(i, m) <= target; inf when the floor is above it."""
        gap = target - self.floor(m)
        if gap <= 0:
            return math.inf
        scale = self.b + self.c / m
        if scale <= 0:
            return 1.0
        return max(1.0, (scale / gap) ** (1.0 / self.p))

    def describe(self) -> str:
        return (f"g(i, m) = {self.a:.4g} + {self.d:.4g}/m + ({self.b:.4g} + {self.c:.4g}/m)·i^-{self.p:.3g}")

    def to_dict(self) -> dict:
        return {"a": self.a, "d": self.d, "b": self.b, "c": self.c, "p": self.p,
                "fit_rms_relative_error": self.residual_rel, "formula": self.describe()}


def crossing(records: list[dict], target: float, metric: str, x_key: str = "sim_time_s"):
    """Where a run's evaluations first reach ``target``: (step, x) interpolated linearly in log loss
    between the last evaluation above the target and the first at or below it; None if never."""
    prev = None
    for rec in records:
        v = rec.get(metric)
        if v is None or not math.isfinite(v):
            continue
        if v <= target:
            if prev is None or prev[0] <= 0 or v <= 0:
                return float(rec["step"]), float(rec[x_key])
            lo, hi = math.log(v), math.log(prev[0])
            t = (hi - math.log(target)) / (hi - lo) if hi > lo else 1.0
            return (prev[1]["step"] + t * (rec["step"] - prev[1]["step"]),
                    prev[1][x_key] + t * (rec[x_key] - prev[1][x_key]))
        prev = (v, rec)
    return None
