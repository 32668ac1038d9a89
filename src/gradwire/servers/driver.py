"""The Driver interface: how the run's steps are driven, whoever drives them.

The run loop (``run/loop.py``) holds one driver and calls it the same way whatever it is:

- ``step(step) -> dict``: one step of the run as the loop counts them (its figures, with ``loss``);
- ``before_evaluation()``: at an evaluation step, what every process does first;
- ``save_checkpoint(step)``: the run's checkpoint at ``step`` (through the parts' checkpointer);
- ``state_dict()`` / ``load_state_dict(state, stepdir)``: the driver's own entries in the run's
  checkpoint, beside the algorithm's, the data's, the clock's and the transport's;
- ``takes_state_from(stepdir)``: whether this process resumes from the checkpoint in ``stepdir``;
- ``train(loop)``: the whole training of this process; the run loop for all but one driver;
- ``finish()``: at the end of a finished run, the driver's goodbyes and its summary entries.

Implementations: :class:`CollectiveDriver` (every worker steps together through the algorithm's
collectives), ``SimulatedServer`` (server mode on the simulator, ``simulated.py``), and on a real
backend ``RealServer`` (process 0) with ``RealWorker`` (every other process, ``real.py``). Each is
built from :class:`DriverParts`, never from the run, by ``run/drivers.py``'s one factory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gradwire.algorithms.base import Algorithm, Context
from gradwire.transports.base import Transport
from gradwire.transports.clocks import Clock

FaultPoint = Callable[[int, str], None]
"""A test's fault injection: called with (step, phase) at the places a process may be made to
fail (phase "step": after a step; "sent": a server-mode worker after sending; "saved": a
server-mode worker after saving its part of a checkpoint)."""


def no_faults(step: int, phase: str) -> None:
    """The production fault point: nothing happens."""


class Checkpoints(Protocol):
    """What a driver needs of the run's checkpointer (``run/checkpointer.py``)."""

    def save(self, step: int, extra: dict | None = None, *, part_of_cut: bool = False) -> None:
        """Save this process's state at ``step`` (with ``extra`` entries); ``part_of_cut``: one
        process's part of a server's quiescent cut (no barrier, ``latest`` left where it is)."""

    def mark_latest(self, step: int) -> None:
        """Move ``latest`` to ``step``, once every part of it is saved."""

    def clear_parts(self, step: int) -> None:
        """Remove the workers' parts an earlier attempt at the checkpoint of ``step`` left."""


@dataclass
class DriverParts:
    """What a driver drives: the typed parts it is built from."""

    ctx: Context                 # the workers this process hosts, the oracle, the timeline
    algorithm: Algorithm
    transport: Transport
    clock: Clock
    timeout_s: float             # a real backend's longest wait on a peer
    checkpoints: Checkpoints     # where a checkpoint's state goes
    fault_point: FaultPoint = no_faults  # a test's fault injection (fault/kill.py); nothing by default


class Driver:
    """The interface, with the behaviour every driver shares by default."""

    def __init__(self, parts: DriverParts):
        self.parts = parts
        self.ctx, self.algo, self.transport = parts.ctx, parts.algorithm, parts.transport

    def step(self, step: int) -> dict:
        raise NotImplementedError

    def start(self, evaluate: Callable[[], None]) -> None:
        """A run from step 0: ``evaluate`` records the step-0 evaluation (at once, by default)."""
        evaluate()

    def before_evaluation(self) -> None:
        """Every process, at the same steps: the transport's counters agreed, then what the
        algorithm gathers for an evaluation (e.g. the workers' average)."""
        self.transport.sync_counters()
        self.algo.before_evaluation(self.ctx)

    def save_checkpoint(self, step: int) -> None:
        self.parts.checkpoints.save(step)

    def state_dict(self) -> dict:
        """The driver's entries in the run's checkpoint state (none by default)."""
        return {}

    def load_state_dict(self, state: dict, stepdir: Path | None = None) -> None:
        """Take the driver's entries back from a run's checkpoint ``state`` (read from ``stepdir``
        when it came from a file)."""

    def takes_state_from(self, stepdir: Path, label: str) -> bool:
        """Whether this process resumes from ``stepdir``: by default always (a missing file of
        its own is an error, which loading it reports)."""
        return True

    def train(self, loop: Callable[[], dict]) -> dict:
        """This process's training: the run loop, which calls ``step``."""
        return loop()

    def finish(self) -> dict:
        """A finished run's end: the entries the driver adds to the summary."""
        return {}


class CollectiveDriver(Driver):
    """Every worker steps together: the algorithm's step, with its collectives."""

    def step(self, step: int) -> dict:
        return self.algo.step(self.ctx, step)
