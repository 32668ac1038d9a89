"""``gradwire plan`` through the command line, in this process (``cli.main``): constructed cases
whose best answer is known, validation, and bad input (one line, exit 2)."""

import json
import math

import pytest

from gradwire import cli
from gradwire.cli.plan import spec_list
from gradwire.config import RunConfig
from gradwire.plan.planner import _torch_argv, seconds_per_step


@pytest.fixture(autouse=True)
def no_run_curves(monkeypatch):
    """Each profiling run's own curves.png (report/plots.py) is most of a tiny run's wall time on 2
    shared cores and nothing here reads it; plan.png is drawn by plan/output.py, not patched."""
    monkeypatch.setattr("gradwire.report.plots.plot_runs", lambda records, path, *a, **k: path)


TINY = ["--task", "synthetic-logreg:samples=256,dim=5,hetero=0", "--batch-size", "4", "--steps", "30", "--seed", "1",
        "--lr", "0.05"]  # the step size these constructed cases were worked out for; hetero=0: one data set at every m


def plan(tmp_path, *args):
    code = cli.main(["plan", *TINY, "--out", str(tmp_path / "plan"), *args])
    assert code == 0
    return json.loads((tmp_path / "plan" / "plan.json").read_text())


def test_a_network_so_slow_that_the_fewest_workers_win(tmp_path, capsys):
    # 200 ms latency per message and 10 ms of compute: every allreduce costs 40x a step's work,
    # while more workers barely speed up a full-data logistic regression
    p = plan(tmp_path, "--network", "ps:mbps=100,latency_ms=200", "--stragglers", "none:compute_s=0.01",
             "--workers", "2,4,8", "--max-workers", "64", "--target-loss", "0.55")
    best = p["recommendation"]
    assert (best["candidate"], best["workers"]) == ("sync", 2)
    # the ps allreduce of 5 float32 costs 2·(latency + m·20 B/bw): Ernest's θ0 + θ3·m, fitted exactly
    sys_fit = p["fits"]["sync"]["system"]
    assert sys_fit["fit_rms_relative_error"] < 1e-6
    rows = {r["workers"]: r for r in p["predictions"]}
    assert rows[64]["seconds_per_iteration"] == pytest.approx(0.01 + 2 * (0.2 + 64 * 20 / 12.5e6), rel=1e-6)
    assert sorted(rows) == [2, 4, 8, 16, 32, 64]  # from the smallest profiled m up
    out = capsys.readouterr().out
    assert "recommended: sync on 2 workers" in out
    assert "warning: not validated: --validate measures held-out worker counts" in out
    assert (tmp_path / "plan" / "plan.md").read_text().startswith("# Plan: reach train_loss <= 0.55")
    assert (tmp_path / "plan" / "plan.png").stat().st_size > 0


def test_one_worker_is_left_out_of_the_system_fit(tmp_path):
    # the default --workers 1,2,4,8: m = 1 runs no collective; fitted on m = 2, 4, 8 the ps allreduce
    # is exactly θ0 + θ3·m, and the held-out m = 16 is predicted exactly (it missed by +78 % with m = 1 in)
    p = plan(tmp_path, "--network", "ps:mbps=100,latency_ms=200", "--stragglers", "none:compute_s=0.01",
             "--max-workers", "16", "--deadline", "2", "--validate", "16")
    sys_fit = p["fits"]["sync"]["system"]
    assert sys_fit["fit_rms_relative_error"] < 1e-6 and list(sys_fit["measured"]) == ["1"]
    rows = {r["workers"]: r for r in p["predictions"]}
    assert rows[1]["seconds_per_iteration"] == pytest.approx(0.01)
    (v,) = [v for v in p["validation"] if v["workers"] == 16]
    assert abs(v["error_seconds_per_iteration"]) < 1e-6
    assert "system_fit_warning" not in p["recommendation"]


def test_a_straggler_tail_where_backups_win_and_validation(tmp_path, capsys):
    # one step in ten is 20x slower: sync waits for the slowest of m, sync:backups=1 drops it
    p = plan(tmp_path, "--network", "ring:mbps=1000,latency_ms=0.1",
             "--stragglers", "tail:p=0.1,slowdown=20,compute_s=0.01", "--algorithms", "sync,sync:backups=1",
             "--workers", "2,4,8", "--max-workers", "16", "--target-loss", "0.55", "--validate", "16",
             "--validate-max-steps", "80")
    best = p["recommendation"]
    assert best["candidate"] == "sync:backups=1"
    assert {r["workers"] for r in p["runs"] if r["purpose"] == "profile"} == {2, 4, 8}
    pred = {(r["candidate"], r["workers"]): r for r in p["predictions"]}
    for m in (2, 4, 8, 16):
        assert pred[("sync:backups=1", m)]["time_s"] < pred[("sync", m)]["time_s"]
    val = {(v["candidate"], v["workers"]): v for v in p["validation"]}
    assert ("sync", 16) in val and ("sync:backups=1", 16) in val
    for v in val.values():  # each error is (predicted - measured) / measured of that run
        got = v["measured_seconds_per_iteration"]
        assert v["error_seconds_per_iteration"] == pytest.approx((v["predicted_seconds_per_iteration"] - got) / got)
        run = next(r for r in p["runs"] if r["folder"] == v["folder"])
        summary = json.loads((tmp_path / "plan" / "validate" / v["folder"].split("/validate/")[1] /
                              "summary.json").read_text())
        assert got == pytest.approx(summary["sim_time_s"] / summary["steps"]) and run["purpose"] == "validate"
    assert p["validation_summary"]["mean_abs_error_seconds_per_iteration"] is not None
    # a validation run lasts 1.3x the predicted iterations + 2 steps, at least --steps (30), at most
    # --validate-max-steps (80), and evaluates ~40 times (every other step of 80); a profiling run ~15 times
    for v in val.values():
        assert v["steps_run"] == int(min(max(1.3 * v["predicted_iterations"] + 2, 30), 80))
    runs = {r["purpose"]: [] for r in p["runs"]}
    for r in p["runs"]:
        runs[r["purpose"]].append(r)
    assert [(r["steps"], r["evaluations"]) for r in runs["validate"]] == [(80, 80 // 2 + 1)] * 2
    assert {(r["steps"], r["evaluations"]) for r in runs["profile"]} == {(30, 30 // 2 + 1)}
    # the profiling figures (what --budget bounds) are the profiling runs' alone: validation not counted
    assert len(runs["profile"]) == p["profiling"]["runs"] == 6
    assert p["profiling"]["wall_s"] == pytest.approx(sum(r["wall_time_s"] for r in runs["profile"]), rel=1e-9)
    assert p["profiling"]["simulated_s"] == pytest.approx(sum(r["sim_time_s"] for r in runs["profile"]), rel=1e-9)
    # the recommendation carries the error measured for it, and the printed line says it
    own = val.get((best["candidate"], best["workers"]))
    assert best["measured_error"] == (own["error_time"] if own else None)
    assert ("warning" in best) == (best["largest_validation_error"] is None
                                   or abs(best["largest_validation_error"]) > 0.2
                                   or (own is not None and abs(own["error_time"]) > 0.2))


def test_deadline_mode_picks_the_lowest_predicted_objective(tmp_path):
    p = plan(tmp_path, "--network", "ps:mbps=100,latency_ms=200", "--stragglers", "none:compute_s=0.01",
             "--workers", "1,2,4", "--max-workers", "8", "--deadline", "2")
    best = p["recommendation"]
    assert best["workers"] == 1  # 200 iterations alone against under 5 with 2 workers
    assert best["iterations"] == pytest.approx(2 / best["seconds_per_iteration"])
    assert best["objective"] == min(r["objective"] for r in p["predictions"])


def bad(capsys, *args) -> str:
    code = cli.main(["plan", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line(tmp_path, capsys):
    out = ["--out", str(tmp_path / "bad")]
    err = bad(capsys, *TINY, *out, "--algorithms", "sync,nosuch", "--target-loss", "0.5")
    assert "nosuch" in err and "sync" in err and "diana" in err  # the bad name and the valid ones
    err = bad(capsys, *TINY, *out, "--workers", "2,4", "--target-loss", "0.5")
    assert "workers=2,4" in err and "at least 3" in err
    err = bad(capsys, *TINY, *out, "--workers", "1,2,x", "--target-loss", "0.5")
    assert "'1,2,x'" in err
    err = bad(capsys, *TINY, *out, "--workers", "1,2,4")
    assert "--target-loss" in err and "--deadline" in err
    err = bad(capsys, *TINY, *out, "--workers", "1,2,4", "--target-loss", "0.5", "--metric", "accuracy")
    assert "accuracy" in err and "train_loss, suboptimality" in err
    err = bad(capsys, *TINY, *out, "--workers", "1,2,4", "--max-workers", "2", "--target-loss", "0.5")
    assert "max-workers=2" in err
    err = bad(capsys, *TINY, *out, "--workers", "1,2,4", "--validate", "4", "--target-loss", "0.5")
    assert "[4]" in err and "held-out" in err
    err = bad(capsys, *TINY, *out, "--workers", "1,2,4", "--target-loss", "-1")  # was refused only after profiling
    assert err.endswith("target-loss=-1: train_loss is never below 0, so no run reaches it; give a target above the "
                        "losses the runs start from (--target-loss)")
    err = bad(capsys, *TINY, *out, "--workers", "1,2,4", "--target-loss", "0.5", "--work", "-1")
    assert err.endswith("work=-1.0: s of Ernest's θ1·s/m term must be a finite number > 0 (--work)")
    err = bad(capsys, *TINY, *out, "--task", "digits-logreg", "--workers", "1,2,4", "--target-loss", "0.5",
              "--metric", "suboptimality")  # was refused only after the first profiling run, its folder left
    assert err.endswith("metric='suboptimality': task 'digits-logreg' does not know its optimum f* (the synthetic "
                        "tasks do); use --metric train_loss (--metric)")
    assert not (tmp_path / "bad").exists()  # refused before any run


def test_a_recommendation_that_could_not_run_says_so():
    """A recommendation at an m where its own validation run was refused (a shard smaller than the
    batch) is no recommendation: the warning names the refusal (a plan had recommended 64 workers
    silently)."""
    from gradwire.plan.planner import trust

    best = {"candidate": "sync", "workers": 64}
    validation = [{"candidate": "sync", "workers": 64, "error_objective": None,
                   "status": "refused: batch_size=32 is larger than the smallest shard"},
                  {"candidate": "sync", "workers": 16, "error_objective": 0.05, "status": "finished"}]
    t = trust(best, validation, target=False)
    assert t["warning"] == ("the recommended sync at m=64 did not run: refused: batch_size=32 is larger than the "
                            "smallest shard; choose another recommendation from the predictions, or lower "
                            "--max-workers")
    ran = [validation[1] | {"workers": 64}]
    assert "warning" not in trust(best, ran, target=False)


def test_a_target_no_candidate_reaches(tmp_path, capsys):
    err = bad(capsys, *TINY, "--out", str(tmp_path / "p"), "--workers", "1,2,4", "--steps", "10",
              "--target-loss", "0")
    assert "target-loss=0 is reached by no candidate" in err and "floor" in err


def test_a_budget_too_small_for_three_worker_counts(tmp_path, capsys):
    err = bad(capsys, *TINY, "--out", str(tmp_path / "p"), "--workers", "1,2,4", "--steps", "10",
              "--target-loss", "0.5", "--budget", "0.001")
    assert "budget=0.001 s affords 1 distinct worker count" in err and "raise --budget" in err


def test_a_budget_refusal_shows_the_seconds_it_measured(tmp_path, capsys, monkeypatch):
    """A pilot of milliseconds (here 3 ms a run on the planner's clock, patched: nothing is timed)
    and the budget it asks for, with two significant digits: they were shown as "took 0.0 s" and
    "raise --budget to about 0 s"."""
    from itertools import count
    from types import SimpleNamespace

    ticks = count()
    monkeypatch.setattr("gradwire.plan.planner.time", SimpleNamespace(perf_counter=lambda: 0.003 * next(ticks)))
    monkeypatch.setattr("gradwire.plan.planner.steps_wall", lambda records: 1.0)  # (capped at the run's 3 ms)
    err = bad(capsys, *TINY, "--out", str(tmp_path / "p"), "--workers", "1,2,4", "--steps", "10",
              "--target-loss", "0.5", "--budget", "0.001")
    # the pilot's 3 ms are all steps: m=2 and m=4 are estimated at 2x and 4x that, 3 + 6 + 12 ms in all
    assert err.endswith("(the pilot at m=1 took 0.003 s); the system model needs 3: raise --budget to about "
                        "0.021 s or lower --steps"), err


def test_seconds_are_shown_with_two_significant_digits():
    from gradwire.plan.planner import _figures

    assert [_figures(x) for x in (0.0, 0.0031234, 0.0499, 0.42, 7.549, 9.96, 134.0, 1234.5)] == [
        "0", "0.0031", "0.05", "0.42", "7.5", "10", "130", "1200"]


def test_spec_lists_keep_their_parameters():
    assert spec_list("sync:backups=2,diana,local:period=8,eval=average", "--algorithms") == [
        "sync:backups=2", "diana", "local:period=8,eval=average"]
    assert spec_list("none, qsgd:levels=4,bucket=128", "--compressors") == ["none", "qsgd:levels=4,bucket=128"]


def test_overwrite_removes_the_replaced_plans_runs_that_it_did_not_make(tmp_path, capsys):
    """A plan replaced with --overwrite left its profiling and validation runs that the new plan
    did not make (another candidate's, other worker counts', its validation's) among the new ones;
    they go once the new plan is written, as compare --overwrite does, and nothing of the user's:
    a file of theirs, a folder of no run, a recorded folder whose run is not the plan's."""
    out = tmp_path / "plan"
    plan(tmp_path, "--algorithms", "sync,local:period=2", "--workers", "2,3,4", "--max-workers", "8",
         "--steps", "6", "--deadline", "1", "--validate", "8")
    (out / "profile" / "sync" / "notes.txt").write_text("mine")
    (out / "validate" / "sync" / "m99").mkdir()
    summary = out / "profile" / "local_period=2" / "m2" / "summary.json"
    summary.write_text(json.dumps(json.loads(summary.read_text()) | {"label": "a run of mine"}))
    capsys.readouterr()
    p = plan(tmp_path, "--workers", "1,2,4", "--max-workers", "8", "--steps", "6", "--deadline", "1", "--overwrite")
    assert {(r["candidate"], r["workers"], r["purpose"]) for r in p["runs"]} == {
        ("sync", 1, "profile"), ("sync", 2, "profile"), ("sync", 4, "profile")}
    assert capsys.readouterr().err.splitlines()[-1] == (
        "removed the replaced plan's run folders: profile/local_period=2/m3, profile/local_period=2/m4, "
        "profile/sync/m3, validate/local_period=2/m8, validate/sync/m8")
    left = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_dir() and f.name.startswith("m"))
    assert left == ["profile/local_period=2/m2", "profile/sync/m1", "profile/sync/m2", "profile/sync/m4",
                    "validate/sync/m99"]
    assert (out / "profile" / "sync" / "notes.txt").read_text() == "mine"
    assert not (out / "validate" / "local_period=2").exists()  # left empty: gone with its runs


def test_a_plan_reuses_only_runs_of_its_own_configuration(tmp_path):
    """make_plan(reuse=True) read every m* folder of a candidate's label as its run: a run of
    another task or --steps (the same label, sync) was taken as this plan's measurement."""
    from gradwire.plan.planner import Planner, PlanRequest, make_plan

    cand = RunConfig(task="synthetic-logreg:samples=256,dim=5,hetero=0", batch_size=4, steps=6, seed=1, lr=0.05)

    def request(c):
        return PlanRequest(candidates=[c], workers=[1, 2, 4], max_workers=8, out=tmp_path, deadline_s=1.0)

    make_plan(request(cand), log=lambda *a, **k: None)
    said = []
    for c, reused in [(cand, 3), (cand.replace(steps=8), 0), (cand.replace(task="synthetic-logreg:samples=128"), 0),
                      (cand.replace(lr=None), 0)]:  # (no --lr: the algorithm's own, 0.8 for sync)
        planner = Planner(request(c), log=lambda line, **k: said.append(line))
        planner.load()
        assert len(planner.runs) == reused, c
    assert said[0] == f"not reused: {tmp_path}/profile/sync/m1 ran steps=6 (this plan: 8)"
    assert said[-1] == f"not reused: {tmp_path}/profile/sync/m4 ran lr=0.05 (this plan: 0.8)"


def test_plan_help_says_what_out_and_overwrite_do_in_a_plan(capsys):
    """--out and --overwrite had run's help (a run folder; its files and checkpoint/)."""
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--out OUT plan folder: plan.json, plan.md and plan.png, the profiling runs in OUT/profile/ and the "
            "validation runs in OUT/validate/ (default: a fresh runs/plan-<YYYYmmdd-HHMMSS>)") in text
    assert "--overwrite, --no-overwrite replace the plan already in OUT: plan.json, plan.md, plan.png" in text
    assert "run folder (default" not in text and "replace the run already in OUT" not in text


def test_torch_runs_go_through_gradwire_launch():
    cfg = RunConfig(task="synthetic-logreg", workers=3, algorithm="sync:backups=1", steps=7, error_feedback=True,
                    compressor="topk:ratio=0.1", backend="torch", out="runs/x")
    argv = _torch_argv(cfg)
    i = argv.index("launch")
    assert argv[i:i + 5] == ["launch", "--nproc-per-node", "4", "--", "run"]  # 3 workers + the server
    rest = argv[i + 5:]
    assert "--workers" not in rest and "--backend" not in rest  # launch adds both
    assert rest[rest.index("--steps") + 1] == "7" and "--error-feedback" in rest
    assert rest[rest.index("--compressor") + 1] == "topk:ratio=0.1"


def test_real_backend_step_time_leaves_out_the_steps_after_an_evaluation():
    # steps of 0.1 s; rank 0 evaluated after steps 0 (before step 1) and 2, costing 5 s each
    times = [5.1, 5.2, 10.3, 10.4, 10.5]
    rows = [{"step": k + 1, "sim_time_s": t} for k, t in enumerate(times)]
    assert seconds_per_step(rows, {0, 2}) == pytest.approx(0.1)
    assert seconds_per_step(rows[:1], {0}) is None


def test_a_recommendation_carries_its_measured_error_and_a_warning_beyond_the_target():
    from gradwire.plan.planner import TARGET_ERROR, trust

    best = {"candidate": "sync", "workers": 1}
    validation = [{"candidate": "sync", "workers": 1, "error_time": -0.63},
                  {"candidate": "qsgd", "workers": 8, "error_time": 0.39}]
    t = trust(best, validation, target=True)
    assert t["measured_error"] == -0.63 and t["largest_validation_error"] == -0.63 and t["target_error"] == 0.2
    assert t["warning"].startswith("the predicted time to target erred by up to -63% on the held-out runs (its own "
                                   "-63%, beyond the planner's 20% target)")
    close = [{"candidate": "sync", "workers": 1, "error_objective": 0.05},
             {"candidate": "qsgd", "workers": 8, "error_objective": -TARGET_ERROR}]
    assert trust(best, close, target=False) == {"measured_error": 0.05, "largest_validation_error": -TARGET_ERROR,
                                                "target_error": TARGET_ERROR}  # within the target: no warning
    far_elsewhere = [close[0], {"candidate": "qsgd", "workers": 8, "error_objective": 0.3}]
    assert "up to +30%" in trust(best, far_elsewhere, target=False)["warning"]
    assert trust(best, [], target=True)["warning"].startswith("not validated")
    unreached = [{"candidate": "sync", "workers": 1, "error_time": None}]
    assert "untested" in trust(best, unreached, target=True)["warning"]


def test_a_recommendation_at_a_profiled_m_is_checked_against_its_own_run():
    """Where the profiling run at the recommended m reached the target, the fit's prediction there is
    compared with it: beyond the planner's target error, the warning says so (a plan had predicted
    1 iteration at a profiled m where its own run took 15)."""
    from gradwire.plan.planner import TARGET_ERROR, trust

    close = [{"candidate": "sync", "workers": 8, "error_time": 0.1}]
    off = {"candidate": "sync", "workers": 8, "iterations": 1.0, "measured_iterations": 15.3}
    t = trust(off, close, target=True)
    assert t["fit_error"] == pytest.approx(1 / 15.3 - 1)
    assert t["warning"] == ("at m=8, profiled, its own run reached the target in 15 iterations where the fit predicts "
                            "1 (-93%): the convergence model does not fit this run; profile longer (--steps) or set "
                            "--target-loss nearer the losses it reached")
    near = off | {"iterations": 15.3 * (1 + TARGET_ERROR / 2)}
    assert "warning" not in trust(near, close, target=True) and "fit_error" not in trust(near, close, target=True)
    assert trust(off, [], target=True)["warning"].startswith("not validated: --validate measures held-out worker "
                                                             "counts and says how far to trust it; at m=8, profiled")


def test_a_target_met_at_the_first_evaluation_is_planned_and_validated(tmp_path):
    """A target the start already meets takes 0 s: the validation's regret (a ratio of times) has
    no value then (it divided by zero)."""
    p = plan(tmp_path, "--steps", "4", "--eval-every", "4", "--workers", "2,4,8", "--max-workers", "16",
             "--target-loss", "100", "--validate", "16", "--validate-max-steps", "4")
    assert p["validation_summary"]["regret"] is None and p["validation_summary"]["best_measured"]["time_s"] == 0
    assert p["recommendation"]["measured_error"] is None  # (predicted - measured) / measured: measured 0


def _last_within(folder, metric, deadline):
    recs = [json.loads(line) for line in open(f"{folder}/metrics.jsonl")]
    return [r[metric] for r in recs if r["sim_time_s"] <= deadline][-1]


def test_a_deadline_is_validated_at_the_deadline(tmp_path):
    # m=8 is predicted ~2.7 steps in 2 s: the validation run stops soon after 2 simulated seconds (not at
    # --steps 30, ~12 s) and is scored on the objective it had at 2 s, not at its end
    p = plan(tmp_path, "--network", "ps:mbps=100,latency_ms=200", "--stragglers", "none:compute_s=0.01",
             "--workers", "1,2,4", "--max-workers", "8", "--deadline", "2", "--validate", "8")
    (v,) = [v for v in p["validation"] if v["workers"] == 8]
    assert "system_fit_warning" in p["recommendation"]  # m = 1 in the fit (test below)
    summary = json.loads(open(f"{v['folder']}/summary.json").read())
    assert v["steps_run"] < 30 and summary["sim_time_s"] >= 2.0
    assert v["measured_objective"] == _last_within(v["folder"], "train_loss", 2.0)
    assert v["measured_objective"] != json.loads(open(f"{v['folder']}/metrics.jsonl").readlines()[-1])["train_loss"]
    assert v["error_objective"] == pytest.approx((v["predicted_objective"] - v["measured_objective"])
                                                 / v["measured_objective"])


def test_a_deadline_shorter_than_a_step_credits_no_step(tmp_path, capsys):
    # 0.3 s: 30 steps of 10 ms alone, no step of 0.41 s (two 200 ms messages) with 2 or more workers
    p = plan(tmp_path, "--network", "ps:mbps=100,latency_ms=200", "--stragglers", "none:compute_s=0.01",
             "--workers", "1,2,4", "--max-workers", "8", "--deadline", "0.3")
    rows = {r["workers"]: r for r in p["predictions"]}
    assert rows[1]["steps_in_deadline"] == math.floor(0.3 / rows[1]["seconds_per_iteration"]) == 29
    for m in (4, 8):
        assert rows[m]["steps_in_deadline"] == 0 and rows[m]["objective"] is None
        assert "no step within the deadline" in rows[m]["note"]
    assert p["recommendation"]["workers"] == 1
    # m = 1, 2, 4 (0.01, 0.41, 0.41 s) leave only two counts >= 2: m = 1 stays in the fit, which misses
    assert p["fits"]["sync"]["system"]["fit_rms_relative_error"] > 0.2
    assert "the system model misses its own profiling runs by sync" in p["recommendation"]["warning"]
    assert "warning: " in capsys.readouterr().out
    err = bad(capsys, *TINY, "--out", str(tmp_path / "p2"), "--network", "ps:mbps=100,latency_ms=200",
              "--stragglers", "none:compute_s=0.01", "--workers", "1,2,4", "--deadline", "0.001")
    assert "deadline=0.001 s is shorter than one step of every candidate at every m" in err


def test_a_deadline_validation_that_ends_before_the_deadline_is_rerun_longer(tmp_path):
    """f(m) predicted 1 s a step where the run takes 0.1 s: the first validation run (1.3 x 2
    predicted steps + 2 = 5) ends at 0.5 s, before D = 2 s, so it is rerun with the steps its own
    pace needs (2 / 0.1 x 1.3 + 2 = 28) and scored at D."""
    from gradwire.plan.planner import Measurement, Planner, PlanRequest

    cand = RunConfig(task="synthetic-logreg:samples=256,dim=5,hetero=0", steps=30)
    req = PlanRequest(candidates=[cand], workers=[1, 2, 4], max_workers=8, out=tmp_path, deadline_s=2.0,
                      validate=[8])
    planner = Planner(req, log=lambda *a, **k: None)
    made = []

    def measure(cfg, purpose):
        made.append(cfg.steps)
        t = 0.1 * cfg.steps
        m = Measurement(cfg.label(), cfg.workers, cfg.steps, "finished", 0.1, t, 0.0, purpose, str(cfg.out),
                        [], None, 0.5, 0.6 if t >= 2 else None, t >= 2)
        planner.runs.append(m)
        return m

    planner.measure = measure
    row = {"candidate": cand.label(), "workers": 8, "seconds_per_iteration": 1.0, "iterations": 2.0,
           "objective": 0.7}
    (v,) = planner.validate([row], row)
    assert made == [5, 28]
    assert v["steps_run"] == 28 and v["measured_objective"] == 0.6
    assert v["error_objective"] == pytest.approx((0.7 - 0.6) / 0.6)
    assert [r.steps for r in planner.runs] == [28]  # the short run is not kept as a measurement


def test_a_candidate_refused_at_small_counts_is_predicted_only_where_it_runs(tmp_path, data_dir, capsys):
    """sync with 2 backups cannot run on 1 or 2 workers (refused when profiled): the plan predicts it
    from 3 workers on, never at a count it would refuse."""
    out = tmp_path / "plan"
    assert cli.main(["plan", "--task", "synthetic-logreg", "--steps", "10", "--eval-every", "5", "--data-dir",
                     str(data_dir), "--algorithms", "sync:backups=2", "--workers", "1,2,4,8,16",
                     "--target-loss", "0.55", "--max-workers", "16", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["fits"]["sync:backups=2"]["smallest_workers"] == 3
    assert sorted(r["workers"] for r in plan["predictions"]) == [4, 8, 16]


def test_a_deadline_plans_validation_runs_at_least_a_candidates_first_round(tmp_path, data_dir, capsys):
    """Under --deadline a validation run takes 1.3x the predicted steps, which for local SGD averaging
    every 16 steps came to 10: refused (no averaging would complete) where it should be measured."""
    out = tmp_path / "plan"
    assert cli.main(["plan", "--task", "synthetic-logreg", "--steps", "40", "--eval-every", "10", "--data-dir",
                     str(data_dir), "--algorithms", "local:period=16", "--workers", "1,2,4", "--deadline", "0.3",
                     "--validate", "8", "--out", str(out)]) == 0
    row = next(r for r in json.loads((out / "plan.json").read_text())["validation"] if r["workers"] == 8)
    assert row["status"] == "finished" and row["steps_run"] >= 16, row
