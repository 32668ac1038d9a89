"""Behaviour of the simulated cluster with sync SGD, backups and async SGD."""

import numpy as np
import pytest
import torch

from gradwire.algorithms.protocol import HEADER_BYTES
from gradwire.run.loop import Run, run
from gradwire.transports.network import NETWORKS
from tests.helpers import read_jsonl

SHORT = dict(steps=20, eval_every=10)  # for make_config: 20 steps, no momentum


def test_sync_one_worker_equals_plain_sgd(make_config):
    r = Run(make_config(SHORT, workers=1, momentum=0.9, weight_decay=1e-3, steps=15))
    # the same model, data order and hyper-parameters through torch.optim.SGD on the nn.Module
    from gradwire.seeding import hash_seed

    module = r.task.model_fn(torch.Generator().manual_seed(hash_seed(0, "model")))  # an independent copy
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    data = r.oracle.workers[0]
    from gradwire.tasks.oracle import WorkerData

    replay = WorkerData(data.x, data.y, batch_size=16, seed=0, rank=0)
    for _ in range(15):
        r.train_step()
        x, y = replay.next_batch()
        opt.zero_grad()
        r.task.loss_fn(module(x), y).backward()
        opt.step()
    plain = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    torch.testing.assert_close(r.algorithm.eval_params(), plain, rtol=1e-5, atol=1e-6)


def test_plain_sync_waits_for_the_slowest_then_the_allreduce(make_config):
    c = make_config(SHORT, workers=6, algorithm="sync", stragglers="lognormal:sigma=1.0,compute_s=0.1",
                    network="ps:mbps=10,latency_ms=5")
    r = Run(c)
    cost = NETWORKS.build(c.network).allreduce(r.model.numel * 4, 6)
    for step in range(1, 6):
        before, sent = r.clock.now, r.transport.bytes_sent
        info = r.train_step()
        assert info["gradients"] == 6 and info["dropped"] == 0
        times = r.ctx.stragglers.times(6, step)
        assert r.clock.now - before == pytest.approx(max(times) + cost.time_s, rel=1e-12)
        assert r.transport.bytes_sent - sent == cost.bytes
    assert r.gradients == 6 * 5  # every step's, the first included (metrics.jsonl's rows write this count)


@pytest.mark.parametrize("backups", [1, 3])
def test_backups_aggregate_exactly_n_and_step_time_is_order_statistic(make_config, backups):
    c = make_config(SHORT, workers=6, algorithm=f"sync:backups={backups}",
                    stragglers="lognormal:sigma=1.0,compute_s=0.1", network="ps:mbps=10,latency_ms=5")
    r = Run(c)
    net = NETWORKS.build(c.network)
    n = 6 - backups
    up = HEADER_BYTES + r.algorithm.averager.compressor.nbytes(r.model.numel, torch.float32)  # a gradient
    down = HEADER_BYTES + r.model.numel * 4                                                # x_{t+1}
    info = r.train_step()
    # step 1: every worker starts at time 0; the first n gradients to reach the server win, and
    # the step ends with the n-th arrival (compute time + upload: the order statistic)
    arrivals = [r.ctx.stragglers.time(w, 1) + net.send(up).time_s for w in range(6)]
    assert info["winners"] == sorted(np.argsort(arrivals, kind="stable")[:n].tolist())
    assert info["gradients"] == n and info["dropped"] == 0
    assert r.clock.now == pytest.approx(np.sort(arrivals)[n - 1], rel=1e-12)
    assert r.transport.bytes_sent == n * up + n * down
    taken = n
    for _ in range(2, 6):
        info = r.train_step()
        assert info["gradients"] == n and len(set(info["winners"])) == n and len(info["late"]) == info["dropped"]
        taken += n + info["dropped"]
    # every gradient computed was taken (applied, or dropped as late) or is still on its way
    assert taken + len(r.driver.queue) == sum(r.driver.counts.values())
    assert r.transport.bytes_sent == taken * (up + down)  # ... and each taken one was answered once


def test_same_seed_same_metrics(make_config, tmp_path):
    def metrics(sub, seed):
        c = make_config(SHORT, algorithm="sync:backups=1", stragglers="tail:p=0.2,slowdown=5",
                        compressor="qsgd:levels=4", error_feedback=True, seed=seed, out=sub)
        run(c, progress=False)
        recs = read_jsonl(tmp_path / sub / "metrics.jsonl")
        for x in recs:
            x.pop("wall_time_s"), x.pop("eval_time_s")
        return recs

    a, b, other = metrics("a", 1), metrics("b", 1), metrics("c", 2)
    assert a == b
    # the gradients applied so far: N = 3 of the 4 workers' each step (backups=1), from step 1 on
    assert [(x["step"], x["gradients"]) for x in a] == [(0, 0), (10, 30), (20, 60)]
    assert a != other


def test_compressed_sync_counts_exact_payload_bytes(make_config):
    from gradwire.compress import build

    c = make_config(SHORT, compressor="qsgd:levels=4,bucket=64", network="ring:mbps=100,latency_ms=1")
    r = Run(c)
    payload = build("qsgd:levels=4,bucket=64").nbytes(r.model.numel, torch.float32)
    r.train_step()
    assert r.transport.bytes_sent == NETWORKS.build(c.network).allgather([payload] * 4).bytes == 3 * 4 * payload


@pytest.mark.parametrize("spec", ["topk:ratio=0.05", "threshold:tau=0.01"])
def test_variable_size_payloads_are_counted_exactly(make_config, spec):
    """topk and threshold payloads depend on the data (nbytes is None). Threshold's is unbounded
    (any count): the transport counts the bytes each worker's packet actually has. Top-k's is
    bounded (k values, at most gapcode.max_section_bytes of positions): every packet travels framed
    at that bound plus a 4-byte length, so that no transport exchanges sizes first."""
    c = make_config(SHORT, compressor=spec, error_feedback=True, network="ring:mbps=100,latency_ms=1")
    r = Run(c)
    sizes, encode = [], r.algorithm.averager.encode

    def recording(rank, x):
        packet = encode(rank, x)
        sizes.append(packet.nbytes)
        return packet

    r.algorithm.averager.encode = recording
    total = 0
    for _ in range(3):
        sizes.clear()
        r.train_step()
        assert len(sizes) == 4
        if spec.startswith("topk"):
            bound = r.algorithm.averager.compressor.max_nbytes(r.algorithm.x.numel())
            assert max(sizes) <= bound < 1.1 * max(sizes)
            sizes = [4 + bound] * len(sizes)
        total += NETWORKS.build(c.network).allgather(sizes).bytes
    assert r.transport.bytes_sent == total
    assert len(set(sizes)) > 1 or spec.startswith("topk")  # threshold counts differ between workers


def test_async_records_staleness_and_drops(make_config):
    c = make_config(SHORT, algorithm="async", stragglers="lognormal:sigma=1.0,compute_s=0.1", lr=0.02)
    r = Run(c)
    infos = [r.train_step() for _ in range(10)]
    assert all(i["gradients"] == 4 and i["dropped"] == 0 for i in infos)
    assert max(i["staleness_max"] for i in infos) >= 2  # heterogeneous workers do see stale parameters
    strict = Run(c.replace(algorithm="async:max_staleness=0"))
    dropped = sum(strict.train_step()["dropped"] for _ in range(10))
    assert dropped > 0


def test_async_same_speed_workers_round_robin(make_config):
    # equal compute times and a free network: arrivals in rank order, staleness = workers - 1 in steady state
    c = make_config(SHORT, algorithm="async", stragglers="none:compute_s=1", network="ps:mbps=1e9,latency_ms=0")
    r = Run(c)
    r.train_step()
    info = r.train_step()
    assert info["staleness_max"] == 3 and info["staleness_mean"] == 3


def test_async_applies_exactly_the_gradients_within_max_staleness(make_config):
    """Every message replayed in the order the server handled it, against torch.optim.SGD: a gradient
    read at version v arriving at version V is applied iff V - v <= max_staleness (the boundary both
    ways), dropped ones leave x and the version as they were."""
    c = make_config(SHORT, algorithm="async:max_staleness=1", dtype="float64", lr=0.05, momentum=0.0,
                    stragglers="lognormal:sigma=1.0,compute_s=0.1")
    r = Run(c)
    alg = r.algorithm
    x = torch.nn.Parameter(alg.x.clone())
    reference = torch.optim.SGD([x], lr=0.05)
    seen = {"applied_at_1": 0, "dropped": 0, "applied": 0}
    on_message = alg.on_message

    def replayed(msg, finished):
        version, stale = alg.version, alg.version - msg.tag
        answer = on_message(msg, finished)
        if stale <= 1:
            x.grad = alg.averager.decode(msg.body, alg.x).clone()
            reference.step()
            seen["applied"] += 1
            seen["applied_at_1"] += stale == 1
            assert alg.version == version + 1 and not answer.dropped
        else:
            seen["dropped"] += 1
            assert alg.version == version and answer.dropped
        torch.testing.assert_close(alg.x, x.detach(), rtol=0, atol=1e-13)
        return answer

    alg.on_message = replayed
    infos = [r.train_step() for _ in range(10)]
    assert seen["dropped"] == sum(i["dropped"] for i in infos) > 0
    assert seen["applied_at_1"] > 0 and seen["applied"] == sum(i["gradients"] for i in infos)


def test_sync_backups_apply_the_first_n_and_never_a_late_gradient(make_config):
    """sync:backups=2 on 6 workers, replayed against torch.optim.SGD: the N = 4 gradients of a step's
    first arrivals move x by their mean (rank order) when the 4th arrives; a late one (computed for an
    earlier step) leaves x as it was."""
    c = make_config(SHORT, workers=6, algorithm="sync:backups=2", dtype="float64", lr=0.05, momentum=0.0,
                    stragglers="lognormal:sigma=1.0,compute_s=0.1")
    r = Run(c)
    alg = r.algorithm
    x = torch.nn.Parameter(alg.x.clone())
    reference = torch.optim.SGD([x], lr=0.05)
    fresh, late = {}, 0
    on_message = alg.on_message

    def replayed(msg, finished):
        nonlocal fresh, late
        if msg.tag != alg.current:
            late += 1
        else:
            fresh[msg.worker] = alg.averager.decode(msg.body, alg.x).clone()
            if len(fresh) == 4:
                x.grad = sum(fresh[w] for w in sorted(fresh)) / 4
                reference.step()
                fresh = {}
        answer = on_message(msg, finished)
        torch.testing.assert_close(alg.x, x.detach(), rtol=0, atol=1e-13)
        return answer

    alg.on_message = replayed
    infos = [r.train_step() for _ in range(8)]
    assert late == sum(i["dropped"] for i in infos) > 0
