"""The spawn helper of the tensor-parallel tests waits for all its processes until one deadline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.parallel import spawn


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class HungProcess:
    """A process that never ends by itself: each join waits out its whole timeout."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.alive, self.exitcode = clock, True, None

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        if self.alive and timeout is not None:
            self.clock.now += timeout

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.alive, self.exitcode = False, -9


def test_hung_processes_are_killed_at_one_deadline(monkeypatch, tmp_path):
    """Four hung processes and a 120 s timeout: all are killed 120 s after the start (on the fake
    clock), not after 4 x 120 s, and the test fails naming their exit codes."""
    clock = FakeClock()
    monkeypatch.setattr(spawn, "_clock", clock)
    monkeypatch.setattr(spawn, "_ctx", SimpleNamespace(Process=lambda target, args: HungProcess(clock)))
    with pytest.raises(AssertionError, match=r"four: exit codes \[-9, -9, -9, -9\]"):
        spawn.run_scenario("four", 4, tmp_path, timeout_s=120)
    assert clock.now == 120
