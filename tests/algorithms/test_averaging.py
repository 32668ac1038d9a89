"""Local SGD, DaSGD and EASGD: their reductions to one another, the elastic round against the paper's
update (and its conservation law), and the simulated clock of an overlapped average."""

import pytest
import torch

from gradwire.algorithms.protocol import HEADER_BYTES
from gradwire.run.loop import Run
from gradwire.transports.network import NETWORKS
from tests.helpers import LOCAL_UPDATES


def run_steps(cfg, steps):
    r = Run(cfg)
    infos = [r.train_step() for _ in range(steps)]
    return r, infos


def test_local_sgd_period_one_is_synchronous_sgd(make_config):
    local, _ = run_steps(make_config(LOCAL_UPDATES, algorithm="local:period=1"), 10)
    sync, _ = run_steps(make_config(LOCAL_UPDATES, algorithm="sync"), 10)
    torch.testing.assert_close(local.algorithm.eval_params(), sync.algorithm.eval_params(), rtol=1e-5, atol=1e-6)
    assert local.transport.bytes_sent == sync.transport.bytes_sent  # one allreduce of d floats per step


def test_dasgd_delay_zero_is_local_sgd_bit_for_bit(make_config):
    local, a = run_steps(make_config(LOCAL_UPDATES, algorithm="local:period=3"), 12)
    dasgd, b = run_steps(make_config(LOCAL_UPDATES, algorithm="dasgd:period=3,delay=0"), 12)
    for k in range(4):
        assert torch.equal(local.algorithm.replicas.x[k], dasgd.algorithm.replicas.x[k])
    assert torch.equal(local.algorithm.eval_params(), dasgd.algorithm.eval_params())
    assert [i["loss"] for i in a] == [i["loss"] for i in b]
    assert local.clock.now == dasgd.clock.now and local.transport.bytes_sent == dasgd.transport.bytes_sent


def test_dasgd_merges_the_average_plus_local_progress(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="dasgd:period=4,delay=2"))
    alg = r.algorithm
    for _ in range(4):
        r.train_step()
    started = {k: x.clone() for k, x in alg.replicas.x.items()}  # x_i(4), whose average is in flight
    average = sum(started[k] for k in range(4)) / 4
    local, merge = {}, alg._merge

    def spy(ctx, info):
        local.update({k: x.clone() for k, x in alg.replicas.x.items()})  # x_i(6) before the merge
        merge(ctx, info)

    alg._merge = spy
    assert r.train_step()["in_flight"] == 1 and not local
    info = r.train_step()
    assert info["merged_from_step"] == 4 and info["in_flight"] == 0
    for k in range(4):  # x_i(6) <- mean_j x_j(4) + (x_i(6) - x_i(4))
        torch.testing.assert_close(alg.replicas.x[k], average + (local[k] - started[k]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alg.eval_params(), average, rtol=1e-6, atol=1e-7)


def test_dasgd_hides_the_communication_local_sgd_pays_for_it(make_config):
    # 0.1 s per step, an allreduce of this model costs about 0.03 s on the ps network: one step of
    # delay covers it, so DaSGD's clock is pure computation
    kw = dict(stragglers="none:compute_s=0.1", network="ps:mbps=10,latency_ms=5")
    local, _ = run_steps(make_config(LOCAL_UPDATES, algorithm="local:period=2", **kw), 12)
    dasgd, _ = run_steps(make_config(LOCAL_UPDATES, algorithm="dasgd:period=2,delay=1", **kw), 12)
    comm = NETWORKS.build(kw["network"]).allreduce(local.model.numel * 4, 4).time_s
    assert 0 < comm < 0.1
    assert local.clock.now == pytest.approx(12 * 0.1 + 6 * comm)
    assert dasgd.clock.now == pytest.approx(12 * 0.1)  # the average of step 12 is still in flight
    assert dasgd.transport.bytes_sent == local.transport.bytes_sent
    assert dasgd.transport.comm_time_s == pytest.approx(6 * comm)


@pytest.mark.parametrize("spec, alpha, beta, period", [
    ("easgd:alpha=0.2,beta=0.8,period=2", 0.2, 0.8, 2),  # β = pα (the paper's choice): symmetric forces
    ("easgd:alpha=0.3,beta=0.5,period=3", 0.3, 0.5, 3),  # asymmetric: Σ x_i + x̃ is not conserved
    ("easgd:beta=0.9", 0.9 / 4, 0.9, 2),                 # alpha=0 (default): β/p; period 2 (the default)
])
def test_easgd_rounds_are_the_elastic_update(make_config, spec, alpha, beta, period):
    """Zhang, Choromanska, LeCun 2015, eqs. (5)-(6), synchronous, after the local steps (easgd.py): every
    τ-th step, from the replicas x_i (after their gradient steps) and the centre x̃ both saved before the
    round, x_i <- x_i - α (x_i - x̃) and x̃ <- x̃ + β (mean_i x_i - x̃); between rounds x̃ stays put. α, β
    and τ are the spec's, written as literals; float64, 4 workers."""
    r = Run(make_config(LOCAL_UPDATES, algorithm=spec, dtype="float64"))
    alg = r.algorithm
    real = r.transport.allreduce_mean
    seen = []

    def spy(tensors, ranks=None):
        seen.append({k: t.clone() for k, t in tensors.items()})  # the x_i of the round, before it
        return real(tensors, ranks)

    r.transport.allreduce_mean = spy
    rounds = 0
    for step in range(1, 10):
        center = alg.center.clone()
        seen.clear()
        info = r.train_step()
        if step % period:
            assert not seen and torch.equal(alg.center, center), f"step {step} is no round"
            continue
        rounds += 1
        assert len(seen) == 1 and sorted(seen[0]) == [0, 1, 2, 3]
        x = seen[0]
        mean = sum(x.values()) / 4
        for k in range(4):
            torch.testing.assert_close(alg.replicas.x[k], x[k] - alpha * (x[k] - center), rtol=0, atol=1e-12,
                                       msg=lambda m, s=step, w=k: f"x_{w} after step {s}: {m}")
        torch.testing.assert_close(alg.center, center + beta * (mean - center), rtol=0, atol=1e-12,
                                   msg=lambda m, s=step: f"centre after step {s}: {m}")
        conserved = sum(alg.replicas.x.values()) + alg.center - (sum(x.values()) + center)
        # Σ_i x_i + x̃ changes by (β - 4α)(mean - x̃): zero exactly where β = pα
        torch.testing.assert_close(conserved, (beta - 4 * alpha) * (mean - center), rtol=0, atol=1e-12)
        assert float((mean - center).abs().max()) > 1e-3  # the forces were not negligible
        assert info["center_distance"] > 0
    assert rounds == 9 // period and alg.evaluates == "center"


def test_easgd_default_alpha_is_beta_over_workers(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="easgd:beta=0.9", workers=6))
    assert r.algorithm.alpha == pytest.approx(0.15) and r.algorithm.spec().startswith("easgd:alpha=0.15,beta=0.9")


def test_async_easgd_each_worker_exchanges_every_period_of_its_own_steps(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="easgd:async=true,period=3",
                        stragglers="lognormal:sigma=1.0,compute_s=0.05"))
    exchanges = sum(r.train_step()["exchanges"] for _ in range(15))
    done = r.algorithm.local_steps  # as the master heard them
    assert sum(done.values()) == 60 and len(set(done.values())) > 1  # workers progress at their own pace
    assert exchanges == sum(n // 3 for n in done.values())
    model_bytes = r.model.numel * 4
    # every step: a report and an answer (a header each); every exchange adds x_i up and e down
    assert r.transport.bytes_sent == 60 * 2 * HEADER_BYTES + 2 * exchanges * model_bytes
