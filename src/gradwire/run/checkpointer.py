"""The run's checkpointer: the state of every stateful piece of a run, saved and loaded.

One process's state is one dict (the layout every checkpoint since format 1 has): ``step``,
``gradients``, ``window`` (the run's counters), ``algorithm``, ``data`` (the oracle's positions),
``clock``, ``gradient_counts``, ``transport`` (counters, messages in flight), plus the driver's
own entries (``servers/driver.py``: ``simulated_server``; a real server's ``server`` and a
server-mode worker's ``worker_position``, taken at a quiescent cut). Files and their format are
``gradwire/checkpoint.py``'s; this module decides what goes in them and where it comes back to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from gradwire import checkpoint
from gradwire.algorithms.base import Algorithm, Context
from gradwire.errors import ConfigError
from gradwire.servers.driver import Driver
from gradwire.tasks.oracle import GradientOracle
from gradwire.transports.base import Transport
from gradwire.transports.clocks import Clock


class RunCounters:
    """The run's own counters: its step, the gradients computed, the losses since the last evaluation."""

    def __init__(self):
        self.step = 0
        self.gradients = 0
        self.window: list[float] = []


class Checkpointer:
    """Saves and loads a run's state; ``driver`` is attached once built (it saves through this)."""

    def __init__(self, folder: Path, label: str, config: dict, *, counters: RunCounters, algorithm: Algorithm,
                 oracle: GradientOracle, clock: Clock, ctx: Context, transport: Transport, device: torch.device,
                 is_writer: bool, elapsed: Callable[[], dict]):
        self.folder, self.label, self.config = Path(folder), label, config
        self.counters, self.algorithm, self.oracle, self.clock = counters, algorithm, oracle, clock
        self.ctx, self.transport, self.device = ctx, transport, device
        self.is_writer, self.elapsed = is_writer, elapsed
        self.driver: Driver | None = None

    # -- the state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        c = self.counters
        return {"step": c.step, "gradients": c.gradients, "window": list(c.window),
                "algorithm": self.algorithm.state_dict(), "data": self.oracle.state_dict(),
                "clock": self.clock.state_dict(),
                "gradient_counts": {str(k): v for k, v in self.ctx.gradient_counts.items()},
                "transport": self.transport.state_dict()} | self.driver.state_dict()

    def load_state_dict(self, state: dict, stepdir: Path | None = None) -> None:
        c = self.counters
        try:
            c.step, c.gradients, c.window = int(state["step"]), int(state["gradients"]), list(state["window"])
            self.algorithm.load_state_dict(checkpoint.floats_to(state["algorithm"], self.device))
            self.oracle.load_state_dict(state["data"])
            self.clock.load_state_dict(state["clock"])
            self.ctx.gradient_counts = {int(k): int(v) for k, v in state["gradient_counts"].items()}
            self.transport.load_state_dict(state["transport"])
            self.driver.load_state_dict(state, stepdir)
        except (KeyError, TypeError, RuntimeError) as e:
            where = f"checkpoint {stepdir}" if stepdir is not None else "checkpoint"
            missing = isinstance(e, KeyError) and e.args
            what = f"its state has no {e.args[0]!r}" if missing else f"{type(e).__name__}: {e}"
            raise ConfigError(f"{where} does not fit this run ({what}): it was written by another gradwire version or "
                              "configuration; resume with the gradwire that wrote it, or start afresh with another "
                              "--out") from None

    # -- files ----------------------------------------------------------------------------------------
    def save(self, step: int, extra: dict | None = None, *, part_of_cut: bool = False) -> None:
        """This process's state at ``step`` (with ``extra`` entries). Every process of a collective
        run saves, and ``latest`` moves once all have; ``part_of_cut``: one part of a server's
        quiescent cut, whose server moves ``latest`` itself (``mark_latest``)."""
        self.ctx.timeline.mark_checkpoint(step)
        state = self.state_dict() | (extra or {})
        checkpoint.save(self.folder, step, self.label, state, self.config, elapsed=self.elapsed(),
                        barrier=None if part_of_cut else self.transport.barrier,
                        moves_latest=self.is_writer and not part_of_cut)

    def mark_latest(self, step: int) -> None:
        checkpoint.mark_latest(self.folder, step)

    def clear_parts(self, step: int) -> None:
        """Remove the workers' parts an earlier attempt at the checkpoint of ``step`` left."""
        for stale in (self.folder / f"step-{step:08d}").glob("rank*.pt"):
            stale.unlink()

    def resume(self) -> dict | None:
        """Load the latest checkpoint into every piece; returns its wall-clock figures (``elapsed``),
        or None when there is none, or none for this process (a server-mode worker that rejoins)."""
        stepdir = checkpoint.latest(self.folder)
        if stepdir is None or not self.driver.takes_state_from(stepdir, self.label):
            return None
        step, state, elapsed = checkpoint.load(stepdir, self.label, self.config)
        self.load_state_dict(state, stepdir)
        if self.counters.step != step:
            raise ConfigError(f"checkpoint {stepdir} is inconsistent: step {step} vs state step {self.counters.step}")
        return elapsed
