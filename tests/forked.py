"""Processes forked from one server per test process, a server that has imported torch, torchft and
gradwire once: a fresh interpreter imports torch again, 2-3 CPU-seconds on this machine, and most of
what the multi-process tests cost was that (``tests.cpu_times`` and a census of the processes they
started: 191 of 238 ``gradwire run`` processes were ranks under torchrun, each 2.2 CPU-s, nearly all
of it the import).

Everything that forks for a test goes through ``CONTEXT`` (multiprocessing's ``forkserver`` start
method, whose one server per process imports ``PRELOAD``), so the server starts once per xdist
worker whichever test needs it first. The server itself never runs a torch operation, so no thread
pool exists to be lost in the fork; the children start theirs.

:class:`Forked` is a ``gradwire`` command in such a process with ``subprocess.Popen``'s interface
(``poll``, ``wait``, ``communicate``, ``send_signal``, ``kill``, ``returncode``), its stdout and
stderr in files. What a forked command does not go through is the interpreter's start: tests whose
subject is that (the imports a typo waits for, ``python -m gradwire`` itself, torchrun's launcher)
start real interpreters (``tests.helpers.gw``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PRELOAD = ["torch", "torch.distributed", "torchft", "gradwire.cli", "gradwire.run.loop",
           "gradwire.transports.torch_dist", "tests.parallel.harness", "tests.ddp.ddp_harness"]
CONTEXT = mp.get_context("forkserver")
CONTEXT.set_forkserver_preload(PRELOAD)


def _gradwire_main(argv: list[str], env: dict, cwd: str, out: str, err: str | None) -> None:
    """The forked process: ``env`` as its whole environment, stdout and stderr to the files ``out``
    and ``err`` (both appended to ``out`` when ``err`` is None), then ``gradwire ARGV``; its exit code
    is the command's."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    streams = {1: out, 2: out} if err is None else {1: out, 2: err}
    mode = os.O_APPEND if err is None else os.O_TRUNC  # a log is appended to, across restarts
    for fd, path in streams.items():
        target = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout.reconfigure(line_buffering=True)  # as ``python -u``: a killed process's lines are kept
    from gradwire.cli import main

    sys.argv = ["gradwire", *argv]
    sys.exit(main(argv))


class Forked:
    """``gradwire ARGV`` in a process forked from the preloaded server, with the parts of
    ``subprocess.Popen`` the tests use. ``env`` is the process's whole environment (default: this
    process's); stdout and stderr are read as text once it has ended, or, with ``log``, both are
    appended to that file (and ``communicate`` gives two empty strings)."""

    def __init__(self, argv: list[str], env: dict | None = None, cwd: str | os.PathLike | None = None,
                 log: str | os.PathLike | None = None):
        self.args = ["gradwire", *argv]
        self._dir = None if log else Path(tempfile.mkdtemp(prefix="gradwire-forked-"))
        self._out, self._err = (Path(log), None) if log else (self._dir / "stdout", self._dir / "stderr")
        self._process = CONTEXT.Process(target=_gradwire_main, daemon=False,
                                        args=(list(argv), dict(os.environ if env is None else env),
                                              str(cwd or os.getcwd()), str(self._out),
                                              None if self._err is None else str(self._err)))
        self._process.start()
        self.pid = self._process.pid
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._dir is None:
            return "", ""
        texts = self._read(self._out), self._read(self._err)
        shutil.rmtree(self._dir, ignore_errors=True)
        return texts

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text(errors="replace") if path.exists() else ""

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_replica(argv: list[str], env: dict, log: Path) -> Forked:
    """``gradwire.fault.harness.ReplicaSet``'s ``start``: a replica forked from the preloaded server,
    its output appended to ``log``."""
    return Forked(argv, env=env, log=log)
