"""benchmarks/bounded.py: a benchmark's child command that outlives its time limit is ended with all
of its own children (subprocess.run's timeout leaves a torchrun's workers running)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import load_script

BOUNDED = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "bounded.py", "bounded")


def test_a_timeout_ends_the_grandchildren_too(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    parent = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired):
        BOUNDED.run_group([sys.executable, "-c", parent], 2.0)
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed: gone from the process table
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        pytest.fail(f"grandchild {grandchild} outlived the timeout")


def test_a_command_within_its_limit_returns_its_output():
    done = BOUNDED.run_group([sys.executable, "-c", "print('ok')"], 30, stdout=subprocess.PIPE, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n"
    with pytest.raises(subprocess.CalledProcessError):
        BOUNDED.run_group([sys.executable, "-c", "raise SystemExit(3)"], 30, check=True)
