"""Fault injection for ``--fault-tolerance torchft`` runs on one machine (tests and benchmarks).

:class:`ReplicaSet` starts a torchft Lighthouse in this process and one ``gradwire run`` process
per replica on loopback, each writing its own run folder (``OUT/replica-K``) and log
(``OUT/replica-K.log``); it kills (SIGKILL), hangs (SIGSTOP) and restarts replicas, and every wait
has a timeout. ``GRADWIRE_KILL_AT=K:STEP`` (the run's fault point, fault/kill.py) makes replica K kill itself
after committing STEP, so a fault lands at a chosen step whatever the processes' speeds;
``GRADWIRE_FT_LEAVE_AT=K:STEP`` makes it leave cleanly instead, and ``GRADWIRE_FT_FULL_AT=S``
makes step S wait for every replica (fault/replica.py): together they replay a run's sequence of
quorums without a fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class ReplicaSet:
    def __init__(self, out: Path, run_args: list[str], *, replicas: int, min_replicas: int, timeout_s: float = 10.0,
                 quorum_timeout_s: float = 180.0, heartbeat_timeout_ms: int = 1000, join_timeout_ms: int = 3000,
                 env: dict | None = None):
        from torchft.coordination import LighthouseServer

        self.out, self.run_args, self.replicas = Path(out), list(run_args), replicas
        self.out.mkdir(parents=True, exist_ok=True)
        self._lighthouse_args = {"min_replicas": min_replicas, "join_timeout_ms": join_timeout_ms,
                                 "heartbeat_timeout_ms": heartbeat_timeout_ms}
        self.lighthouse = LighthouseServer(bind="127.0.0.1:0", **self._lighthouse_args)
        self.lighthouse_port = int(self.lighthouse.address().rsplit(":", 1)[1])
        # quorum_timeout_s bounds how long the replicas wait for one that is (re)starting at a step that
        # needs all of them (the first, GRADWIRE_FT_FULL_AT's): on a loaded machine a replica's
        # imports alone were seen to take over a minute, so it is far above a quiet machine's seconds
        self.spec = (f"torchft:min_replicas={min_replicas},timeout_s={timeout_s:g},"
                     f"quorum_timeout_s={max(quorum_timeout_s, timeout_s):g},"
                     f"lighthouse=127.0.0.1:{self.lighthouse_port}")
        self.env = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG="warn") | (env or {})
        self.procs: dict[int, subprocess.Popen] = {}
        self.started: dict[int, float] = {}

    def folder(self, k: int) -> Path:
        return self.out / f"replica-{k}"

    def start(self, k: int, env: dict | None = None) -> subprocess.Popen:
        """Start replica ``k`` (again: its folder is replaced; its state comes from a peer)."""
        log = open(self.out / f"replica-{k}.log", "a")  # noqa: SIM115 - the child keeps it open
        log.write(f"--- gradwire.fault.harness: replica {k} starts at {time.strftime('%H:%M:%S')}\n")
        log.flush()
        cmd = [sys.executable, "-m", "gradwire", "run", "--backend", "torch", "--workers", str(self.replicas),
               *self.run_args, "--fault-tolerance", f"{self.spec},replica={k}", "--out", str(self.folder(k)),
               "--overwrite", "--timeout-s", "60"]
        self.started[k] = time.time()
        self.procs[k] = subprocess.Popen(cmd, env=self.env | (env or {}), stdout=log, stderr=subprocess.STDOUT)
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
