"""``python -m gradwire.fault.lighthouse`` (docs/fault_tolerance.md), run as a user runs it."""

import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'gradwire[ft]')")

pytestmark = pytest.mark.multiprocess


def blocks(pid: int, tid: int, sig: int) -> bool:
    """Whether thread ``tid`` of process ``pid`` blocks ``sig`` (Linux: /proc)."""
    status = open(f"/proc/{pid}/task/{tid}/status").read()  # noqa: SIM115 - read at once
    mask = next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1]
    return bool(int(mask, 16) >> (sig - 1) & 1)


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line ``proc`` prints on its (unbuffered, binary) stdout, waiting at most
    ``timeout_s``; what came before the deadline or the end of the output, if no whole line did."""
    got, deadline = b"", time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:  # end of output: the command exited
                break
            got += chunk
    return got.decode(errors="replace").partition("\n")[0]


def stop(proc: subprocess.Popen) -> str:
    """Kill ``proc`` if it still runs, and its stderr (bounded waits)."""
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate(timeout=30)
    return err.decode(errors="replace")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the threads' signal masks in /proc")
def test_it_prints_its_address_and_stops_cleanly_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "gradwire.fault.lighthouse", "--bind", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        line = first_line(proc, timeout_s=120)  # printed once the server listens
        if not line.startswith("gradwire lighthouse: listening on "):
            pytest.fail(f"no address line within 120 s; stdout {line!r}; stderr:\n{stop(proc)[-3000:]}")
        assert not line.strip().endswith(":0")  # port 0 asked for a free port: the real one is printed
        # a stop reaches the main thread (it waits in sigwait): no other thread can take it, for a
        # signal the kernel handed to one (the server's, torch's) once left the command running
        others = [t for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others and all(blocks(proc.pid, int(t), signal.SIGTERM) for t in others)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after SIGTERM; stderr:\n{stop(proc)[-3000:]}")
        assert code == 0, stop(proc)[-3000:]
    finally:
        stop(proc)


def test_a_bad_value_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "gradwire.fault.lighthouse", "--min-replicas", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--min-replicas" in done.stderr.strip().splitlines()[-1]
