"""Per-worker timelines: when each worker computed, waited and communicated.

One :class:`Timeline` per process records intervals ``(worker, step, kind, flags, start, end,
bytes, value)`` on the run's clock (simulated seconds on the simulator, elapsed ones on a real
backend) and appends them, once per step, as fixed-size binary records to
``RUN/timeline/<label>.bin`` (``sim``, or ``rankR`` on a real backend, where every process writes
its own), beside ``<label>.json`` (the clock, and its origin in Unix seconds, which aligns the
processes' files). A crash loses at most the step under way; at a checkpoint the recorder notes how many records
the file held (``mark_checkpoint``), and a run resumed from it keeps those and records the rest
again. The
records are numpy's
``RECORD`` dtype, 38 bytes each; :func:`read_timeline` merges a folder's files.

``step``: the run's step for the collective algorithms; in server mode, the worker's own
computation count (which the server's messages carry), so the server's verdict on a message
(``SERVE`` with ``DROPPED``: a backup's late gradient, a gradient staler than ``max_staleness``)
marks the computation that produced it. ``QUEUED`` and ``SERVE`` records name the worker whose
message they concern; a plot draws them on the server's row.

Kinds: ``COMPUTE`` (a gradient or a local step; on a real backend the straggler delay included),
``COMM`` (blocking communication: a collective, a message's transfer), ``WAIT`` (neither: waiting
for the slowest, for the server's answer, for an average still in flight), ``OVERLAP`` (a
collective in flight while the worker computes: DaSGD, Streaming DiLoCo; and ``sync:overlap=true``,
whose communication thread records its collectives as ``COMM``, the parts inside the computation
becoming ``OVERLAP`` when read, :func:`mark_overlapped`), ``QUEUED`` (a message
that reached the server and waits to be handled; real backends: the simulated server handles at
once), ``SERVE`` (the server handles a message; ``value`` is its staleness where the algorithm
says). On the simulator time passes only through compute and communication, so ``WAIT`` is
derived exactly as each worker's gaps between them. On a real backend a blocking collective also
contains the time spent waiting for slower peers (it is one call), and a server-mode worker's
wait for its answer is recorded as ``WAIT``, the transfer included.

``bytes``: on the simulator, the worker's share of each collective's bytes (the total split by
payload size, remainders to the first participant, so the shares sum to the run's ``bytes_sent``
exactly) and, in server mode, each message's bytes on the record of its arrival (the server's
``SERVE`` for uploads, the worker's ``COMM`` for replies); on a real backend the server-mode
messages' bytes only (collectives record 0).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np

from gradwire.report.run_folder import read_json_or_empty, write_json

COMPUTE, COMM, WAIT, OVERLAP, QUEUED, SERVE = range(6)
KIND_NAMES = ("compute", "comm", "wait", "overlap", "queued", "serve")
DROPPED = 1  # flag: the computation's result was dropped (a late backup, a too-stale gradient)
RECORD = np.dtype([("worker", "<i4"), ("step", "<i4"), ("kind", "u1"), ("flags", "u1"),
                   ("start", "<f8"), ("end", "<f8"), ("bytes", "<i8"), ("value", "<f4")])
FOLDER = "timeline"


class Timeline:
    """The recorder one process passes down (``Context.timeline``, ``Transport.timeline``).

    ``folder`` None records nothing (``NULL_TIMELINE``, the default of both). ``simulated``: the
    clock is the simulator's (compute and transfer times come from the models, waits are derived);
    else real time, read from ``clock`` where the code measures it. The file is opened at the
    first ``flush`` (on a real backend the other processes then know rank 0 has claimed the
    folder)."""

    def __init__(self, folder: Path | None, label: str = "sim", *, clock=None, simulated: bool = True):
        self.enabled = folder is not None
        self.folder, self.label, self.clock, self.simulated = folder, label, clock, simulated
        self.keep = 0         # a resumed run: the records its checkpoint had; later ones are recorded again
        self.written = 0      # records in the file
        self.step = 0                 # the run's step, set by the loop (or the worker's count)
        self.pending: list[tuple] = []
        self.last_end: dict[int, float] = {}  # each worker's end of its latest compute or communication
        self._paused = 0
        self._file = None

    def now(self) -> float:
        return self.clock.now

    def add(self, worker: int, kind: int, start: float, end: float, *, step: int | None = None, flags: int = 0,
            nbytes: int = 0, value: float = float("nan")) -> None:
        if not self.enabled or self._paused:
            return
        step = self.step if step is None else step
        if self.simulated and kind in (COMPUTE, COMM):
            last = self.last_end.get(worker)
            if last is not None and start > last:  # simulated time passes only by these: the gap is waiting
                self.pending.append((worker, step, WAIT, 0, last, start, 0, float("nan")))
            self.last_end[worker] = end if last is None else max(last, end)
        self.pending.append((worker, step, kind, flags, start, end, nbytes, value))

    def add_many(self, workers, kind: int, start: float, end: float, nbytes: list[int] | None = None) -> None:
        """The same interval for several workers (a collective's participants)."""
        for i, w in enumerate(workers):
            self.add(w, kind, start, end, nbytes=0 if nbytes is None else nbytes[i])

    @contextlib.contextmanager
    def paused(self):
        """Nothing recorded inside (evaluation's uncharged communication, whose clock is rewound)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def flush(self) -> None:
        """Append what was recorded since the last flush to the file (opened on first use)."""
        if not self.enabled or not self.pending:
            return
        if self._file is None:
            self._open()
        self._file.write(np.array(self.pending, dtype=RECORD).tobytes())
        self._file.flush()
        self.written += len(self.pending)
        self.pending.clear()

    def mark_checkpoint(self, step: int) -> None:
        """A checkpoint of ``step`` is being taken: flush, and note in ``<label>.checkpoints.json``
        how many records the file holds and where each worker's last interval ended (so a wait that
        spans the checkpoint is still derived). Kept beside the records rather than in the
        checkpoint, whose state stays the algorithm's own (wall-clock figures differ run to run)."""
        if not self.enabled:
            return
        self.flush()
        if self._file is None:
            self._open()
        path = self.folder / f"{self.label}.checkpoints.json"
        marks = json.loads(path.read_text()) if path.exists() else {}
        marks[str(step)] = {"records": self.written, "last_end": {str(w): t for w, t in self.last_end.items()}}
        write_json(path, marks)

    def resume_from(self, step: int) -> None:
        """A run resumed from the checkpoint of ``step``: keep the records it had (the file is cut
        there when first written); none when that checkpoint left no mark (start afresh)."""
        path = self.folder / f"{self.label}.checkpoints.json" if self.enabled else None
        mark = json.loads(path.read_text()).get(str(step)) if path is not None and path.exists() else None
        if mark is not None:
            self.keep = int(mark["records"])
            self.last_end = {int(w): float(t) for w, t in mark["last_end"].items()}

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.label}.bin"
        kept = _records(path)[: self.keep] if self.keep and path.exists() else np.empty(0, dtype=RECORD)
        path.write_bytes(kept.tobytes())  # resumed: what the checkpoint had; else a fresh file
        self.written = len(kept)
        origin = time.time() - (self.clock.now if self.clock is not None else 0.0)
        header = {"format": 1, "clock": "simulated" if self.simulated else "wall", "origin_unix_s": origin,
                  "kinds": list(KIND_NAMES), "record": [[n, str(RECORD.fields[n][0])] for n in RECORD.names]}
        write_json(self.folder / f"{self.label}.json", header)  # atomic: a kill never leaves half a header
        self._file = open(path, "ab")  # noqa: SIM115 - closed in close()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


NULL_TIMELINE = Timeline(None)


def sim_shares(total: int, sizes: list[int]) -> list[int]:
    """``total`` bytes split among participants in proportion to ``sizes`` (equal when all are 0),
    in whole bytes, the remainder to the first: the shares sum to ``total`` exactly."""
    weight = sum(sizes)
    shares = [total * s // weight for s in sizes] if weight else [total // len(sizes)] * len(sizes)
    shares[0] += total - sum(shares)
    return shares


def _records(path: Path) -> np.ndarray:
    data = Path(path).read_bytes()
    usable = len(data) - len(data) % RECORD.itemsize  # a record cut short by a crash is left out
    return np.frombuffer(data[:usable], dtype=RECORD).copy()


def read_timeline(run_dir: Path, *, overlapped: bool = True) -> tuple[np.ndarray, str] | None:
    """Every process's records of ``run_dir`` on one time axis (real backends: aligned by each
    file's origin, the earliest at 0), sorted by start, with ``DROPPED`` carried from the server's
    verdicts to the computations they judged; and the clock ("simulated" or "wall"). On a real
    clock, each collective's wait for the last rank is split off (:func:`split_collective_waits`)
    and, with ``overlapped``, what a worker's collectives spent while it was computing is recorded
    as ``OVERLAP`` (:func:`mark_overlapped`; not where several processes record one worker, as the
    shards of a tensor-parallel worker do); ``overlapped=False`` keeps the collectives whole.
    None for a run folder without a timeline (written before timelines existed)."""
    folder = Path(run_dir) / FOLDER
    files = sorted(folder.glob("*.bin")) if folder.is_dir() else []
    if not files:
        return None
    parts, origins, clock = [], [], "simulated"
    for path in files:
        header = read_json_or_empty(path.with_suffix(".json"))  # ({} if a kill as it began left it empty)
        clock = header.get("clock", clock)
        parts.append(_records(path))
        origins.append(float(header.get("origin_unix_s", 0.0)))
    if clock == "wall" and len(parts) > 1:
        first = min(origins)
        for recs, origin in zip(parts, origins):
            recs["start"] += origin - first
            recs["end"] += origin - first
    # a worker recorded by several processes (tensor parallelism: P shards of one worker) computes
    # in each of them at once: one shard's computing says nothing about another's waiting
    recs = np.concatenate(parts)
    shared = sum(len(np.unique(r["worker"])) for r in parts) > len(np.unique(recs["worker"]))
    if clock == "wall" and len(parts) > 1:
        recs = split_collective_waits(recs)
    if clock == "wall" and overlapped and not shared:
        recs = mark_overlapped(recs)
    verdicts = recs[(recs["kind"] == SERVE) & (recs["flags"] & DROPPED > 0)]
    if len(verdicts):
        judged = {(int(w), int(s)) for w, s in zip(verdicts["worker"], verdicts["step"])}
        hit = np.array([(int(w), int(s)) in judged for w, s in zip(recs["worker"], recs["step"])])
        recs["flags"][hit & (recs["kind"] == COMPUTE)] |= DROPPED
    return recs[np.argsort(recs["start"], kind="stable")], clock


def split_collective_waits(recs: np.ndarray) -> np.ndarray:
    """On a real backend a blocking collective returns on every rank only once the last one has
    entered it, so each rank's measured interval is waiting for the slowest plus communicating.
    Within a step where every worker recorded the same number of collectives (issued in the same
    order on every rank, as gloo and NCCL require), the k-th ones belong together: each worker's
    is split at the latest start among them into WAIT (before) and COMM (after). Steps where the
    counts differ (collectives over subsets of the workers) are left as they were recorded, and so
    is a server-mode run (it has SERVE records), whose COMM records are point-to-point messages."""
    idx = np.flatnonzero(recs["kind"] == COMM)
    workers = np.unique(recs["worker"])
    if len(idx) == 0 or len(workers) < 2 or (recs["kind"] == SERVE).any():
        return recs
    # the collectives grouped by (step, worker), each group in the order its worker issued them
    idx = idx[np.lexsort((recs["start"][idx], recs["worker"][idx], recs["step"][idx]))]
    steps, who = recs["step"][idx].astype(np.int64), recs["worker"][idx]
    first = np.flatnonzero(np.r_[True, (steps[1:] != steps[:-1]) | (who[1:] != who[:-1])])
    counts = np.diff(np.r_[first, len(idx)])
    k = np.arange(len(idx)) - np.repeat(first, counts)  # the k-th collective of its worker in its step
    # a step qualifies when every worker recorded collectives there, all the same number of them
    step_of, at = np.unique(steps[first], return_inverse=True)
    low = np.full(len(step_of), np.iinfo(np.int64).max)
    high = np.zeros(len(step_of), dtype=np.int64)
    np.minimum.at(low, at, counts)
    np.maximum.at(high, at, counts)
    ok = (np.bincount(at, minlength=len(step_of)) == len(workers)) & (low == high)
    keep = ok[np.searchsorted(step_of, steps)]
    idx, steps, k = idx[keep], steps[keep], k[keep]
    if not len(idx):
        return recs
    # the k-th collectives of a step belong together: the last to enter sets where waiting ends
    pair, where = np.unique(steps * (int(k.max()) + 1) + k, return_inverse=True)
    last_in = np.full(len(pair), -np.inf)
    np.maximum.at(last_in, where, recs["start"][idx])
    last_in = last_in[where]
    # the last to arrive, or a clock offset beyond the interval: kept whole
    split = (last_in > recs["start"][idx]) & (last_in < recs["end"][idx])
    idx, last_in = idx[split], last_in[split]
    if not len(idx):
        return recs
    waits = recs[idx].copy()
    waits["kind"], waits["end"], waits["bytes"] = WAIT, last_in, 0
    recs["start"][idx] = last_in
    return np.concatenate([recs, waits])


def mark_overlapped(recs: np.ndarray) -> np.ndarray:
    """A real backend's ``COMM`` and ``WAIT`` records that lie, in part or whole, inside the same
    worker's ``COMPUTE`` are cut at the computation's edges, and the pieces inside become
    ``OVERLAP``: a collective that a communication thread runs while the worker computes
    (``sync:overlap=true``) is in flight, not time the worker spent communicating or waiting, so
    each worker's compute, comm and wait seconds add up to at most its elapsed time. A record's
    bytes stay with its first piece. The simulator needs none of this: there a worker's time passes
    by one interval at a time."""
    blocking = np.isin(recs["kind"], (COMM, WAIT))
    pieces, cut = [], np.zeros(len(recs), dtype=bool)
    for worker in np.unique(recs["worker"][blocking]):
        starts, ends = _union(recs[(recs["worker"] == worker) & (recs["kind"] == COMPUTE)])
        mine = np.flatnonzero(blocking & (recs["worker"] == worker))
        # the first computation that ends after the record starts: does it start before it ends?
        first = np.searchsorted(ends, recs["start"][mine], side="right")
        hit = first < len(starts)
        hit[hit] = starts[first[hit]] < recs["end"][mine[hit]]
        for i, j in zip(mine[hit], first[hit]):
            rec, at = recs[i], float(recs["start"][i])
            end, parts = float(rec["end"]), []
            while j < len(starts) and starts[j] < end:
                if starts[j] > at:
                    parts.append((int(rec["kind"]), at, float(starts[j])))
                inside_end = min(end, float(ends[j]))
                if inside_end > max(at, starts[j]):
                    parts.append((OVERLAP, max(at, float(starts[j])), inside_end))
                at, j = max(at, inside_end), j + 1
            if end > at:
                parts.append((int(rec["kind"]), at, end))
            parts = parts or [(OVERLAP, at, end)]  # an instant inside a computation
            pieces += [(rec["worker"], rec["step"], kind, rec["flags"], start, stop, rec["bytes"] if k == 0 else 0,
                        rec["value"]) for k, (kind, start, stop) in enumerate(parts)]
            cut[i] = True
    if not cut.any():
        return recs
    return np.concatenate([recs[~cut], np.array(pieces, dtype=RECORD)])


def _union(busy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The starts and ends of the union of ``busy``'s intervals of positive length: disjoint and
    sorted, so each record of ``mark_overlapped`` visits only the computations it meets."""
    busy = busy[busy["end"] > busy["start"]]
    busy = busy[np.argsort(busy["start"], kind="stable")]
    if not len(busy):
        return np.empty(0), np.empty(0)
    reach = np.maximum.accumulate(busy["end"])
    opens = np.flatnonzero(np.r_[True, busy["start"][1:] > reach[:-1]])
    return busy["start"][opens], np.maximum.reduceat(busy["end"], opens)


def per_worker(recs: np.ndarray) -> dict[int, dict[str, float]]:
    """Each worker's totals: seconds per kind, bytes, dropped computations, mean staleness."""
    out: dict[int, dict[str, float]] = {}
    workers = sorted({int(w) for w in recs["worker"]})
    serve = recs[recs["kind"] == SERVE]
    for w in workers:
        mine = recs[recs["worker"] == w]
        row = {f"{name}_s": float((mine["end"] - mine["start"])[mine["kind"] == k].sum())
               for k, name in enumerate(KIND_NAMES) if k not in (QUEUED, SERVE)}
        judged = serve[serve["worker"] == w]
        row["bytes"] = int(mine["bytes"].sum())
        row["dropped"] = int(((mine["kind"] == COMPUTE) & (mine["flags"] & DROPPED > 0)).sum())
        stale = judged["value"][~np.isnan(judged["value"])]
        row["staleness_mean"] = float(stale.mean()) if len(stale) else float("nan")
        out[w] = row
    return out
