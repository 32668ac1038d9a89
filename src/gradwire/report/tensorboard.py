"""``--tensorboard``: the run's scalars also as TensorBoard event files, in ``OUT/tensorboard``.

The same numbers as the run folder: every evaluation row of ``metrics.jsonl`` under
``metrics/<key>`` and every step row of ``steps.jsonl`` under ``steps/<key>``, at the run's step
(numbers only; booleans, strings and lists are left out). Written with
``torch.utils.tensorboard``, which needs the optional ``tensorboard`` package
(``pip install 'gradwire[tensorboard]'``); asking for it without the package is a config error.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from gradwire.errors import ConfigError

FOLDER = "tensorboard"


def require_tensorboard() -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package, which is not installed: "
                          "pip install 'gradwire[tensorboard]' (or leave --tensorboard off)")


class ScalarWriter:
    """TensorBoard event files under ``out/tensorboard``; ``purge_step``: a resumed run's
    checkpoint step (TensorBoard hides the later events of the first attempt)."""

    def __init__(self, out: Path, *, purge_step: int | None = None):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(out) / FOLDER), purge_step=purge_step)

    def scalars(self, prefix: str, row: dict) -> None:
        step = int(row["step"])
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
