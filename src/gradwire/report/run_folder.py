"""The run folder: what one run leaves for people and for ``gradwire compare``.

``config.json`` (fully resolved, written first), ``algorithm.json`` (an algorithm's set-up
choices), ``steps.jsonl`` (every step's loss and algorithm figures), ``metrics.jsonl`` (one object
per evaluation, flushed as it is written, so a crash loses nothing already measured),
``summary.json`` (written last, also after a divergence or a failure) and ``curves.png``. JSON
files are replaced atomically. Only the process that evaluates (rank 0) writes; on the others a
``RunFolder(enabled=False)`` takes the same calls and writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    """Write atomically: a crash never leaves a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    path = Path(path)
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of steps <= ``step`` (a resumed run rewrites what came after its checkpoint)."""
    if path.exists():
        keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        path.write_text("".join(x + "\n" for x in keep))


class RunFolder:
    def __init__(self, out: Path, *, enabled: bool):
        self.out, self.enabled = Path(out), enabled
        self.records: list[dict] = []  # metrics.jsonl, as written (a resumed run's earlier rows first)
        self._metrics = self._steps = None

    def open(self, config: dict, setup_info: dict, resumed_step: int | None) -> None:
        """Write the config and start the logs; ``resumed_step``: the checkpoint's step, whose later
        rows are dropped and rewritten."""
        if not self.enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / "config.json", config)
        if setup_info:
            write_json(self.out / "algorithm.json", setup_info)
        if resumed_step is not None:
            for name in ("metrics.jsonl", "steps.jsonl"):
                _truncate_jsonl(self.out / name, resumed_step)
            self.records = read_jsonl(self.out / "metrics.jsonl")
        mode = "w" if resumed_step is None else "a"
        self._metrics = open(self.out / "metrics.jsonl", mode)  # noqa: SIM115 - closed in close()
        self._steps = open(self.out / "steps.jsonl", mode)  # noqa: SIM115

    def step(self, row: dict) -> None:
        if self._steps is not None:
            self._steps.write(json.dumps(row) + "\n")
            self._steps.flush()  # a crash loses no step already taken

    def metrics(self, row: dict) -> None:
        if self._metrics is not None:
            self.records.append(row)
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()

    def close(self) -> None:
        for f in (self._metrics, self._steps):
            if f is not None:
                f.close()
        self._metrics = self._steps = None

    def finish(self, summary: dict, label: str) -> None:
        """Write summary.json and curves.png (closing the logs first)."""
        self.close()
        if not self.enabled:
            return
        write_json(self.out / "summary.json", summary)
        if self.records:
            from gradwire.report.plots import plot_runs

            plot_runs({label: self.records}, self.out / "curves.png")
