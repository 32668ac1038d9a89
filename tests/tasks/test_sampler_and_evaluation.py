"""The worker's sampler (without replacement, in seeded epochs, resumable) and the evaluation's
chunked pass over sets larger than one chunk."""

import types

import pytest
import torch
import torch.nn.functional as F

from gradwire.tasks.evaluate import _pass
from gradwire.tasks.oracle import FlatModel, WorkerData


def _epochs(w: WorkerData, n: int, batches: int) -> list[list[int]]:
    return [torch.cat([w.next_batch()[1] for _ in range(batches)]).tolist() for _ in range(n)]


def test_each_epoch_draws_distinct_samples_and_epochs_differ():
    # 10 samples, batches of 3: an epoch is 3 batches (len // bs · bs = 9 samples), the 10th waits
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    w = WorkerData(x, y, batch_size=3, seed=5, rank=2)
    epochs = _epochs(w, 6, 3)
    for e in epochs:
        assert len(e) == 9 and len(set(e)) == 9  # without replacement: no sample twice in an epoch
    assert len({tuple(e) for e in epochs}) == 6  # a new permutation every epoch
    assert w.epoch == 5 and w.position == 9
    big = WorkerData(torch.arange(1000.0)[:, None], torch.arange(1000), batch_size=10, seed=5, rank=0)
    (e,) = _epochs(big, 1, 100)
    assert sorted(e) == list(range(1000))  # a batch size that divides the shard: every sample once


def test_batches_depend_on_seed_and_rank_only():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    a, b = (WorkerData(x, y, batch_size=3, seed=5, rank=2) for _ in range(2))
    assert _epochs(a, 3, 3) == _epochs(b, 3, 3)
    assert _epochs(WorkerData(x, y, batch_size=3, seed=5, rank=1), 3, 3) != _epochs(
        WorkerData(x, y, batch_size=3, seed=5, rank=2), 3, 3)


def test_a_mid_epoch_resume_continues_the_same_sequence():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    a = WorkerData(x, y, batch_size=3, seed=5, rank=2)
    for _ in range(4):  # into the second epoch, one batch in
        a.next_batch()
    state = a.state_dict()
    assert state == {"epoch": 1, "position": 3}
    b = WorkerData(x, y, batch_size=3, seed=5, rank=2)
    b.load_state_dict(state)
    ref = WorkerData(x, y, batch_size=3, seed=5, rank=2)
    for _ in range(4):
        ref.next_batch()
    for _ in range(10):  # across the next epoch boundaries too
        got, want, again = b.next_batch()[1], a.next_batch()[1], ref.next_batch()[1]
        assert torch.equal(got, want) and torch.equal(got, again)


@pytest.mark.parametrize("n, chunk", [(9000, 4096), (23, 5)])  # 2 full chunks + 808; 4 full + 3
def test_evaluation_in_chunks_equals_one_pass(n, chunk):
    torch.manual_seed(0)
    module = torch.nn.Linear(6, 4)
    model = FlatModel(module)
    x, y = torch.randn(n, 6), torch.randint(0, 4, (n,))
    task = types.SimpleNamespace(loss_fn=F.cross_entropy, predict=lambda out: out.argmax(dim=1))
    assert n > chunk and n % chunk != 0  # a short last chunk
    loss, acc = _pass(model, task, model.flatten(), x, y, chunk=chunk)
    with torch.no_grad():
        out = module(x)
    assert loss == pytest.approx(float(F.cross_entropy(out, y)), rel=1e-5)
    assert acc == int((out.argmax(dim=1) == y).sum()) / n
