"""Which profiling runs to make: Ernest's optimal experimental design, greedily, under a cost budget.

Ernest (Venkataraman et al., NSDI 2016, section 3.2) picks the training runs that make the fit of
θ most precise for their cost: with x(m) the feature row of a run at m workers (system_model.py)
and λ_m ∈ {0, 1} whether it is made, it minimises the A-optimality criterion
tr((Σ λ_m x(m) x(m)ᵀ)⁻¹), the summed variance of the least-squares θ, subject to
Σ λ_m cost(m) ≤ budget. Ernest solves the convex relaxation (λ ∈ [0, 1]) and rounds; with the
handful of candidate m a planner offers we take the greedy version of the same criterion instead:
start from the cheapest run (the pilot, which also measures what a run costs), then repeatedly add
the candidate m with the largest drop of tr(M⁻¹) per second of cost that still fits in the
budget, the criterion on the features scaled to unit columns (each divided by its largest value over
the candidates: the choice does not depend on the units of s). Without a budget every candidate is run.

Cost here is the wall-clock time of a profiling run, whatever the backend: on the simulator the
wall time of a run grows like m·steps (every simulated worker computes its gradient), and the
simulated seconds it represents are not what the user waits for. The pilot gives both parts of
``cost(m) = setup + m·steps·per_worker_step``: the wall time of its steps (metrics.jsonl) per
worker-step, and the rest of its wall time (building, evaluating, writing) as the setup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gradwire.plan.system_model import features

RIDGE = 1e-6  # keeps M invertible before it has 4 independent rows


@dataclass(frozen=True)
class RunCost:
    """A candidate's measured cost of a profiling run: setup seconds plus seconds per worker-step."""

    setup_s: float
    per_worker_step_s: float

    def __call__(self, workers: int, steps: int) -> float:
        return self.setup_s + workers * steps * self.per_worker_step_s

    @classmethod
    def from_pilot(cls, wall_s: float, steps_wall_s: float, workers: int, steps: int) -> RunCost:
        """From a pilot run's total wall time and the wall time of its steps alone (``steps_wall``):
        the steps are what grows like m·steps; everything else (building the task and model, the
        evaluations, the summary and plots) is paid once per run, whatever m, and is the setup."""
        steps_wall_s = max(0.0, min(steps_wall_s, wall_s))
        return cls(wall_s - steps_wall_s, max(steps_wall_s, 1e-9) / (workers * steps))


def steps_wall(records: list[dict]) -> float:
    """Wall seconds a run spent in its steps, from its metrics.jsonl: the wall time between its
    first and last evaluation less the evaluations in between (each row's ``wall_time_s`` is taken
    before its evaluation, and ``eval_time_s`` sums the evaluations before it)."""
    if len(records) < 2:
        return 0.0
    first, last = records[0], records[-1]
    return max(0.0, (last["wall_time_s"] - last["eval_time_s"]) - (first["wall_time_s"] - first["eval_time_s"]))


def a_criterion(rows: np.ndarray) -> float:
    """tr(M⁻¹), M = Σ x xᵀ (+ a small ridge), for feature rows already scaled to unit columns."""
    m = rows.T @ rows + RIDGE * np.eye(rows.shape[1])
    return float(np.trace(np.linalg.inv(m)))


def choose_workers(candidates: list[int], cost: Callable[[int], float], budget_s: float | None,
                   done: list[int], spent_s: float, work: float = 1.0) -> list[int]:
    """The worker counts to profile after ``done`` (already run, ``spent_s`` seconds), in order:
    every remaining candidate when ``budget_s`` is None, else Ernest's A-optimal choice, greedily,
    while the estimated costs fit in the budget."""
    remaining = [m for m in sorted(set(candidates)) if m not in done]
    if budget_s is None:
        return remaining
    scale = np.abs(features(candidates, work)).max(axis=0)
    scale[scale == 0] = 1.0

    def rows(ms):
        return features(ms, work) / scale if ms else np.zeros((0, 4))

    chosen: list[int] = []
    left = budget_s - spent_s
    while True:
        base = a_criterion(rows(done + chosen))
        best = None
        for m in remaining:
            c = cost(m)
            if m in chosen or c > left:
                continue
            gain = (base - a_criterion(rows(done + chosen + [m]))) / max(c, 1e-9)
            if best is None or gain > best[0]:
                best = (gain, m, c)
        if best is None:
            return chosen
        chosen.append(best[1])
        left -= best[2]
