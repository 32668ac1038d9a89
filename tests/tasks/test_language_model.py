"""The stdlib-lm task: deterministic byte-level data split by file, a causal transformer without
buffers, and a loss that falls in a short run."""

import sysconfig
from pathlib import Path

import pytest
import torch

from gradwire.cli import main
from gradwire.errors import ConfigError
from gradwire.run.loop import run
from gradwire.tasks import build_task
from gradwire.tasks.language import stdlib_sources
from gradwire.tasks.oracle import FlatModel
from tests.helpers import read_jsonl

TINY = "stdlib-lm:context=16,dim=32,layers=1,heads=2,train_bytes=40000,val_bytes=4000"


def test_data_is_deterministic_and_split_by_file():
    a = build_task(TINY, num_workers=2, seed=0)
    b = build_task(TINY, num_workers=2, seed=5)  # the seed draws nothing in the data
    for name in ("x_train", "y_train", "x_test", "y_test", "eval_train"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    files = stdlib_sources()
    assert files == sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")) and len(files) >= 10
    # the first training window is the first file's first 17 bytes; targets are inputs shifted by one
    first = torch.tensor(list(files[0].read_bytes()[:17]))
    assert torch.equal(a.x_train[0], first[:16]) and torch.equal(a.y_train[0], first[1:])
    assert torch.equal(a.x_train[:, 1:], a.y_train[:, :-1])
    assert torch.equal(a.x_test[0], torch.tensor(list(files[9].read_bytes()[:16])))  # validation: file 9, 19, ...
    assert a.x_train.dtype == torch.int64 and int(a.x_train.max()) < 256
    assert a.x_train.shape == (40000 // 17, 16) and a.x_test.shape == (4000 // 17, 16)
    assert len(a.eval_train) == len(a.x_test) and a.partition_labels().shape == (len(a.x_train),)


def test_model_is_causal_has_no_buffers_and_default_size_is_1_to_5_million():
    task = build_task(TINY, num_workers=1, seed=0)
    model = FlatModel(task.model_fn(torch.Generator().manual_seed(0)))  # refuses buffers
    again = FlatModel(task.model_fn(torch.Generator().manual_seed(0)))
    assert torch.equal(model.flat, again.flat)
    x = task.x_train[:3].clone()
    with torch.no_grad():
        out = model.forward(model.flat, x).clone()
        x[:, 10:] = (x[:, 10:] + 1) % 256
        changed = model.forward(model.flat, x)
    assert out.shape == (3, 16, 256)
    assert torch.equal(out[:, :10], changed[:, :10]) and not torch.equal(out[:, 10:], changed[:, 10:])
    state = torch.get_rng_state()
    other = FlatModel(task.model_fn(torch.Generator().manual_seed(1)))
    assert torch.equal(state, torch.get_rng_state()) and not torch.equal(model.flat, other.flat)  # generator only
    default = build_task("stdlib-lm", num_workers=1, seed=0)
    numel = sum(p.numel() for p in default.model_fn(torch.Generator().manual_seed(0)).parameters())
    assert 1_000_000 <= numel <= 5_000_000


def test_loss_decreases_in_a_short_run(tmp_path, data_dir):
    from gradwire.config import RunConfig

    cfg = RunConfig(task=TINY, workers=2, steps=30, batch_size=8, eval_every=30, lr=0.003,
                    algorithm="diloco:inner_steps=5,outer_lr=0.7,outer_momentum=0.9", partition="dirichlet:alpha=1",
                    out=str(tmp_path / "o"), data_dir=str(data_dir))
    run(cfg, progress=False)
    first, last = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    uniform = float(torch.log(torch.tensor(256.0)))  # the loss of a uniform guess, near the initial model's
    assert first["test_loss"] == pytest.approx(uniform, abs=0.5)
    assert last["test_loss"] < first["test_loss"] - 1.0 and last["train_loss"] < first["train_loss"] - 1.0
    assert 0 <= last["test_acc"] <= 1 and last["test_acc"] > first["test_acc"]


def test_bad_size_is_a_clear_error():
    with pytest.raises(ConfigError, match="dim must be a positive multiple of heads=4, got dim=30"):
        build_task("stdlib-lm:dim=30", num_workers=1, seed=0)


def test_listed(capsys):
    assert main(["list", "tasks"]) == 0
    assert "stdlib-lm" in capsys.readouterr().out
