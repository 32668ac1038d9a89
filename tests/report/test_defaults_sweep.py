"""``benchmarks/defaults_sweep.py``: a sweep passes the run flags it documents (the workers, the
batch and the optimizer of docs/defaults.md's signSGD controls) to every run it makes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "defaults_sweep.py"


def test_a_sweep_runs_each_seed_with_the_workers_batch_and_optimizer_given(monkeypatch):
    sweep = load_script(BENCH, "defaults_sweep")
    ran = []
    monkeypatch.setattr(sweep, "one", lambda tmp, **kw: ran.append(kw) or (0.5, 0.0))
    monkeypatch.setattr(sys, "argv", ["defaults_sweep.py", "sweep", "--algorithms", "signsgd", "--lrs", "0.006",
                                      "--workers", "1", "--batch-size", "256", "--optimizer", "sgd",
                                      "--seeds", "3,4"])
    sweep.main()
    assert [(r["seed"], r["lr"], r["workers"], r["batch_size"], r["optimizer"]) for r in ran] == \
        [(3, 0.006, 1, 256, "sgd"), (4, 0.006, 1, 256, "sgd")]
    # left out, they are the run's defaults (8 workers, batch 32), not None
    monkeypatch.setattr(sys, "argv", ["defaults_sweep.py", "sweep", "--algorithms", "sync", "--lrs", "1.6"])
    ran.clear()
    sweep.main()
    assert (ran[0]["workers"], ran[0]["batch_size"]) == (8, 32)


def test_one_run_reports_the_final_accuracy_of_a_real_run(tmp_path, data_dir):
    sweep = load_script(BENCH, "defaults_sweep")
    acc, mb = sweep.one(tmp_path, algorithm="signsgd", seed=3, lr=0.006, workers=1, batch_size=256, steps=20,
                        data_dir=str(data_dir))
    assert mb == 0.0  # one worker: nothing crosses the wire
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert acc == summary["final"]["test_acc"] == last["test_acc"]  # the final accuracy, not the best or first
    acc2, _ = sweep.one(tmp_path, algorithm="sync", seed=3, lr=0.006, workers=2, batch_size=32, steps=20,
                        data_dir=str(data_dir))
    assert acc2 != acc and acc2 == json.loads((tmp_path / "run" / "summary.json").read_text())["final"]["test_acc"]
