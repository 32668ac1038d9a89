"""The README's "Tensor parallelism" block: each line is a launch that gradwire accepts as written
(its process count, layout, task and compressor pass every check launch makes before torchrun
starts: nothing is started here), and the 1-D line runs, shrunk to world size 2 (1d:p=2 on 2
processes, 2 steps). The 2.5-D line needs q*q*d = 8 processes per worker, and 1d:p=4 four: as
written neither fits this machine's 2 cores; tests/parallel runs each layout at small sizes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.cli import build_parser
from gradwire.cli.launch import torchrun_argv

ROOT = Path(__file__).resolve().parents[2]


def readme_lines() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text.split("\n### Tensor parallelism inside, gradwire's data parallelism across\n", 1)[1]
    block = block.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_block_is_what_this_test_runs():
    lines = readme_lines()
    assert len(lines) == 2 and all(cmd[:2] == ["gradwire", "launch"] for cmd in lines)
    assert "1d:p=4" in lines[1] and "2.5d:q=2,d=2" in lines[0]


@pytest.mark.parametrize("index", [0, 1])
def test_each_line_passes_launchs_checks_as_written(index, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADWIRE_RUN_STAMP", "20260101-000000")
    argv = [*readme_lines()[index][1:], "--out", str(tmp_path / "r")]
    command = torchrun_argv(build_parser().parse_args(argv))  # ConfigError if refused; starts nothing
    assert command[:2] == ["--nproc-per-node", "8"] and "--tensor-parallel" in command


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_1d_line_runs_at_world_size_2(tmp_path, data_dir):
    line = readme_lines()[1]
    argv = [a.replace("1d:p=4", "1d:p=2") for a in line[1:]]
    argv[argv.index("--nproc-per-node") + 1] = "2"
    out = tmp_path / "tp"
    p = subprocess.run([sys.executable, "-m", "gradwire", *argv, "--steps", "2", "--eval-every", "2", "--no-curves",
                        "--data-dir", str(data_dir), "--out", str(out)], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
