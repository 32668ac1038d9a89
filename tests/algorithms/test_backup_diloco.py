"""DiLoCo with backup replicas: with no backups it is DiLoCo; with backups the outer step is
DiLoCo's on the first N pseudo-gradients only (a reference replays the recorded winners with
torch.optim.SGD), late ones are never applied, and the real driver takes the first N (what both
server-mode DiLoCos share is tested in test_server_diloco.py)."""

import pytest
import torch

from gradwire.algorithms.protocol import GRADIENT
from gradwire.run.loop import Run, run
from tests.helpers import read_jsonl


@pytest.mark.parametrize("schedule", ["constant", "cosine:warmup=2,min_ratio=0.1"])
@pytest.mark.parametrize("inner", ["adamw", "sgd"])
def test_without_backups_it_is_diloco(make_config, schedule, inner):
    """b = 0, no stragglers: every round averages every replica's Δ, as DiLoCo's allreduce does (both
    sum in rank order), so round t's θ is DiLoCo's after t·H inner steps, bitwise (float64); under a
    --lr-schedule too, whose horizon is --steps rounds of H inner updates (DiLoCo's: its --steps)."""
    cfg = make_config(dtype="float64", lr=0.01, workers=3, lr_schedule=schedule)
    backup = Run(cfg.replace(algorithm=f"backup-diloco:backups=0,inner_steps=3,inner={inner}", steps=4))
    diloco = Run(cfg.replace(algorithm=f"diloco:inner_steps=3,inner={inner}", steps=12))
    for _ in range(4):
        info = backup.train_step()
        assert info["winners"] == [0, 1, 2] and info["dropped"] == 0
        for _ in range(3):
            diloco.train_step()
        assert torch.equal(backup.algorithm.theta, diloco.algorithm.theta)


def test_outer_steps_use_the_first_n_and_drop_the_late(make_config):
    """Worker 0 is 4x slower: it never wins a round. Each round's θ is a Nesterov step of
    torch.optim.SGD on the mean of the winners' Δ_i = θ_start - x_i as they arrived; the late Δ
    are answered with the current θ and never touch it."""
    cfg = make_config(algorithm="backup-diloco:backups=1,inner_steps=2,outer_lr=0.7,outer_momentum=0.9,outer_warmup=0",
                      dtype="float64", lr=0.01, workers=3, stragglers="slow:count=1,slowdown=4,compute_s=0.01")
    r = Run(cfg)
    alg = r.algorithm
    messages = []
    on_message = alg.on_message

    def recorded(msg, finished):
        if msg.kind == GRADIENT:
            messages.append((msg.worker, msg.tag, msg.tensor(alg.theta).clone()))
        return on_message(msg, finished)

    alg.on_message = recorded
    theta = torch.nn.Parameter(alg.theta.clone())
    outer = torch.optim.SGD([theta], lr=0.7, momentum=0.9, nesterov=True)
    late = 0
    for t in range(1, 7):
        info = r.train_step()
        assert info["winners"] == [1, 2]
        mine = [d for w, tag, d in messages if tag == t]
        late += sum(1 for w, tag, _ in messages if tag < t and w == 0)
        theta.grad = (mine[0] + mine[1]) / 2  # both winners; rank order is arrival order here
        outer.step()
        torch.testing.assert_close(alg.theta, theta.detach(), rtol=0, atol=1e-13)
        messages = [m for m in messages if m[1] > t]
    assert late >= 1  # worker 0's pseudo-gradients did arrive, for rounds already over


def replay_run(make_config, late: str):
    """Three replicas, one of them 4x slow, with the late rule ``late``; and a reference θ with
    torch.optim.SGD's Nesterov step (0.7, 0.9), both starting from the run's θ."""
    cfg = make_config(algorithm=f"backup-diloco:backups=1,late={late},inner_steps=2,outer_lr=0.7,outer_momentum=0.9,"
                                "outer_warmup=0",
                      dtype="float64", lr=0.01, workers=3, stragglers="slow:count=1,slowdown=4,compute_s=0.01")
    r = Run(cfg)
    theta = torch.nn.Parameter(r.algorithm.theta.clone())
    return r, r.algorithm, theta, torch.optim.SGD([theta], lr=0.7, momentum=0.9, nesterov=True)


def test_late_pseudo_gradients_applied_with_the_staleness_rule(make_config):
    """late=stale: every message is replayed in the order the server handled it. A late Δ of
    staleness s moves θ by -α Δ / (N s) at once (plain SGD: the Nesterov buffer untouched); a
    round's N fresh ones take torch.optim.SGD's Nesterov step on their mean."""
    r, alg, theta, outer = replay_run(make_config, "stale")
    fresh, applied = [], 0
    on_message = alg.on_message

    def replayed(msg, finished):
        nonlocal applied, fresh
        current = alg.current
        answer = on_message(msg, finished)
        delta = msg.tensor(alg.theta).clone()
        with torch.no_grad():
            if msg.tag < current:
                theta.sub_(delta, alpha=0.7 / (2 * (current - msg.tag)))
                applied += 1
            else:
                fresh.append(delta)
                if len(fresh) == 2:
                    theta.grad = (fresh[0] + fresh[1]) / 2
                    with torch.enable_grad():
                        outer.step()
                    fresh = []
        torch.testing.assert_close(alg.theta, theta.detach(), rtol=0, atol=1e-13)
        return answer

    alg.on_message = replayed
    infos = [r.train_step() for _ in range(8)]
    assert applied >= 1 and all(i["dropped"] == 0 for i in infos) and any(i["late"] for i in infos)


def test_late_pseudo_gradients_buffered_with_fedbuff_weights(make_config):
    """late=buffer, written from FedBuff's server (Nguyen et al. 2022, Algorithm 1) as the round's
    buffer: every message is replayed in the order the server handled it. A late Δ of staleness s
    waits in the round in progress as Δ / sqrt(1 + s) and leaves θ alone; the round's N-th fresh Δ
    closes it with torch.optim.SGD's Nesterov step on (Σ fresh + Σ buffered) / (N + L)."""
    r, alg, theta, outer = replay_run(make_config, "buffer")
    fresh, buffered, used = [], [], 0
    on_message = alg.on_message

    def replayed(msg, finished):
        nonlocal fresh, buffered, used
        current = alg.current
        before = alg.theta.clone()
        answer = on_message(msg, finished)
        delta = msg.tensor(alg.theta).clone()
        if msg.tag < current:
            buffered.append(delta / (1 + (current - msg.tag)) ** 0.5)
            assert torch.equal(alg.theta, before)  # a late Δ waits for the round's end
        else:
            fresh.append(delta)
            if len(fresh) == 2:
                theta.grad = (sum(fresh) + sum(buffered, torch.zeros_like(delta))) / (2 + len(buffered))
                with torch.enable_grad():
                    outer.step()
                used += len(buffered)
                fresh, buffered = [], []
        torch.testing.assert_close(alg.theta, theta.detach(), rtol=0, atol=1e-13)
        return answer

    alg.on_message = replayed
    infos = [r.train_step() for _ in range(8)]
    assert used >= 1 and sum(i["buffered"] for i in infos) == used and all(i["dropped"] == 0 for i in infos)


def test_a_message_costs_its_inner_steps_draws(make_config):
    """On the simulator a replica sends after the sum of its H inner steps' straggler draws."""
    cfg = make_config(algorithm="backup-diloco:backups=0,inner_steps=4", lr=0.01, workers=2,
                      stragglers="lognormal:sigma=0.5,compute_s=0.05", network="ring:mbps=1000000,latency_ms=0")
    r = Run(cfg)
    r.train_step()
    draws = [sum(r.ctx.compute_time(w, j) for j in range(1, 5)) for w in range(2)]
    assert r.clock.now == pytest.approx(max(draws), rel=1e-6)


@pytest.mark.parametrize("late", ["drop", "stale", "buffer"])
def test_real_driver_takes_the_first_n_of_each_round(make_config, late):
    cfg = make_config(algorithm=f"backup-diloco:backups=1,late={late},inner_steps=2", workers=3, steps=5, eval_every=5,
                      lr=0.01, backend="threads", timeout_s=30, stragglers="lognormal:sigma=0.5,compute_s=0.002")
    summary = run(cfg, progress=False)
    assert summary["status"] == "finished" and summary["lost_workers"] == []
    steps = read_jsonl(cfg.out + "/steps.jsonl")
    assert [len(s["winners"]) for s in steps] == [2] * 5
