"""What a run shows while it trains: a tqdm bar on a terminal, else a compact line on stderr every
few seconds (a log of a batch job is not silent)."""

from __future__ import annotations

import os
import sys
import time

from gradwire.errors import ConfigError


def progress_mode(progress: bool | None) -> tuple[str | None, float]:
    """How the writer shows progress: ``"bar"`` (tqdm) on a terminal, ``"lines"`` (a line on stderr
    every ``interval`` seconds and at the end) elsewhere, or None. ``progress``: None = on unless CI
    is set; True or False decides. GRADWIRE_PROGRESS_S is the lines' interval (default 10 s, 0 = no
    lines); when it is set, lines are on under CI too."""
    given = os.environ.get("GRADWIRE_PROGRESS_S")
    try:
        interval = 10.0 if given is None else float(given)
    except ValueError:
        raise ConfigError(f"GRADWIRE_PROGRESS_S={given!r} is not a number of seconds") from None
    if progress is False:
        return None, interval
    if sys.stderr.isatty():
        return ("bar" if progress or not os.environ.get("CI") else None), interval
    wanted = progress or given is not None or not os.environ.get("CI")
    return ("lines" if wanted and interval > 0 else None), interval


class ProgressLines:
    """``LABEL: step 120/800 loss=0.53 acc=0.81 3.1 MB 12 s`` on stderr, at most every ``interval``
    seconds (and once at the end): what a log shows of a run that has no terminal."""

    def __init__(self, label: str, total: int, interval: float, started: float):
        self.label, self.total, self.interval, self.started = label, total, interval, started
        self.due = time.perf_counter() + interval

    def tick(self, step: int, records: list[dict], bytes_sent: int, *, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now < self.due:
            return
        self.due = now + self.interval
        last = records[-1] if records else {}
        parts = [f"step {step}/{self.total}"]
        if last.get("train_loss") is not None:
            parts.append(f"loss={last['train_loss']:.4g}")
        if last.get("test_acc") is not None:
            parts.append(f"acc={last['test_acc']:.3f}")
        parts += [f"{bytes_sent / 1e6:.1f} MB", f"{now - self.started:.0f} s"]
        print(f"{self.label}: {' '.join(parts)}", file=sys.stderr, flush=True)
