"""Checkpoints that resume a run bitwise: everything that changes during training.

Layout inside the run folder::

    checkpoint/step-00000120/sim.pt      (simulator: one process holds every worker)
    checkpoint/step-00000120/rank3.pt    (torch backend: each rank its own workers' state)
    checkpoint/latest                    ("step-00000120", written last)

Each file is written to a temporary name and renamed, and ``latest`` is replaced only after
every rank has written (a barrier), so a crash at any moment leaves the previous checkpoint
intact. Files hold tensors, numbers and strings only and are read with
``torch.load(weights_only=True)``: a checkpoint cannot run code.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from gradwire.errors import ConfigError

FORMAT = 1
# Keys that must agree between the run that wrote a checkpoint and the run that resumes it.
MUST_MATCH = ("task", "workers", "algorithm", "compressor", "error_feedback", "partition", "stragglers",
              "network", "backend", "batch_size", "lr", "momentum", "weight_decay", "dtype", "seed")


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save(folder: Path, step: int, label: str, state: dict, config: dict, *, barrier=None,
         moves_latest: bool = True, keep: int = 1) -> Path:
    """Write this process's ``state`` for ``step``; with ``moves_latest``, point ``latest`` at it."""
    stepdir = Path(folder) / f"step-{step:08d}"
    stepdir.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "step": step, "config": {k: config[k] for k in MUST_MATCH}, "state": state}
    _atomic_save(payload, stepdir / f"{label}.pt")
    if barrier is not None:
        barrier()  # every rank has written before `latest` moves
    if moves_latest:
        mark_latest(folder, step, keep=keep)
    return stepdir


def mark_latest(folder: Path, step: int, *, keep: int = 1) -> None:
    """Point ``latest`` at ``step`` (atomically) and remove older step folders."""
    name = f"step-{step:08d}"
    tmp = Path(folder) / "latest.tmp"
    tmp.write_text(name + "\n")
    os.replace(tmp, Path(folder) / "latest")
    old = sorted(p for p in Path(folder).glob("step-*") if p.is_dir() and p.name < name)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)


def latest(folder: Path) -> Path | None:
    marker = Path(folder) / "latest"
    if not marker.exists():
        return None
    stepdir = Path(folder) / marker.read_text().strip()
    if not stepdir.is_dir():
        raise ConfigError(f"checkpoint marker {marker} names {stepdir.name}, which does not exist")
    return stepdir


def load(stepdir: Path, label: str, config: dict) -> tuple[int, dict]:
    """This process's state from ``stepdir``; ConfigError for a corrupt or mismatched file."""
    path = Path(stepdir) / f"{label}.pt"
    if not path.exists():
        have = ", ".join(sorted(p.name for p in Path(stepdir).glob("*.pt"))) or "none"
        raise ConfigError(f"checkpoint {stepdir} has no {label}.pt (it has: {have}); was it written with "
                          "another backend or number of workers?")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise ConfigError(f"checkpoint {path} is unreadable (corrupt or truncated): "
                          f"{str(e).splitlines()[0][:200]}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "state" not in payload:
        raise ConfigError(f"checkpoint {path} is not a gradwire checkpoint of format {FORMAT}")
    saved = payload["config"]
    diff = [f"{k}: checkpoint {saved.get(k)!r} vs now {config[k]!r}" for k in MUST_MATCH if saved.get(k) != config[k]]
    if diff:
        raise ConfigError(f"checkpoint {path} was written by a different run configuration ({'; '.join(diff)})")
    return int(payload["step"]), payload["state"]
