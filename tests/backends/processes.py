"""Starting gradwire on real torch.distributed processes: through torchrun (``gradwire launch``), the
launcher's own processes forked from the tests' preloaded server (``ranks``: the same ``gradwire run``
command lines and the environment torchrun gives them, without a launcher, supervisors and a fresh
interpreter per rank), or one process per rank by hand when a test must see each exit code."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time

from tests.helpers import gw


def launch(nproc: int, args: list[str], out, data_dir, timeout=180, extra_env=None, launch_args=()):
    """``gradwire launch --nproc-per-node NPROC [LAUNCH_ARGS] -- run ARGS`` writing to ``out``, one
    thread per process, without curves.png (1.4 s of process 0's CPU, which no test here reads);
    returns the CompletedProcess."""
    env = dict(os.environ, OMP_NUM_THREADS="1") | (extra_env or {})
    return gw("launch", "--nproc-per-node", str(nproc), *launch_args, "--", "run", *args, "--no-curves",
              "--out", str(out), "--data-dir", str(data_dir), "--timeout-s", "60", env=env, timeout=timeout)


def ranks(nproc: int, args: list[str], out, data_dir, timeout=180, extra_env=None) -> subprocess.CompletedProcess:
    """What ``launch(nproc, args, out, data_dir)`` runs, for the tests whose subject is the torch
    backend rather than the launcher: the run command line ``gradwire launch`` builds for its
    processes (``torchrun_argv``: its checks, --workers counted, --backend torch), run by ``nproc``
    processes forked from the preloaded server with torchrun's environment (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RESTART_COUNT=0), rank 0 holding the
    store. Returns a CompletedProcess: the first non-zero exit code in rank order (else 0), every
    rank's stdout and stderr one after another."""
    from gradwire.cli import build_parser
    from gradwire.cli.launch import torchrun_argv
    from tests.forked import Forked

    ns = build_parser().parse_args(["launch", "--nproc-per-node", str(nproc), "--", "run", *args, "--no-curves",
                                    "--out", str(out), "--data-dir", str(data_dir), "--timeout-s", "60"])
    argv = torchrun_argv(ns)
    command = argv[len(argv) - argv[::-1].index("gradwire"):]  # after the last "gradwire": ... -m gradwire run ARGS
    port = str(free_port())
    base = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_RESTART_COUNT="0",
                TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_USE_AGENT_STORE="False") | (extra_env or {})
    procs = [Forked(command, env=base | {"RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0"})
             for r in range(nproc)]
    ends, outs = finished(procs, timeout, stdout=True)
    code = next((c for c, _ in ends if c != 0), 0)
    return subprocess.CompletedProcess(command, code, "".join(outs), "".join(err for _, err in ends))


def sim_and_torch(tmp_path, data_dir, nproc: int, args: list[str]) -> tuple[list[dict], list[dict]]:
    """The metrics of one run on ``nproc`` gloo processes (``gradwire launch``) and of the same run on
    the simulator with ``nproc`` workers: (torch records, simulator records)."""
    from gradwire.cli import main
    from tests.helpers import read_jsonl

    p = ranks(nproc, args, tmp_path / "torch", data_dir)
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
    """``gradwire run --backend torch`` in ``nproc`` processes forked from the preloaded server (rank 0 the server or
    coordinator, ``nproc - 1`` workers); returns (exit code, stderr) of each, in rank order."""
    from tests.forked import Forked

    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1") | env_extra
        procs.append(Forked(["run", "--backend", "torch", "--workers", str(nproc - 1), *args, "--no-curves",
                             "--out", str(out), "--data-dir", str(data_dir), "--timeout-s", "20"], env=env))
    return finished(procs, timeout=200)


def finished(procs: list, timeout: float, stdout: bool = False):
    """(exit code, stderr) of each process (a ``subprocess.Popen`` or ``tests.forked.Forked``), in
    order, all of them within ``timeout`` seconds of the call (then killed); with ``stdout``, also
    each one's stdout: (that list, the list of stdouts). However the wait ends (pytest-timeout's
    exception included), no process is left running."""
    results, outs, deadline = [], [], time.monotonic() + timeout
    try:
        for p in procs:
            out = ""
            try:
                out, err = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:  # a grandchild that holds the pipe open must not hold the test too
                    out, err = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    err = f"(killed after {timeout} s; its pipes stayed open 30 s more: a child of it still runs)"
            results.append((p.returncode, err))
            outs.append(out or "")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return (results, outs) if stdout else results
