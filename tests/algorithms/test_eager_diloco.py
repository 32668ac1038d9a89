"""Eager updates for Streaming DiLoCo (Kale, Douillard, Donchev 2025, arXiv:2502.12996) on the
simulator: the outer loop against a reference written from the rule in docs/low_communication.md,
the same bytes and clock as plain overlapped rounds, and a resume that is bitwise."""

import pytest
import torch

from gradwire.run.loop import Run
from tests.algorithms.test_diloco import COSINE, cosine_factor, spec_values
from tests.helpers import record_inner_steps, through_bytes


@pytest.mark.parametrize("spec", [
    "streaming-diloco:inner_steps=3,fragments=1,overlap=3,inner=sgd,outer_warmup=0,eager=true",  # fully overlapped
    "streaming-diloco:inner_steps=4,fragments=2,overlap=2,inner=adamw,outer_warmup=2,eager=true",
    "streaming-diloco:inner_steps=3,fragments=3,overlap=1,outer_lr=0.5,outer_momentum=0.6,outer_warmup=0,"
    "inner=sgd,eager=true",  # η and μ not the defaults: the spec's own reach every worker's outer step
    f"streaming-diloco:inner_steps=4,fragments=2,overlap=2,inner=sgd,outer_warmup=0,outer_schedule=inner,eager=true"
    f"|{COSINE}",  # each proxy step at η f(t - 1), t the step its round starts
])
def test_eager_outer_steps_match_a_reference(make_config, spec):
    """Each worker i keeps θ_i and a torch.optim.SGD (Nesterov) of its own; when fragment p's round
    starts it sends Δ_i = θ_{i,p} - x_{i,p}, steps θ_{i,p} at once on Δ_i / n + (1/n) Σ_{j≠i} Δ_j of
    the previous round (zero before the first average arrives) and restarts x_{i,p} <- θ_{i,p}; the
    average, τ steps later, changes no parameter. Inner steps are gradwire's own (taken as given)."""
    spec, _, schedule = spec.partition("|")
    r = Run(make_config(algorithm=spec, dtype="float64", lr=0.01, workers=3, lr_schedule=schedule or "constant"))
    alg = r.algorithm
    v = spec_values(spec)  # the numbers the spec asked for (its keys, else the documented defaults), not alg's
    assert v["eager"] == "true" and v["outer_momentum"] > 0
    n, h, fragments, tau = 3, v["inner_steps"], v["fragments"], v["overlap"]
    eta, mu, warmup = v["outer_lr"], v["outer_momentum"], v["outer_warmup"]
    bounds = [p * alg.theta.numel() // fragments for p in range(fragments + 1)]
    ranges = list(zip(bounds, bounds[1:]))
    theta = {i: [torch.nn.Parameter(alg.theta[a:b].clone()) for a, b in ranges] for i in range(n)}
    outer = {i: [torch.optim.SGD([t], lr=eta, momentum=mu, nesterov=True) for t in ts] for i, ts in theta.items()}
    others = {i: [torch.zeros(b - a, dtype=torch.float64) for a, b in ranges] for i in range(n)}
    after_inner = record_inner_steps(alg)
    sent: dict[int, tuple[dict, int]] = {}  # fragment -> ({worker: Δ_i}, step sent)
    rounds = [0] * fragments
    for step in range(1, 21):
        r.train_step()
        x = dict(after_inner)
        for p in sorted(sent):
            if sent[p][1] + tau == step:  # the average arrives: the others' share for the next proxy
                deltas = sent.pop(p)[0]
                mean = sum(deltas.values()) / n
                for i in range(n):
                    others[i][p] = mean - deltas[i] / n
        for p, (a, b) in enumerate(ranges):
            if (step - p * h // fragments) % h == 0:
                deltas = {i: theta[i][p].detach() - x[i][a:b] for i in range(n)}
                sent[p] = (deltas, step)
                momentum = mu * min(1.0, rounds[p] / warmup) if warmup else mu
                rounds[p] += 1
                for i in range(n):
                    theta[i][p].grad = deltas[i] / n + others[i][p]
                    outer[i][p].param_groups[0]["momentum"] = momentum
                    if v["outer_schedule"] == "inner":
                        outer[i][p].param_groups[0]["lr"] = eta * cosine_factor(step - 1)
                    outer[i][p].step()
                    if not momentum:  # torch keeps no buffer at μ = 0: v_k = μ_k v_{k-1} + Δ_k
                        outer[i][p].state[theta[i][p]]["momentum_buffer"] = theta[i][p].grad.clone()
                    x[i][a:b] = theta[i][p].detach()
        for i in range(n):
            for p, (a, b) in enumerate(ranges):
                torch.testing.assert_close(alg.thetas[i][a:b], theta[i][p].detach(), rtol=0, atol=1e-12,
                                           msg=lambda m, s=step, w=i, f=p: f"θ_{w} fragment {f} step {s}: {m}")
            torch.testing.assert_close(alg.replicas.x[i], x[i], rtol=0, atol=1e-12,
                                       msg=lambda m, s=step, w=i: f"replica {w} after step {s}: {m}")
    assert not torch.equal(alg.thetas[0], alg.thetas[1])  # each worker's own proxy
    assert torch.equal(alg.theta, alg.thetas[0])  # what is evaluated


@pytest.mark.parametrize("extra", [{}, dict(compressor="qsgd:levels=8,bucket=64", error_feedback=True),
                                   dict(compressor="fp16")])
def test_eager_sends_what_plain_overlapped_rounds_send(make_config, extra):
    """The same collectives at the same steps: the same bytes and the same simulated clock."""
    spec = "streaming-diloco:inner_steps=4,fragments=2,overlap=3"
    runs = [Run(make_config(algorithm=spec + eager, lr=0.01, stragglers="lognormal:sigma=0.5,compute_s=0.05",
                            network="ring:mbps=10,latency_ms=1", **extra)) for eager in ("", ",eager=true")]
    for _ in range(10):
        for run in runs:
            run.train_step()
    plain, eager = runs
    assert eager.transport.bytes_sent == plain.transport.bytes_sent > 0
    assert eager.clock.now == plain.clock.now
    assert not torch.equal(eager.algorithm.theta, plain.algorithm.theta)


def test_eager_resume_mid_flight_equals_never_stopping(make_config):
    cfg = make_config(algorithm="streaming-diloco:inner_steps=4,fragments=2,overlap=3,eager=true", lr=0.01,
                      compressor="qsgd:levels=8,bucket=64", error_feedback=True)
    straight = Run(cfg)
    expected = [straight.train_step() for _ in range(11)]
    first = Run(cfg)
    for _ in range(6):
        first.train_step()
    assert first.algorithm.in_flight
    resumed = Run(cfg)
    resumed.load_state_dict(through_bytes(first.state_dict()))
    assert [resumed.train_step() for _ in range(5)] == expected[6:]
    for k, theta in straight.algorithm.thetas.items():
        assert torch.equal(resumed.algorithm.thetas[k], theta)
        assert torch.equal(resumed.algorithm.others[k], straight.algorithm.others[k])
        assert torch.equal(resumed.algorithm.replicas.x[k], straight.algorithm.replicas.x[k])


def test_one_eager_worker_is_blocking_diloco(make_config):
    """With one worker the average is its own outer gradient: the eager proxy is the whole of it and
    the others' share zero, so a fully overlapped eager run takes DiLoCo's blocking outer steps."""
    runs = [Run(make_config(algorithm=spec, lr=0.01, workers=1)) for spec in
            ("diloco:inner_steps=3", "streaming-diloco:inner_steps=3,fragments=1,overlap=3,eager=true")]
    for _ in range(10):
        assert runs[0].train_step()["loss"] == runs[1].train_step()["loss"]
        assert torch.equal(runs[0].algorithm.theta, runs[1].algorithm.theta)
