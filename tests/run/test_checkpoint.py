"""Checkpoints: a run stopped at step k and resumed ends bitwise identical to the run that never
stopped; bad checkpoints give clear errors."""

import json

import pytest
import torch
from tests.util import states_equal

from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.run.loop import run


def _cfg(tmp_path, data_dir, name, **kw):
    base = dict(task="digits-mlp", workers=3, steps=30, eval_every=5, batch_size=16, lr=0.05, momentum=0.9,
                stragglers="lognormal:sigma=0.5", checkpoint_every=10, out=str(tmp_path / name), data_dir=str(data_dir))
    return RunConfig(**(base | kw))


def _final_state(folder):
    stepdir = folder / "checkpoint" / (folder / "checkpoint" / "latest").read_text().strip()
    return torch.load(stepdir / "sim.pt", weights_only=True)


def _metrics(folder):
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("wall_time_s")
    return rows


@pytest.mark.parametrize("kw", [
    dict(algorithm="sync:backups=1", compressor="qsgd:levels=4", error_feedback=True),
    dict(algorithm="diana", compressor="pquant:p=2,block=32"),
    dict(algorithm="async", lr=0.02, compressor="topk:ratio=0.1", error_feedback=True),
    dict(algorithm="signsgd:momentum=0.9", lr=0.005),
])
def test_resume_is_bitwise_exact(tmp_path, data_dir, kw):
    run(_cfg(tmp_path, data_dir, "whole", **kw), progress=False)
    run(_cfg(tmp_path, data_dir, "split", steps=25, **kw), progress=False)  # "crashes" after step 25
    assert (tmp_path / "split" / "checkpoint" / "latest").read_text().strip() == "step-00000020"
    summary = run(_cfg(tmp_path, data_dir, "split", resume=True, **kw), progress=False)
    assert summary["resumed"]
    assert states_equal(_final_state(tmp_path / "whole")["state"], _final_state(tmp_path / "split")["state"])
    assert _metrics(tmp_path / "whole") == _metrics(tmp_path / "split")


def test_resume_without_checkpoint_starts_fresh(tmp_path, data_dir):
    s = run(_cfg(tmp_path, data_dir, "fresh", resume=True, steps=5), progress=False)
    assert not s["resumed"] and s["steps"] == 5


def test_mismatched_checkpoint_names_the_difference(tmp_path, data_dir):
    run(_cfg(tmp_path, data_dir, "a", steps=10), progress=False)
    with pytest.raises(ConfigError, match=r"lr: checkpoint 0.05 vs now 0.1"):
        run(_cfg(tmp_path, data_dir, "a", steps=20, lr=0.1, resume=True), progress=False)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, data_dir):
    run(_cfg(tmp_path, data_dir, "c", steps=10), progress=False)
    f = tmp_path / "c" / "checkpoint" / "step-00000010" / "sim.pt"
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    with pytest.raises(ConfigError, match="unreadable .corrupt or truncated."):
        run(_cfg(tmp_path, data_dir, "c", steps=20, resume=True), progress=False)


def test_checkpoint_refuses_pickled_code(tmp_path, data_dir):
    run(_cfg(tmp_path, data_dir, "p", steps=10), progress=False)
    f = tmp_path / "p" / "checkpoint" / "step-00000010" / "sim.pt"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"format": 1, "evil": Evil()}, f)
    with pytest.raises(ConfigError, match="unreadable"):
        run(_cfg(tmp_path, data_dir, "p", steps=20, resume=True), progress=False)
