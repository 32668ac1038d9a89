"""Leader SGD: the invariants of its update, leader election, multi-leader groups, the asynchronous
version, and the curse of symmetry it avoids (Teng et al. 2019); the authors' protocol (issue 17):
the per-step proximal pull, the election window, what is evaluated, and the old trajectories that
prox=0, window=τ still give."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from gradwire.algorithms import ALGORITHMS, CodecConfig, OptimConfig
from gradwire.algorithms.protocol import HEADER_BYTES
from gradwire.reproduce.double_well import EASGD_SPEC, LSGD_SPEC, WORKERS, f, simulate
from gradwire.run.loop import Run
from gradwire.servers.simulated import SimulatedServer
from gradwire.tasks.evaluate import evaluate
from gradwire.tasks.oracle import WorkerData
from tests.algorithms.lsgd_reference import CASES, FILE, mismatches, trajectory
from tests.helpers import LOCAL_UPDATES, read_jsonl


class Spy:
    """Records every (rank, loss) the oracle returns, in call order."""

    def __init__(self, oracle):
        self.oracle, self.calls = oracle, []

    def __call__(self, rank, params):
        loss, grad = self.oracle(rank, params)
        self.calls.append((rank, loss))
        return loss, grad


@pytest.mark.parametrize("nesterov", [False, True])
def test_pull_zero_is_independent_sgd_on_each_worker(make_config, nesterov):
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:pull=0,prox=0,period=2", weight_decay=1e-3,
                        nesterov=nesterov))
    start = r.model.flatten()
    for _ in range(10):
        r.train_step()
    for rank in range(4):  # each worker alone: torch.optim.SGD on its own data stream
        module = r.task.model_fn(torch.Generator())
        r.model.load(start)
        module.load_state_dict(r.model.module.state_dict())
        opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=nesterov)
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
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:pull=1,period=1,eval=leader"))
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
    r = Run(make_config(LOCAL_UPDATES, algorithm=f"lsgd:pull=0.3,period={period},window={period}", workers=5))
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
    spec = "lsgd:groups=2,pull=1,period=1,global_pull=0,global_period=3,global_prox=0,eval=leader"
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
    r.algorithm, r.driver = alg, SimulatedServer(dataclasses.replace(r.driver.parts, algorithm=alg))
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


@pytest.mark.parametrize("spec, evaluated", [
    ("lsgd:period=2", "average"), ("lsgd:period=2,eval=leader", "leader"), ("lsgd:async=true", "leader"),
    ("easgd:period=2", "center"), ("easgd:period=2,eval=each", "each"), ("local:period=2", "last_average"),
    ("local:period=2,eval=average", "average"), ("sync", "model")])
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


# -- the authors' protocol (issue 17) ---------------------------------------------------------------


@pytest.mark.parametrize("old", list(CASES))
def test_prox_zero_and_window_tau_reproduce_the_recorded_trajectories(data_dir, tmp_path, old):
    """Recorded with the code from before the proximal pull and the window (lsgd_reference.py):
    every step's leaders, gradients and bytes exactly, and each replica's parameters, the losses,
    the clock and the last evaluation within what float32 summation order explains (on any CPU)."""
    recorded = json.loads(FILE.read_text())[old]
    assert mismatches(recorded, trajectory(old + CASES[old], str(data_dir), str(tmp_path / "run"))) == []
    # ... and the new defaults do move them (the reference can fail)
    assert mismatches(recorded, trajectory(old, str(data_dir), str(tmp_path / "new")))


def _spy_prox(alg):
    calls = []
    pull = alg.proximal_pull

    def spy(rank):
        before = alg.replicas.x[rank].clone()
        snapshot = {k: t.clone() for k, t in alg.snapshots[rank].items()}
        pull(rank)
        calls.append((rank, before, snapshot, alg.replicas.x[rank].clone()))

    alg.proximal_pull = spy
    return calls


def test_prox_moves_every_worker_leader_included_by_the_stated_formula(make_config):
    prox, period = 0.4, 3
    r = Run(make_config(LOCAL_UPDATES, algorithm=f"lsgd:pull=0.5,period={period},prox={prox},eval=leader"))
    assert torch.equal(r.algorithm.leader_x, r.model.flatten())  # the snapshot before any round: the start
    calls = _spy_prox(r.algorithm)
    w = prox / period
    leaders = set()
    for _ in range(12):
        calls.clear()
        snapshot_before = r.algorithm.leader_x.clone()  # the last round's leader, as broadcast
        info = r.train_step()
        assert sorted(c[0] for c in calls) == [0, 1, 2, 3]  # every worker, every step
        for _rank, before, snapshot, after in calls:
            assert torch.equal(snapshot["global"], snapshot_before)
            expected = (1 - w) * before.double() + w * snapshot["global"].double()   # x <- (1 - p/τ) x + (p/τ) x̃
            torch.testing.assert_close(after.double(), expected, rtol=0, atol=1e-6)
            assert (after - before).abs().max() > 1e-4  # moved, the leader too
        if "leader_loss" in info:
            leaders.add(info["leader"])
            assert torch.equal(r.algorithm.leader_x, r.algorithm.replicas.x[info["leader"]])
    assert leaders  # there were rounds, and their leaders were pulled at the steps after them


def test_prox_pulls_towards_both_leaders_with_groups(make_config):
    spec = "lsgd:groups=2,pull=0.5,period=2,global_pull=0.5,global_period=4,prox=0.6,global_prox=2,eval=leader"
    r = Run(make_config(LOCAL_UPDATES, algorithm=spec))
    for _ in range(4):
        r.train_step()  # a group round at steps 2 and 4, a global round at 4
    alg = r.algorithm
    calls = _spy_prox(alg)
    r.train_step()
    # the global leader led its group too, so only the other group has two different snapshots
    assert sum(not torch.equal(c[2]["group"], c[2]["global"]) for c in calls) == 2
    for _rank, before, snapshot, after in calls:
        x = before.double()
        x = (1 - 0.6 / 2) * x + 0.6 / 2 * snapshot["group"].double()     # towards the group leader: p/τ
        x = (1 - 2 / 4) * x + 2 / 4 * snapshot["global"].double()        # towards the global leader: p_G/τ_G
        torch.testing.assert_close(after.double(), x, rtol=0, atol=1e-6)
    assert torch.equal(calls[0][2]["global"], alg.leader_x)


def test_async_workers_pull_towards_the_last_leader_they_received(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:async=true,pull=0.5,period=1,prox=0.5"))
    alg = r.algorithm
    calls = _spy_prox(alg)
    start = r.model.flatten()
    for _ in range(6):
        r.train_step()
    assert sorted({c[0] for c in calls}) == [0, 1, 2, 3]
    for _rank, before, snapshot, after in calls:
        torch.testing.assert_close(after.double(), 0.5 * before.double() + 0.5 * snapshot["global"].double(),
                                   rtol=0, atol=1e-6)
    # the snapshots moved off the start: to uploaded leader parameters, which the server also holds
    assert all(not torch.equal(s["global"], start) for s in alg.snapshots.values())
    uploaded = [s["global"] for s in alg.snapshots.values()]
    assert any(torch.equal(u, alg.leader_x) for u in uploaded)


@pytest.mark.parametrize("spec", ["lsgd:period=2", "easgd:period=2,eval=average", "local:period=3,eval=average"])
def test_average_evaluation_is_the_mean_of_the_replicas_and_costs_the_run_nothing(make_config, spec):
    r = Run(make_config(LOCAL_UPDATES, algorithm=spec))
    for _ in range(5):  # step 5: between rounds, the replicas differ
        r.train_step()
    xs = r.algorithm.replicas.x
    assert not torch.equal(xs[0], xs[1])
    bytes_sent, now = r.transport.bytes_sent, r.clock.now
    r.algorithm.before_evaluation(r.ctx)
    assert (r.transport.bytes_sent, r.clock.now) == (bytes_sent, now)
    mean = (xs[0] + xs[1] + xs[2] + xs[3]) / 4  # summed in rank order, as the allreduce does
    assert torch.equal(r.algorithm.eval_params(), mean)
    assert r.evaluate() == evaluate(r.task, r.model, mean)
    assert r.algorithm.evaluates == "average"


def test_each_evaluation_evaluates_every_worker(make_config):
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:period=2,eval=each"))
    for _ in range(3):
        r.train_step()
    r.algorithm.before_evaluation(r.ctx)
    stack = r.algorithm.eval_params()
    assert all(torch.equal(stack[k], r.algorithm.replicas.x[k]) for k in range(4))
    got = r.evaluate()
    each = [evaluate(r.task, r.model, r.algorithm.replicas.x[k]) for k in range(4)]
    assert got["test_acc_each"] == [e["test_acc"] for e in each]
    assert got["test_loss"] == pytest.approx(np.mean([e["test_loss"] for e in each]), rel=1e-12)


def test_default_window_is_a_quarter_period_and_elects_on_it(make_config):
    assert ALGORITHMS.build("lsgd:period=8").window_size == 2
    assert ALGORITHMS.build("lsgd:period=2").window_size == 1
    assert ALGORITHMS.build("lsgd:period=8,window=5").window_size == 5
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd:period=4,window=2,prox=0"))
    spy = Spy(r.oracle)
    r.ctx.oracle = spy
    history = {k: [] for k in range(4)}
    for step in range(1, 9):
        spy.calls.clear()
        info = r.train_step()
        for rank, loss in spy.calls:
            history[rank].append(loss)
        if step % 4 == 0:
            means = {k: np.float32(np.mean(v[-2:])) for k, v in history.items()}
            assert info["leader"] == min(means, key=lambda k: (means[k], k))
            assert info["leader_loss"] == float(means[info["leader"]])
    assert r.algorithm.spec() == "lsgd:pull=0.1,period=4,prox=0,window=2,eval=average"


@pytest.mark.parametrize("partition, warned", [("iid", True), ("shared", False)])
def test_fixed_shards_warn_that_they_measure_shard_bias(make_config, partition, warned):
    r = Run(make_config(LOCAL_UPDATES, algorithm="lsgd", partition=partition))
    info = r.algorithm.setup_info()
    assert ("warning" in info) == warned
    if warned:
        assert info["warning"].startswith("fixed shards measure shard bias, not the algorithm")


def test_gradwire_run_prints_the_fixed_shard_warning(tmp_path, data_dir, capsys):
    from gradwire.cli import main

    common = ["run", "--task", "digits-logreg", "--workers", "2", "--steps", "2", "--eval-every", "2",
              "--algorithm", "lsgd", "--data-dir", str(data_dir)]
    assert main([*common, "--out", str(tmp_path / "iid")]) == 0
    assert "warning=fixed shards measure shard bias, not the algorithm" in capsys.readouterr().out
    assert main([*common, "--partition", "shared", "--out", str(tmp_path / "shared")]) == 0
    assert "fixed shards" not in capsys.readouterr().out
