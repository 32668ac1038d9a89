"""docs/reports.md's first bash block runs, in order, on small settings (tests/cli/test_documented_examples.py's
``_small``: 4 steps, a comparison on 4 workers), in one folder: the run, its report, the demo
comparison and the comparison's report written elsewhere (here into the test's folder, not /tmp)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.cli.test_documented_examples import _run_in_order

ROOT = Path(__file__).resolve().parents[2]


def doc_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "reports.md").read_text()
    block = text.split("```bash\n", 1)[1].split("\n```", 1)[0].replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_block_is_what_this_test_runs():
    assert [cmd[:2] for cmd in doc_commands()] == [["gradwire", "run"], ["gradwire", "report"],
                                                  ["gradwire", "compare"], ["gradwire", "report"]]
    assert doc_commands()[3][-2:] == ["--out", "/tmp/demo.html"]


@pytest.mark.slow
def test_the_reports_doc_block_runs_in_order(tmp_path, data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    commands = doc_commands()
    commands[3] = [*commands[3][:-1], str(tmp_path / "demo.html")]  # never /tmp/demo.html from a test
    _run_in_order(commands, data_dir, monkeypatch)
    assert (tmp_path / "runs" / "b2" / "report.html").is_file()
    assert (tmp_path / "runs" / "demo" / "report.html").is_file() and (tmp_path / "demo.html").is_file()
