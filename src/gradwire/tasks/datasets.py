"""Small real classification tasks that need no download: MNIST-1D and scikit-learn's digits.

MNIST-1D (Greydanus, 2020, "Scaling down deep learning", arXiv:2011.14439) is *generated* by the
``mnist1d`` package from its default arguments (seed 42 of its own), so it is the standard data set
whatever the run seed; we never call its downloader. Generation takes about a second, so the arrays
are cached as ``.npz`` under ``data_dir``, keyed on the package version (its default arguments are
the package's own). The digits split is cached the same way, keyed on scikit-learn's version.

Reading a cache imports neither package: ``mnist1d.data`` imports matplotlib and requests (1.3 s)
and scikit-learn's digits loader all of scikit-learn (1.1 s), which every process of a run paid
before, most of its start-up after torch itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import tempfile
import threading
from functools import partial
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from gradwire.errors import ConfigError
from gradwire.tasks.base import TASKS, Task, TaskContext, cross_entropy
from gradwire.tasks.models import mlp, mnist1d_cnn

_ARRAY_KEYS = ("x", "y", "x_test", "y_test")


@contextlib.contextmanager
def _global_rng_untouched():
    """mnist1d's ``make_dataset`` reseeds Python's and NumPy's global RNGs; undo that on exit."""
    # legacy global-RNG calls on purpose: they are what mnist1d touches
    np_state, py_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    try:
        yield
    finally:
        np.random.set_state(np_state)  # noqa: NPY002
        random.setstate(py_state)


def _generate_mnist1d() -> dict[str, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset  # lazy: imports matplotlib

    with _global_rng_untouched():
        data = make_dataset(get_dataset_args())
    return {k: np.asarray(data[k]) for k in _ARRAY_KEYS}


def cache_path(data_dir: str | Path, name: str, package: str, what: str) -> Path:
    """Cache file of data set ``name`` built by ``package`` (``what``: how it is built from it);
    another version of the package gets another file. Reads the version from the package's metadata,
    without importing it."""
    key = json.dumps({"package": package, "version": metadata.version(package), "what": what}, sort_keys=True)
    return Path(data_dir) / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.npz"


def mnist1d_cache_path(data_dir: str | Path) -> Path:
    """Cache file for MNIST-1D at the package's default arguments."""
    return cache_path(data_dir, "mnist1d", "mnist1d", "make_dataset(get_dataset_args())")


# One reader or builder at a time in a process: ``np.load`` parses each array's header with
# ``ast.literal_eval``, which is not thread-safe on CPython 3.11: two threads parsing at once
# sometimes fail with "SystemError: AST constructor recursion depth mismatch" (seen in CI under
# ``--backend threads``, which loads the task in every process-thread; python/cpython gh-106905).
# Building MNIST-1D also swaps the global random state, which only one thread may do at a time.
_CACHE_LOCK = threading.Lock()


def cached_arrays(path: Path, build) -> dict[str, np.ndarray]:
    """The arrays x, y, x_test, y_test read from ``path``, or ``build()`` and written there first."""
    with _CACHE_LOCK:
        return _cached_arrays(path, build)


def _cached_arrays(path: Path, build) -> dict[str, np.ndarray]:
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as f:
                data = {k: f[k] for k in _ARRAY_KEYS}
            if len(data["x"]) == len(data["y"]) and len(data["x_test"]) == len(data["y_test"]):
                return data
        except (OSError, KeyError, ValueError):
            pass  # unreadable cache: regenerate and overwrite it
    data = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # only the tasks that cache data need --data-dir: checked where they first write it
        raise ConfigError(f"data_dir={str(path.parent)!r} cannot be used: cannot create it ({e.strerror}) "
                          "(--data-dir)") from None
    # Write a temporary file and rename it: concurrent builders (one per process under
    # torch.distributed) never see a half-written cache, and the last rename wins harmlessly.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return data


def load_mnist1d(data_dir: str | Path) -> dict[str, np.ndarray]:
    """The MNIST-1D arrays (x, y, x_test, y_test), generated once and then read from the cache."""
    return cached_arrays(mnist1d_cache_path(data_dir), _generate_mnist1d)


def _classification_task(name: str, data: dict[str, np.ndarray], model_fn, dtype: torch.dtype) -> Task:
    def x(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.float64).to(dtype).contiguous()

    def y(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a.astype(np.int64))

    return Task(
        name=name, x_train=x(data["x"]), y_train=y(data["y"]), x_test=x(data["x_test"]),
        y_test=y(data["y_test"]), num_classes=10, model_fn=model_fn, loss_fn=cross_entropy,
    )


@TASKS.register("mnist1d-logreg", help="MNIST-1D, logistic regression Linear(40,10) (paper, trained: 32% test acc.)")
def mnist1d_logreg(*, _ctx: TaskContext) -> Task:
    """MNIST-1D (4000 train / 1000 test, 40 features) with a linear model; Greydanus (2020) report
    32% test accuracy for logistic regression."""
    model_fn = partial(mlp, sizes=(40, 10), dtype=_ctx.dtype)
    return _classification_task("mnist1d-logreg", load_mnist1d(_ctx.data_dir), model_fn, _ctx.dtype)


@TASKS.register("mnist1d-mlp", help="MNIST-1D, MLP 40-100-100-10 ReLU; 500 steps on 8 workers: 0.70 test acc. "
                "with sync's defaults (--lr 1.6, its best: this task doubles a default gradient step); each "
                "algorithm's on its defaults, against the bar 0.63: docs/defaults.md (the paper's 68% is after "
                "full training)")
def mnist1d_mlp(*, _ctx: TaskContext) -> Task:
    """MNIST-1D with the paper's MLP (two hidden layers of 100, ReLU); Greydanus (2020): 68%."""
    model_fn = partial(mlp, sizes=(40, 100, 100, 10), dtype=_ctx.dtype)
    return _classification_task("mnist1d-mlp", load_mnist1d(_ctx.data_dir), model_fn, _ctx.dtype)


# --lr left out is an algorithm's default_lr times this where --lr is a gradient step (tasks/base.py,
# default_lr_scale): the MLP learns best at twice the step that most tasks take; sync SGD at 1.6
# against 0.8 (docs/defaults.md)
mnist1d_mlp.default_lr_scale = 2.0


@TASKS.register("mnist1d-cnn", help="MNIST-1D, 3-layer Conv1d net of the paper (paper, fully trained: 94% test acc.)")
def mnist1d_cnn_task(*, _ctx: TaskContext) -> Task:
    """MNIST-1D with the paper's CNN (see :func:`~gradwire.tasks.models.mnist1d_cnn`); Greydanus
    (2020): 94% test accuracy, the gap to the MLP being the point of the data set (spatial bias)."""
    model_fn = partial(mnist1d_cnn, dtype=_ctx.dtype)
    return _classification_task("mnist1d-cnn", load_mnist1d(_ctx.data_dir), model_fn, _ctx.dtype)


# the CNN's gradient step is 3/4 of most tasks': at 0.8 sync SGD diverged on 1 of seeds 0-4 and ended
# at chance on another, EASGD and DaSGD diverged on one and two; at 0.6 all of them learn on all five
# (docs/defaults.md, seventh round)
mnist1d_cnn_task.default_lr_scale = 0.75


def load_digits_split(data_dir: str | Path) -> dict[str, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1797 images, offline), pixels scaled from 0..16 to [0, 1],
    split 80/20, stratified by label, with the fixed seed 0 (the same split for every run); built
    once, then read from the cache."""
    path = cache_path(data_dir, "digits", "scikit-learn", "load_digits, /16, train_test_split 0.2 seed 0 stratified")
    return cached_arrays(path, _split_digits)


def _split_digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x, x_test, y, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return {"x": x, "y": y, "x_test": x_test, "y_test": y_test}


@TASKS.register("digits-logreg", help="sklearn 8x8 digits (64 features), logistic regression Linear(64,10)")
def digits_logreg(*, _ctx: TaskContext) -> Task:
    model_fn = partial(mlp, sizes=(64, 10), dtype=_ctx.dtype)
    return _classification_task("digits-logreg", load_digits_split(_ctx.data_dir), model_fn, _ctx.dtype)


@TASKS.register("digits-mlp", help="sklearn 8x8 digits (64 features), MLP 64-64-10 ReLU")
def digits_mlp(*, _ctx: TaskContext) -> Task:
    model_fn = partial(mlp, sizes=(64, 64, 10), dtype=_ctx.dtype)
    return _classification_task("digits-mlp", load_digits_split(_ctx.data_dir), model_fn, _ctx.dtype)
