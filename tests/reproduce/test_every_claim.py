"""Every claim of ``gradwire reproduce --quick`` runs to a verdict, its plot drawn (a claim whose
plotting raised was reported as "not" while the suite ran only the claim without a plot), and a
claim that raises is reported as ``error`` with its exception, never as "not reproduced"."""

from __future__ import annotations

import json
import time

import pytest

from gradwire import reproduce
from gradwire.cli import main
from gradwire.reproduce.claim import VERDICTS


@pytest.mark.slow
@pytest.mark.parametrize("name", list(reproduce.CLAIMS))
def test_every_quick_claim_runs_to_a_verdict_with_its_plot(name, tmp_path):
    started = time.process_time()
    [claim] = reproduce.run_claims(tmp_path, quick=True, names=[name])
    assert claim.verdict in ("reproduced", "partly", "not"), claim.reason  # measured and judged
    assert claim.checks and claim.rows and claim.measured and "error" not in claim.measured
    assert claim.plot == f"{name}/{name}.png" or name == "lsgd-symmetry" or claim.plot.startswith(f"{name}/")
    assert (tmp_path / claim.plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"{name}: {claim.verdict}, {time.process_time() - started:.1f} s CPU")


def test_a_claim_that_raises_is_an_error_with_its_exception_never_not(tmp_path, monkeypatch, capsys):
    def broken(out, scale):
        raise ZeroDivisionError("a planted failure")

    monkeypatch.setattr(reproduce.CLAIMS["dasgd"], "run", broken)
    assert "error" in VERDICTS
    code = main(["reproduce", "--quick", "--only", "dasgd", "--out", str(tmp_path / "rep")])
    assert code == 1  # an experiment raised
    [claim] = json.loads((tmp_path / "rep" / "claims.json").read_text())["claims"]
    assert claim["verdict"] == "error"
    assert claim["reason"] == "the experiment raised ZeroDivisionError: a planted failure"
    assert "ZeroDivisionError" in claim["measured"]["error"] and claim["checks"] == []
    out = capsys.readouterr().out
    assert "| **error** |" in out and "| **not** |" not in out
    md = (tmp_path / "rep" / "reproduce.md").read_text()
    assert "Verdicts: 0 reproduced, 0 partly, 0 not, 1 error." in md
    assert "**Verdict: error.** the experiment raised ZeroDivisionError: a planted failure" in md
