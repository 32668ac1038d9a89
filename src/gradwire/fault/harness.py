"""Fault injection for ``--fault-tolerance torchft`` runs on one machine (tests and benchmarks).

:class:`ReplicaSet` starts a torchft Lighthouse in this process and one ``gradwire run`` process
per replica on loopback, each writing its own run folder (``OUT/replica-K``) and log
(``OUT/replica-K.log``); it kills (SIGKILL), hangs (SIGSTOP) and restarts replicas, and every wait
has a timeout. ``GRADWIRE_KILL_AT=K:STEP`` (the run's fault point, fault/kill.py) makes replica K kill itself
after committing STEP, so a fault lands at a chosen step whatever the processes' speeds;
``GRADWIRE_FT_LEAVE_AT=K:STEP`` makes it leave cleanly instead, and ``GRADWIRE_FT_FULL_AT=S``
makes step S wait for every replica (fault/replica.py): together they replay a run's sequence of
quorums without a fault.

With a :class:`~gradwire.fault.netns.Link` (``link=``, ``sides={replica: "a" or "b"}``) the replicas
run inside its two network namespaces instead, each advertising its side's address (and gloo bound
to its side's device), and the Lighthouse runs in side a as ``python -m gradwire.fault.lighthouse``:
cutting or throttling the link then partitions or slows the replicas of side b.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


class ReplicaSet:
    def __init__(self, out: Path, run_args: list[str], *, replicas: int, min_replicas: int, timeout_s: float = 10.0,
                 quorum_timeout_s: float = 180.0, heartbeat_timeout_ms: int = 1000, join_timeout_ms: int = 3000,
                 env: dict | None = None, link=None, sides: dict[int, str] | None = None, start=None):
        """``start(argv, env, log)``, when given, starts a replica outside a namespace (``gradwire
        ARGV`` with environment ``env``, stdout and stderr appended to the file ``log``) and returns
        an object with ``subprocess.Popen``'s ``pid``, ``poll``, ``wait``, ``kill``, ``send_signal``
        and ``returncode``; by default each replica is a fresh interpreter (``python -m gradwire``)."""
        from torchft.coordination import LighthouseServer

        self.out, self.run_args, self.replicas = Path(out), list(run_args), replicas
        self.out.mkdir(parents=True, exist_ok=True)
        self._lighthouse_args = {"min_replicas": min_replicas, "join_timeout_ms": join_timeout_ms,
                                 "heartbeat_timeout_ms": heartbeat_timeout_ms}
        self.link, self.sides = link, dict(sides or {})
        self.lighthouse_proc = None
        lighthouse_host = "127.0.0.1"
        if link is None:
            self.lighthouse = LighthouseServer(bind="127.0.0.1:0", **self._lighthouse_args)
            address = self.lighthouse.address()
        else:
            self.lighthouse, lighthouse_host = None, link.address("a")
            address = self._start_lighthouse_in(link, lighthouse_host)
        self.lighthouse_port = int(address.rsplit(":", 1)[1].strip("/"))
        # quorum_timeout_s bounds how long the replicas wait for one that is (re)starting at a step that
        # needs all of them (the first, GRADWIRE_FT_FULL_AT's): on a loaded machine a replica's
        # imports alone were seen to take over a minute, so it is far above a quiet machine's seconds
        self.spec = (f"torchft:min_replicas={min_replicas},timeout_s={timeout_s:g},"
                     f"quorum_timeout_s={max(quorum_timeout_s, timeout_s):g},"
                     f"lighthouse={lighthouse_host}:{self.lighthouse_port}")
        self.env = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG="warn") | (env or {})
        self.procs: dict[int, subprocess.Popen] = {}
        self.started: dict[int, float] = {}
        self._start = start

    def _start_lighthouse_in(self, link, host: str) -> str:
        """``python -m gradwire.fault.lighthouse`` in side a of ``link``; its address."""
        a = self._lighthouse_args
        cmd = [*link.prefix("a"), sys.executable, "-m", "gradwire.fault.lighthouse", "--bind", f"{host}:0",
               "--min-replicas", str(a["min_replicas"]), "--join-timeout-ms", str(a["join_timeout_ms"]),
               "--heartbeat-timeout-ms", str(a["heartbeat_timeout_ms"])]
        log = open(self.out / "lighthouse.log", "a")  # noqa: SIM115 - the child keeps it open
        self.lighthouse_proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                                env=dict(os.environ, RUST_LOG="warn"))
        log.close()
        # its imports (torch, torchft) were seen to take over a minute beside other work on 2 cores
        line = self._readline(self.lighthouse_proc, timeout=600)
        if "listening on" not in line:
            self.lighthouse_proc.kill()
            raise RuntimeError(f"the Lighthouse did not start: {line!r} (see {self.out / 'lighthouse.log'})")
        return line.split("listening on", 1)[1].strip()

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout: float) -> str:
        """The first line ``proc`` prints, waiting at most ``timeout`` s ('' if none)."""
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return got[0] if got else ""

    def folder(self, k: int) -> Path:
        return self.out / f"replica-{k}"

    def start(self, k: int, env: dict | None = None) -> subprocess.Popen:
        """Start replica ``k`` (again: its folder is replaced; its state comes from a peer)."""
        log = open(self.out / f"replica-{k}.log", "a")  # noqa: SIM115 - the child keeps it open
        log.write(f"--- gradwire.fault.harness: replica {k} starts at {time.strftime('%H:%M:%S')}\n")
        log.flush()
        spec, prefix, placed = f"{self.spec},replica={k}", [], {}
        if self.link is not None:  # in its side's namespace, advertising that side's address
            side = self.sides.get(k, "a")
            prefix, spec = self.link.prefix(side), f"{spec},host={self.link.address(side)}"
            placed = {"GLOO_SOCKET_IFNAME": self.link.device(side)}
        argv = ["run", "--backend", "torch", "--workers", str(self.replicas), *self.run_args, "--fault-tolerance",
                spec, "--out", str(self.folder(k)), "--overwrite", "--timeout-s", "60"]
        self.started[k] = time.time()
        if self._start is not None and not prefix:
            log.close()
            self.procs[k] = self._start(argv, self.env | placed | (env or {}), self.out / f"replica-{k}.log")
            return self.procs[k]
        self.procs[k] = subprocess.Popen([*prefix, sys.executable, "-m", "gradwire", *argv],
                                         env=self.env | placed | (env or {}), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self.procs[k]

    def start_all(self, env_of: dict[int, dict] | None = None) -> None:
        for k in range(self.replicas):
            self.start(k, (env_of or {}).get(k))

    def wait(self, k: int, timeout: float) -> int:
        """Replica ``k``'s exit code, waiting at most ``timeout`` s (then it is killed: -9)."""
        try:
            return self.procs[k].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.procs[k].kill()
            return self.procs[k].wait(timeout=30)

    def wait_for_step(self, k: int, step: int, timeout: float) -> None:
        """Until replica ``k`` has recorded ``step`` in its steps.jsonl (TimeoutError after ``timeout``)."""
        path, deadline = self.folder(k) / "steps.jsonl", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and f'{{"step": {step},' in path.read_text():
                return
            if self.procs[k].poll() is not None:
                raise RuntimeError(f"replica {k} exited with {self.procs[k].returncode} before step {step}")
            time.sleep(0.02)
        raise TimeoutError(f"replica {k} did not reach step {step} within {timeout:g} s")

    def restart_lighthouse(self, down_s: float) -> None:
        """Stop the Lighthouse, and start a new one on the same port ``down_s`` seconds later."""
        from torchft.coordination import LighthouseServer

        self.lighthouse.shutdown()
        self.lighthouse = None  # torchft's server closes its port when dropped, not at shutdown()
        time.sleep(down_s)
        self.lighthouse = LighthouseServer(bind=f"127.0.0.1:{self.lighthouse_port}", **self._lighthouse_args)

    def signal(self, k: int, sig: int) -> None:
        os.kill(self.procs[k].pid, sig)

    def log(self, k: int) -> str:
        return (self.out / f"replica-{k}.log").read_text(errors="replace")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(timeout=30)
        if self.lighthouse is not None:
            self.lighthouse.shutdown()
            self.lighthouse = None
        if self.lighthouse_proc is not None and self.lighthouse_proc.poll() is None:
            self.lighthouse_proc.terminate()
            try:
                self.lighthouse_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.lighthouse_proc.kill()
                self.lighthouse_proc.wait(timeout=30)
