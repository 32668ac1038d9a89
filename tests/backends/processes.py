"""Starting gradwire on real torch.distributed processes: through torchrun (``gradwire launch``), or
one process per rank by hand when a test must see each process's exit code."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time

from tests.helpers import gw


def launch(nproc: int, args: list[str], out, data_dir, timeout=180, extra_env=None, launch_args=()):
    """``gradwire launch --nproc-per-node NPROC [LAUNCH_ARGS] -- run ARGS`` writing to ``out``, one
    thread per process, without curves.png (1.4 s of process 0's CPU, which no test here reads);
    returns the CompletedProcess."""
    env = dict(os.environ, OMP_NUM_THREADS="1") | (extra_env or {})
    return gw("launch", "--nproc-per-node", str(nproc), *launch_args, "--", "run", *args, "--no-curves",
              "--out", str(out), "--data-dir", str(data_dir), "--timeout-s", "60", env=env, timeout=timeout)


def sim_and_torch(tmp_path, data_dir, nproc: int, args: list[str]) -> tuple[list[dict], list[dict]]:
    """The metrics of one run on ``nproc`` gloo processes (``gradwire launch``) and of the same run on
    the simulator with ``nproc`` workers: (torch records, simulator records)."""
    from gradwire.cli import main
    from tests.helpers import read_jsonl

    p = launch(nproc, args, tmp_path / "torch", data_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert main(["run", *args, "--workers", str(nproc), "--out", str(tmp_path / "sim"),
                 "--data-dir", str(data_dir)]) == 0
    return read_jsonl(tmp_path / "torch" / "metrics.jsonl"), read_jsonl(tmp_path / "sim" / "metrics.jsonl")


_ports = random.Random()  # its own generator: the suite seeds the global one from each test's id


def free_port() -> int:
    """A free port that no other pytest-xdist worker of this run picks, and that the kernel never
    hands out on its own: a port of the kernel's ephemeral range (32768-60999 here), free when asked,
    could be given to some other test's gloo connection in the seconds before the child process
    that was meant to bind it has imported torch. So: a block of 2,000 ports per worker below that
    range (20000 + 2000 k for worker gw<k>), one found free there by binding it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    low = 20000 + 2000 * (int(worker) % 6 if worker.isdigit() else 0)
    for _ in range(200):
        port = _ports.randrange(low, low + 2000)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + 1999}")


def spawn(nproc, args, out, data_dir, env_extra):
    """``gradwire run --backend torch`` in ``nproc`` processes started here (rank 0 the server or
    coordinator, ``nproc - 1`` workers); returns (exit code, stderr) of each, in rank order."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1") | env_extra
        procs.append(subprocess.Popen([sys.executable, "-m", "gradwire", "run", "--backend", "torch",
                                       "--workers", str(nproc - 1), *args, "--no-curves", "--out", str(out),
                                       "--data-dir", str(data_dir), "--timeout-s", "20"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return finished(procs, timeout=200)


def finished(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """(exit code, stderr) of each process, in order, all of them within ``timeout`` seconds of the
    call (then killed). However the wait ends (pytest-timeout's exception included), no process is
    left running."""
    results, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            try:
                _, err = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:  # a grandchild that holds the pipe open must not hold the test too
                    _, err = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    err = f"(killed after {timeout} s; its pipes stayed open 30 s more: a child of it still runs)"
            results.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return results
