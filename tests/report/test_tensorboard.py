"""--tensorboard: the run folder's scalars as TensorBoard events; without the package, one clear line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gradwire.errors import ConfigError
from gradwire.run.loop import run


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="the tensorboard extra is not installed")
def test_tensorboard_holds_the_same_scalars(make_config):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = make_config(tensorboard=True, steps=6, eval_every=3)
    run(cfg, progress=False)
    events = EventAccumulator(str(Path(cfg.out) / "tensorboard"))
    events.Reload()
    metrics = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
    steps = [json.loads(x) for x in (Path(cfg.out) / "steps.jsonl").read_text().splitlines()]
    got = [(e.step, e.value) for e in events.Scalars("metrics/test_acc")]
    assert got == [(m["step"], pytest.approx(m["test_acc"], rel=1e-6)) for m in metrics]  # float32 in the events
    assert [e.step for e in events.Scalars("steps/loss")] == [s["step"] for s in steps]
    assert [e.value for e in events.Scalars("steps/bytes_sent")] == [s["bytes_sent"] for s in steps]


def test_tensorboard_without_the_package_is_a_config_error(make_config, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"--tensorboard needs the tensorboard package.*gradwire\[tensorboard\]"):
        make_config(tensorboard=True).validate()
