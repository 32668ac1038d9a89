"""Asynchronous DiLoCo: one replica with period 1 is DiLoCo; every arrival moves θ by the delayed
Nesterov rule (replayed from the messages in the order the server handled them, against a
reference written from Liu et al. 2024's description); the real driver runs it (what both
server-mode DiLoCos share is tested in test_server_diloco.py)."""

import pytest
import torch

from gradwire.algorithms.protocol import GRADIENT
from gradwire.errors import ConfigError
from gradwire.run.loop import Run, run
from tests.helpers import read_jsonl


@pytest.mark.parametrize("schedule", ["constant", "cosine:warmup=2,min_ratio=0.1"])
def test_one_replica_with_period_one_is_diloco(make_config, schedule):
    """Period 1 is Nesterov on every arrival, so one replica's θ after round t is DiLoCo's after
    t·H inner steps, bitwise (float64), the momentum warm-up included; under a --lr-schedule too,
    spanning --steps rounds of H inner updates."""
    cfg = make_config(dtype="float64", lr=0.01, workers=1, lr_schedule=schedule)
    asynchronous = Run(cfg.replace(algorithm="async-diloco:inner_steps=3,period=1,outer_lr=0.7,outer_warmup=2",
                                   steps=5))
    diloco = Run(cfg.replace(algorithm="diloco:inner_steps=3,outer_warmup=2", steps=15))
    for _ in range(5):
        asynchronous.train_step()
        for _ in range(3):
            diloco.train_step()
        assert torch.equal(asynchronous.algorithm.theta, diloco.algorithm.theta)


def delayed_nesterov_reference(theta, deltas, *, lr, momentum, period, warmup=0):
    """Liu et al. 2024's delayed Nesterov on a sequence of arrivals, written from its description:
    every arrival moves θ by -η Δ/N; every N-th also updates the momentum with the mean of the N
    buffered Δ and adds its Nesterov term. ``warmup`` W: the j-th momentum update (0-based) uses
    μ·min(1, j/W) (docs/diloco.md's ramp, counted in momentum updates, not arrivals)."""
    theta, m, buffer = theta.clone(), torch.zeros_like(theta), torch.zeros_like(theta)
    for k, delta in enumerate(deltas, start=1):
        buffer = buffer + delta
        if k % period:
            theta = theta - lr * delta / period
        else:
            j = k // period - 1
            mu = momentum * min(1.0, j / warmup) if warmup else momentum
            m = mu * m + buffer / period
            theta = theta - lr * (delta / period + mu * m)
            buffer = torch.zeros_like(theta)
    return theta


@pytest.mark.parametrize("period, warmup", [(0, 0), (2, 0), (2, 3)])
def test_every_arrival_follows_the_delayed_nesterov_rule(make_config, period, warmup):
    """3 replicas, one 3x slower (so arrivals interleave unevenly and staleness varies): the
    server's θ after each arrival equals the reference replayed on the Δ in arrival order; with a
    warm-up whose ramp counts momentum updates, which differ from arrivals when N > 1."""
    cfg = make_config(algorithm=f"async-diloco:inner_steps=2,period={period},outer_lr=0.5,outer_momentum=0.9,"
                                f"outer_warmup={warmup}",
                      dtype="float64", lr=0.01, workers=3, stragglers="slow:count=1,slowdown=3,compute_s=0.01")
    r = Run(cfg)
    alg = r.algorithm
    start, deltas, stale = alg.theta.clone(), [], []
    on_message = alg.on_message

    def replayed(msg, finished):
        answer = on_message(msg, finished)
        if msg.kind == GRADIENT and not finished:
            deltas.append(msg.tensor(alg.theta).clone())
            stale.append(answer.staleness)
            expected = delayed_nesterov_reference(start, deltas, lr=0.5, momentum=0.9, period=period or 3,
                                                  warmup=warmup)
            torch.testing.assert_close(alg.theta, expected, rtol=0, atol=1e-12)
        return answer

    alg.on_message = replayed
    infos = [r.train_step() for _ in range(6)]
    assert len(deltas) == 18 and all(i["gradients"] == 6 for i in infos)
    assert len(set(stale)) > 1  # the slow replica's Δ are staler than the others'
    assert infos[-1]["momentum_updates"] == 18 // (period or 3)


def test_without_stragglers_each_replica_reads_theta_a_round_late(make_config):
    """Equal replicas arrive in turn: after the first round each Δ is applied after the other n-1."""
    r = Run(make_config(algorithm="async-diloco:inner_steps=2", lr=0.01, workers=4,
                        stragglers="none:compute_s=0.01"))
    first, later = r.train_step(), [r.train_step() for _ in range(3)]
    assert first["staleness_mean"] == pytest.approx(1.5) and first["staleness_max"] == 3
    assert all(i["staleness_mean"] == 3 and i["staleness_max"] == 3 for i in later)


def test_bad_settings_are_refused_with_their_value(make_config):
    with pytest.raises(ConfigError, match="period must be >= 0.*-1"):
        Run(make_config(algorithm="async-diloco:period=-1"))
    with pytest.raises(ConfigError, match="inner='lion'.*adamw, sgd"):
        Run(make_config(algorithm="async-diloco:inner=lion"))


def test_real_driver_runs_three_replicas(make_config):
    cfg = make_config(algorithm="async-diloco:inner_steps=2", workers=3, steps=4, eval_every=4, lr=0.01,
                      backend="threads", timeout_s=30, stragglers="lognormal:sigma=0.5,compute_s=0.002")
    summary = run(cfg, progress=False)
    assert summary["status"] == "finished" and summary["lost_workers"] == []
    steps = read_jsonl(cfg.out + "/steps.jsonl")
    assert len(steps) == 4 and all(s["gradients"] == 6 and s["dropped"] == 0 for s in steps)
