"""synthetic-logreg: F* is the minimum to float64 precision; heterogeneity shifts the workers' data."""

import numpy as np
import pytest
import torch

from gradwire.errors import ConfigError
from gradwire.tasks import build_task

SPECS = [
    "synthetic-logreg",
    "synthetic-logreg:l2=0,hetero=0",
    "synthetic-logreg:hetero=4,l2=0.001,dim=30",
    "synthetic-logreg:l1=0.05",
    "synthetic-logreg:l1=0.01,l2=0,hetero=3",
]


def model_at(task, w):
    model = task.model_fn(torch.Generator()).double()
    with torch.no_grad():
        model[0].weight.copy_(w.view(1, -1))
    return model


def smooth_grad(task, w):
    """Gradient of the smooth part mean loss + l2/2||w||^2, by autograd in float64."""
    w = w.clone().requires_grad_(True)
    loss = task.loss_fn(task.x_train.double() @ w.unsqueeze(1), task.y_train) + 0.5 * task.l2 * w.dot(w)
    (g,) = torch.autograd.grad(loss, w)
    return g


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("spec", SPECS)
def test_optimum_is_stationary(spec, dtype):
    task = build_task(spec, num_workers=4, seed=0, dtype=dtype)
    w = task.w_star
    g = smooth_grad(task, w)
    # prox-gradient mapping (unit step): w - soft(w - g, l1); equal to g when l1 = 0
    v = w - g
    mapping = w - torch.sign(v) * torch.clamp(v.abs() - task.l1, min=0)
    assert float(mapping.norm()) < 1e-10
    if task.l1 > 0:
        assert 0 < int((w == 0).sum()) < len(w)  # the l1 term is active: some, not all, weights are 0
    assert task.objective(model_at(task, w)) == task.f_star


@pytest.mark.parametrize("spec", SPECS)
def test_f_star_below_objective_everywhere(spec):
    task = build_task(spec, num_workers=4, seed=1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-6, 1e-3, 1.0, 10.0):
        for _ in range(5):
            w = task.w_star + scale * torch.randn(task.w_star.shape, generator=gen, dtype=torch.float64)
            assert task.objective(model_at(task, w)) >= task.f_star
    for _ in range(3):
        assert task.objective(task.model_fn(gen)) > task.f_star + 1e-3
    assert 0.1 < task.f_star < np.log(2)  # finite, informative labels, not separable


def test_hetero_shifts_worker_feature_means():
    def worker_means(hetero):
        task = build_task(f"synthetic-logreg:hetero={hetero}", num_workers=4, seed=0)
        return torch.stack([task.x_train[idx].mean(0) for idx in task.worker_indices])

    iid, shifted = worker_means(0.0), worker_means(3.0)
    assert iid.norm(dim=1).max() < 0.5  # sampling noise only: about sqrt(20/500) = 0.2
    assert shifted.norm(dim=1).min() > 2.5  # ||hetero * mu_k|| = 3
    assert torch.cdist(shifted, shifted).fill_diagonal_(10).min() > 1.0  # each worker its own mean


def test_worker_indices_nearly_equal_and_covering():
    task = build_task("synthetic-logreg:samples=2003", num_workers=4, seed=0)
    assert [len(i) for i in task.worker_indices] == [501, 501, 501, 500]  # every sample used
    assert len(task.x_train) == 2003
    assert torch.equal(torch.cat(task.worker_indices).sort().values, torch.arange(len(task.x_train)))
    assert set(task.y_train.tolist()) == {0, 1} and set(task.y_test.tolist()) == {0, 1}
    assert task.num_classes == 2


def test_deterministic_given_seed():
    a, b = (build_task("synthetic-logreg:l1=0.02", num_workers=3, seed=5) for _ in range(2))
    c = build_task("synthetic-logreg:l1=0.02", num_workers=3, seed=6)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test) and a.f_star == b.f_star
    assert not torch.equal(a.x_train, c.x_train) and a.f_star != c.f_star


def test_separable_data_without_regularisation_is_rejected():
    with pytest.raises(ConfigError, match="separable"):
        build_task("synthetic-logreg:samples=20,dim=20,l2=0", num_workers=2, seed=0)
    # with l2 > 0 the same data have a minimiser
    assert build_task("synthetic-logreg:samples=20,dim=20", num_workers=2, seed=0).f_star > 0


def test_without_heterogeneity_the_data_do_not_depend_on_the_worker_count():
    # the planner profiles one problem at several m: with hetero = 0 it must be the same problem
    # (it was not: the k shifts were drawn first from the run's one stream and shifted every later
    # draw, and samples were rounded down to a multiple of k; F* of samples=256, seed 1: 0.48143, 0.48006,
    # 0.50176 at k = 1, 2, 4)
    spec = "synthetic-logreg:samples=250,dim=5,hetero=0"
    one = build_task(spec, num_workers=1, seed=1)
    for k in (2, 3, 4, 8, 16):
        task = build_task(spec, num_workers=k, seed=1)
        for name in ("x_train", "y_train", "x_test", "y_test", "w_star"):
            assert torch.equal(getattr(task, name), getattr(one, name)), (k, name)
        assert task.f_star == one.f_star
        assert sum(len(i) for i in task.worker_indices) == 250


def test_a_workers_shift_does_not_depend_on_the_worker_count():
    # with hetero > 0 the problems differ by the shifts of the workers k adds, and by nothing else:
    # worker 0's samples are the same at every k (its noise, label draws and mu_0 are)
    spec = "synthetic-logreg:samples=240,dim=5,hetero=2"
    one = build_task(spec, num_workers=1, seed=3)
    for k in (2, 4, 8):
        task = build_task(spec, num_workers=k, seed=3)
        first = task.worker_indices[0]
        assert torch.equal(task.x_train[first], one.x_train[first])
        assert torch.equal(task.y_train[first], one.y_train[first])
        assert not torch.equal(task.x_train, one.x_train)  # the other workers are shifted elsewhere
