"""Straggler models: each worker's compute time for each of its steps, drawn from the seed.

A draw depends only on (seed, worker, the worker's own step count), so it is the same whatever
order the simulator (or a real process) asks in, and after a resume.
"""

from __future__ import annotations

import numpy as np

from gradwire.seeding import hash_seed
from gradwire.spec import Registry, Specced, require

STRAGGLERS = Registry("straggler model")
FROM_RUN = ("seed",)  # the run passes its seed when it builds a model: not part of the model's spec


class Stragglers(Specced):
    name = "?"

    def __init__(self, *, compute_s: float, seed: int = 0):
        require(compute_s > 0, f"compute_s must be > 0, got {compute_s}")
        self.compute_s, self.seed = compute_s, seed

    def _rng(self, worker: int, step: int) -> np.random.Generator:
        return np.random.default_rng(hash_seed(self.seed, "straggler", worker, step))

    def time(self, worker: int, step: int) -> float:
        return self.compute_s * self.factor(worker, step)

    def factor(self, worker: int, step: int) -> float:
        raise NotImplementedError

    def times(self, num_workers: int, step: int) -> np.ndarray:
        return np.array([self.time(w, step) for w in range(num_workers)])


@STRAGGLERS.register("none", help="every worker takes exactly compute_s per step",
                     params={"compute_s": "seconds per step"}, context=FROM_RUN)
class NoStragglers(Stragglers):
    name = "none"

    def __init__(self, *, compute_s: float = 0.05, seed: int = 0):
        super().__init__(compute_s=compute_s, seed=seed)

    def factor(self, worker, step):
        return 1.0


@STRAGGLERS.register("lognormal", help="compute_s times a log-normal factor exp(sigma·Z - sigma²/2) (mean 1)",
                     params={"sigma": "log-space standard deviation", "compute_s": "mean seconds per step"},
                     context=FROM_RUN)
class LogNormal(Stragglers):
    name = "lognormal"

    def __init__(self, *, sigma: float = 0.5, compute_s: float = 0.05, seed: int = 0):
        super().__init__(compute_s=compute_s, seed=seed)
        require(sigma >= 0, f"sigma must be >= 0, got {sigma}")
        self.sigma = sigma

    def factor(self, worker, step):
        z = self._rng(worker, step).standard_normal()
        return float(np.exp(self.sigma * z - 0.5 * self.sigma**2))


@STRAGGLERS.register("tail", help="heavy tail: with probability p a step is slowdown times longer",
                     params={"p": "probability of a slow step", "slowdown": "factor of a slow step",
                             "compute_s": "seconds per normal step"}, context=FROM_RUN)
class Tail(Stragglers):
    name = "tail"

    def __init__(self, *, p: float = 0.05, slowdown: float = 10.0, compute_s: float = 0.05, seed: int = 0):
        super().__init__(compute_s=compute_s, seed=seed)
        require(0 <= p <= 1, f"p must be in [0, 1], got {p}")
        require(slowdown >= 1, f"slowdown must be >= 1, got {slowdown}")
        self.p, self.slowdown = p, slowdown

    def factor(self, worker, step):
        return self.slowdown if self._rng(worker, step).random() < self.p else 1.0


@STRAGGLERS.register("slow", help="persistent stragglers: the first `count` workers are always slowdown times slower",
                     params={"count": "how many workers (the lowest ranks) are slow", "slowdown": "their factor",
                             "compute_s": "seconds per step of the other workers"}, context=FROM_RUN)
class Slow(Stragglers):
    """A heterogeneous cluster (older machines, a shared node): the same workers are slow at every
    step, which is what the asynchronous variants exploit (fast workers take more local steps)."""

    name = "slow"

    def __init__(self, *, count: int = 1, slowdown: float = 3.0, compute_s: float = 0.05, seed: int = 0):
        super().__init__(compute_s=compute_s, seed=seed)
        require(count >= 0, f"count must be >= 0, got {count}")
        require(slowdown >= 1, f"slowdown must be >= 1, got {slowdown}")
        self.count, self.slowdown = count, slowdown

    def factor(self, worker, step):
        return self.slowdown if worker < self.count else 1.0
