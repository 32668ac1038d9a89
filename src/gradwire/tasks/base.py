"""The task contract: data, a model factory, a loss and the training objective it defines.

A :class:`Task` is plain data (tensors, picklable callables and a few floats), so it can be built
once and handed to every worker of the simulator or to spawned torch.distributed processes.
Tasks are registered in :data:`TASKS` and built from a spec string by :func:`build_task`; a
factory receives its spec parameters as annotated keywords and the run context in ``_ctx``
(underscored so that it is not a spec parameter, see :mod:`gradwire.spec`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradwire.errors import ConfigError
from gradwire.spec import Registry, render

TASKS = Registry("task")


@dataclass(frozen=True)
class TaskContext:
    """What a task factory needs besides its spec parameters."""

    num_workers: int  # the synthetic task draws one data distribution per worker
    seed: int  # run seed: only tasks whose data are random by design (synthetic) use it
    dtype: torch.dtype  # dtype of the features and of the model parameters
    data_dir: Path  # cache of generated data sets (MNIST-1D)
    check_only: bool = False  # run the parameters' range checks, then return None: no data loaded


@dataclass
class Task:
    """A training problem: min_w mean_i loss(model_w(x_i), y_i) + l2/2 ||w||^2 + l1 ||w||_1."""

    name: str  # the resolved spec, e.g. "mnist1d-cnn" or "synthetic-logreg:samples=2000,..."
    x_train: Tensor  # (n, features), float in the task dtype
    y_train: Tensor  # (n,), int64 class labels (synthetic-logreg: 0/1)
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    model_fn: Callable[[torch.Generator], nn.Module]  # fresh model drawn from the generator only
    loss_fn: Callable[[Tensor, Tensor], Tensor]  # mean loss of model output vs labels
    l2: float = 0.0  # smooth term (l2/2)||w||^2; the run loop adds it to the loss
    l1: float = 0.0  # non-smooth term l1*||w||_1; the algorithms apply its proximal step
    f_star: float | None = None  # min of the full training objective (float64), when known
    worker_indices: list[Tensor] | None = None  # set when the task fixes each worker's data
    w_star: Tensor | None = None  # float64 flat minimiser (parameter order of model_fn), when known
    eval_train: Tensor | None = None  # indices of the training samples train_loss is measured on, when
    #                                   evaluating all of them is too slow (a language model); None: all

    def partition_labels(self) -> Tensor:
        """One class label per training sample, for the partitions: ``y_train``, or where the
        targets are sequences (a language model, 2-D) each sample's last target."""
        return self.y_train if self.y_train.dim() == 1 else self.y_train[:, -1]

    def objective(self, model: nn.Module) -> float:
        """Full training objective in float64 (used for suboptimality ``objective - f_star``).

        ``w`` is all parameters of ``model``; the model is copied to float64, so a float32 model is
        evaluated exactly at its (rounded) parameters. Token inputs (integers) stay as they are; the
        loss is over ``eval_train``'s samples where the task names some.
        """
        x, y = self.x_train, self.y_train
        if self.eval_train is not None:
            x, y = x[self.eval_train], y[self.eval_train]
        with torch.no_grad():
            m = copy.deepcopy(model).to(torch.float64)
            loss = self.loss_fn(m(x.to(torch.float64) if x.is_floating_point() else x), y)
            w = torch.cat([p.reshape(-1) for p in m.parameters()])
            return float(loss + 0.5 * self.l2 * w.dot(w) + self.l1 * w.abs().sum())

    def to(self, device: torch.device) -> Task:
        """The same task with its data sets on ``device`` (models are placed by the run)."""
        return replace(self, x_train=self.x_train.to(device), y_train=self.y_train.to(device),
                       x_test=self.x_test.to(device), y_test=self.y_test.to(device))

    def predict(self, output: Tensor) -> Tensor:
        """Class labels from model outputs: argmax, or the sign of a single logit (binary)."""
        if output.shape[-1] == 1:
            return (output.squeeze(-1) > 0).long()
        return output.argmax(dim=-1)

    def accuracy(self, model: nn.Module, *, train: bool = False) -> float:
        """Fraction of correctly classified test (or training) samples."""
        x, y = (self.x_train, self.y_train) if train else (self.x_test, self.y_test)
        with torch.no_grad():
            return float((self.predict(model(x)) == y).double().mean())


def cross_entropy(output: Tensor, labels: Tensor) -> Tensor:
    """Mean softmax cross-entropy (multi-class tasks)."""
    return F.cross_entropy(output, labels)


def logistic(output: Tensor, labels: Tensor) -> Tensor:
    """Mean log(1 + exp(-s z)) with s = 2y - 1 in {-1, +1} and z the single logit."""
    return F.binary_cross_entropy_with_logits(output.squeeze(-1), labels.to(output.dtype))


def resolved_spec(spec: str) -> str:
    """``spec`` with every parameter spelled out, defaults included (reproducible run records)."""
    entry, kwargs = TASKS.resolve(spec)
    values = {name: kwargs.get(name, p.default) for name, p in entry.params.items()}
    return render(entry.name, values, fmt=str)  # str(value): the task names of existing run records


def default_lr_scale(spec: str) -> float:
    """The step size the task ``spec`` takes, as a multiple of the usual: an algorithm whose --lr is
    a gradient step (``Algorithm.lr_scales_with_task``) defaults to its ``default_lr`` times this
    where --lr is not given (``gradwire.run.combination.resolved``; config.json records the
    product). 1 unless the task's factory declares ``default_lr_scale`` (mnist1d-mlp: 2, measured
    in docs/defaults.md)."""
    entry, _ = TASKS.resolve(spec)
    return float(getattr(entry.factory, "default_lr_scale", 1.0))


def build_task(
    spec: str,
    *,
    num_workers: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    data_dir: str | Path = "data-cache",
) -> Task:
    """Build the task named by ``spec`` (see ``TASKS.describe()``); ConfigError on bad input."""
    if num_workers < 1:
        raise ConfigError(f"num_workers must be >= 1, got {num_workers}")
    if not dtype.is_floating_point:
        raise ConfigError(f"task dtype must be a floating point dtype, got {dtype}")
    ctx = TaskContext(num_workers=num_workers, seed=seed, dtype=dtype, data_dir=Path(data_dir))
    task = TASKS.build(spec, _ctx=ctx)
    task.name = resolved_spec(spec)
    return task


def check_task(spec: str, *, num_workers: int) -> None:
    """The checks :func:`build_task` makes on ``spec`` for ``num_workers`` workers (names, keys and
    the parameters' ranges), without loading or generating data: a run makes them before it claims
    its folder. A factory with parameters returns None when ``_ctx.check_only`` is set, after its
    range checks; one without parameters has nothing to check beyond its name."""
    entry, _ = TASKS.resolve(spec)
    if not entry.params:
        return
    ctx = TaskContext(num_workers=num_workers, seed=0, dtype=torch.float32, data_dir=Path("."), check_only=True)
    TASKS.build(spec, _ctx=ctx)
