"""Leader SGD: the invariants of its update, leader election, multi-leader groups, the asynchronous
version, and the curse of symmetry it avoids (Teng et al. 2019)."""

import numpy as np
import pytest
import torch

from gradwire.algorithms import ALGORITHMS, CodecConfig, OptimConfig
from gradwire.algorithms.protocol import HEADER_BYTES
from gradwire.run.loop import Run
from gradwire.servers.simulated import SimulatedServer
from gradwire.tasks.oracle import WorkerData
from tests.algorithms.double_well import EASGD_SPEC, LSGD_SPEC, WORKERS, f, simulate
from tests.helpers import LOCAL_UPDATES, read_jsonl


class Spy:
    """Records every (rank, loss) the oracle returns, in call order."""

    def __init__(self, oracle):
        self.oracle, self.calls = oracle, []

    def __call__(self, rank, params):
        loss, grad = self.oracle(rank, params)
        self.calls.append((rank, loss))
        return loss, grad


def test_pull_zero_is_independent_sgd_on_each_worker(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:pull=0,period=2", weight_decay=1e-3))
    start = r.model.flatten()
    for _ in range(10):
        r.train_step()
    for rank in range(4):  # each worker alone: torch.optim.SGD on its own data stream
        module = r.task.model_fn(torch.Generator())
        r.model.load(start)
        module.load_state_dict(r.model.module.state_dict())
        opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        data = r.oracle.workers[rank]
        replay = WorkerData(data.x, data.y, batch_size=16, seed=0, rank=rank)
        for _ in range(10):
            x, y = replay.next_batch()
            opt.zero_grad()
            r.task.loss_fn(module(x), y).backward()
            opt.step()
        alone = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        torch.testing.assert_close(r.algorithm.replicas.x[rank], alone, rtol=1e-5, atol=1e-6)


def test_pull_one_period_one_makes_every_worker_the_leader(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:pull=1,period=1"))
    leaders = set()
    for _ in range(8):
        info = r.train_step()
        lead = r.algorithm.replicas.x[info["leader"]]
        leaders.add(info["leader"])
        for x in r.algorithm.replicas.x.values():
            assert torch.equal(x, lead)
        assert torch.equal(r.algorithm.eval_params(), lead)
        assert info["leader_distance"] > 0  # they had drifted apart during the step
    assert r.algorithm.evaluates == "leader"


def test_leader_is_the_lowest_running_mean_loss_ties_to_lowest_rank(make_config):
    period = 3
    r = Run(make_config(LOCAL_UPDATES, algorithm=f"lsgd:pull=0.3,period={period}", workers=5))
    spy = Spy(r.oracle)
    r.ctx.oracle = spy
    history = {k: [] for k in range(5)}
    for step in range(1, 13):
        spy.calls.clear()
        info = r.train_step()
        for rank, loss in spy.calls:
            history[rank].append(loss)
        if step % period:
            assert "leader_loss" not in info
            continue
        means = {k: np.float32(np.mean(v[-period:])) for k, v in history.items()}
        expected = min(means, key=lambda k: (means[k], k))
        assert info["leader"] == expected and info["leader_loss"] == float(means[expected])
    # a tie goes to the lowest rank: every worker reporting the same score elects rank 0
    from gradwire.algorithms.replicas import elect

    assert elect(r.ctx, {k: 1.5 for k in range(5)}) == (0, 1.5)
    assert elect(r.ctx, {0: 2.0, 1: 1.0, 2: 1.0, 3: 3.0, 4: 1.0}) == (1, 1.0)


def test_multi_leader_pulls_to_group_and_global_leaders(make_config):
    spec = "lsgd:groups=2,pull=1,period=1,global_pull=0,global_period=3"
    r = Run(make_config(LOCAL_UPDATES, algorithm=spec))
    assert r.algorithm.members == [[0, 1], [2, 3]] and r.algorithm.setup_info()["groups"] == [[0, 1], [2, 3]]
    for step in range(1, 7):
        info = r.train_step()
        xs = r.algorithm.replicas.x
        a, b = info["group_leaders"]
        assert a in (0, 1) and b in (2, 3)
        assert torch.equal(xs[0], xs[a]) and torch.equal(xs[1], xs[a])   # λ = 1: a copy of the group leader
        assert torch.equal(xs[2], xs[b]) and torch.equal(xs[3], xs[b])
        assert not torch.equal(xs[0], xs[2])                               # λ_G = 0: groups stay apart
        assert ("leader_loss" in info) == (step % 3 == 0)
        if step % 3 == 0:
            assert info["leader"] in (a, b) and torch.equal(r.algorithm.eval_params(), xs[info["leader"]])
    # λ_G = 1 at every round: one model for everybody
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:groups=2,pull=0.5,period=2,global_pull=1,global_period=1"))
    r.train_step()
    assert all(torch.equal(x, r.algorithm.replicas.x[0]) for x in r.algorithm.replicas.x.values())


class Speeds:
    """Worker k takes (1 + k) · 10 ms per step: worker 0 is four times as fast as worker 3."""

    def time(self, rank, count):
        return 0.01 * (1 + rank)

    def times(self, n, step):
        return np.array([self.time(k, step) for k in range(n)])


@pytest.mark.parametrize("spec", ["lsgd:async=true,pull=0.2,period=2", "lsgd:async=true,groups=2,period=2"])
def test_async_rounds_count_local_steps_in_total_fast_workers_step_more(make_config, spec):
    r = Run(make_config(LOCAL_UPDATES, algorithm="sync"))
    r.ctx.stragglers = Speeds()
    alg = ALGORITHMS.build(spec)
    alg.setup(r.ctx, r.model.flatten(), OptimConfig(lr=0.1), CodecConfig())
    r.algorithm, r.server = alg, SimulatedServer(r.ctx, alg)
    global_every = 2 if alg.multi is False else alg.global_period
    model, expected, pulls = r.model.numel * 4, 0, 0
    for step in range(1, 17):
        info = r.train_step()
        pulls += info.get("pulls", 0)
        assert info["gradients"] == 4 and sum(alg.local_steps.values()) == 4 * step
        # one global round triggered per period·n local steps reported in total
        assert alg.server.triggered["global"] == step // global_every
        # bytes: every local step a report and its answer (a header each); an upload adds the
        # leader's header + model, answered by a header; a pull adds a model to a member's answer
        uploads = info.get("rounds", 0) + info.get("uploads_superseded", 0)
        expected += 4 * 2 * HEADER_BYTES + uploads * (2 * HEADER_BYTES + model) + info.get("pulls", 0) * model
        assert r.transport.bytes_sent == expected
    assert pulls > 0  # the rounds' parameters reached their members
    done = alg.local_steps
    assert done[0] > done[1] > done[2] > done[3]
    assert done[0] >= 3 * done[3]
    assert alg.spec().endswith("async=true")


def test_curse_of_symmetry_lsgd_picks_a_well_easgd_center_stalls():
    for seed in (0, 1, 2):
        lsgd, path = simulate(LSGD_SPEC, seed=seed)
        x1 = [float(path[-1][k][0]) for k in range(WORKERS)]
        assert all(abs(abs(v) - 1) < 0.15 for v in x1) and len({np.sign(v) for v in x1}) == 1, x1
        assert f(lsgd.eval_params()) < 0.05
        easgd, path = simulate(EASGD_SPEC, seed=seed)
        x1 = [float(path[-1][k][0]) for k in range(WORKERS)]
        assert min(x1) < -0.6 and max(x1) > 0.6, x1           # the workers sit in both wells ...
        assert abs(float(easgd.eval_params()[0])) < 0.1       # ... and the center between them,
        assert f(easgd.eval_params()) > 0.9                   # at the saddle's value f = 1


@pytest.mark.parametrize("spec, evaluated", [("lsgd:period=2", "leader"), ("easgd:period=2", "center"),
                                             ("local:period=2", "average"), ("sync", "model")])
def test_metrics_say_whose_parameters_were_evaluated(make_config, tmp_path, spec, evaluated):
    from gradwire.run.loop import run

    run(make_config(LOCAL_UPDATES, algorithm=spec, steps=4, eval_every=2))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 4] and {r["evaluated"] for r in rows} == {evaluated}


@pytest.mark.parametrize("per_node, groups", [(1, [[0, 1, 2, 3]]), (2, [[0, 1], [2, 3]]), (4, [[0, 1, 2, 3]])])
def test_default_groups_follow_nodes_but_never_groups_of_one(make_config, per_node, groups):
    r = Run(make_config(LOCAL_UPDATES, algorithm="sync"))
    r.ctx.transport.node_of = lambda rank: rank // per_node  # as torchrun's LOCAL_WORLD_SIZE would say
    alg = ALGORITHMS.build("lsgd:pull=0.5,period=2")
    alg.setup(r.ctx, r.model.flatten(), OptimConfig(lr=0.1), CodecConfig())
    assert alg.members == groups and alg.multi == (len(groups) > 1)
