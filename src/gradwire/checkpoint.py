"""Checkpoints that resume a run bitwise: everything that changes during training.

Layout inside the run folder::

    checkpoint/step-00000120/sim.pt      (simulator: one process holds every worker)
    checkpoint/step-00000120/rank3.pt    (torch backend: each rank its own workers' state)
    checkpoint/latest                    ("step-00000120", written last)

Each file is written to a temporary name, fsynced and renamed (the folder fsynced after), and
``latest`` is replaced (the same way) only after every rank has written (a barrier), and older
step folders removed only after that, so a crash or a power loss at any moment leaves the
previous checkpoint intact. Files hold tensors, numbers and strings only and are read with
``torch.load(weights_only=True)``: a checkpoint cannot run code.

Each file also holds ``sha256``: the digest of a canonical serialization of everything else in it
(type tags, keys, numbers, and every tensor's dtype, shape and raw bytes; see :func:`digest`),
so it does not depend on the device a tensor was saved from or on torch.save's byte layout.
:func:`load` checks it, so a file that changed after it was written (a flipped byte, a truncated
or empty file, a file that is no gradwire checkpoint) is a ConfigError naming the file and what is
wrong, never a silent resume from corrupted state.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
from pathlib import Path

import torch

from gradwire.errors import ConfigError
from gradwire.spec import parse_spec

FORMAT = 2  # 2: with the sha256 digest (format 1 had none)
# Keys that must agree between the run that wrote a checkpoint and the run that resumes it.
MUST_MATCH = ("task", "workers", "algorithm", "compressor", "error_feedback", "compressed_mean", "owner_compressor",
              "partition",
              "stragglers", "network", "backend", "batch_size", "lr", "optimizer", "lr_schedule", "momentum",
              "nesterov", "weight_decay", "dtype", "seed", "tensor_parallel")
# keys added after checkpoints were already written: what an older checkpoint that lacks them meant
# (--device is not here: a checkpoint resumes on either device; tensor_parallel: each process's state
# is its shard, whose size and meaning the layout decides, and 1d:p=4 and 2d:q=2 have as many files)
ADDED_KEYS = {"compressed_mean": "gather", "owner_compressor": "",
              "nesterov": False, "optimizer": "sgd", "lr_schedule": "constant", "tensor_parallel": ""}


def floats_to(obj, device: torch.device):
    """``obj`` with its floating-point tensors moved to ``device`` (checkpoints load onto the CPU;
    parameters, momenta and residuals belong on the run's device). Integer and byte tensors, such
    as random generators' states, which ``set_state`` wants on the CPU, stay where they are."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {key: floats_to(value, device) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(floats_to(value, device) for value in obj)
    return obj


def digest(obj) -> str:
    """sha256 (hex) of a canonical serialization of ``obj``: nested dicts (keys in order), lists,
    tuples, numbers, strings and tensors (dtype, shape and raw bytes, whatever their device)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().resolve_conj().resolve_neg()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            try:
                h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            except (RuntimeError, TypeError):  # a layout without plain bytes (sparse, quantized)
                h.update(repr(t.tolist()).encode())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for key, value in obj.items():
            _feed(h, key)
            _feed(h, value)
    elif isinstance(obj, list | tuple):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
        for value in obj:
            _feed(h, value)
    elif type(obj) is float:
        h.update(b"F" + struct.pack("<d", obj))
    else:  # bool, int, str, None, bytes, torch.dtype, ...: the type and the exact repr
        text = repr(obj).encode("utf-8", "surrogatepass")
        h.update(f"{type(obj).__name__}{len(text)}:".encode() + text)


def _fsync_folder(folder: Path) -> None:
    """Make the names in ``folder`` (a rename, a new entry) durable: a rename is in the folder's
    data, which the file's own fsync does not write."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_save(obj, path: Path) -> None:
    """``obj`` at ``path``, whole or not at all, also after a power loss: written to a temporary
    name and fsynced (else the rename can reach the disk before the data: an empty or partial file
    under the final name), renamed, then the folder fsynced (the rename itself)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full disk: nothing half-written stays behind)
        raise
    _fsync_folder(path.parent)


def save(folder: Path, step: int, label: str, state: dict, config: dict, *, barrier=None,
         moves_latest: bool = True, keep: int = 1, elapsed: dict | None = None) -> Path:
    """Write this process's ``state`` for ``step``; with ``moves_latest``, point ``latest`` at it.
    ``elapsed``: the run's wall-clock figures at the checkpoint (``wall_time_s``, ``eval_time_s``),
    beside the state, not in it: the state is what a resumed run must equal bit for bit."""
    stepdir = Path(folder) / f"step-{step:08d}"
    if not stepdir.is_dir():
        stepdir.mkdir(parents=True, exist_ok=True)
        _fsync_folder(Path(folder))  # the new step folder's name is durable before `latest` names it
    kept = {k: config[k] for k in MUST_MATCH} | ({"steps": config["steps"]} if "steps" in config else {})
    payload = {"format": FORMAT, "step": step, "config": kept, "state": state}
    if elapsed:
        payload["elapsed"] = elapsed
    payload["sha256"] = digest(payload)
    _atomic_save(payload, stepdir / f"{label}.pt")
    if barrier is not None:
        barrier()  # every rank has written before `latest` moves
    if moves_latest:
        mark_latest(folder, step, keep=keep)
    return stepdir


def mark_latest(folder: Path, step: int, *, keep: int = 1) -> None:
    """Point ``latest`` at ``step`` (atomically and durably) and only then remove older step
    folders: until the new ``latest`` is on disk, the old one may be what a crash leaves."""
    name = f"step-{step:08d}"
    tmp = Path(folder) / "latest.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, Path(folder) / "latest")
    _fsync_folder(Path(folder))
    old = sorted(p for p in Path(folder).glob("step-*") if p.is_dir() and p.name < name)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)


def step_of(stepdir: Path) -> int:
    """The step of a checkpoint's step folder (``step-00000120``: 120; :func:`save` names them)."""
    return int(Path(stepdir).name.split("-")[-1])


def latest(folder: Path) -> Path | None:
    marker = Path(folder) / "latest"
    if not marker.exists():
        return None
    name = marker.read_text(errors="replace").strip()
    if not re.fullmatch(r"step-\d{8,}", name):
        raise ConfigError(f"checkpoint marker {marker} is corrupt: it holds {name[:40]!r}, not a step folder "
                          "name such as 'step-00000120'")
    stepdir = Path(folder) / name
    if not stepdir.is_dir():
        raise ConfigError(f"checkpoint marker {marker} names {stepdir.name}, which does not exist")
    return stepdir


def load(stepdir: Path, label: str, config: dict) -> tuple[int, dict, dict]:
    """This process's (step, state, elapsed) from ``stepdir`` (``elapsed``: the wall-clock figures
    saved beside the state, {} in older checkpoints); ConfigError for a corrupt or mismatched file,
    or one at a step past ``config["steps"]`` (resuming it would silently report more steps)."""
    path = Path(stepdir) / f"{label}.pt"
    if not path.exists():
        have = ", ".join(sorted(p.name for p in Path(stepdir).glob("*.pt"))) or "none"
        raise ConfigError(f"checkpoint {stepdir} has no {label}.pt (it has: {have}); was it written with "
                          "another backend or number of workers?")
    payload = read(path)
    saved = payload["config"]
    saved_steps = saved.get("steps")
    saved = {k: saved.get(k, ADDED_KEYS.get(k)) for k in MUST_MATCH}
    diff = [f"{k}: checkpoint {saved[k]!r} vs now {config[k]!r}" for k in MUST_MATCH if saved[k] != config[k]]
    schedule = config.get("lr_schedule", "constant")
    scheduled = parse_spec(schedule)[0] != "constant"  # the schedule spans --steps
    if saved_steps is not None and scheduled and saved_steps != config.get("steps"):
        diff.append(f"steps: checkpoint {saved_steps!r} vs now {config.get('steps')!r}, which lr_schedule "
                    f"{schedule!r} spans")
    if diff:
        raise ConfigError(f"checkpoint {path} was written by a different run configuration ({'; '.join(diff)})")
    step = int(payload["step"])
    steps = config.get("steps")
    if steps is not None and step > int(steps):
        raise ConfigError(f"checkpoint {path} is at step {step}, past --steps {steps}: pass --steps {step} or more "
                          "to continue it, or another --out to start afresh")
    elapsed = payload.get("elapsed")
    return step, payload["state"], elapsed if isinstance(elapsed, dict) else {}


def read(path: Path) -> dict:
    """The verified payload of one checkpoint file: ConfigError naming the file when it is empty,
    truncated, no gradwire checkpoint, unreadable, or its contents do not match its checksum."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(4)
            f.seek(max(0, size - 65_557))  # the zip's end record is within 22 + 65535 bytes of the end
            tail = f.read()
    except OSError as e:
        raise ConfigError(f"checkpoint {path} cannot be read: {e.strerror}") from None
    if size == 0:
        raise ConfigError(f"checkpoint {path} is empty (0 bytes), so it cannot be resumed; start afresh "
                          "with another --out")
    if head != b"PK\x03\x04":
        raise ConfigError(f"checkpoint {path} is not a gradwire checkpoint (not a file written by torch.save)")
    if b"PK\x05\x06" not in tail:
        raise ConfigError(f"checkpoint {path} is unreadable (corrupt or truncated): truncated at {size} bytes, "
                          "before the end of its zip archive")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"checkpoint {path} is unreadable (corrupt or truncated): {first}") from None
    if not isinstance(payload, dict) or "format" not in payload or "state" not in payload:
        raise ConfigError(f"checkpoint {path} is not a gradwire checkpoint (no format, step and state in it)")
    if payload["format"] != FORMAT:
        raise ConfigError(f"checkpoint {path} has format {payload['format']!r}, this gradwire reads format {FORMAT} "
                          "(format 1 had no checksum); resume with the gradwire that wrote it, or start afresh "
                          "with another --out")
    stored = payload.pop("sha256", None)
    if not isinstance(stored, str):
        raise ConfigError(f"checkpoint {path} is not a gradwire checkpoint (no sha256 checksum in it)")
    actual = digest(payload)
    if actual != stored:
        raise ConfigError(f"checkpoint {path} is corrupt: checksum mismatch (stored sha256 {stored[:16]}..., "
                          f"contents give {actual[:16]}...): it changed after it was written "
                          "and cannot be resumed; start afresh with another --out")
    if not isinstance(payload.get("config"), dict) or not isinstance(payload.get("step"), int):
        raise ConfigError(f"checkpoint {path} is not a gradwire checkpoint (no config or step in it)")
    return payload
