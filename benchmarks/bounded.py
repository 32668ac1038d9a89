"""A child command with a time limit that ends the whole process group: ``subprocess.run``'s timeout
kills only the direct child, and torchrun's workers (or a wrapper's children) would keep running on
the machine's cores."""

from __future__ import annotations

import os
import signal
import subprocess


def run_group(cmd: list[str], timeout: float, *, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=timeout, check=check, **kwargs)`` in a session of its own: on the
    timeout SIGTERM goes to the whole group, SIGKILL 10 s later to what is left, then TimeoutExpired."""
    with subprocess.Popen(cmd, start_new_session=True, **kwargs) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            raise
    done = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    if check:
        done.check_returncode()
    return done
