"""Behaviour of the simulated cluster with sync SGD, backups and async SGD."""

import numpy as np
import pytest
import torch

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


@pytest.mark.parametrize("backups", [0, 1, 3])
def test_backups_aggregate_exactly_n_and_step_time_is_order_statistic(make_config, backups):
    c = make_config(SHORT, workers=6, algorithm=f"sync:backups={backups}",
                    stragglers="lognormal:sigma=1.0,compute_s=0.1", network="ps:mbps=10,latency_ms=5")
    r = Run(c)
    net = NETWORKS.build(c.network)
    n = 6 - backups
    seen: list[int] = []
    real = r.oracle

    class Spy:
        def __call__(self, rank, params):
            seen.append(rank)
            return real(rank, params)

    r.ctx.oracle = Spy()
    for step in range(1, 6):
        before, sent = r.clock.now, r.transport.bytes_sent
        seen.clear()
        r.step += 1
        info = r.algorithm.step(r.ctx, r.step)
        times = r.ctx.stragglers.times(6, step)
        expected_winners = sorted(np.argsort(times, kind="stable")[:n].tolist())
        assert sorted(seen) == expected_winners and info["gradients"] == n and info["dropped"] == backups
        cost = net.allreduce(r.model.numel * 4, n)
        assert r.clock.now - before == pytest.approx(np.sort(times)[n - 1] + cost.time_s, rel=1e-12)
        assert r.transport.bytes_sent - sent == cost.bytes


def test_same_seed_same_metrics(make_config, tmp_path):
    def metrics(sub, seed):
        c = make_config(SHORT, algorithm="sync:backups=1", stragglers="tail:p=0.2,slowdown=5",
                        compressor="qsgd:levels=4", error_feedback=True, seed=seed, out=sub)
        run(c, progress=False)
        recs = read_jsonl(tmp_path / sub / "metrics.jsonl")
        for x in recs:
            x.pop("wall_time_s")
        return recs

    a, b, other = metrics("a", 1), metrics("b", 1), metrics("c", 2)
    assert a == b
    assert a != other


def test_compressed_sync_counts_exact_payload_bytes(make_config):
    from gradwire.compress import build

    c = make_config(SHORT, compressor="qsgd:levels=4,bucket=64", network="ring:mbps=100,latency_ms=1")
    r = Run(c)
    payload = build("qsgd:levels=4,bucket=64").nbytes(r.model.numel, torch.float32)
    r.train_step()
    assert r.transport.bytes_sent == NETWORKS.build(c.network).allgather([payload] * 4).bytes == 3 * 4 * payload


def test_async_records_staleness_and_drops(make_config):
    c = make_config(SHORT, algorithm="async", stragglers="lognormal:sigma=1.0,compute_s=0.1", lr=0.02)
    r = Run(c)
    infos = [r.train_step() for _ in range(10)]
    assert all(i["gradients"] == 4 and i["dropped"] == 0 for i in infos)
    assert max(i["staleness_max"] for i in infos) >= 2  # heterogeneous workers do see stale parameters
    times = [r.clock.now]
    strict = Run(c.replace(algorithm="async:max_staleness=0"))
    dropped = sum(strict.train_step()["dropped"] for _ in range(10))
    assert dropped > 0
    assert times[0] > 0


def test_async_same_speed_workers_round_robin(make_config):
    # equal compute times and a free network: arrivals in rank order, staleness = workers - 1 in steady state
    c = make_config(SHORT, algorithm="async", stragglers="none:compute_s=1", network="ps:mbps=1e9,latency_ms=0")
    r = Run(c)
    r.train_step()
    info = r.train_step()
    assert info["staleness_max"] == 3 and info["staleness_mean"] == 3
