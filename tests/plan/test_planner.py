"""The planner's steps on their own, without runs: the steps a deadline admits, a run's coverage of
the deadline, the evaluation spacing and length of its runs, and the regret of the recommendation
(docs/planning.md)."""

import json
import math

import pytest

from gradwire.config import RunConfig
from gradwire.plan import planner as P
from gradwire.plan.convergence import ConvergenceModel
from gradwire.plan.system_model import SystemModel

TASK = "synthetic-logreg:samples=256,dim=5,hetero=0"


def quiet(*args, **kwargs):
    pass


def test_a_deadline_counts_every_step_that_ends_within_it(tmp_path):
    """0.3 s at 0.1 s a step: the third step ends at 0.3 s, within D, so 3 steps count (0.3 / 0.1 is
    2.9999999999999996 in floating point: a plain floor credited 2)."""
    req = P.PlanRequest(candidates=[RunConfig(task=TASK, steps=30)], workers=[1, 2, 4], max_workers=4,
                        out=tmp_path, deadline_s=0.3)
    fits = {"sync": {"system": SystemModel((0.1, 0.0, 0.0, 0.0)),
                     "convergence": ConvergenceModel(a=0.1, d=0.0, b=1.0, c=0.0, p=1.0),
                     "profiled_steps": 30, "smallest_workers": 1}}
    rows = P.Planner(req, log=quiet).predict(fits)
    assert [r["workers"] for r in rows] == [1, 2, 4]
    for r in rows:
        assert r["seconds_per_iteration"] == pytest.approx(0.1)
        assert r["steps_in_deadline"] == 3
        assert r["objective"] == pytest.approx(0.1 + 1.0 / 3)  # g(3, m)


def _run_folder(folder, end_s, evaluations):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"status": "finished", "steps": 20, "sim_time_s": end_s,
                                                     "wall_time_s": 1.0}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evaluations))


def test_a_run_whose_clock_ends_exactly_at_the_deadline_covers_it(tmp_path):
    """A deadline run is scored on its last evaluation at a time <= D; one whose clock ended before D
    is rerun longer. A run that ends exactly at D has passed it."""
    req = P.PlanRequest(candidates=[RunConfig(task=TASK, steps=30)], workers=[1, 2, 4], max_workers=8,
                        out=tmp_path, deadline_s=0.3)
    planner = P.Planner(req, log=quiet)
    evals = [{"step": 0, "train_loss": 1.0, "sim_time_s": 0.0}, {"step": 10, "train_loss": 0.5, "sim_time_s": 0.15},
             {"step": 20, "train_loss": 0.25, "sim_time_s": 0.3}]
    for end_s, covers in ((0.3, True), (0.3 - 1e-9, False), (0.45, True)):
        folder = tmp_path / f"run{end_s}"
        _run_folder(folder, end_s, [e | {"sim_time_s": e["sim_time_s"] * end_s / 0.3} for e in evals])
        m = planner.read(RunConfig(task=TASK, workers=2, out=str(folder)), "validate")
        assert m.covers_deadline is covers, end_s
    assert m.at_deadline == 0.5  # the run ending at 0.45 s: its evaluation at 0.3 s is after D


def test_profiling_and_validation_runs_are_evaluated_about_15_and_40_times(tmp_path):
    cand = RunConfig(task=TASK, steps=300)
    req = P.PlanRequest(candidates=[cand], workers=[1, 2, 4], max_workers=8, out=tmp_path, target=0.5)
    planner = P.Planner(req, log=quiet)
    profile = planner.config(cand, 2, "profile")
    assert (profile.steps, profile.eval_every) == (300, 20)  # 15 evaluations after step 0
    validate = planner.config(cand, 8, "validate", 400)
    assert (validate.steps, validate.eval_every) == (400, 10)  # 40
    assert planner.config(cand, 8, "validate", 60).eval_every == 1  # under 80 steps: every step


def test_a_target_validation_run_lasts_1_3_times_the_predicted_iterations_plus_2(tmp_path):
    """Between --steps and --validate-max-steps (docs/planning.md: validation)."""
    cands = [RunConfig(task=TASK, steps=30), RunConfig(task=TASK, steps=30, algorithm="sync:backups=1")]
    req = P.PlanRequest(candidates=cands, workers=[2, 4, 8], max_workers=64, out=tmp_path, target=0.5,
                        validate=[16, 32, 64], validate_max_steps=200)
    planner = P.Planner(req, log=quiet)
    made = {}

    def measure(cfg, purpose):
        made[(cfg.label(), cfg.workers)] = cfg.steps
        m = P.Measurement(cfg.label(), cfg.workers, cfg.steps, "finished", 0.1, 0.1 * cfg.steps, 0.0, purpose,
                          str(cfg.out), [], (10.0, 1.0), 0.4)
        planner.runs.append(m)
        return m

    planner.measure = measure
    iters = {("sync", 16): 50.0, ("sync", 32): 10.0, ("sync", 64): 500.0,
             ("sync:backups=1", 16): 60.0, ("sync:backups=1", 32): math.inf, ("sync:backups=1", 64): 20.0}
    rows = [{"candidate": c, "workers": m, "seconds_per_iteration": 0.1, "iterations": i, "time_s": 0.1 * i}
            for (c, m), i in iters.items()]
    planner.validate(rows, rows[0])
    assert made == {("sync", 16): int(50 * 1.3 + 2), ("sync", 32): 30, ("sync", 64): 200,
                    ("sync:backups=1", 16): int(60 * 1.3 + 2), ("sync:backups=1", 32): 200,
                    ("sync:backups=1", 64): 30}


def test_regret_is_the_recommendations_measured_time_over_the_best_measured_less_one(tmp_path, monkeypatch):
    """The recommendation (sync at m = 2) measured 4 s to the target, the best run (m = 8, a validation
    run) 2 s: it took 100 % longer (docs/planning.md's "+0.0%" for the best one)."""
    def run(m, seconds, purpose):
        return P.Measurement("sync", m, 30, "finished", 0.1, 3.0, 0.1, purpose, str(tmp_path), [(30, 0.4)],
                             reached=(20.0, seconds))

    monkeypatch.setattr(P.Planner, "profile", lambda self: self.runs.extend(
        [run(2, 4.0, "profile"), run(4, 3.0, "profile"), run(8, 2.0, "validate")]))
    monkeypatch.setattr(P.Planner, "fit", lambda self: {"sync": {"error": "stub"}})
    monkeypatch.setattr(P.Planner, "predict", lambda self, fits: [])
    monkeypatch.setattr(P.Planner, "recommend", lambda self, rows, fits: {
        "candidate": "sync", "workers": 2, "iterations": 20.0, "time_s": 4.0})
    monkeypatch.setattr(P.Planner, "validate", lambda self, rows, best: [
        {"candidate": "sync", "workers": 8, "error_time": 0.1, "error_seconds_per_iteration": 0.1}])
    req = P.PlanRequest(candidates=[RunConfig(task=TASK, steps=30)], workers=[2, 4, 16], max_workers=16,
                        out=tmp_path, target=0.5, validate=[8])
    s = P.make_plan(req, log=quiet)["validation_summary"]
    assert s["recommended_measured_time_s"] == 4.0 and s["best_measured"]["time_s"] == 2.0
    assert s["regret"] == pytest.approx(1.0)
