"""Errors that gradwire raises for bad input.

Every user-facing mistake (a bad spec string, config key, value, file or checkpoint) is a
:class:`ConfigError`; the CLI prints its message as one line and exits non-zero.
"""


class ConfigError(ValueError):
    """A value given by the user is invalid; the message names it and the valid choices."""


class DivergenceError(RuntimeError):
    """Training produced a non-finite value; the message names the step and the worker."""

    def __init__(self, message: str, *, step: int, worker: int | None = None):
        super().__init__(message)
        self.step = step
        self.worker = worker


class CommunicationError(RuntimeError):
    """A peer did not answer in time or sent a malformed payload."""
