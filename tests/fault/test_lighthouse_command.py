"""``python -m gradwire.fault.lighthouse`` (docs/fault_tolerance.md), run as a user runs it."""

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'gradwire[ft]')")

pytestmark = pytest.mark.multiprocess


def blocks(pid: int, tid: int, sig: int) -> bool:
    """Whether thread ``tid`` of process ``pid`` blocks ``sig`` (Linux: /proc)."""
    status = open(f"/proc/{pid}/task/{tid}/status").read()  # noqa: SIM115 - read at once
    mask = next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1]
    return bool(int(mask, 16) >> (sig - 1) & 1)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the threads' signal masks in /proc")
def test_it_prints_its_address_and_stops_cleanly_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "gradwire.fault.lighthouse", "--bind", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the server listens
        assert line.startswith("gradwire lighthouse: listening on "), (line, proc.stderr.read())
        assert not line.strip().endswith(":0")  # port 0 asked for a free port: the real one is printed
        # a stop reaches the main thread (it waits in sigwait): no other thread can take it, for a
        # signal the kernel handed to one (the server's, torch's) once left the command running
        others = [t for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others and all(blocks(proc.pid, int(t), signal.SIGTERM) for t in others)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_bad_value_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "gradwire.fault.lighthouse", "--min-replicas", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--min-replicas" in done.stderr.strip().splitlines()[-1]
