"""The run folder: what one run leaves for people and for ``gradwire compare``.

``config.json`` (fully resolved, written first), ``algorithm.json`` (an algorithm's set-up
choices), ``steps.jsonl`` (every step's loss and algorithm figures), ``metrics.jsonl`` (one object
per evaluation, flushed as it is written, so a crash loses nothing already measured),
``summary.json`` (written last, also after a divergence or a failure), ``curves.png``,
``timeline/`` (each process's per-worker intervals, report/timeline.py) and, with
``--tensorboard``, ``tensorboard/`` (report/tensorboard.py). JSON
files are replaced atomically. Only the process that evaluates (rank 0) writes; on the others a
``RunFolder(enabled=False)`` takes the same calls and writes nothing.

A folder is claimed before a run writes it (:func:`claim`): an OS lock (``.gradwire.lock``, held
for the run, released by the OS however the process ends) keeps a second writer out, and a folder
that already holds a run is replaced only when asked (``overwrite``) or continued (``resume``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from gradwire.errors import ConfigError

# What shows that a folder holds a run, and what --overwrite removes (nothing else in the folder).
RUN_MARKERS = ("summary.json", "metrics.jsonl", "steps.jsonl", "config.json", "checkpoint")
RUN_FILES = ("config.json", "algorithm.json", "metrics.jsonl", "steps.jsonl", "summary.json", "curves.png",
             "report.html")
LOCK_NAME = ".gradwire.lock"
# An --overwrite run sets the old run aside here, and removes it only once it starts writing: a setting
# refused while the run is built (a batch larger than a shard, an algorithm's set-up) puts it back.
REPLACED_NAME = ".gradwire-replaced"


def holds_run(folder: Path, *, files_only: bool = False) -> str | None:
    """The first file or folder that shows ``folder`` holds a run, or None; ``files_only``: its files
    alone (a comparison's variant folder may be named checkpoint)."""
    folder = Path(folder)
    if files_only:
        return next((name for name in RUN_MARKERS[:-1] if (folder / name).is_file()), None)
    return next((name for name in RUN_MARKERS if (folder / name).exists()), None)


def refuse_existing(folder: Path, *, overwrite: bool, resume: bool) -> None:
    """Raise ConfigError when ``folder`` holds a run and neither ``overwrite`` nor ``resume`` asks
    to touch it."""
    if overwrite and resume:
        raise ConfigError(f"--overwrite replaces the run in {folder} and --resume continues it: pass one of them")
    refuse_other_kind(folder, "run")  # (--overwrite would replace the runs' files only)
    refuse_others(folder)  # (runs/: --overwrite would remove the files of a run, beside the other runs)
    found = None if (overwrite or resume) else holds_run(folder)
    if found is not None:
        raise ConfigError(f"run folder {folder} already holds a run ({found}); pass --overwrite to replace it "
                          "or --resume to continue it (or choose another --out)")


RUN_FOLDERS = ("checkpoint", "timeline", "tensorboard")


def clear_run(folder: Path) -> None:
    """Remove an earlier run's files and checkpoint/ from ``folder`` (nothing else in it)."""
    folder = Path(folder)
    for name in RUN_FILES:
        for path in (folder / name, folder / (name + ".tmp")):
            path.unlink(missing_ok=True)
    for name in RUN_FOLDERS:
        shutil.rmtree(folder / name, ignore_errors=True)


def _run_entries(folder: Path) -> list[Path]:
    """What :func:`clear_run` removes, as far as it is there."""
    names = [n for name in RUN_FILES for n in (name, name + ".tmp")] + list(RUN_FOLDERS)
    return [folder / name for name in names if (folder / name).exists()]


SET_ASIDE_DONE = ".complete"  # in the aside folder once every entry is in it


def set_aside(folder: Path) -> None:
    """Move the run in ``folder`` into ``folder/.gradwire-replaced`` (renames, within the folder):
    --overwrite's old run, kept until the new run writes (:func:`drop_replaced`) or is refused
    before that (:func:`put_back`). The renames are one by one: a marker says they all happened, and
    an aside without it (a kill in between) is only ever moved back whole (:func:`_recover_replaced`)."""
    folder = Path(folder)
    aside = folder / REPLACED_NAME
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir()
    for path in _run_entries(folder):
        os.replace(path, aside / path.name)
    (aside / SET_ASIDE_DONE).touch()


def put_back(folder: Path) -> None:
    """Undo :func:`set_aside`: whatever the refused run made goes, the old run comes back."""
    folder = Path(folder)
    aside = folder / REPLACED_NAME
    if not aside.is_dir():
        return
    if (aside / SET_ASIDE_DONE).exists():  # else the new run never started: the folder holds the rest
        clear_run(folder)
    for path in aside.iterdir():
        if path.name != SET_ASIDE_DONE:
            os.replace(path, folder / path.name)
    (aside / SET_ASIDE_DONE).unlink(missing_ok=True)
    aside.rmdir()


def drop_replaced(folder: Path) -> None:
    """The new run starts writing: the run it replaces goes for good."""
    shutil.rmtree(Path(folder) / REPLACED_NAME, ignore_errors=True)


def _recover_replaced(folder: Path, *, replacing: bool) -> None:
    """What an --overwrite run killed before it wrote anything left: its set-aside old run. A
    ``replacing`` claim (``--resume-or-start``: what a restarted attempt of that --overwrite run gets)
    finishes the replacement, and the old run goes; any other claim gets the old run back. A folder
    that holds a newer run keeps it, and the old one goes; an aside left half made (killed during
    :func:`set_aside`) is always moved back whole."""
    aside = folder / REPLACED_NAME
    if not aside.is_dir():
        return
    if not (aside / SET_ASIDE_DONE).exists() or (holds_run(folder) is None and not replacing):
        put_back(folder)
    else:
        drop_replaced(folder)


def remove_unless_written(folder: Path) -> bool:
    """Remove ``folder`` (a run's, by a comparison or reproduction that replaces it) unless a gradwire
    process holds its lock (it is writing there): True where it was removed."""
    folder = Path(folder)
    with open(folder / LOCK_NAME, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(folder)  # the lock held: no gradwire process writes there meanwhile
        return True


def remove_replaced(folders: list[Path], what: str, echo=print, root: Path | None = None) -> None:
    """Remove ``folders``, the ``what`` of a result an --overwrite replaced (each checked by the caller
    just now), except those a gradwire process is writing; ``echo`` says which went and which stayed,
    each named by its path below ``root`` (default: its own name)."""
    removed, busy = [], []
    for folder in folders:
        name = str(folder.relative_to(root)) if root is not None else folder.name
        (removed if remove_unless_written(folder) else busy).append(name)
    if removed:
        echo(f"removed the replaced {what}: {', '.join(removed)}")
    if busy:
        echo(f"kept the replaced {what} that a gradwire process is writing: {', '.join(busy)}")


class FolderLock:
    """An exclusive ``flock`` on ``FOLDER/.gradwire.lock`` while a run writes the folder. The OS
    drops it when the process ends, however it ends; the file stays, except where this lock made
    it and the run wrote nothing (a run refused at or after the claim): then what the lock made (the
    file, and the folder if it made that too) goes, while the lock is still held. A process that
    opened the file just before it went finds, once it holds its lock, that the path names another
    file (or none) and opens it again, so two writers never both hold a lock on one folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._file = None
        self.created = False  # whether acquire() made the folder
        self.made_file = False  # whether acquire() made the lock file

    def acquire(self) -> FolderLock:
        self.created = not self.folder.exists()
        path = self.folder / LOCK_NAME
        for _ in range(5):  # each retry: the file was removed by its holder between our open and our lock
            self.folder.mkdir(parents=True, exist_ok=True)
            made = not path.exists()
            f = open(path, "a+")  # noqa: SIM115 - held until release()
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "?"
                f.close()
                raise ConfigError(f"run folder {self.folder} is being written by another gradwire process (pid "
                                  f"{holder}); wait for it to end or choose another --out") from None
            try:
                mine, there = os.fstat(f.fileno()), os.stat(path)
                same = (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                f.seek(0)
                f.truncate()
                f.write(f"{os.getpid()}\n")
                f.flush()
                self._file, self.made_file = f, made
                return self
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        raise ConfigError(f"run folder {self.folder}: its lock file kept being replaced by other gradwire "
                          "processes; try again")

    def discard(self) -> None:
        """Release, removing the lock file if this lock made it (the claim was refused: nothing of this
        run is in the folder), and the folder if this lock made it and nothing else is in it."""
        self.release(discard=True)

    def release(self, *, discard: bool = False, restore: bool = True) -> None:
        """Unlock. An --overwrite run that ends before it wrote anything puts the old run back when
        ``restore`` (refused, or stopped: the replacement did not happen), and drops it otherwise (it
        failed: a restarted attempt, which comes without --overwrite, starts the new run afresh)."""
        if self._file is None:
            return
        if restore:
            put_back(self.folder)
        else:
            drop_replaced(self.folder)
        alone = self.created and self.folder.is_dir() and [p.name for p in self.folder.iterdir()] == [LOCK_NAME]
        if (discard and self.made_file) or alone:  # still locked: no other writer is inside
            (self.folder / LOCK_NAME).unlink(missing_ok=True)
            if self.created:
                with contextlib.suppress(OSError):  # not empty: another process made something meanwhile
                    self.folder.rmdir()
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None


def require_named(out: str | Path) -> None:
    """An empty ``--out``, ``.`` (the current directory) or the file system's root would write beside
    whatever is there: refused (a run, a comparison or a plan needs a folder of its own)."""
    if not str(out).strip():
        raise ConfigError("--out '' names no folder (it would write into the current directory); name one, or "
                          "leave --out off for a fresh folder under runs/")
    path = Path(out).resolve()
    if path == Path(path.anchor):
        raise ConfigError(f"--out {str(out)!r} is the file system's root; name a folder of its own, e.g. runs/NAME, "
                          "or leave --out off for a fresh folder under runs/")
    if path == Path.cwd().resolve():
        raise ConfigError(f"--out {str(out)!r} is the current directory, which holds other files; name a folder of "
                          "its own, e.g. runs/NAME, or leave --out off for a fresh folder under runs/")


def holds_run_labelled(folder: Path, label: str) -> bool:
    """``folder`` is a real folder (not a link) holding a run whose summary's label is ``label``."""
    return (not folder.is_symlink() and folder.is_dir() and holds_run(folder, files_only=True) is not None
            and read_json_or_empty(folder / "summary.json").get("label") == label)


def holds_others(folder: Path, *, own: tuple[str, ...] = (), runs: bool = True) -> str | None:
    """The first subfolder of ``folder`` (other than ``own`` and a run's own folders) that holds a run,
    a comparison or a plan, or None: ``folder`` is then a folder of results (``runs/``), not one
    result's own. ``runs=False``: runs do not count (an interrupted comparison's variants of other
    seeds or settings, which --overwrite or --resume claims)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for sub in sorted(folder.iterdir()):
        if not sub.is_dir() or sub.name.startswith(".") or sub.name in RUN_FOLDERS or sub.name in own:
            continue
        if (runs and holds_run(sub, files_only=True)) or any((sub / name).is_file() for name in OTHER_RESULTS):
            return sub.name
    return None


# what shows that a folder holds a comparison, a plan or a reproduction (beside a run's markers)
OTHER_RESULTS = ("comparison.md", "comparison.csv", "plan.json", "claims.json")

# each kind of result, the files at a folder's top that show it holds one, and the command that writes it
RESULT_KINDS = {"run": RUN_MARKERS[:-1], "comparison": OTHER_RESULTS[:2], "plan": OTHER_RESULTS[2:3],
                "reproduction": OTHER_RESULTS[3:]}
KIND_COMMANDS = {"run": "run", "comparison": "compare", "plan": "plan", "reproduction": "reproduce"}
# where a kind keeps its own runs, said when it refuses a folder of another kind
KIND_LAYOUT = {"comparison": ", its runs in subfolders", "reproduction": ", its claims in subfolders"}


def refuse_other_kind(folder: Path, kind: str) -> None:
    """ConfigError when ``folder`` holds a result of another kind than ``kind`` (a run, a comparison, a
    plan or a reproduction: :data:`RESULT_KINDS`), even with --overwrite, which replaces its own kind
    only: each needs a folder of its own (one's report.html would replace the other's)."""
    folder = Path(folder)
    for other, names in RESULT_KINDS.items():
        found = next((name for name in names if (folder / name).is_file()), None) if other != kind else None
        if found is not None:
            raise ConfigError(f"{KIND_COMMANDS[kind]} folder {folder} holds a {other} ({found}): a {kind} needs a "
                              f"folder of its own{KIND_LAYOUT.get(kind, '')}; choose another --out")


def refuse_others(folder: Path, *, own: tuple[str, ...] = (), runs: bool = True) -> None:
    """ConfigError when ``folder`` holds other results in subfolders (:func:`holds_others`)."""
    other = holds_others(folder, own=own, runs=runs)
    if other is not None:
        raise ConfigError(f"--out {str(folder)!r} holds other results ({other}/ is a run, comparison or plan): "
                          f"it is a folder of results, not one of its own; name a new folder, e.g. "
                          f"{Path(folder) / 'NAME'}")


def claim(folder: str | Path, *, overwrite: bool, resume: bool, replacing: bool = False) -> FolderLock:
    """Lock ``folder`` for this process and check that writing it loses nothing unasked: refused
    when it holds a run unless ``overwrite`` (the old run's files are set aside, removed when the
    new run starts writing, and put back by ``FolderLock.release`` if it was refused before) or
    ``resume``. ``replacing``: a --resume-or-start claim, which finishes an --overwrite that a kill
    cut short (:func:`_recover_replaced`)."""
    require_named(folder)  # before Path(), which reads "" as "."
    folder = Path(folder)
    lock = FolderLock(folder).acquire()  # first: a folder another run is writing is said to be that
    try:
        _recover_replaced(folder, replacing=replacing)
        refuse_existing(folder, overwrite=overwrite, resume=resume)
        if overwrite:
            set_aside(folder)  # removed once the run is built and writes (RunFolder.open), else put back
    except BaseException:
        lock.discard()  # refused: the lock file (and folder) it made go again
        raise
    told = os.environ.get(CLAIMED_ENV)
    if told:  # gradwire launch: a restarted attempt resumes only a folder that an attempt claimed (cli/supervise.py)
        Path(told).touch()
    return lock


CLAIMED_ENV = "GRADWIRE_LAUNCH_CLAIMED"  # (cli/supervise.py's, which imports nothing of gradwire)


def write_json(path: Path, data: Any) -> None:
    """Write atomically: a crash never leaves a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def read_json_or_empty(path: Path) -> dict:
    """A JSON object file's contents, or {} when it is missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_jsonl(path: Path) -> list[dict]:
    path = Path(path)
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def read_complete_jsonl(path: Path) -> tuple[list[dict], int]:
    """(every line of ``path`` that holds a whole JSON object, the number of lines that do not).
    A run killed while writing leaves its last line cut off; a report still reads the rest."""
    path = Path(path)
    if not path.exists():
        return [], 0
    rows, skipped = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the rows of steps <= ``last_step`` (a resumed run rewrites what came after its
    checkpoint). A line that is no whole JSON row is dropped: a crash while it was written cut it
    off, so it is the file's last and came after the checkpoint. The kept rows replace the file
    atomically (a crash here leaves the old file, which this reads again on the next resume)."""
    path = Path(path)
    if not path.exists():
        return
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= last_step:
            keep.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    tmp.replace(path)


class RunFolder:
    def __init__(self, out: Path, *, enabled: bool, curves: bool = True):
        self.out, self.enabled, self.curves = Path(out), enabled, curves  # curves: write curves.png at finish
        self.backend = "sim"  # from the config (open): names the plots' time axis
        self.records: list[dict] = []  # metrics.jsonl, as written (a resumed run's earlier rows first)
        self._metrics = self._steps = None
        self.scalars = None  # --tensorboard: report/tensorboard.py's writer of the same rows

    def open(self, config: dict, setup_info: dict, resumed_step: int | None, *,
             evaluates_at_resumed_step: bool = True) -> None:
        """Write the config and start the logs; ``resumed_step``: the checkpoint's step, whose later
        rows are dropped and rewritten. ``evaluates_at_resumed_step`` False: the metrics row at that
        step goes too (the last step of a finished run that is continued: the longer run does not
        evaluate there)."""
        self.backend = config.get("backend", "sim")
        if not self.enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        if resumed_step is None:
            drop_replaced(self.out)  # built and writing: the run --overwrite replaces goes now
        write_json(self.out / "config.json", config)
        if setup_info:
            write_json(self.out / "algorithm.json", setup_info)
        if resumed_step is not None:
            _truncate_jsonl(self.out / "steps.jsonl", resumed_step)
            _truncate_jsonl(self.out / "metrics.jsonl", resumed_step - (0 if evaluates_at_resumed_step else 1))
            self.records = read_jsonl(self.out / "metrics.jsonl")
        if config.get("tensorboard"):
            from gradwire.report.tensorboard import ScalarWriter

            self.scalars = ScalarWriter(self.out, purge_step=None if resumed_step is None else resumed_step + 1)
        mode = "w" if resumed_step is None else "a"
        self._metrics = open(self.out / "metrics.jsonl", mode)  # noqa: SIM115 - closed in close()
        self._steps = open(self.out / "steps.jsonl", mode)  # noqa: SIM115

    def step(self, row: dict) -> None:
        if self._steps is not None:
            self._steps.write(json.dumps(row) + "\n")
            self._steps.flush()  # a crash loses no step already taken
        if self.scalars is not None:
            self.scalars.scalars("steps", row)

    def metrics(self, row: dict) -> None:
        if self._metrics is not None:
            self.records.append(row)
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        if self.scalars is not None:
            self.scalars.scalars("metrics", row)

    def close(self) -> None:
        for f in (self._metrics, self._steps):
            if f is not None:
                f.close()
        self._metrics = self._steps = None
        if self.scalars is not None:
            self.scalars.close()
            self.scalars = None

    def finish(self, summary: dict, label: str) -> None:
        """Write summary.json and, unless left out, curves.png (closing the logs first); left out, the
        curves.png of the run before it was continued (--resume --no-curves) goes: it ends earlier.
        So does a report.html that `gradwire report` wrote of the run before it went on (a run writes
        none itself), saying so: `gradwire report OUT` writes it again."""
        self.close()
        if not self.enabled:
            return
        write_json(self.out / "summary.json", summary)
        report = self.out / "report.html"
        if report.exists():
            report.unlink()
            print(f"gradwire: removed {report}, the report of the run before it went on; `gradwire report "
                  f"{self.out}` writes it again", file=sys.stderr)
        if self.records and self.curves:
            self.draw_curves(label)
        elif not self.curves:
            (self.out / "curves.png").unlink(missing_ok=True)

    def draw_curves(self, label: str) -> None:
        """curves.png: about a second of matplotlib in a fresh process (0.6 s once it is imported)."""
        from gradwire.report.plots import plot_runs

        plot_runs({label: self.records}, self.out / "curves.png", backends=[self.backend])
