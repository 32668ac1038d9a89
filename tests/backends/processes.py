"""Starting gradwire on real torch.distributed processes: through torchrun (``gradwire launch``), or
one process per rank by hand when a test must see each process's exit code."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """(exit code, stderr) of each process, in order, each waited for at most ``timeout`` seconds
    (then killed)."""
    results = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            try:  # a grandchild that holds the pipe open must not hold the test too
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                err = f"(killed after {timeout} s; its pipes stayed open 30 s more: a child of it still runs)"
        results.append((p.returncode, err))
    return results
