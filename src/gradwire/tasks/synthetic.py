"""Synthetic binary logistic regression with a known optimum and tunable worker heterogeneity.

Objective (w in R^dim, labels y in {0,1}, s = 2y - 1):

    F(w) = 1/n sum_i log(1 + exp(-s_i <x_i, w>)) + l2/2 ||w||^2 + l1 ||w||_1

Data: worker k draws x ~ N(hetero * mu_k, I) with mu_k a random unit vector, and every worker
labels with the same ground truth, P(y=1 | x) = sigmoid(<x, w_true>), ||w_true|| = 2. The
Bernoulli label noise keeps the data non-separable (for n >> dim), so F has a finite, well
conditioned minimum even without l2; hetero = 0 makes the workers iid. Heterogeneity is a
covariate shift (and, through <mu_k, w_true>, a label-balance shift) between workers.

F* is computed in float64 to the last digits: damped Newton for l1 = 0; for l1 > 0, FISTA with
adaptive restart (Beck & Teboulle 2009; O'Donoghue & Candes 2015) until the support is found, then
Newton on the support with fixed signs (a proximal-Newton polish), accepted only if the
prox-gradient mapping ||w - soft(w - grad f(w), l1)|| falls below 1e-12.
"""

from __future__ import annotations

import math
import warnings
from functools import partial

import numpy as np
import torch

from gradwire.spec import require
from gradwire.tasks.base import TASKS, Task, TaskContext, logistic
from gradwire.tasks.models import mlp

TOL = 1e-12  # gradient / prox-gradient-mapping norm at the returned optimum
W_TRUE_NORM = 2.0  # ||w_true||: Bayes error ~ 0.2, far from separable


def expit(z: np.ndarray) -> np.ndarray:
    """The logistic function, scipy's: imported here, not at the top, so that a process that builds no
    synthetic task does not pay scipy's 0.3 s of import."""
    from scipy.special import expit as logistic_function

    return logistic_function(z)


def _smooth(X: np.ndarray, s: np.ndarray, w: np.ndarray, l2: float, hess: bool = False):
    """Value, gradient (and Hessian) of the smooth part f(w) = mean logistic loss + l2/2 ||w||^2."""
    m = s * (X @ w)
    f = float(np.logaddexp(0.0, -m).mean() + 0.5 * l2 * w @ w)
    p = expit(-m)  # = -d/dm log(1 + exp(-m))
    g = -(X.T @ (s * p)) / len(s) + l2 * w
    if not hess:
        return f, g, None
    H = (X.T * (p * (1.0 - p))) @ X / len(s) + l2 * np.eye(len(w))
    return f, g, H


def _soft(v: np.ndarray, t: float) -> np.ndarray:
    """prox of t*||.||_1: soft thresholding."""
    return np.sign(v) * np.maximum(np.abs(v) - t, 0.0)


def prox_grad_norm(X: np.ndarray, s: np.ndarray, w: np.ndarray, l2: float, l1: float) -> float:
    """||w - prox_{l1}(w - grad f(w))||: zero exactly at the minimiser; ||grad f|| when l1 = 0."""
    _, g, _ = _smooth(X, s, w, l2)
    return float(np.linalg.norm(w - _soft(w - g, l1)))


def _newton(X, s, w, support, l2, l1, max_iter=100):
    """Damped Newton on f(w) + l1 <sign(w_S), w_S> over the coordinates in ``support`` (others 0).

    With l1 = 0 and the full support this is plain Newton on F, globally convergent by the Armijo
    backtracking; near the optimum full steps are taken so the last iterations are quadratic.
    """
    w = w.copy()
    sign = np.sign(w[support])
    polish = 0
    for _ in range(max_iter):
        f, g, H = _smooth(X, s, w, l2, hess=True)
        gs = g[support] + l1 * sign
        if np.linalg.norm(gs) < TOL:
            polish += 1  # a few more full steps push the gradient down to rounding level
            if polish > 2:
                break
        d = -np.linalg.solve(H[np.ix_(support, support)], gs)
        decrement = -float(gs @ d)
        if decrement < 1e-12:  # quadratic region: F differences are below rounding, take the step
            w[support] += d
            continue
        phi0, t = f + l1 * float(sign @ w[support]), 1.0
        while t > 1e-10:
            trial = w.copy()
            trial[support] += t * d
            phi = _smooth(X, s, trial, l2)[0] + l1 * float(sign @ trial[support])
            if phi <= phi0 - 1e-4 * t * decrement:
                break
            t /= 2
        w = trial
    return w


def _fista(X, s, w, l2, l1, step, iters):
    """``iters`` steps of FISTA with gradient-based adaptive restart (O'Donoghue & Candes 2015)."""
    y, theta = w.copy(), 1.0
    for _ in range(iters):
        w_new = _soft(y - step * _smooth(X, s, y, l2)[1], step * l1)
        theta_new = (1.0 + math.sqrt(1.0 + 4.0 * theta * theta)) / 2.0
        if float((y - w_new) @ (w_new - w)) > 0:  # momentum points uphill: restart it
            theta_new, y = 1.0, w_new.copy()
        else:
            y = w_new + ((theta - 1.0) / theta_new) * (w_new - w)
        w, theta = w_new, theta_new
    return w


def separable(X: np.ndarray, s: np.ndarray) -> bool:
    """Is there w with s_i <x_i, w> >= 1 for all i? Then the unregularised loss has infimum 0 and no
    minimiser (Albert & Anderson 1984); an LP feasibility problem."""
    from scipy.optimize import linprog  # here, not at the top: it costs every process 0.6 s of import

    res = linprog(np.zeros(X.shape[1]), A_ub=-(s[:, None] * X), b_ub=-np.ones(len(s)), bounds=(None, None))
    return res.status == 0


def solve_logreg(X: np.ndarray, y: np.ndarray, *, l2: float, l1: float, max_iter: int = 200_000):
    """Minimise F in float64; returns (w_star, prox-gradient-mapping norm at w_star)."""
    X, s = np.asarray(X, np.float64), 2.0 * np.asarray(y, np.float64) - 1.0
    w = np.zeros(X.shape[1])
    if l1 == 0:
        w = _newton(X, s, w, np.ones(len(w), bool), l2, 0.0)
        gap = prox_grad_norm(X, s, w, l2, 0.0)
        # On separable data Newton drives F to ~0 along a diverging w; the LP is slow on big data,
        # so run it only when F* is suspiciously small or Newton did not converge.
        suspicious = not gap < TOL or _smooth(X, s, w, l2)[0] < 1e-2
        if l2 == 0 and suspicious and separable(X, s):
            raise ValueError("the training data are linearly separable, so F has no minimiser: use l2 > 0, "
                             "l1 > 0 or more samples")
        return w, gap
    step = 1.0 / (np.linalg.eigvalsh(X.T @ X / len(s))[-1] / 4.0 + l2)  # 1/L: sigmoid' <= 1/4
    target, done = 1e-6, 0
    while done < max_iter:
        w = _fista(X, s, w, l2, l1, step, 50)
        done += 50
        gap = prox_grad_norm(X, s, w, l2, l1)
        if gap < TOL:
            return w, gap
        if gap < target:  # support probably identified: try to finish with Newton on it
            target /= 100
            support = w != 0
            if support.any():
                polished = _newton(X, s, w, support, l2, l1)
                polished_gap = prox_grad_norm(X, s, polished, l2, l1)
                if polished_gap < TOL:
                    return polished, polished_gap
    return w, gap


@TASKS.register(
    "synthetic-logreg",
    help="binary logistic regression, l2/l1-regularised, known F*; workers' features shifted by hetero",
    params={
        "samples": "training samples in total (split n // k or one more per worker; all used whatever k)",
        "dim": "number of features (= parameters, no bias)",
        "l2": "weight of (l2/2)||w||^2",
        "l1": "weight of l1*||w||_1 (handled by the proximal step)",
        "hetero": "shift of each worker's feature mean (0 = iid workers)",
        "test_samples": "test samples, drawn from the mixture of the workers' distributions",
    },
)
def synthetic_logreg(
    *, samples: int = 2000, dim: int = 20, l2: float = 0.01, l1: float = 0.0, hetero: float = 1.0,
    test_samples: int = 1000, _ctx: TaskContext,
) -> Task | None:
    k = _ctx.num_workers
    require(dim >= 1, f"dim must be >= 1, got {dim}")
    require(samples >= k, f"samples={samples} < {k} workers: every worker needs at least one sample")
    require(l2 >= 0 and math.isfinite(l2), f"l2 must be >= 0, got {l2}")
    require(l1 >= 0 and math.isfinite(l1), f"l1 must be >= 0, got {l1}")
    require(hetero >= 0 and math.isfinite(hetero), f"hetero must be >= 0, got {hetero}")
    require(test_samples >= 1, f"test_samples must be >= 1, got {test_samples}")
    if _ctx.check_only:
        return None

    # What depends on the worker count k draws from streams of its own, so the main stream (w_true,
    # every sample's noise and label draw) is the same for every k: with hetero = 0 the data set is
    # the same at every k, and with hetero > 0 only the shifts hetero * mu_k differ (worker j's mu_j
    # is the same whatever k). The data at k = 1 are those of the earlier one-stream version.
    rng = np.random.default_rng(_ctx.seed)
    w_true = rng.standard_normal(dim)
    w_true *= W_TRUE_NORM / np.linalg.norm(w_true)
    mu = np.concatenate([rng.standard_normal((1, dim)),
                         np.random.default_rng([_ctx.seed, 1]).standard_normal((k - 1, dim))])
    mu /= np.linalg.norm(mu, axis=1, keepdims=True)

    def draw(component: np.ndarray):
        x = rng.standard_normal((len(component), dim)) + hetero * mu[component]
        # round to the task dtype first, so F* is the minimum over the data the run will see
        x = torch.from_numpy(x).to(_ctx.dtype)
        y = rng.random(len(component)) < expit(x.double().numpy() @ w_true)
        return x, torch.from_numpy(y.astype(np.int64))

    sizes = [len(part) for part in np.array_split(np.arange(samples), k)]  # n // k or one more each
    x_train, y_train = draw(np.repeat(np.arange(k), sizes))
    x_test, y_test = draw(np.random.default_rng([_ctx.seed, 2]).integers(k, size=test_samples))

    w_star, gap = solve_logreg(x_train.double().numpy(), y_train.numpy(), l2=l2, l1=l1)
    if not np.all(np.isfinite(w_star)) or not gap < 1e-9:
        raise ValueError(f"could not find the minimiser (prox-gradient norm {gap:.1e}): use a larger l2")
    if gap >= TOL:
        warnings.warn(f"synthetic-logreg: F* only accurate to a prox-gradient norm of {gap:.1e}",
                      stacklevel=2)

    task = Task(
        name="synthetic-logreg", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        num_classes=2, model_fn=partial(mlp, sizes=(dim, 1), dtype=_ctx.dtype, bias=False),
        loss_fn=logistic, l2=l2, l1=l1,
        worker_indices=list(torch.arange(samples).split(sizes)),
        w_star=torch.from_numpy(w_star),
    )
    # F* through the same code path as Task.objective, so objective(w_star) - f_star == 0 exactly.
    model = mlp(torch.Generator(), sizes=(dim, 1), dtype=torch.float64, bias=False)
    with torch.no_grad():
        model[0].weight.copy_(task.w_star.view(1, dim))
    task.f_star = task.objective(model)
    return task
