"""The planner's models on synthetic data with known parameters: Ernest's NNLS fit, the
convergence model, the interpolated crossing of a target, and the profiling design."""

import math

import numpy as np
import pytest

from gradwire.plan.convergence import ConvergenceModel, crossing
from gradwire.plan.design import RunCost, a_criterion, choose_workers, steps_wall
from gradwire.plan.system_model import SystemModel, distinct_enough, features, log2_grid


def test_nnls_recovers_known_theta_from_exact_times():
    theta = np.array([0.02, 0.5, 0.003, 0.0004])
    workers = [1, 2, 4, 8, 16, 32]
    times = features(workers, work=3.0) @ theta
    fit = SystemModel.fit(workers, times, work=3.0)
    np.testing.assert_allclose(fit.theta, theta, rtol=1e-6, atol=1e-12)
    assert fit.residual_rel < 1e-9
    np.testing.assert_allclose(fit.predict([256]), features([256], 3.0) @ theta, rtol=1e-6)


def test_nnls_recovers_theta_within_noise_and_stays_non_negative():
    rng = np.random.default_rng(7)
    theta = np.array([0.05, 0.2, 0.0, 0.002])  # no log term: NNLS must not invent a negative one
    workers = np.array([1, 2, 3, 4, 6, 8, 12, 16] * 4)
    times = features(workers) @ theta * (1 + 0.01 * rng.standard_normal(len(workers)))
    fit = SystemModel.fit(workers, times)
    assert min(fit.theta) >= 0
    np.testing.assert_allclose(fit(256), features([256]) @ theta, rtol=0.05)  # extrapolated 16x


def test_one_worker_is_measured_not_fitted():
    # Ernest (Venkataraman et al., NSDI 2016, eq. 1) on a ps network: 2(lat + m·B/bw) from m = 2 on,
    # but one worker sends nothing (compute alone): the step at m = 1 -> 2 fits no θ >= 0
    comm = lambda m: 0.01 + 2 * (0.2 + m * 20 / 12.5e6)  # noqa: E731
    workers = [1, 2, 4, 8]
    times = [0.01] + [comm(m) for m in workers[1:]]
    fit = SystemModel.fit(workers, times)
    assert fit.residual_rel < 1e-9 and fit(1) == 0.01
    assert fit(16) == pytest.approx(comm(16), rel=1e-9) and fit(256) == pytest.approx(comm(256), rel=1e-9)
    assert fit.to_dict()["measured"] == {"1": 0.01} and "m=1: 0.01 s measured" in fit.describe()
    # with fewer than 3 counts >= 2 it stays in the fit, and the fit's error shows it
    small = SystemModel.fit(workers[:3], times[:3])
    assert small.measured == () and small.residual_rel > 0.2
    assert SystemModel.fit(workers, times, single_apart=False).residual_rel > 0.2


def test_nnls_refuses_non_positive_times():
    with pytest.raises(ValueError, match="positive time"):
        SystemModel.fit([1, 2, 4], [0.1, 0.0, 0.3])


def test_distinct_counts_and_grid():
    assert not distinct_enough([2, 4, 4, 2])
    assert distinct_enough([1, 2, 4])
    assert log2_grid(48, [6]) == [1, 2, 4, 6, 8, 16, 32, 48]


def test_convergence_fit_recovers_known_parameters():
    truth = ConvergenceModel(a=0.12, d=0.3, b=2.0, c=1.0, p=0.8)
    i = np.tile(np.arange(1, 201, 5), 4)
    m = np.repeat([1, 2, 4, 8], len(i) // 4)
    fit = ConvergenceModel.fit(i, m, truth.loss(i, m))
    assert fit.p == pytest.approx(0.8, rel=0.03)  # the grid's spacing is 3.5%
    for key in "adbc":
        assert getattr(fit, key) == pytest.approx(getattr(truth, key), rel=0.15, abs=0.01), key
    # what the planner uses: iterations to a target at an m never profiled
    assert fit.iterations_to(0.2, 64) == pytest.approx(truth.iterations_to(0.2, 64), rel=0.1)


def test_iterations_to_is_the_inverse_of_the_loss():
    g = ConvergenceModel(a=0.1, d=0.2, b=3.0, c=0.5, p=1.5)
    i = g.iterations_to(0.2, 4)
    assert g.loss(i, 4) == pytest.approx(0.2, rel=1e-12)
    assert g.floor(4) == pytest.approx(0.15)
    assert math.isinf(g.iterations_to(0.15, 4))  # at the floor: never
    assert math.isinf(g.iterations_to(0.2, 2))   # floor 0.2 at m = 2


def test_crossing_interpolates_in_log_loss():
    recs = [{"step": 0, "sim_time_s": 0.0, "loss": 1.0}, {"step": 10, "sim_time_s": 2.0, "loss": 0.5},
            {"step": 20, "sim_time_s": 4.0, "loss": 0.125}]
    step, t = crossing(recs, 0.25, "loss")  # log 0.25 is half way from log 0.5 to log 0.125
    assert step == pytest.approx(15.0) and t == pytest.approx(3.0)
    assert crossing(recs, 1.5, "loss") == (0.0, 0.0)
    assert crossing(recs, 0.1, "loss") is None
    # off the middle the direction shows: 0.3 lies 0.369 of the way (in log loss) from 0.5 to 0.125
    share = math.log(0.5 / 0.3) / math.log(0.5 / 0.125)
    step, t = crossing(recs, 0.3, "loss")
    assert step == pytest.approx(10 + 10 * share) and t == pytest.approx(2 + 2 * share)
    # the first evaluation at or below the target (docs/planning.md): one exactly at it is the crossing,
    # also when it is the run's last
    assert crossing(recs, 0.125, "loss") == (20.0, 4.0)
    assert crossing(recs, 0.5, "loss") == (10.0, 2.0)


def test_run_cost_from_a_pilot():
    cost = RunCost.from_pilot(wall_s=3.0, steps_wall_s=2.0, workers=2, steps=100)
    assert cost.setup_s == 1.0 and cost.per_worker_step_s == pytest.approx(0.01)
    assert cost(8, 50) == pytest.approx(1.0 + 8 * 50 * 0.01)


def test_run_cost_keeps_per_run_overhead_out_of_the_per_worker_step_cost():
    # a pilot at m=1 of 30 steps that took 0.8 s wall: 0.02 s before step 0, 0.06 s of steps between
    # 0.1 s of evaluations, the rest (task build, summary, plots) after the last step
    records = [{"step": 0, "wall_time_s": 0.02, "eval_time_s": 0.0},
               {"step": 15, "wall_time_s": 0.10, "eval_time_s": 0.05},
               {"step": 30, "wall_time_s": 0.18, "eval_time_s": 0.10}]
    assert steps_wall(records) == pytest.approx(0.06)
    cost = RunCost.from_pilot(wall_s=0.8, steps_wall_s=steps_wall(records), workers=1, steps=30)
    assert cost.setup_s == pytest.approx(0.74) and cost.per_worker_step_s == pytest.approx(0.002)
    # the review's case: runs at m = 2, 4 cost about the pilot's time each, not 2x and 4x of it, so a
    # 3 s budget affords m = 1, 2, 4 (it was refused, 'raise --budget to about 8 s')
    assert cost(2, 30) == pytest.approx(0.86) and cost(4, 30) == pytest.approx(0.98)
    assert choose_workers([1, 2, 4], lambda m: cost(m, 30), 3.0, [1], 0.8) == [2, 4]
    assert steps_wall(records[:1]) == 0.0


def test_design_without_budget_runs_everything_and_with_one_stays_inside_it():
    assert choose_workers([1, 2, 4, 8, 16], lambda m: 1.0 * m, None, [1], 1.0) == [2, 4, 8, 16]
    chosen = choose_workers([1, 2, 4, 8, 16, 32], lambda m: float(m), 20.0, [1], 1.0)
    assert sum(chosen) + 1 <= 20.0
    assert len(set(chosen) | {1}) >= 3
    # the greedy step is A-optimal per second: each pick lowers tr(M^-1) the most per unit cost
    assert chosen == [2, 4, 8]
    assert a_criterion(features([1, 2, 4, 8]) / features([1, 2, 4, 8]).max(axis=0)) < a_criterion(
        features([1, 2, 4]) / features([1, 2, 4, 8]).max(axis=0))


def test_design_spends_nothing_when_nothing_fits():
    assert choose_workers([1, 2, 4], lambda m: 100.0, 50.0, [1], 10.0) == []


def test_design_counts_the_pilot_against_the_budget_and_a_run_may_use_all_that_is_left():
    # --budget bounds every profiling run, the pilot's included (docs/planning.md): after a pilot of 5 s
    # a 10 s budget leaves 5 s, which affords m = 2 (2 s) and then not m = 4 (4 s > 3 s left)
    assert choose_workers([1, 2, 4, 8], lambda m: float(m), 10.0, [1], 5.0) == [2]
    # a run that costs exactly what is left still fits: 1 s spent, 2 + 4 s of runs in a 7 s budget
    assert choose_workers([1, 2, 4], lambda m: float(m), 7.0, [1], 1.0) == [2, 4]


def test_design_criterion_is_on_unit_scaled_features_so_the_units_of_s_do_not_matter():
    """tr(M^-1) is taken over feature columns scaled to their largest value over the candidates
    (a_criterion's rows), so the choice does not change with --work's units (s of θ1·s/m); on the raw
    features [1, s/m, log m, m] it does (m = 4 at s = 1, m = 34 at s = 0.001 below) and, with m up to
    64, the m column's large values leave its variance out of the criterion."""
    cost = lambda m: 1.0 + 0.01 * m  # noqa: E731
    for work in (1.0, 1000.0, 0.001):
        assert choose_workers(list(range(1, 65)), cost, 3.5, [1], 0.0, work) == [2, 3, 10], work
        # equal costs: the pure A-optimal order
        assert choose_workers([1, 2, 4, 8, 16, 32, 64], lambda m: 1.0, 3.0, [1], 0.0, work) == [64, 8, 2], work
