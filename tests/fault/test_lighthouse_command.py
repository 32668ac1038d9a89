"""``python -m gradwire.fault.lighthouse`` (docs/fault_tolerance.md), run as a user runs it."""

import signal
import subprocess
import sys

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'gradwire[ft]')")

pytestmark = pytest.mark.multiprocess


def test_it_prints_its_address_and_stops_cleanly_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "gradwire.fault.lighthouse", "--bind", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the server listens
        assert line.startswith("gradwire lighthouse: listening on "), (line, proc.stderr.read())
        assert not line.strip().endswith(":0")  # port 0 asked for a free port: the real one is printed
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
