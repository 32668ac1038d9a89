"""Errors that gradwire raises for bad input.

Every user-facing mistake (a bad spec string, config key, value, file or checkpoint) is a
:class:`ConfigError`; the CLI prints its message as one line and exits non-zero.
"""

import signal


class ConfigError(ValueError):
    """A value given by the user is invalid; the message names it and the valid choices."""


class NoCheckpointToContinue(ConfigError):
    """``--resume`` (or ``--resume-or-start``) of a run that finished with the same settings and saved
    no checkpoint, to other ``--steps``: it cannot be continued, only replaced. ``steps``: the step
    it finished at."""

    def __init__(self, message: str, *, steps: int | None):
        super().__init__(message)
        self.steps = steps


class DivergenceError(RuntimeError):
    """Training produced a non-finite value; the message names the step and the worker."""

    def __init__(self, message: str, *, step: int, worker: int | None = None):
        super().__init__(message)
        self.step = step
        self.worker = worker


class CommunicationError(RuntimeError):
    """A peer did not answer in time or sent a malformed payload."""


class Stopped(KeyboardInterrupt):
    """A signal ended the run (SIGTERM from a scheduler, SIGINT from Ctrl-C); the command exits with
    128 + ``signum``. The run fills in ``step``, ``out`` (None where no summary was written) and
    ``checkpoint_step`` (where ``--resume`` continues; None without a checkpoint)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.step: int | None = None
        self.out: str | None = None
        self.checkpoint_step: int | None = None


class AlreadyFinished(Exception):
    """``--resume`` on a run that has finished its steps: nothing to do, and nothing is rewritten
    (the command says so and exits 0). ``summary``: the run's summary.json."""

    def __init__(self, out: str, summary: dict, *, continuable: bool = True):
        more = ("--steps beyond it continues the run from its checkpoint" if continuable else
                "it saved no checkpoint, so more --steps need a new run: --overwrite or another --out")
        super().__init__(f"run folder {out} already finished at step {summary['steps']}; nothing to resume, "
                         f"nothing rewritten ({more})")
        self.out, self.summary = out, summary
