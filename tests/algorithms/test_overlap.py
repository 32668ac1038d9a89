"""``sync:overlap=true``: the gradient averaged bucket by bucket as the backward pass produces it.
The buckets (reverse parameter order, handed on in bucket order), the backward hooks that announce
each tensor, the same numbers as ``overlap=false`` on the simulator and on the threads backend (where
a communication thread averages while the backward pass goes on), and what it refuses."""

from __future__ import annotations

import threading

import pytest
import torch

from gradwire.algorithms import ALGORITHMS, CodecConfig, Context, OptimConfig
from gradwire.algorithms.buckets import BucketPlan, BucketQueue
from gradwire.algorithms.sync import SyncSGD
from gradwire.errors import ConfigError, DivergenceError
from gradwire.run.loop import Run, run
from gradwire.tasks.oracle import FlatModel
from gradwire.transports.sim import SimClock
from gradwire.transports.threads import Hub, ThreadTransport
from tests.helpers import read_jsonl

# digits-mlp: 64x64 weight, 64 bias, 10x64 weight, 10 bias (4096, 64, 640, 10 floats)
MLP = dict(task="digits-mlp", workers=3, steps=8, eval_every=2, lr=0.05, momentum=0.9)
SMALL_BUCKETS = 700 * 4 / 2**20  # bucket_mb for 700 floats: buckets [10x64 weight, its bias], [64], [64x64]


def test_plan_groups_tensors_in_reverse_order_up_to_the_cap():
    shapes = [torch.Size(s) for s in [(64, 64), (64,), (10, 64), (10,)]]
    plan = BucketPlan(shapes, cap=700)
    assert plan.buckets == [[2, 3], [1], [0]]  # 10 + 640 fit; 64 more would not; 4096 alone exceeds the cap
    assert plan.bucket_of == {3: 0, 2: 0, 1: 1, 0: 2}
    flat = torch.arange(4810, dtype=torch.float32)
    views = [plan.views(flat, b) for b in range(3)]
    assert [t.shape for t in views[0]] == [shapes[2], shapes[3]]
    assert torch.equal(plan.assemble(views, flat), flat)
    assert BucketPlan([(5,), (5,), (5,)], cap=100).buckets == [[0, 1, 2]]
    with pytest.raises(ValueError, match="cap=0"):
        BucketPlan([(5,)], cap=0)


def test_queue_hands_buckets_on_in_bucket_order_whatever_order_they_finish_in():
    plan = BucketPlan([(4096,), (64,), (640,), (10,)], cap=700)
    handed = []
    queue = BucketQueue(plan, lambda b, tensors: handed.append((b, [t.numel() for t in tensors])))
    grads = {i: torch.zeros(n) for i, n in enumerate([4096, 64, 640, 10])}
    queue.ready(1, grads[1])  # bucket 1 is complete first, but bucket 0 must go first
    assert handed == []
    queue.ready(3, grads[3])
    queue.ready(2, grads[2])
    assert handed == [(0, [640, 10]), (1, [64])]
    with pytest.raises(RuntimeError, match="announced twice"):
        queue.ready(2, grads[2])
    queue.flush(torch.zeros(4810))
    assert handed[-1] == (2, [4096])  # never announced (no gradient): flushed from the flat vector


def test_backward_announces_every_tensor_once_with_its_finished_gradient():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model = FlatModel(module)
    x, y = torch.randn(11, 5), torch.randint(0, 3, (11,))
    loss_fn = torch.nn.functional.cross_entropy
    params = model.flatten() + 0.1
    loss, plain = model.loss_and_grad(params, loss_fn, x, y, l2=0.01)
    seen = []
    hooked_loss, hooked = model.loss_and_grad(params, loss_fn, x, y, l2=0.01,
                                              on_ready=lambda i, g: seen.append((i, g.clone())))
    assert sorted(i for i, _ in seen) == [0, 1, 2, 3] and seen[0][0] in (2, 3)  # the last layer first
    assert torch.equal(plain, hooked) and torch.equal(loss, hooked_loss)  # the L2 term too, bit for bit
    offsets = [0, 35, 42, 63, 66]
    for i, g in seen:  # what each hook saw is the finished gradient of its tensor
        assert torch.equal(g.reshape(-1), plain[offsets[i]:offsets[i + 1]])
    model.loss_and_grad(params, loss_fn, x, y)  # no on_ready: the hooks stay silent
    assert len(seen) == 4


def test_a_tensor_without_gradient_still_gets_the_l2_term_and_is_never_announced():
    torch.manual_seed(1)
    used, unused = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    module = torch.nn.ModuleDict({"used": used, "unused": unused})
    module.forward = lambda x: used(x)  # the loss never reaches the second layer
    model = FlatModel(module)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    params = model.flatten()
    _, plain = model.loss_and_grad(params, torch.nn.functional.cross_entropy, x, y, l2=0.5)
    seen = []
    _, hooked = model.loss_and_grad(params, torch.nn.functional.cross_entropy, x, y, l2=0.5,
                                    on_ready=lambda i, g: seen.append(i))
    assert sorted(seen) == [0, 1]
    assert torch.equal(hooked, plain) and bool(hooked[15:].ne(0).all())  # 0.5 x for the unused layer


@pytest.mark.parametrize("compressor", ["none", "powersgd:rank=2", "powersgd:rank=2,alternate=true", "fp16", "bf16"])
def test_simulator_gives_the_numbers_and_bytes_of_overlap_false(make_config, compressor):
    base = run(make_config(MLP, out="plain", network="ring", compressor=compressor), progress=False)
    over = run(make_config(MLP, out="over", network="ring", compressor=compressor,
                           algorithm=f"sync:overlap=true,bucket_mb={SMALL_BUCKETS}"), progress=False)
    assert over["bytes_sent"] == base["bytes_sent"]
    assert over["final"]["train_loss"] == base["final"]["train_loss"]
    assert over["final"]["test_acc"] == base["final"]["test_acc"]


def test_threads_backend_overlaps_on_a_communication_thread_and_agrees(make_config, tmp_path, monkeypatch):
    """The threads backend runs the real-backend path: each rank's buckets go to a communication
    thread as its backward pass finishes them. Same losses and bytes as without overlap, and each
    rank's run closes its algorithm, which ends that thread."""
    algorithm = f"sync:overlap=true,bucket_mb={SMALL_BUCKETS}"
    closed, close = [], SyncSGD.close

    def counted(self):
        closed.append(self._thread is not None)
        close(self)
        assert self._thread is None

    monkeypatch.setattr(SyncSGD, "close", counted)
    for name, alg in (("plain", "sync:overlap=false"), ("over", algorithm)):
        run(make_config(MLP, out=name, algorithm=alg, backend="threads", compressor="powersgd:rank=2,start_step=2"),
            progress=False)
    plain, over = (read_jsonl(tmp_path / n / "metrics.jsonl") for n in ("plain", "over"))
    assert [r["train_loss"] for r in over] == [r["train_loss"] for r in plain]
    assert [r["bytes_sent"] for r in over] == [r["bytes_sent"] for r in plain]
    assert over[-1]["train_loss"] < over[0]["train_loss"]
    assert closed == [False] * 3 + [True] * 3  # 3 ranks without overlap, then 3 with a thread to end


@pytest.mark.parametrize("compressor", ["none", "bf16", "powersgd:rank=2,start_step=2"])
def test_overlap_is_on_by_default_on_the_threads_backend_and_changes_no_number(make_config, tmp_path, compressor):
    """The default (overlap=auto) overlaps wherever the mean taken bucket by bucket is the whole
    gradient's, element for element: on the threads backend (one worker per rank, a communication
    thread) the losses, parameters and bytes equal overlap=false's, bit for bit."""
    finals = {}
    for name, alg in (("off", "sync:overlap=false"), ("auto", f"sync:bucket_mb={SMALL_BUCKETS}")):
        result = run(make_config(MLP, out=name, algorithm=alg, backend="threads", compressor=compressor),
                     progress=False)
        finals[name] = (read_jsonl(tmp_path / name / "metrics.jsonl"), result["bytes_sent"])
    (off, off_bytes), (auto, auto_bytes) = finals["off"], finals["auto"]
    assert [r["train_loss"] for r in auto] == [r["train_loss"] for r in off]
    assert [r["test_loss"] for r in auto] == [r["test_loss"] for r in off]
    assert auto_bytes == off_bytes and [r["bytes_sent"] for r in auto] == [r["bytes_sent"] for r in off]


@pytest.mark.parametrize("compressor, error_feedback, backend, overlaps", [
    ("none", False, "threads", True),
    ("fp16", False, "threads", True),
    ("powersgd:rank=2", False, "threads", True),
    ("fp16", True, "threads", False),  # one residual for the whole gradient
    ("topk:ratio=0.1", True, "threads", False),  # a selection over the whole gradient
    ("qsgd:levels=4", False, "threads", False),  # blocks and random draws along the flat vector
    ("none", False, "sim", False),  # one process hosts every worker: nothing overlaps, one collective
])
def test_auto_overlaps_where_the_mean_can_be_taken_bucket_by_bucket(make_config, compressor, error_feedback,
                                                                     backend, overlaps):
    cfg = make_config(MLP, compressor=compressor, error_feedback=error_feedback, workers=1)
    alg = ALGORITHMS.build("sync")
    ctx = Run(cfg).ctx
    if backend == "threads":
        ctx = Context(world_size=2, local_ranks=(0,), transport=ThreadTransport(Hub(10.0), 2, 0), oracle=ctx.oracle,
                      stragglers=ctx.stragglers, clock=SimClock(), seed=0, param_shapes=ctx.param_shapes)
    alg.setup(ctx, Run(cfg).model.flatten(), OptimConfig(lr=0.05), CodecConfig(compressor, error_feedback))
    assert (alg.plan is not None) == overlaps


def test_a_worker_with_a_non_finite_gradient_stops_every_worker_at_that_step(make_config):
    """Worker 1's data turns to NaN before step 3. Its buckets were already on their way, so every
    worker finishes the step's collectives and stops there with a DivergenceError (none waits for a
    peer that is gone)."""
    cfg = make_config(MLP, algorithm=f"sync:overlap=true,bucket_mb={SMALL_BUCKETS}")
    hub, outcome = Hub(timeout_s=20.0), {}

    def worker(rank: int) -> None:
        r = Run(cfg)
        ctx = Context(world_size=3, local_ranks=(rank,), transport=ThreadTransport(hub, 3, rank), oracle=r.oracle,
                      stragglers=r.ctx.stragglers, clock=SimClock(), seed=cfg.seed,
                      param_shapes=r.ctx.param_shapes)
        alg = ALGORITHMS.build(cfg.algorithm)
        alg.setup(ctx, r.model.flatten(), OptimConfig(lr=0.05), CodecConfig())
        try:
            for t in range(1, 6):
                r.oracle.step = t
                if t == 3 and rank == 1:
                    r.oracle.workers[1].x.fill_(float("nan"))
                alg.step(ctx, t)
            outcome[rank] = "finished"
        except DivergenceError as e:
            outcome[rank] = (e.step, str(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert {k: v[0] for k, v in outcome.items()} == {0: 3, 1: 3, 2: 3}
    assert "on worker 1" in outcome[1][1] and "another worker's gradient was not finite" in outcome[0][1]


def test_a_step_stopped_mid_way_starts_no_further_bucket(make_config):
    """A stop (SIGTERM arrives as a KeyboardInterrupt) after the backward pass has handed every
    bucket to the communication thread, on a worker whose peer never comes: the bucket under way
    waits out its timeout, the others are cancelled instead of each waiting out one of their own
    (3 collectives entered, 1.5 s, without the cancelling)."""
    cfg = make_config(MLP, workers=2, algorithm=f"sync:overlap=true,bucket_mb={SMALL_BUCKETS}")
    r = Run(cfg)
    transport = ThreadTransport(Hub(timeout_s=0.5), 2, 0)
    entered = []
    inner_mean = transport.allreduce_mean

    def allreduce_mean(tensors, ranks=None):
        entered.append(1)
        return inner_mean(tensors, ranks)

    transport.allreduce_mean = allreduce_mean

    def oracle(rank, params, on_ready=None):
        r.oracle(rank, params, on_ready)  # every bucket announced and handed on, then the stop
        raise KeyboardInterrupt("SIGTERM")

    ctx = Context(world_size=2, local_ranks=(0,), transport=transport, oracle=oracle, stragglers=r.ctx.stragglers,
                  clock=SimClock(), seed=cfg.seed, param_shapes=r.ctx.param_shapes)
    alg = ALGORITHMS.build(cfg.algorithm)
    alg.setup(ctx, r.model.flatten(), OptimConfig(lr=0.05), CodecConfig())
    assert len(alg.plan.buckets) == 3
    with pytest.raises(KeyboardInterrupt):
        alg.step(ctx, 1)
    alg._thread.submit(lambda: None).result(timeout=10)  # whatever was queued before it has run or was cancelled
    alg._thread.shutdown(wait=False)
    assert len(entered) <= 1  # the first bucket, if the thread had started it before the stop


@pytest.mark.parametrize("changes, message", [
    (dict(algorithm="sync:overlap=true,backups=1"), "overlap=true needs backups=0"),
    (dict(algorithm="sync:overlap=true", compressor="topk:ratio=0.1"), "use none, fp16, bf16"),
    (dict(algorithm="sync:overlap=true", compressor="fp16", error_feedback=True), "without error feedback"),
    (dict(algorithm="sync:overlap=maybe"), "overlap='maybe': valid choices are auto, true, false"),
    (dict(algorithm="sync:overlap=true,bucket_mb=0"), "bucket_mb must be a number > 0"),
])
def test_what_it_cannot_do_is_refused_in_one_line(make_config, changes, message):
    with pytest.raises(ConfigError, match=message) as info:
        run(make_config(MLP, **changes), progress=False)
    assert "\n" not in str(info.value)
