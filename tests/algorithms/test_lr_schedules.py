"""``--lr-schedule``: warm-up and decay of the learning rate, followed by every update rule that
``--optimizer`` builds (and DiLoCo's inner AdamW), checked against torch.optim with LambdaLR, kept
across a resume, and refused where an algorithm has an update of its own."""

import json
import math
import os
import signal

import pytest
import torch

from gradwire.algorithms.base import OptimConfig
from gradwire.algorithms.optim import LR_SCHEDULES, HeavyBall, ScheduledRate, torch_lr_scheduler
from gradwire.cli import main
from gradwire.errors import ConfigError, Stopped
from gradwire.run import loop
from gradwire.run.loop import Run, run
from tests.helpers import final_checkpoint, read_jsonl, states_equal, torch_on_mean_gradient


def test_cosine_warms_up_linearly_then_decays_to_min_ratio():
    cosine = LR_SCHEDULES.build("cosine:warmup=4,min_ratio=0.1")
    total = 24
    f = [cosine.factor(k, total) for k in range(total + 3)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]          # (k + 1) / W: the W-th update is the first at full rate
    assert f[4] == 1.0                                # the decay starts at the full rate
    assert all(a >= b for a, b in zip(f[4:], f[5:], strict=False))  # then never rises
    assert f[4 + 10] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the 20 decay updates: (1 + min) / 2
    assert f[total - 1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 19 / 20)))
    assert f[total:] == [0.1, 0.1, 0.1]               # past the horizon it stays at min_ratio


def test_linear_decays_in_equal_steps_and_constant_is_one():
    linear = LR_SCHEDULES.build("linear:min_ratio=0.2")
    f = [linear.factor(k, 5) for k in range(6)]
    assert f == pytest.approx([1.0, 0.84, 0.68, 0.52, 0.36, 0.2])
    assert {LR_SCHEDULES.build("constant").factor(k, 5) for k in range(9)} == {1.0}


def test_torch_lr_scheduler_gives_a_torch_optimizer_the_rules_rates():
    spec, steps = "cosine:warmup=3,min_ratio=0.1", 10
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.2)
    scheduler = torch_lr_scheduler(opt, spec, steps)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])  # the rate of this update
        opt.step()
        scheduler.step()
    assert rates == [ScheduledRate(0.2, spec, steps).at(k) for k in range(steps)]
    with pytest.raises(ConfigError, match=r"warms up over 10 steps, but the run has only --steps 10"):
        torch_lr_scheduler(opt, "linear:warmup=10", steps)


def test_a_state_from_before_the_schedules_loads_at_update_zero():
    # checkpoints written before --lr-schedule hold a heavy ball's velocity (or nothing) and no count
    rule = HeavyBall(torch.zeros(3), OptimConfig(lr=0.1, momentum=0.9))
    rule.apply(torch.ones(3))
    rule.load_state_dict({"velocity": torch.full((3,), 2.0)})
    assert rule.steps == 0 and torch.equal(rule.velocity, torch.full((3,), 2.0))
    assert HeavyBall(torch.zeros(3), OptimConfig(lr=0.1)).state_dict() == {"steps": 0}


def test_dagc_with_one_local_step_follows_the_schedule(make_config):
    # dagc's workers send gradients (K = 1) and its rule on the averaged gradient is scheduled: with
    # every coordinate kept (budget=1) it trains as sync under the same schedule
    def params(algorithm: str, schedule: str):
        r = Run(make_config(algorithm=algorithm, lr_schedule=schedule, steps=6, out=f"{algorithm}-{schedule}"))
        for _ in range(6):
            r.train_step()
        return r.algorithm.eval_params()

    scheduled = params("dagc:budget=1", "linear:warmup=2")
    assert (scheduled - params("sync", "linear:warmup=2")).abs().max() < 1e-4
    assert (scheduled - params("dagc:budget=1", "constant")).abs().max() > 1e-3


def test_metrics_record_the_rate_under_a_schedule(make_config, tmp_path):
    spec = "linear:warmup=2,min_ratio=0.5"
    run(make_config(lr=0.1, lr_schedule=spec, steps=6, eval_every=1), progress=False)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    schedule = LR_SCHEDULES.build(spec)
    assert [row["lr"] for row in rows] == [0.1 * schedule.factor(max(k - 1, 0), 6) for k in range(7)]
    assert [row["lr"] for row in rows][:4] == pytest.approx([0.05, 0.05, 0.1, 0.1])
    run(make_config(steps=2, eval_every=1, out="constant"), progress=False)
    assert all("lr" not in row for row in read_jsonl(tmp_path / "constant" / "metrics.jsonl"))


def _torch_on_mean_gradient(r: Run, steps: int, make_opt, schedule) -> torch.Tensor:
    """The same model and batches through a torch.optim optimizer with LambdaLR on the nn.Module,
    stepping with the workers' mean gradient (what sync averages exactly)."""
    return torch_on_mean_gradient(r, steps, make_opt, lambda k: schedule.factor(k, steps))


@pytest.mark.parametrize(("algorithm", "workers"), [("sync", 3), ("local:period=1", 1)])
def test_adamw_with_cosine_equals_torch_adamw_with_lambda_lr(make_config, algorithm, workers):
    spec = "cosine:warmup=3,min_ratio=0.1"
    r = Run(make_config(optimizer="adamw:beta2=0.95", lr=0.01, weight_decay=0.1, lr_schedule=spec,
                        algorithm=algorithm, workers=workers, steps=10))
    reference = _torch_on_mean_gradient(
        r, 10, lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
        LR_SCHEDULES.build(spec))
    for _ in range(10):
        r.train_step()
    torch.testing.assert_close(r.algorithm.eval_params(), reference, rtol=1e-5, atol=1e-6)
    # and the schedule mattered: constant AdamW ends elsewhere
    constant = _torch_on_mean_gradient(
        r, 10, lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
        LR_SCHEDULES.build("constant"))
    assert (constant - reference).abs().max() > 100 * (r.algorithm.eval_params() - reference).abs().max()


def test_heavy_ball_with_linear_schedule_equals_torch_sgd_with_lambda_lr(make_config):
    spec = "linear:warmup=2,min_ratio=0.0"
    r = Run(make_config(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3, lr_schedule=spec,
                        algorithm="sync", workers=2, steps=8))
    reference = _torch_on_mean_gradient(
        r, 8, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
        LR_SCHEDULES.build(spec))
    for _ in range(8):
        r.train_step()
    torch.testing.assert_close(r.algorithm.eval_params(), reference, rtol=1e-5, atol=1e-6)


def test_diloco_inner_adamw_follows_the_schedule(make_config):
    # one worker, outer SGD of rate 1 without momentum: θ <- θ - (θ - x) = x after every round, so
    # DiLoCo is its worker's AdamW (the spec's default weight decay 0.1), whose rate follows the
    # schedule across rounds
    spec = "cosine:warmup=2,min_ratio=0.1"
    r = Run(make_config(lr=0.01, lr_schedule=spec, workers=1, steps=9,
                        algorithm="diloco:inner_steps=3,outer_lr=1,outer_momentum=0,beta2=0.95"))
    reference = _torch_on_mean_gradient(
        r, 9, lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
        LR_SCHEDULES.build(spec))
    for _ in range(9):
        r.train_step()
    torch.testing.assert_close(r.algorithm.eval_params(), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [
    dict(algorithm="sync", optimizer="adamw:beta2=0.95", weight_decay=0.1),
    dict(algorithm="sync"),                      # plain SGD: the update count is its only state
    dict(algorithm="sync:backups=1", momentum=0.9),  # the server's rule
    dict(algorithm="local:period=3", momentum=0.9),
    dict(algorithm="diloco:inner_steps=3"),
    dict(algorithm="backup-diloco:backups=1,inner_steps=2"),  # server mode: each replica's place in it
    dict(algorithm="async-diloco:inner_steps=2,period=2"),
])
def test_a_run_stopped_mid_schedule_resumes_bitwise(make_config, tmp_path, monkeypatch, kw):
    # stopped by SIGINT after step 7 (a checkpoint of step 7), resumed with the same --steps: the
    # update count in the optimizers' state continues the schedule where it stopped
    cfg = dict(kw, lr=0.01, lr_schedule="cosine:warmup=3,min_ratio=0.1", steps=12, checkpoint_every=4, workers=3,
               stragglers="lognormal:sigma=0.5")
    run(make_config(cfg, out="whole"), progress=False)
    original = loop.Run.train_step

    def train_step(self):
        info = original(self)
        if self.step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # handled after this step
        return info

    with monkeypatch.context() as patch, pytest.raises(Stopped):
        patch.setattr(loop.Run, "train_step", train_step)
        run(make_config(cfg, out="split"), progress=False)
    stopped = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert stopped["status"] == "stopped" and stopped["steps"] == 7 and stopped["checkpoint_step"] == 7
    assert run(make_config(cfg, out="split", resume=True), progress=False)["resumed"]
    whole, split = (final_checkpoint(tmp_path / name)["state"] for name in ("whole", "split"))
    assert states_equal(whole, split)


def test_resuming_with_other_steps_is_refused_under_a_schedule(make_config):
    # the schedule spans --steps: a resumed run with more steps would change the rates already used
    cfg = dict(lr_schedule="cosine:warmup=2", checkpoint_every=4, steps=8)
    run(make_config(cfg, out="a"), progress=False)
    with pytest.raises(ConfigError, match=r"steps: checkpoint 8 vs now 12, which lr_schedule 'cosine:warmup=2' spans"):
        run(make_config(cfg, out="a", steps=12, resume=True), progress=False)
    with pytest.raises(ConfigError, match=r"lr_schedule: checkpoint 'cosine:warmup=2' vs now 'constant'"):
        run(make_config(cfg, out="a", lr_schedule="constant", resume=True), progress=False)
    # a constant rate does not depend on --steps: a finished run may be extended
    run(make_config(checkpoint_every=4, steps=8, out="b"), progress=False)
    assert run(make_config(checkpoint_every=4, steps=12, out="b", resume=True), progress=False)["resumed"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--lr-schedule", "cos"], "unknown lr_schedule 'cos'; valid lr_schedules: constant, cosine, linear"),
    (["--lr-schedule", "cosine:min_ratio=2"], "min_ratio must be in [0, 1]"),
    (["--lr-schedule", "linear:warmup=-1"], "warmup must be an integer >= 0"),
    (["--lr-schedule", "cosine:warmup=5"], "warms up over 5 steps, but the run has only --steps 5"),
    (["--lr-schedule", "cosine", "--algorithm", "diana"], "diana (its own update on the master) does not follow "
                                                           "--lr-schedule 'cosine'"),
    (["--lr-schedule", "cosine", "--algorithm", "async"], "async (its server applies every worker's gradient"),
    (["--lr-schedule", "cosine", "--algorithm", "dagc:local_steps=2"], "dagc with local_steps=2 (its workers' local "
                                                                       "steps use --lr as it is)"),
    (["--lr-schedule", "cosine", "--algorithm", "easgd:async=true"], "easgd:async=true (each worker's updates"),
    (["--lr-schedule", "cosine", "--algorithm", "lsgd:async=true"], "lsgd:async=true (each worker's updates"),
])
def test_bad_schedule_input_is_one_line(tmp_path, data_dir, capsys, flags, message):
    code = main(["run", *flags, "--steps", "5", "--task", "digits-logreg", "--workers", "2",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_server_mode_diloco_warms_up_within_its_inner_steps(make_config):
    """backup-diloco's and async-diloco's step is a round of H inner steps, and their replicas'
    schedule spans --steps × H updates: a warm-up longer than --steps but shorter than that fits, one
    as long is refused naming the inner steps."""
    from gradwire.run.combination import check_combination

    for spec in ("backup-diloco:backups=1,inner_steps=3", "async-diloco:inner_steps=3"):
        check_combination(make_config(algorithm=spec, steps=4, lr_schedule="cosine:warmup=10"))
        with pytest.raises(ConfigError, match=r"warms up over 12 steps, but the run has only 12 inner steps "
                                              r"\(--steps 4 × 3\)"):
            check_combination(make_config(algorithm=spec, steps=4, lr_schedule="cosine:warmup=12"))
