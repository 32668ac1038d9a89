"""``benchmarks/defaults_probes.py``, the probes behind docs/defaults.md's tenth round: each runs end to
end on a small task, prints one line per setting, leaves signSGD as it was, and draws Leader SGD's
settings from its seed alone (the doc's figures name the draws by that seed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradwire.algorithms.signsgd import SignSGD
from tests.helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "defaults_probes.py"
SMALL = ["--task", "digits-logreg", "--steps", "6", "--workers", "4"]


@pytest.fixture()
def probes():
    return load_script(BENCH, "defaults_probes")


@pytest.mark.parametrize("reply", ["vote", "ef", "mean", "ef-vector", "ef-tensor", "ef-block", "relative",
                                   "relative-mean"])
def test_each_reply_runs_and_signsgd_is_left_as_it_was(probes, capsys, data_dir, reply):
    own = SignSGD.setup, SignSGD.step
    probes.main(["replies", "--reply", reply, "--lrs", "0.01,0.02", "--seeds", "3", "--block", "16", *SMALL,
                 "--data-dir", str(data_dir)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{reply} β=0.8 linear --lr {lr}" for lr in ("0.01", "0.02")]
    assert all(0 <= float(line.rsplit("mean ", 1)[1]) <= 1 for line in lines)
    assert (SignSGD.setup, SignSGD.step) == own


def test_the_patched_step_is_what_runs(probes, capsys, data_dir):
    """A probe reply replaces the algorithm's own: the votes' mean as it is does not end where the
    default reply (down=ef, what runs unpatched) ends."""
    for reply in ("ef", "mean"):
        probes.main(["replies", "--reply", reply, "--lrs", "0.05,0.2", "--seeds", "3,4", *SMALL,
                     "--data-dir", str(data_dir)])
    lines = [line.split(": ")[1] for line in capsys.readouterr().out.splitlines()]
    assert lines[:2] != lines[2:]


def test_reply_scale_trace_and_the_leader_search(probes, capsys, data_dir):
    probes.main(["reply-scale", "--seeds", "3", "--at", "0,5", *SMALL, "--data-dir", str(data_dir)])
    scale = capsys.readouterr().out.strip()
    values = [float(v) for v in re.findall(r"\d+: ([0-9.]+)", scale)]
    assert scale.startswith("signsgd seed 3: s = mean |u| at step 0:") and len(values) == 2
    assert 0 < values[0] <= 1  # the first reply: the votes' mean magnitude, no residual yet
    probes.main(["trace", "--algorithm", "sync", "--lr", "0.1", "--seeds", "1", "--show", "2-4", *SMALL,
                 "--data-dir", str(data_dir)])
    assert [line.split(": ")[0] for line in capsys.readouterr().out.splitlines()] == [
        f"sync --lr 0.1 seed 1 step {k}" for k in (2, 3, 4)]
    probes.main(["lsgd-search", "--rng", "1", "--draws", "2", "--seeds", "3", *SMALL, "--data-dir", str(data_dir)])
    drawn = [line.split(": ")[0] for line in capsys.readouterr().out.splitlines()]
    # Python's random.Random(1), the same on every machine: the doc's first two settings
    assert drawn == ["lsgd:pull=0.7,period=1,prox=0.3 --lr 1.2 --momentum 0.0 --lr-schedule cosine",
                     "lsgd:pull=0.4,period=8,prox=0.1 --lr 2 --momentum 0.0 --lr-schedule cosine"]
