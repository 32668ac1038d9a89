"""Trajectories of Leader SGD as gradwire ran it before the authors' protocol (issue 17) was added:
no proximal pull, the election window equal to τ, the leader evaluated. ``test_leader_sgd.py``
checks that ``prox=0`` and ``window=τ`` (``global_prox=0`` and ``global_window=τ_G`` for
multi-leader) with ``eval=leader`` still give these steps.

Recorded with the code of commit 5587257 (before the protocol; ``git archive 5587257 src``, then
``PYTHONPATH=<that>/src python tests/algorithms/lsgd_reference.py``) into
``data/lsgd_reference.json``: every step's figures (the elected leaders, the gradients and bytes
counted: integers, compared exactly) and, per worker, four float64 statistics of its parameters x
(Σx, Σ|x|, Σx², and Σ s_i x_i for a fixed ±1 pattern s), then the last evaluation.

The runs are in float64 (``dtype="float64"``), because results are not the same on every CPU:
PyTorch's vectorised kernels (AVX2, AVX-512, or none: ATEN_CPU_CAPABILITY=default) sum in
different orders, and the last bit moves. In float32 that last bit is 6e-8 of a value; momentum
(0.9) carries each step's difference into the next ten, the gradients feed it back, and the
leader is elected by comparing losses, so a float32 recording could fail on another CPU for a
reason that is not a bug. In float64 a sum of n terms in any order is within (n-1)·u·Σ|terms| of
the exact sum (u = 2^-53, Higham 2002, §4.2); with n <= 81 (a logit of 64 features and a bias; a
gradient entry over a batch of 16) and 12 steps, two machines differ by about 2·12·81·u ≈ 2e-13
before amplification. RTOL = 1e-9 leaves that a factor of 5,000 for momentum and feedback, and
is still far below what a bug changes (a leader elected from the wrong window, a pull of the
wrong size or direction, a proximal pull applied at prox=0: percents within one round). It
applies to each statistic relative to Σ|x| (Σx², relative to itself) and to each loss.
Accuracies count samples: they may differ by one sample. Measured (2026-11-28): the same code
under ATEN_CPU_CAPABILITY=default departs from the AVX-512 recording by at most 3.3e-16 of Σ|x|.

    PYTHONPATH=src python tests/algorithms/lsgd_reference.py [DATA_DIR]   # rewrites the file: only on purpose
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import torch

from gradwire.config import RunConfig
from gradwire.run.loop import Run

FILE = Path(__file__).parent / "data" / "lsgd_reference.json"
# the spec as it was, and the keys that reproduce it now
CASES = {
    "lsgd:pull=0.3,period=3": ",prox=0,window=3,eval=leader",
    "lsgd:groups=2,pull=0.5,period=2,global_pull=0.2,global_period=4":
        ",prox=0,window=2,global_prox=0,global_window=4,eval=leader",
    "lsgd:async=true,pull=0.5,period=2": ",prox=0,window=2,eval=leader",
}
STEPS = 12
UNIT_ROUNDOFF = 2.0**-53  # float64: the runs' dtype
LONGEST_SUM = 81          # 64 features and a bias (a logit); a batch of 16 (a gradient entry)
RTOL = 1e-9               # 5,000 times 2·STEPS·LONGEST_SUM·UNIT_ROUNDOFF (module docstring)
assert RTOL > 1000 * 2 * STEPS * LONGEST_SUM * UNIT_ROUNDOFF


def statistics(t: torch.Tensor) -> list[float]:
    """[Σx, Σ|x|, Σx², Σ s_i x_i] in float64; s_i = ±1 from the bits of i (integer arithmetic: the
    same pattern everywhere)."""
    x = t.detach().reshape(-1).double()
    signs = 1.0 - 2.0 * ((torch.arange(x.numel(), dtype=torch.int64) * 2654435761 >> 13) & 1).double()
    return [x.sum().item(), x.abs().sum().item(), (x * x).sum().item(), (x * signs).sum().item()]


def trajectory(spec: str, data_dir: str, out: str) -> list[dict]:
    """Run ``spec`` on the tests' local-updates configuration; every step's figures and statistics,
    then the evaluation of the last step."""
    cfg = RunConfig(task="digits-logreg", workers=4, steps=STEPS, batch_size=16, lr=0.1, momentum=0.9, dtype="float64",
                    stragglers="lognormal:sigma=0.5,compute_s=0.05", algorithm=spec, out=out, data_dir=data_dir)
    r = Run(cfg)
    rows = []
    for _ in range(STEPS):
        info = r.train_step()
        keep = {k: v for k, v in info.items() if isinstance(v, int | float | list)}
        rows.append(keep | {"x": {str(k): statistics(x) for k, x in r.algorithm.replicas.x.items()},
                            "sim_time_s": r.clock.now, "bytes_sent": r.transport.bytes_sent})
    rows.append({"eval": r.evaluate(), "eval_params": statistics(r.algorithm.eval_params()),
                 "samples": {"train_acc": len(r.task.y_train), "test_acc": len(r.task.y_test)}})
    return rows


def _close(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=0, abs_tol=RTOL * max(abs(scale), abs(a), abs(b), 1e-30))


def _stats_close(a: list[float], b: list[float]) -> bool:
    scale = max(a[1], b[1])  # Σ|x|: the sums of signed terms are judged against it
    return (_close(a[0], b[0], scale) and _close(a[1], b[1], scale) and _close(a[2], b[2], a[2])
            and _close(a[3], b[3], scale))


def mismatches(recorded: list[dict], measured: list[dict]) -> list[str]:
    """Where ``measured`` departs from ``recorded`` beyond what float32 summation order explains
    (module docstring); [] when it does not."""
    if len(recorded) != len(measured):
        return [f"{len(measured)} rows, recorded {len(recorded)}"]
    out = []
    *steps, last = recorded
    for i, (want, got) in enumerate(zip(steps, measured, strict=False), 1):
        if set(want) != set(got):
            out.append(f"step {i}: keys {sorted(got)} vs recorded {sorted(want)}")
            continue
        for key, value in want.items():
            if key == "x":
                bad = [w for w in value if w not in got["x"] or not _stats_close(value[w], got["x"][w])]
                if bad or set(value) != set(got["x"]):
                    out.append(f"step {i}: worker(s) {bad or sorted(set(value) ^ set(got['x']))} parameters")
            elif isinstance(value, float):
                if not _close(value, got[key], value):
                    out.append(f"step {i}: {key} {got[key]!r} vs recorded {value!r}")
            elif value != got[key]:  # integers and lists of them: exact
                out.append(f"step {i}: {key} {got[key]!r} vs recorded {value!r}")
    end = measured[-1]
    if not _stats_close(last["eval_params"], end["eval_params"]):
        out.append("evaluated parameters")
    for key, value in last["eval"].items():
        near = (abs(value - end["eval"][key]) <= 1 / last["samples"][key] + 1e-12 if key in last["samples"]
                else _close(value, end["eval"][key], value))
        if not near:
            out.append(f"evaluation: {key} {end['eval'][key]!r} vs recorded {value!r}")
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        data = sys.argv[1] if len(sys.argv) > 1 else "data-cache"
        record = {spec: trajectory(spec, data, f"{tmp}/{k}") for k, spec in enumerate(CASES)}
    FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {FILE}")
