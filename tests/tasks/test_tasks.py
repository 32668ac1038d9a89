"""Every registered task: shapes, dtypes, models, deterministic init, float64, the MNIST-1D cache."""

import pickle
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from gradwire.errors import ConfigError
from gradwire.tasks import TASKS, build_task, check_task, datasets

# (train shape, test shape, number of parameters of the model)
EXPECTED = {
    "mnist1d-logreg": ((4000, 40), (1000, 40), 40 * 10 + 10),
    "mnist1d-mlp": ((4000, 40), (1000, 40), 40 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10),
    "mnist1d-cnn": ((4000, 40), (1000, 40), (25 * 5 + 25) + 2 * (25 * 25 * 3 + 25) + 125 * 10 + 10),
    "digits-logreg": ((1437, 64), (360, 64), 64 * 10 + 10),
    "digits-mlp": ((1437, 64), (360, 64), 64 * 64 + 64 + 64 * 10 + 10),
    "synthetic-logreg": ((2000, 20), (1000, 20), 20),
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data-cache")


# language models (token inputs, sequence targets): tested in their own files
SEQUENCE_TASKS = {"stdlib-lm": "tests/tasks/test_language_model.py"}


def test_every_registered_task_is_tested():
    assert sorted([*EXPECTED, *SEQUENCE_TASKS]) == TASKS.names()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shapes_dtypes_and_model(name, dtype, data_dir):
    task = build_task(name, num_workers=4, seed=0, dtype=dtype, data_dir=data_dir)
    train_shape, test_shape, num_params = EXPECTED[name]
    assert tuple(task.x_train.shape) == train_shape and tuple(task.x_test.shape) == test_shape
    assert task.x_train.dtype == task.x_test.dtype == dtype
    assert task.y_train.dtype == task.y_test.dtype == torch.int64
    assert task.y_train.shape == (train_shape[0],) and task.y_test.shape == (test_shape[0],)
    assert set(task.y_train.unique().tolist()) == set(range(task.num_classes))  # every class present
    assert torch.isfinite(task.x_train).all()

    model = task.model_fn(torch.Generator().manual_seed(0))
    assert sum(p.numel() for p in model.parameters()) == num_params
    assert all(p.dtype == dtype for p in model.parameters())
    assert list(model.buffers()) == []  # functional_call on a flat vector needs a stateless model
    out = model(task.x_test[:7])
    assert out.dtype == dtype
    assert tuple(out.shape) == (7, 1 if task.num_classes == 2 else task.num_classes)
    loss = task.loss_fn(out, task.y_test[:7])
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert 0.0 <= task.accuracy(model) <= 1.0
    assert np.isfinite(task.objective(model))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_init_comes_only_from_the_generator(name, data_dir):
    task = build_task(name, num_workers=2, seed=0, data_dir=data_dir)
    state = torch.get_rng_state()
    a = task.model_fn(torch.Generator().manual_seed(3))
    torch.manual_seed(12345)  # the global RNG must not matter
    b = task.model_fn(torch.Generator().manual_seed(3))
    c = task.model_fn(torch.Generator().manual_seed(4))
    torch.set_rng_state(state)
    for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb)
        assert not torch.equal(pa, pc)
    before = torch.get_rng_state()
    task.model_fn(torch.Generator().manual_seed(3))
    assert torch.equal(before, torch.get_rng_state())  # building a model does not consume global RNG


def test_default_init_distribution(data_dir):
    """Weights follow PyTorch's default bound 1/sqrt(fan_in) (fan_in = 100 for the MLP's 2nd layer)."""
    model = build_task("mnist1d-mlp", num_workers=1, seed=0, data_dir=data_dir).model_fn(torch.Generator())
    w = model[2].weight.detach()
    assert w.abs().max() <= 0.1 and w.abs().max() > 0.09
    assert abs(float(w.std()) - 0.1 / 3**0.5) < 0.005  # std of U(-b, b) is b/sqrt(3)
    cnn = build_task("mnist1d-cnn", num_workers=1, seed=0, data_dir=data_dir).model_fn(torch.Generator())
    conv = cnn[3].weight.detach()  # second Conv1d: fan_in = 25 channels * kernel 3
    assert 0.95 / 75**0.5 < conv.abs().max() <= 1 / 75**0.5


def test_objective_is_mean_loss_plus_penalties(data_dir):
    task = build_task("synthetic-logreg:l2=0.3,l1=0.2", num_workers=2, seed=0, data_dir=data_dir)
    model = task.model_fn(torch.Generator().manual_seed(1))
    w = model[0].weight.detach().double().reshape(-1)
    z = task.x_train.double() @ w
    s = 2.0 * task.y_train.double() - 1.0
    expected = torch.log1p(torch.exp(-s * z)).mean() + 0.15 * w.dot(w) + 0.2 * w.abs().sum()
    assert task.objective(model) == pytest.approx(float(expected), rel=1e-12)


def test_mnist1d_is_the_standard_dataset_whatever_the_seed(data_dir):
    a = build_task("mnist1d-logreg", num_workers=1, seed=0, data_dir=data_dir)
    b = build_task("mnist1d-cnn", num_workers=5, seed=99, data_dir=data_dir)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    counts = torch.bincount(a.y_train, minlength=10)
    assert counts.min() > 350 and counts.max() < 450  # 500 per class before the 80/20 split
    assert abs(float(a.x_train.mean())) < 0.1 and abs(float(a.x_train.std()) - 1) < 0.1  # standardised


def test_mnist1d_cache_written_atomically_and_reused(tmp_path, monkeypatch):
    np.random.seed(123)  # noqa: NPY002  (the global state is what is under test)
    random.seed(123)
    np_state, py_state = np.random.get_state()[1].copy(), random.getstate()  # noqa: NPY002
    first = build_task("mnist1d-mlp", num_workers=1, seed=0, data_dir=tmp_path / "cache")
    # mnist1d reseeds the global RNGs; building a task must not leave them changed
    assert np.array_equal(np.random.get_state()[1], np_state) and random.getstate() == py_state  # noqa: NPY002
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(files) == 1 and files[0].startswith("mnist1d-") and files[0].endswith(".npz")  # no temp file

    def fail():
        raise AssertionError("the cache should have been read")

    monkeypatch.setattr(datasets, "_generate_mnist1d", fail)
    second = build_task("mnist1d-cnn", num_workers=1, seed=0, data_dir=tmp_path / "cache")
    assert torch.equal(first.x_train, second.x_train) and torch.equal(first.y_train, second.y_train)


def test_unreadable_cache_is_regenerated(tmp_path):
    path = datasets.mnist1d_cache_path(tmp_path)
    path.write_bytes(b"not an npz file")
    task = build_task("mnist1d-logreg", num_workers=1, seed=0, data_dir=tmp_path)
    assert task.x_train.shape == (4000, 40)
    assert np.load(path)["x"].shape == (4000, 40)


def test_digits_scaled_and_split_stratified(data_dir):
    task = build_task("digits-mlp", num_workers=3, seed=7, data_dir=data_dir)
    assert float(task.x_train.min()) == 0.0 and float(task.x_train.max()) == 1.0
    assert torch.bincount(task.y_test, minlength=10).min() >= 35  # about 36 per class
    again = build_task("digits-logreg", num_workers=1, seed=0, data_dir=data_dir)
    assert torch.equal(task.x_test, again.x_test)  # fixed split, independent of the run seed


def test_digits_split_is_built_once_then_read_from_the_cache(tmp_path, monkeypatch):
    first = datasets.load_digits_split(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("digits-") and files[0].endswith(".npz")  # no temp file

    fresh = datasets._split_digits()

    def fail():
        raise AssertionError("the cache should have been read")

    monkeypatch.setattr(datasets, "_split_digits", fail)
    again = datasets.load_digits_split(tmp_path)
    for key in ("x", "y", "x_test", "y_test"):  # the cached arrays are the split, to the bit and dtype
        assert again[key].dtype == fresh[key].dtype and np.array_equal(again[key], fresh[key])
    assert first["x"].dtype == np.float64 and first["y"].dtype.kind == "i" and len(first["x"]) == 1437


@pytest.mark.multiprocess
def test_a_task_read_from_the_cache_imports_neither_its_data_package_nor_matplotlib(data_dir):
    """mnist1d.data imports matplotlib and requests (1.3 s) and the digits loader all of scikit-learn
    (1.1 s): every process of a run paid them before the caches were read without them."""
    for name in ("mnist1d-mlp", "digits-logreg"):
        build_task(name, num_workers=1, seed=0, data_dir=data_dir)  # the cache exists from here on
    code = ("import sys; from gradwire.tasks import build_task; "
            f"[build_task(n, num_workers=2, seed=0, data_dir={str(data_dir)!r}) "
            "for n in ('mnist1d-mlp', 'digits-logreg')]; "
            "print(sorted(m for m in ('mnist1d', 'sklearn', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_task_pickles(data_dir):
    """The torch.distributed transport may ship the task to spawned processes."""
    for name in ("mnist1d-cnn", "synthetic-logreg"):
        task = build_task(name, num_workers=2, seed=0, data_dir=data_dir)
        copy = pickle.loads(pickle.dumps(task))
        x = task.x_test[:3]
        g = torch.Generator().manual_seed(0)
        assert torch.equal(copy.model_fn(g)(x), task.model_fn(torch.Generator().manual_seed(0))(x))


def test_name_is_the_resolved_spec(data_dir):
    assert build_task("mnist1d-cnn", num_workers=1, seed=0, data_dir=data_dir).name == "mnist1d-cnn"
    task = build_task("synthetic-logreg:dim=5, l1=0.1", num_workers=2, seed=0)
    assert task.name == "synthetic-logreg:samples=2000,dim=5,l2=0.01,l1=0.1,hetero=1.0,test_samples=1000"
    again = build_task(task.name, num_workers=2, seed=0)
    assert torch.equal(task.x_train, again.x_train) and task.f_star == again.f_star


@pytest.mark.parametrize(
    "spec, kwargs, match",
    [
        ("imagenet", {}, "unknown task"),
        ("mnist1d-cnn:width=3", {}, "no parameter"),
        ("synthetic-logreg:l2=-1", {}, "l2"),
        ("synthetic-logreg:l1=-0.5", {}, "l1"),
        ("synthetic-logreg:hetero=-1", {}, "hetero"),
        ("synthetic-logreg:dim=0", {}, "dim"),
        ("synthetic-logreg:samples=3", {}, "every worker"),
        ("synthetic-logreg", {"num_workers": 0}, "num_workers"),
        ("synthetic-logreg", {"dtype": torch.int64}, "dtype"),
    ],
)
def test_bad_specs_raise_config_error(spec, kwargs, match):
    args = {"num_workers": 4, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=match):
        build_task(spec, **args)
    if not kwargs:  # the spec's own fault: the check without data finds it too
        with pytest.raises(ConfigError, match=match):
            check_task(spec, num_workers=4)


@pytest.mark.parametrize("name", TASKS.names())
def test_check_task_loads_no_data(name, tmp_path, monkeypatch):
    """check_task passes every valid task's defaults without building it: a factory with parameters
    returns None after its range checks (check_only), one without is not called."""
    built = []
    entry = TASKS.entry(name)
    monkeypatch.setattr(entry, "factory", lambda *a, _f=entry.factory, **k: built.append(_f(*a, **k)) or built[-1])
    monkeypatch.chdir(tmp_path)  # a data set written by mistake would land here
    check_task(name, num_workers=4)
    assert built == ([None] if entry.params else []) and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_stdlib_lm_takes_a_gradient_step_its_transformer_can_take(make_config):
    """stdlib-lm declares default_lr_scale 0.0375: sync's --lr left out is 0.03, at which SGD with
    momentum trains the transformer without a jump (no step's loss above the first), where sync's
    usual 0.8 jumps (to 9 on this small model, to 25-49 on the default one: docs/defaults.md)."""
    from gradwire.run.combination import resolved
    from gradwire.run.loop import Run

    task = "stdlib-lm:dim=64,layers=2,heads=2"
    assert resolved(make_config(task=task, lr=None)).lr == pytest.approx(0.03)

    def losses(**kw):
        r = Run(resolved(make_config(task=task, workers=2, steps=40, **kw)))
        return [r.train_step()["loss"] for _ in range(40)]

    default = losses(lr=None)
    assert max(default) <= default[0] and sum(default[-5:]) / 5 < 0.65 * default[0], default
    usual = losses(lr=0.8)
    assert max(usual) > 1.2 * usual[0], usual
