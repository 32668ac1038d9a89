"""The tests' forked processes (tests/forked.py) behave as the processes they stand for: a command's
exit code, its stdout and stderr apart, the environment it was given, the signal that ended it, a
log appended to."""

from __future__ import annotations

import os
import signal
import time

from tests.forked import Forked


def test_a_forked_command_gets_its_own_environment_and_reports_its_exit_code_and_streams(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = Forked(["run", "--backend", "torch", "--steps", "1", "--out", str(tmp_path / "run")], env=env | {"RANK": "0"})
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and out == ""
    # the environment given is the child's: RANK came through, the other three are named unset
    assert "WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset" in err and err.count("\n") == 1, err
    p = Forked(["list"], cwd=tmp_path)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "sync" in out and err == ""


def test_a_killed_forked_process_ends_by_that_signal_and_its_log_keeps_every_line(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("before\n")
    p = Forked(["run", "--steps", "100000", "--eval-every", "1000", "--no-curves", "--out", str(tmp_path / "run")],
               env=dict(os.environ, GRADWIRE_PROGRESS_S="0.2"), log=log)  # a progress line every 0.2 s
    deadline = time.monotonic() + 60
    while "step " not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, log.read_text()[-2000:]
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL and p.poll() == -signal.SIGKILL
    text = log.read_text()
    assert text.startswith("before\n") and "step " in text  # appended to, not replaced
