"""Every line of the README's "Real training on torch.distributed" block runs, shortened: 2 processes
a node instead of 4, 4 steps, the two "machines" of the
multi-node lines as two launchers on this one (their rendezvous on 127.0.0.1), "..." read as the
first line's run flags. Each exits 0 and the run folder says the run finished its steps."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.processes import finished, free_port

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def readme_lines() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text.split("\n## Real training on torch.distributed\n", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def small(cmd: list[str], first_flags: list[str], endpoint: str, out: Path, data_dir) -> list[str]:
    """``cmd`` (its program first) on 2 processes a node and 4 steps, "..." replaced, into ``out``."""
    swap = {"4": "2"}
    argv: list[str] = []
    for i, a in enumerate(cmd):
        if i and cmd[i - 1] in ("--nproc-per-node", "--workers"):
            a = swap.get(a, a)
        if i and cmd[i - 1] == "--rdzv-endpoint":
            a = endpoint
        argv.extend(first_flags if a == "..." else [a])
    if argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    else:
        argv = [sys.executable, "-m", *argv]
    return [*argv, "--steps", str(STEPS), "--eval-every", "2", "--checkpoint-every", "2", "--no-curves",
            "--timeout-s", "60", "--out", str(out), "--data-dir", str(data_dir)]


def test_the_block_is_what_this_test_runs():
    lines = readme_lines()
    assert [cmd[0] for cmd in lines] == ["gradwire", "torchrun", "gradwire", "gradwire", "gradwire"]
    assert lines[0][-2:] == ["--out", "runs/d4"] and "..." not in lines[1]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_every_readme_launch_line_runs(tmp_path, data_dir):
    lines = readme_lines()
    first = lines[0][lines[0].index("run") + 1:-2]  # the first run's own flags, less its --out
    env = dict(os.environ, OMP_NUM_THREADS="1")
    endpoint = f"127.0.0.1:{free_port()}"
    groups = [[0], [1], [2, 3], [4]]  # the two node lines start together, as on two machines
    for group in groups:
        out = tmp_path / f"line{group[0]}"
        procs = [subprocess.Popen(small(lines[i], first, endpoint, out, data_dir), env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in group]
        results = finished(procs, timeout=240)
        for i, (code, err) in zip(group, results, strict=True):
            assert code == 0, f"README line {shlex.join(lines[i])}:\n{err[-3000:]}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == STEPS, (group, summary["status"])
