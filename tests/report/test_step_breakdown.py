"""``benchmarks/step_breakdown.py``: the per-step medians that docs/time_to_accuracy.md quotes,
computed from a timeline written by the real recorder."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradwire.report.timeline import COMM, COMPUTE, FOLDER, Timeline
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_breakdown.py"


def load():
    return load_script(SCRIPT, "step_breakdown")


def test_medians_over_steps_leave_out_evaluations_and_the_first_steps(tmp_path, capsys):
    timeline = Timeline(tmp_path / FOLDER, "rank0", simulated=False)
    for step, (compute, collectives) in {
        2: (1.0, [(0.0, 5.0)]),                          # left out: the first steps
        3: (0.1, [(0.05, 0.12), (0.13, 0.2)]),           # overlapped: one collective inside computing
        4: (0.1, [(0.1, 0.3)]),
        5: (0.3, [(0.3, 0.4), (0.4, 0.45), (0.5, 0.6)]),
        20: (1.0, [(1.0, 9.0)]),                         # left out: an evaluation step
    }.items():
        timeline.add(0, COMPUTE, 0.0, compute, step=step)
        for start, end in collectives:
            timeline.add(0, COMM, start, end, step=step)
    timeline.close()
    out = load().breakdown(tmp_path)
    assert out["compute_s"] == pytest.approx(0.1)           # median of 0.1, 0.1, 0.3
    assert out["collectives"] == 2                          # of 2, 1, 3
    assert out["after_compute_s"] == pytest.approx(0.2)     # of 0.1, 0.2, 0.3
    assert out["in_collectives_s"] == pytest.approx(0.2)    # of 0.14, 0.2, 0.25
    assert load().main([str(tmp_path)]) == 0
    line = "computing 100 ms | collectives 2 | after computing 200 ms | in collectives 200 ms"
    assert line in capsys.readouterr().out
    assert load().main([str(tmp_path / "nothing")]) == 1
