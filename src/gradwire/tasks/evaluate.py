"""Evaluation of a parameter vector on the task's full training and test sets."""

from __future__ import annotations

import torch

from gradwire.tasks.oracle import FlatModel


@torch.no_grad()
def _pass(model: FlatModel, task, params, x, y, chunk: int = 4096) -> tuple[float, float]:
    total_loss, correct = 0.0, 0
    for i in range(0, len(x), chunk):
        out = model.forward(params, x[i : i + chunk])
        yy = y[i : i + chunk]
        total_loss += float(task.loss_fn(out, yy)) * len(yy)
        correct += int((task.predict(out) == yy).sum())
    return total_loss / len(x), correct / y.numel()  # per target: a sequence sample has several


def evaluate(task, model: FlatModel, params: torch.Tensor) -> dict:
    """train_loss is the full training objective (mean loss + l2/2·||w||² + l1·||w||_1; the loss
    on ``task.eval_train``'s samples where the task names some); suboptimality = objective - f* in
    float64 where the task knows f*.

    ``params`` may be a stack, one row per worker (``eval=each`` of the local-update algorithms):
    then each row is evaluated, every metric is the mean over the rows, and ``test_acc_each``
    lists each row's test accuracy."""
    if params.dim() == 2:
        each = [evaluate(task, model, row) for row in params]
        out = {k: sum(e[k] for e in each) / len(each) for k in each[0]}
        return out | {"test_acc_each": [e["test_acc"] for e in each]}
    x_train, y_train = task.x_train, task.y_train
    if task.eval_train is not None:  # a fixed subset (a language model's corpus is too large to evaluate often)
        x_train, y_train = x_train[task.eval_train], y_train[task.eval_train]
    train_loss, train_acc = _pass(model, task, params, x_train, y_train)
    reg = 0.5 * task.l2 * float(params.double().square().sum()) + task.l1 * float(params.double().abs().sum())
    test_loss, test_acc = _pass(model, task, params, task.x_test, task.y_test)
    out = {"train_loss": train_loss + reg, "train_acc": train_acc, "test_loss": test_loss, "test_acc": test_acc}
    if task.f_star is not None:
        model.load(params)
        out["train_loss"] = float(task.objective(model.module))
        out["suboptimality"] = out["train_loss"] - task.f_star
    return out
