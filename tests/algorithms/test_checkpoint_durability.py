"""Checkpoint files are written so that a crash or a power loss at any moment leaves a loadable
checkpoint: each file whole under its name or not there (temporary name, fsync, rename, the folder
fsynced), ``latest`` moved the same way, and older step folders removed only after that."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from gradwire import checkpoint

CONFIG = {k: 0 for k in checkpoint.MUST_MATCH} | {"lr_schedule": "constant", "steps": 10}


def state(step: int) -> dict:
    return {"step": step, "params": torch.arange(4.0) * step}


def save(folder: Path, step: int, **kwargs) -> Path:
    return checkpoint.save(folder, step, "sim", state(step), CONFIG, **kwargs)


def loaded_step(folder: Path) -> int:
    stepdir = checkpoint.latest(folder)
    step, saved, _ = checkpoint.load(stepdir, "sim", CONFIG)
    assert torch.equal(saved["params"], state(step)["params"])
    return step


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names each fsynced descriptor through /proc/self/fd")
def test_each_write_is_fsynced_before_its_rename_and_old_steps_go_last(tmp_path, monkeypatch):
    """The order of a checkpoint's durable steps, recorded: the file's data fsynced before its
    rename, the folder fsynced after it; ``latest`` the same; the old step folder removed only
    after the new ``latest`` is durable (there was no fsync at all)."""
    folder = tmp_path / "checkpoint"
    save(folder, 1)
    events = []
    fsync, replace, rmtree = os.fsync, os.replace, shutil.rmtree

    def recorded_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        replace(src, dst)

    def recorded_rmtree(path, *args, **kwargs):
        events.append(("rmtree", str(path)))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    monkeypatch.setattr(shutil, "rmtree", recorded_rmtree)
    save(folder, 2)
    new, pt = folder / "step-00000002", folder / "step-00000002" / "sim.pt"
    tmp = f"{pt}.tmp{os.getpid()}"
    assert events == [("fsync", str(folder)),  # the new step folder's name
                      ("fsync", tmp), ("replace", tmp, str(pt)), ("fsync", str(new)),
                      ("fsync", str(folder / "latest.tmp")), ("replace", str(folder / "latest.tmp"),
                                                              str(folder / "latest")),
                      ("fsync", str(folder)), ("rmtree", str(folder / "step-00000001"))]
    assert loaded_step(folder) == 2


def test_only_the_latest_steps_are_kept(tmp_path):
    folder = tmp_path / "checkpoint"
    for step in (1, 2, 3):
        save(folder, step)
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-00000003"]
    save(folder, 4, keep=2)
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-00000003", "step-00000004"]
    assert loaded_step(folder) == 4


def test_a_crash_before_latest_moves_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    """Killed after the new step's file is written and before ``latest`` moves (every rank has
    written, the barrier passed): ``latest`` still names the old step, which is still there and loads."""
    folder = tmp_path / "checkpoint"
    save(folder, 1)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(checkpoint, "mark_latest", killed)
    with pytest.raises(KeyboardInterrupt):
        save(folder, 2)
    assert (folder / "step-00000002" / "sim.pt").is_file()
    assert loaded_step(folder) == 1


def test_a_write_that_fails_halfway_leaves_the_file_before_it(tmp_path, monkeypatch):
    """A full disk while a checkpoint file is written again (the same step, a resumed run's stop):
    the file under its name is still the whole earlier one, and no partial file is left (a plain
    torch.save onto the name left half a file there)."""
    folder = tmp_path / "checkpoint"
    save(folder, 1)
    before = (folder / "step-00000001" / "sim.pt").read_bytes()
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if isinstance(f, str | os.PathLike):
            with open(f, "wb") as out:
                out.write(before[: len(before) // 2])
        else:
            f.write(before[: len(before) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError):
        save(folder, 1)
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(p.name for p in (folder / "step-00000001").iterdir()) == ["sim.pt"]
    assert (folder / "step-00000001" / "sim.pt").read_bytes() == before
    assert loaded_step(folder) == 1
