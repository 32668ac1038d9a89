"""SIGTERM (what schedulers send) and SIGINT end a run like each other: a summary saying it was
stopped, and on the simulator a checkpoint of the step reached (``--checkpoint-every``)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from gradwire import checkpoint
from gradwire.config import RunConfig
from gradwire.errors import Stopped


class StopSignals:
    """SIGTERM and SIGINT while a run trains, handled in the main thread only (the previous handlers
    come back after). ``deferred`` (the simulator, the threads backend): the first signal asks the
    loop (every process's, on threads) to stop after the step it is in; a second one stops the
    main thread at once on the simulator, while on threads it is ignored (the process threads are
    stopping, each within its next step or its current wait's timeout, and write the summary).
    ``checkpoints`` (the simulator): the loop checkpoints the step it stops at, where the state is
    whole (on threads the processes may stop at different steps). Otherwise (the torch backend,
    possibly blocked on its peers) a signal stops the run at once."""

    def __init__(self, deferred: bool, checkpoints: bool = False):
        self.deferred, self.checkpoints, self.pending, self.stopping = deferred, checkpoints, None, False
        self._previous: dict = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)

    def restore(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.stopping:  # already on the way out: let the summary be written
            return
        if self.deferred and self.pending is None:
            self.pending = signum
            return
        self.stopping = True
        raise Stopped(signum)

    def stop_now(self) -> None:
        self.stopping = True
        raise Stopped(self.pending)


def stop_record(cfg: RunConfig, stopped: Stopped, step: int, writer: bool) -> dict:
    """What summary.json says of a stop, also filled into ``stopped`` for the command's message
    (``out`` only where this process wrote the summary)."""
    stopped.step, stopped.out = step, cfg.out if writer else None
    stopped.checkpoint_step = resume_step(cfg)
    record = {"stopped_by": signal.Signals(stopped.signum).name, "checkpoint_step": stopped.checkpoint_step}
    if cfg.checkpoint_every and cfg.backend != "sim":
        record["checkpoint_note"] = ("no checkpoint at the stop: on a real backend every rank must save at the "
                                     "same step; --resume continues from the last periodic checkpoint")
    return record


def resume_step(cfg: RunConfig) -> int | None:
    """The step ``--resume`` continues ``cfg.out``'s run from: its latest checkpoint's (None without one)."""
    stepdir = checkpoint.latest(Path(cfg.out) / "checkpoint") if cfg.checkpoint_every else None
    return checkpoint.step_of(stepdir) if stepdir is not None else None
