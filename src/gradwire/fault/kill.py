"""``GRADWIRE_KILL_AT``: the tests' fault injection, as a driver's fault point (servers/driver.py).

``GRADWIRE_KILL_AT=WORKER:STEP`` kills the process hosting that worker with SIGKILL after that
step, in the first attempt only (torchrun counts restarts in TORCHELASTIC_RESTART_COUNT), so a
restarted group runs through. ``WORKER:STEP:sent`` kills a server-mode worker right after it sent
that step's message, before the answer. ``WORKER:STEP:saved`` kills a server-mode worker after the
first step at or past STEP that follows a committed checkpoint (it has saved its part, and the
server, which answers only once ``latest`` has moved, has answered since), so that a restart
resumes whatever the processes' relative speeds. ``WORKER:STEP:unacked`` kills a server-mode
worker right after it saved its part of the checkpoint of step STEP, before it acknowledges it (the
server must then leave that cut uncommitted). Only the torch backend's processes are killed
(on the simulator or threads one process is the whole cluster).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from gradwire.errors import ConfigError

PHASES = ("step", "sent", "saved", "unacked")


class KillAt:
    """The fault point that kills this process at the point ``spec`` names."""

    def __init__(self, spec: str, local_ranks: tuple[int, ...]):
        parts = spec.split(":")
        phase = (parts[2:] or ["step"])[0]
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]) or phase not in PHASES:
            raise ConfigError(f"GRADWIRE_KILL_AT={spec!r} must be WORKER:STEP[:PHASE] with PHASE one of "
                              f"{', '.join(PHASES)}")
        self.worker, self.at, self.phase = int(parts[0]), int(parts[1]), phase
        self.hosted = self.worker in local_ranks
        self.saved = 0  # parts of server checkpoints this (server-mode worker) process saved
        self.kill = lambda: os.kill(os.getpid(), signal.SIGKILL)  # (a test replaces it to watch)

    def __call__(self, step: int, phase: str) -> None:
        if phase == "saved":  # a part saved: what a "saved" kill waits for, and where "unacked" strikes
            self.saved += 1
            if self.phase == "unacked" and step == self.at and self.hosted:
                self.kill()
            return
        if self.phase == "unacked":
            return
        if self.phase == "saved":
            hit = phase == "step" and step >= self.at and self.saved > 0
        else:
            hit = step == self.at and phase == self.phase
        if hit and self.hosted:
            self.kill()


def fault_point_from_env(env: Mapping[str, str], backend: str, local_ranks: tuple[int, ...]):
    """The fault point ``env`` asks for (``GRADWIRE_KILL_AT``), or None for none."""
    spec = env.get("GRADWIRE_KILL_AT")
    if not spec or backend != "torch" or env.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return KillAt(spec, local_ranks)
