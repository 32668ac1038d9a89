"""What a reproduced claim is: the paper's statement, the measurement, the criteria, the verdict.

A claim module (one per paper claim, ``reproduce/<name>.py``) runs its experiment at small scale
through gradwire's own run loop (``variants`` below writes ordinary run folders and a
``comparison.md`` beside them, as ``gradwire compare`` does), reduces the runs to a few numbers
(``measured``), and hands those to its pure function ``judge(measured)``, which applies criteria
stated in advance. The verdict follows from the checks alone: every check passed is
``reproduced``, none is ``not``, anything between is ``partly``; the reason lists each check with
its numbers and, for a failed one, the explanation the module gives for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gradwire.config import RunConfig
from gradwire.errors import DivergenceError

# error: the experiment raised, so nothing was measured (never "not", which says the paper's claim
# was measured and did not hold)
VERDICTS = ("reproduced", "partly", "not", "error")
TIE = 0.005  # test accuracies closer than this (half a point) are level: "beats" needs more, "no worse" allows it


@dataclass(frozen=True)
class Scale:
    """How big the experiments are: ``quick`` (the CLI's --quick, minutes on 2 cores) or full."""

    quick: bool

    def pick(self, quick, full):
        return quick if self.quick else full


@dataclass
class Check:
    criterion: str      # what must hold, stated before measuring
    passed: bool
    detail: str         # the measured numbers behind the decision
    if_failed: str = ""  # why gradwire does not show it (part of the reason when the check fails)
    precondition: bool = False  # makes the comparison fair (equal bytes, ...); not part of the paper's claim


@dataclass
class Claim:
    name: str                  # short id, as --only takes it
    title: str
    citation: str              # authors, year, title, venue / arXiv id
    statement: str             # the paper's claim, paraphrased (no quotes from the paper)
    setup: str                 # what gradwire ran, at which scale
    columns: list[str]         # the measurement table
    rows: list[list]
    checks: list[Check]
    verdict: str               # reproduced | partly | not | error (the experiment raised)
    reason: str
    measured: dict             # the numbers the verdict was computed from
    plot: str | None = None    # PNG, relative to the reproduce folder
    runs: str | None = None    # the claim's run folders, relative to the reproduce folder
    wall_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)  # caveats that hold whatever the verdict

    def to_dict(self) -> dict:
        return asdict(self)


def judge_checks(checks: list[Check]) -> tuple[str, str]:
    """(verdict, reason) from the checks. A failed precondition makes the comparison invalid: ``not``.
    Otherwise the claim's own checks decide: all passed -> reproduced, none -> not, else partly."""
    claim_checks = [c for c in checks if not c.precondition]
    if not claim_checks:
        raise ValueError("a claim needs at least one check that is not a precondition")
    passed = sum(c.passed for c in claim_checks)
    broken = [c for c in checks if c.precondition and not c.passed]
    if broken:
        verdict = "not"
    else:
        verdict = "reproduced" if passed == len(claim_checks) else "not" if passed == 0 else "partly"
    parts = []
    for c in checks:
        text = f"{'PASS' if c.passed else 'FAIL'}: {'precondition: ' * c.precondition}{c.criterion} ({c.detail})"
        if not c.passed and c.if_failed:
            text += f"; {c.if_failed}"
        parts.append(text)
    head = (f"the comparison is not fair: {len(broken)} precondition(s) fail. " if broken else "")
    return verdict, head + f"{passed} of {len(claim_checks)} criteria hold. " + " ".join(f"[{p}]" for p in parts)


def met(checks: list[Check]) -> str:
    """"k of n" over the claim's own checks (not the preconditions)."""
    own = [c for c in checks if not c.precondition]
    return f"{sum(c.passed for c in own)} of {len(own)}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_")[:80] or "run"


# -- running variants through the run loop ------------------------------------------------------
@dataclass
class Result:
    """One finished run: its summary, evaluation records and folder."""

    summary: dict
    metrics: list[dict]
    folder: Path

    def steps(self) -> list[dict]:
        """The run's per-step records (steps.jsonl)."""
        from gradwire.report.run_folder import read_jsonl

        return read_jsonl(self.folder / "steps.jsonl")

    @property
    def final(self) -> dict:
        return self.metrics[-1]


def variants(folder: Path, common: RunConfig, specs: dict[str, dict], title: str, *,
             report: bool = True) -> dict[str, Result]:
    """Run each variant (name -> RunConfig overrides) into ``folder/<name>`` and, with ``report``,
    write the comparison report there (``report/compare.py``) and each run's curves.png; --quick
    leaves both out (a second of plotting per run). A diverged run is kept with its metrics."""
    from gradwire.report.compare import write_report
    from gradwire.report.run_folder import read_jsonl
    from gradwire.run.loop import run

    folder.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, overrides in specs.items():
        cfg = common.replace(name=name, out=str(folder / slug(name)), overwrite=True, curves=report, **overrides)
        try:
            summary = run(cfg, progress=False)
        except DivergenceError:
            summary = json.loads((Path(cfg.out) / "summary.json").read_text())
        results[name] = Result(summary, read_jsonl(Path(cfg.out) / "metrics.jsonl"), Path(cfg.out))
    if report:
        write_report(folder, [r.summary for r in results.values()], [r.folder for r in results.values()], title)
    return results


# -- reading curves ------------------------------------------------------------------------------
def interpolate(records: list[dict], x_key: str, y_key: str, x: float) -> float | None:
    """``y_key`` linearly interpolated at ``x`` of ``x_key`` (None beyond the run's range)."""
    pts = [(r[x_key], r[y_key]) for r in records if r.get(y_key) is not None]
    if not pts or x < pts[0][0] or x > pts[-1][0] + 1e-12:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def first_reaching(records: list[dict], y_key: str, target: float, x_key: str = "sim_time_s") -> float | None:
    """``x_key`` at the first evaluation where ``y_key`` >= target (None if never)."""
    return next((r[x_key] for r in records if r.get(y_key) is not None and r[y_key] >= target), None)


def tail_mean(records: list[dict], key: str, fraction: float = 0.2) -> float:
    """Mean of ``key`` over the evaluations in the last ``fraction`` of the run's steps (less noisy
    than the last value)."""
    last = records[-1]["step"]
    vals = [r[key] for r in records if r["step"] >= (1 - fraction) * last and r.get(key) is not None]
    return sum(vals) / len(vals)


def head_mean(records: list[dict], key: str, fraction: float = 0.25) -> float:
    """Mean of ``key`` over the evaluations after step 0 in the first ``fraction`` of the run."""
    last = records[-1]["step"]
    vals = [r[key] for r in records if 0 < r["step"] <= fraction * last and r.get(key) is not None]
    return sum(vals) / len(vals)


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2e}" if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5) else f"{v:.{digits}g}"
    return str(v)


def save_figure(fig, path, axes=()):
    """Grid and legend on ``axes``, then the figure to ``path`` (PNG, 100 dpi), closed; returns ``path``."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
