"""Clocks: simulated seconds on the simulator, real elapsed seconds on a real backend.

Both expose ``now`` (seconds since the run started, a resumed run continuing from its checkpoint),
``advance(seconds)`` (simulated compute or communication; a no-op in real time, which passes by
itself) and ``state_dict()``.
"""

from __future__ import annotations

import time


class Clock:
    """The interface algorithms see as ``ctx.clock``."""

    now: float

    def advance(self, seconds: float) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


class SimClock(Clock):
    """Simulated seconds since the start of the run."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += float(seconds)

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        self.now = float(state["now"])


class WallClock(Clock):
    """Real seconds since the run started; ``advance`` is a no-op (time passes by itself)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.offset = 0.0  # seconds already run before a resume

    @property
    def now(self) -> float:
        return self.offset + time.perf_counter() - self.start

    @now.setter
    def now(self, value: float) -> None:  # event-driven code may set it; real time wins
        pass

    def advance(self, seconds: float) -> None:
        pass

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        self.offset = float(state["now"])
        self.start = time.perf_counter()


