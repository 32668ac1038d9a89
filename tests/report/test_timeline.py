"""The recorded timelines against the simulator's clock, exactly: every computation lasts what the
straggler model drew, every transfer what the network model priced, waits fill the gaps, a step
ends when its last winner's gradient arrives, and the backup workers' dropped gradients are marked."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from gradwire.report.timeline import (
    COMM,
    COMPUTE,
    DROPPED,
    FOLDER,
    OVERLAP,
    RECORD,
    SERVE,
    WAIT,
    Timeline,
    _records,
    mark_overlapped,
    per_worker,
    read_timeline,
    sim_shares,
    split_collective_waits,
)
from gradwire.run.loop import Run, run
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import NETWORKS
from gradwire.transports.stragglers import STRAGGLERS
from tests.helpers import read_jsonl

TAIL = "tail:p=0.3,slowdown=6,compute_s=0.05"


def worker_rows(recs: np.ndarray, w: int) -> np.ndarray:
    return recs[(recs["worker"] == w) & np.isin(recs["kind"], (COMPUTE, COMM, WAIT))]


def assert_tiles(recs: np.ndarray, workers: int) -> None:
    """Each worker's compute, communication and waiting follow each other with no gap and no overlap."""
    for w in range(workers):
        mine = worker_rows(recs, w)
        assert len(mine) > 0
        np.testing.assert_array_equal(mine["start"][1:], mine["end"][:-1])
        assert (mine["end"] >= mine["start"]).all()


def variant(comparison: Path, name: str) -> tuple[Path, dict, dict]:
    """A run of the comparison fixture (tests/report/conftest.py): folder, config, summary."""
    folder = comparison / name
    return folder, json.loads((folder / "config.json").read_text()), json.loads((folder / "summary.json").read_text())


def test_sync_with_backups_under_tail_matches_the_simulator_exactly(comparison):
    out, cfg, summary = variant(comparison, "sync_backups=1")
    assert cfg["algorithm"] == "sync:backups=1" and cfg["stragglers"].startswith("tail:")
    recs, clock = read_timeline(out)
    assert clock == "simulated"
    stragglers = STRAGGLERS.build(cfg["stragglers"], seed=cfg["seed"])
    network = NETWORKS.build(cfg["network"])
    compute, comm, serve = (recs[recs["kind"] == k] for k in (COMPUTE, COMM, SERVE))
    for c in compute:  # every computation lasts exactly the straggler model's draw for (worker, count)
        assert c["end"] == c["start"] + stragglers.time(int(c["worker"]), int(c["step"]))
    for w in range(cfg["workers"]):  # compute k, its upload, the server's reply, compute k + 1, ...
        mine = comm[comm["worker"] == w]
        ups, downs = mine[0::2], mine[1::2]
        starts = compute[compute["worker"] == w]
        np.testing.assert_array_equal(ups["start"], starts["end"][: len(ups)])
        np.testing.assert_array_equal(starts["start"][1:], downs["end"][: len(starts) - 1])
    # each direction of the star's server link carries one message at a time, in the order they are
    # ready, and is never idle while one waits: a message goes out at max(ready, the previous one gone)
    up_bytes = int(serve["bytes"][0])  # a gradient message: 64-byte header + the float32 gradient
    is_up = np.zeros(len(comm), dtype=bool)  # each worker's COMM records alternate: upload, reply
    for w in range(cfg["workers"]):
        is_up[np.flatnonzero(comm["worker"] == w)[0::2]] = True
    ups, downs = comm[is_up], comm[~is_up]
    for messages, size in ((ups, np.full(len(ups), up_bytes)), (downs, downs["bytes"])):
        gone = messages["end"] - network.latency_s  # the last byte left the link
        went = gone - size / network.bytes_per_s    # the first byte went onto it
        order = np.argsort(went, kind="stable")
        assert np.all(np.diff(messages["start"][order]) >= 0)  # first ready, first sent
        previous = np.concatenate([[0.0], gone[order][:-1]])
        np.testing.assert_allclose(went[order], np.maximum(messages["start"][order], previous), rtol=0, atol=1e-12)
    assert np.any(ups["end"] - ups["start"] > network.send(up_bytes).time_s + 1e-9)  # some did queue
    assert_tiles(recs, cfg["workers"])
    steps = read_jsonl(out / "steps.jsonl")
    winners = {(w, c) for s in steps for w, c in zip(s["winners"], s["winner_counts"])}
    handled = {(int(w), int(s)) for w, s in zip(serve["worker"], serve["step"])}
    dropped = {(int(w), int(s)) for w, s, f in zip(compute["worker"], compute["step"], compute["flags"])
               if f & DROPPED}
    assert dropped == handled - winners and len(dropped) == sum(len(s["late"]) for s in steps) > 0
    for s in steps:  # a step ends at the arrival of its N-th gradient: the last winner's upload
        ends = [float(comm[(comm["worker"] == w) & (comm["step"] == c)]["end"][0])
                for w, c in zip(s["winners"], s["winner_counts"])]
        assert s["sim_time_s"] == max(ends)
    assert int(recs["bytes"].sum()) == summary["bytes_sent"]  # every message counted once, where it arrived
    totals = per_worker(recs)
    assert sum(t["dropped"] for t in totals.values()) == len(dropped)


def test_plain_sync_waits_for_the_slowest_then_averages(make_config):
    cfg = make_config(algorithm="sync", stragglers=TAIL, steps=8, eval_every=8)
    summary = run(cfg, progress=False)
    recs, _ = read_timeline(cfg.out)
    stragglers = STRAGGLERS.build(TAIL, seed=cfg.seed)
    ends = [0.0] + [s["sim_time_s"] for s in read_jsonl(Path(cfg.out) / "steps.jsonl")]
    for k in range(1, cfg.steps + 1):
        at = recs[recs["step"] == k]
        times = [stragglers.time(w, k) for w in range(cfg.workers)]
        for w in range(cfg.workers):
            (c,) = at[(at["worker"] == w) & (at["kind"] == COMPUTE)]
            (m,) = at[(at["worker"] == w) & (at["kind"] == COMM)]
            assert (c["start"], c["end"]) == (ends[k - 1], ends[k - 1] + times[w])
            assert m["start"] == ends[k - 1] + max(times) and m["end"] == ends[k]
            waits = at[(at["worker"] == w) & (at["kind"] == WAIT)]
            assert len(waits) == int(times[w] < max(times))
    assert_tiles(recs, cfg.workers)
    assert int(recs["bytes"].sum()) == summary["bytes_sent"]


def test_dasgd_records_the_average_in_flight_behind_computation(comparison):
    out, cfg, summary = variant(comparison, "dasgd_period=2_delay=1")
    recs, _ = read_timeline(out)
    flying = recs[recs["kind"] == OVERLAP]
    assert len(flying) == cfg["workers"] * cfg["steps"] // 2 and not (recs["kind"] == COMM).any()
    network = NETWORKS.build(cfg["network"])
    nbytes = 4 * cfg["num_parameters"]  # float32 parameters
    for f in flying:  # the allreduce starts when its last contribution is ready; nothing blocks on it
        assert f["end"] == f["start"] + network.allreduce(nbytes, cfg["workers"]).time_s
    starts = sorted({float(t) for t in flying["start"]})
    ready = [max(recs[(recs["kind"] == COMPUTE) & (recs["step"] == k)]["end"]) for k in (2, 4, 6, 8)]
    assert starts == ready
    assert int(flying["bytes"].sum()) == summary["bytes_sent"]


@pytest.mark.parametrize("algorithm", ["streaming-diloco:inner_steps=4,fragments=2", "lsgd:async=true",
                                       "easgd:async=true", "diana"])
def test_every_algorithm_family_tiles_time_and_attributes_every_byte(make_config, algorithm):
    """Streaming DiLoCo (fragments in flight), asynchronous LSGD and EASGD (server mode, leaders'
    uploads), DIANA (compressed collectives): each worker's intervals follow each other without a
    gap, and the bytes on the timeline are the run's bytes exactly."""
    cfg = make_config(algorithm=algorithm, stragglers=TAIL, steps=8)
    r = Run(cfg)  # the loop's steps without its evaluations and plots
    timeline = r.record_timeline(Path(cfg.out), resumed=False)
    for _ in range(cfg.steps):
        r.train_step()
        timeline.flush()
    timeline.close()
    recs, _ = read_timeline(cfg.out)
    assert_tiles(recs, cfg.workers)
    assert int(recs["bytes"].sum()) == r.transport.bytes_sent
    assert (recs["kind"] == OVERLAP).any() == algorithm.startswith("streaming-diloco")


def test_recorder_flushes_each_step_and_survives_a_cut_record(tmp_path):
    timeline = Timeline(tmp_path / "timeline", "sim", clock=SimClock())
    timeline.add(0, COMPUTE, 0.0, 1.0)
    timeline.add(0, COMM, 1.5, 2.0, nbytes=7)  # a gap: waiting
    timeline.flush()
    recs, _ = read_timeline(tmp_path)
    assert [(int(r["kind"]), r["start"], r["end"]) for r in recs] == [(COMPUTE, 0, 1), (WAIT, 1, 1.5), (COMM, 1.5, 2)]
    with open(tmp_path / "timeline" / "sim.bin", "ab") as f:  # a crash in the middle of a record
        f.write(b"\x01" * (RECORD.itemsize // 2))
    assert len(read_timeline(tmp_path)[0]) == 3
    timeline.close()


def test_a_resumed_run_records_the_same_timeline(make_config):
    """Stopped at a checkpoint and resumed, a run's timeline equals that of the run straight through
    (server mode: computations recorded ahead, and waits spanning the checkpoint)."""
    whole = make_config(algorithm="sync:backups=1", stragglers=TAIL, steps=8, eval_every=8, out="whole")
    run(whole, progress=False)
    first = make_config(algorithm="sync:backups=1", stragglers=TAIL, steps=4, eval_every=8, checkpoint_every=4,
                        out="parts")
    run(first, progress=False)
    run(first.replace(steps=8, resume=True), progress=False)
    a, b = read_timeline(whole.out)[0], read_timeline(first.out)[0]
    assert len(a) == len(b) and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("total", "sizes", "shares"), [(10, [1, 1, 1], [4, 3, 3]), (9, [0, 0], [5, 4]),
                                                         (100, [3, 1], [75, 25])])
def test_byte_shares_sum_to_the_total(total, sizes, shares):
    assert sim_shares(total, sizes) == shares


def test_real_backend_timelines_threads(make_config):
    """The torch code path (threads backend): one file per process, wall time, the server's
    verdicts carried to the workers' computations."""
    cfg = make_config(algorithm="sync:backups=1", workers=3, steps=6, eval_every=6, backend="threads", timeout_s=30)
    run(cfg, progress=False)
    recs, clock = read_timeline(cfg.out)
    assert clock == "wall"
    names = sorted(p.name for p in (Path(cfg.out) / "timeline").glob("*.bin"))
    assert names == ["rank0.bin", "rank1.bin", "rank2.bin", "rank3.bin"]
    compute, serve = recs[recs["kind"] == COMPUTE], recs[recs["kind"] == SERVE]
    for w in range(cfg.workers):  # counts 1, 2, ... each computation measured, each answer waited for
        counts = compute[compute["worker"] == w]["step"]
        assert len(counts) >= 1, w  # a worker that recorded nothing fails here, not in an empty comparison
        np.testing.assert_array_equal(counts, np.arange(1, len(counts) + 1))
        assert len(recs[(recs["worker"] == w) & (recs["kind"] == WAIT)]) == len(counts)
    assert (recs["end"] >= recs["start"]).all()
    judged = {(int(w), int(s)) for w, s, f in zip(serve["worker"], serve["step"], serve["flags"]) if f & DROPPED}
    marked = {(int(w), int(s)) for w, s, f in zip(compute["worker"], compute["step"], compute["flags"]) if f & DROPPED}
    assert marked == judged
    late = sum(len(s["late"]) for s in read_jsonl(Path(cfg.out) / "steps.jsonl"))
    assert len(judged) >= late  # and the gradients still on their way after the last step


def test_real_backend_collectives_split_into_waiting_and_communicating(make_config):
    """On the torch code path a blocking allreduce lasts, on each rank, from its own arrival until
    all have communicated: the reader splits it at the last arrival into WAIT, then COMM, so the
    collective's COMM starts at one instant on every worker and each split adds up to the recording."""
    cfg = make_config(algorithm="sync:overlap=false", workers=3, steps=4, eval_every=4, backend="threads",
                      timeout_s=30, stragglers="slow:count=1,slowdown=4,compute_s=0.05")  # blocking: not overlapped
    run(cfg, progress=False)
    recs, _ = read_timeline(cfg.out)
    raw = np.concatenate([_records(p) for p in sorted((Path(cfg.out) / "timeline").glob("*.bin"))])
    last, total = [], {}  # per step: the worker that waited least (arrived last); each worker's waits summed
    for step in range(1, cfg.steps + 1):
        comm = recs[(recs["kind"] == COMM) & (recs["step"] == step)]
        assert len(comm) == cfg.workers and np.ptp(comm["start"]) < 1e-9  # one allreduce, entered together
        waits = {}
        for w in range(cfg.workers):
            wait = recs[(recs["kind"] == WAIT) & (recs["step"] == step) & (recs["worker"] == w)]
            mine = comm[comm["worker"] == w]
            waits[w] = 0.0
            if len(wait):
                assert wait["end"][0] == mine["start"][0] and wait["bytes"][0] == 0
                waits[w] = float(wait["end"][0] - wait["start"][0])
            recorded = raw[(raw["kind"] == COMM) & (raw["step"] == step) & (raw["worker"] == w)]
            first = wait["start"][0] if len(wait) else mine["start"][0]
            # (read_timeline puts the files on one axis: compare durations, not raw times)
            assert mine["end"][0] - first == pytest.approx(recorded["end"][0] - recorded["start"][0], abs=1e-9)
        last.append(min(waits, key=waits.get))
        assert all(waits[w] > waits[last[-1]] for w in waits if w != last[-1]), waits
        for w in waits:
            total[w] = total.get(w, 0.0) + waits[w]
    # the slow worker (4x the 50 ms of compute) arrives last: over the run it waits far less than each
    # of the two others (summed over the steps, not step by step: under load one step's order may flip)
    slow = min(total, key=total.get)
    assert all(total[slow] < 0.5 * total[w] for w in total if w != slow), total


def _split_one_by_one(recs: np.ndarray) -> np.ndarray:
    """The rule of split_collective_waits spelled out collective by collective (its first version):
    in a step where every worker recorded the same number of collectives, the k-th ones (by start)
    belong together and each is split at the latest start among them."""
    recs, extra = recs.copy(), []
    workers = np.unique(recs["worker"])
    for step in np.unique(recs["step"][recs["kind"] == COMM]):
        rows = {w: np.flatnonzero((recs["kind"] == COMM) & (recs["step"] == step) & (recs["worker"] == w))
                for w in workers}
        if len({len(r) for r in rows.values()}) != 1:
            continue
        rows = {w: r[np.argsort(recs["start"][r], kind="stable")] for w, r in rows.items()}
        for k in range(len(rows[workers[0]])):
            same = [rows[w][k] for w in workers]
            last_in = recs["start"][same].max()
            for i in same:
                if recs["start"][i] < last_in < recs["end"][i]:
                    wait = recs[i].copy()
                    wait["kind"], wait["end"], wait["bytes"] = WAIT, last_in, 0
                    extra.append(wait)
                    recs["start"][i] = last_in
    return np.concatenate([recs, np.array(extra, dtype=RECORD)])


def _canonical(recs: np.ndarray) -> np.ndarray:
    return np.sort(recs, order=["step", "worker", "kind", "start", "end"])


def test_collective_split_equals_the_rule_one_collective_at_a_time():
    """Vectorised over the whole file: the same records as the plain loop, on 4 workers, 60 steps of
    1-3 collectives each in shuffled order, some steps with a worker's collective missing or extra
    (left as recorded), compute records in between, and arrivals both inside and after an interval."""
    rng = np.random.default_rng(0)
    rows = []
    for step in range(1, 61):
        n = int(rng.integers(1, 4))
        for w in range(4):
            count = n + (1 if step % 7 == 0 and w == 2 else 0) - (1 if step % 11 == 0 and w == 1 else 0)
            rows.append((w, step, COMPUTE, 0, step - 1.0, step - 0.5, 0, 0.0))
            for j in range(count):
                start = step - 0.5 + 0.1 * j + rng.uniform(0, 0.08)
                rows.append((w, step, COMM, 0, start, start + rng.uniform(0.005, 0.09), 100 * (j + 1), 0.0))
    recs = np.array(rows, dtype=RECORD)
    recs = recs[rng.permutation(len(recs))]
    want = _split_one_by_one(recs)
    got = split_collective_waits(recs.copy())
    assert (got["kind"] == WAIT).sum() == (want["kind"] == WAIT).sum() > 100
    assert np.array_equal(_canonical(got), _canonical(want))
    assert split_collective_waits(recs[recs["worker"] == 0]).size == (recs["worker"] == 0).sum()  # one worker


def _intervals(recs: np.ndarray, worker: int) -> list[tuple[int, float, float, int]]:
    mine = recs[recs["worker"] == worker]
    mine = mine[np.lexsort((mine["kind"], mine["start"]))]
    return [(int(r["kind"]), float(r["start"]), float(r["end"]), int(r["bytes"])) for r in mine]


def test_collectives_inside_the_computation_become_overlap():
    """sync:overlap=true's communication thread records collectives while its worker computes: the
    reader cuts COMM and WAIT at the computation's edges, the parts inside become OVERLAP, bytes stay
    on the first piece, another worker's computation changes nothing, and the seconds per worker
    then add up to at most the time that passed."""
    rows = [(0, 1, COMPUTE, 0, 0.0, 1.0, 0, 0.0), (0, 1, WAIT, 0, 0.2, 0.4, 0, 0.0),   # inside: all OVERLAP
            (0, 1, COMM, 0, 0.5, 1.5, 64, 0.0),                                        # across the end
            (0, 2, COMPUTE, 0, 2.0, 3.0, 0, 0.0), (0, 2, COMM, 0, 1.8, 3.2, 8, 0.0),   # around a computation
            (0, 3, COMPUTE, 0, 4.0, 4.5, 0, 0.0), (0, 3, COMPUTE, 0, 4.7, 5.0, 0, 0.0),
            (0, 3, COMM, 0, 4.2, 4.9, 0, 0.0),                                         # across two of them
            (0, 4, COMM, 0, 6.0, 6.5, 0, 0.0),                                         # outside: kept whole
            (1, 1, COMM, 0, 0.5, 1.5, 0, 0.0),                                         # worker 1 never computes
            (2, 1, COMPUTE, 0, 10.0, 14.0, 0, 0.0), (2, 1, COMPUTE, 0, 11.0, 12.0, 0, 0.0),  # computations that
            (2, 1, COMM, 0, 13.0, 15.0, 0, 0.0), (2, 1, COMM, 0, 11.5, 11.5, 5, 0.0),        # overlap; an instant
            (2, 2, COMPUTE, 0, 16.0, 16.0, 0, 0.0), (2, 2, WAIT, 0, 15.5, 16.5, 0, 0.0)]     # an empty computation
    recs = np.array(rows, dtype=RECORD)
    got = mark_overlapped(recs.copy())
    assert _intervals(got, 0) == [
        (COMPUTE, 0.0, 1.0, 0), (OVERLAP, 0.2, 0.4, 0), (OVERLAP, 0.5, 1.0, 64), (COMM, 1.0, 1.5, 0),
        (COMM, 1.8, 2.0, 8), (COMPUTE, 2.0, 3.0, 0), (OVERLAP, 2.0, 3.0, 0), (COMM, 3.0, 3.2, 0),
        (COMPUTE, 4.0, 4.5, 0), (OVERLAP, 4.2, 4.5, 0), (COMM, 4.5, 4.7, 0), (COMPUTE, 4.7, 5.0, 0),
        (OVERLAP, 4.7, 4.9, 0), (COMM, 6.0, 6.5, 0)]
    assert _intervals(got, 1) == _intervals(recs, 1)
    assert _intervals(got, 2) == [
        (COMPUTE, 10.0, 14.0, 0), (COMPUTE, 11.0, 12.0, 0), (OVERLAP, 11.5, 11.5, 5), (OVERLAP, 13.0, 14.0, 0),
        (COMM, 14.0, 15.0, 0), (WAIT, 15.5, 16.5, 0), (COMPUTE, 16.0, 16.0, 0)]
    assert int(got["bytes"].sum()) == int(recs["bytes"].sum())
    t = per_worker(got)[0]
    assert t["overlap_s"] == pytest.approx(0.2 + 0.5 + 1.0 + 0.3 + 0.2)
    assert t["compute_s"] + t["comm_s"] + t["wait_s"] == pytest.approx(2.8 + 0.5 + 0.2 + 0.2 + 0.2 + 0.5)
    assert mark_overlapped(recs[recs["kind"] != COMPUTE]).size == (recs["kind"] != COMPUTE).sum()


def test_overlapped_sync_on_the_threads_backend_adds_up_per_worker(make_config, monkeypatch):
    """sync:overlap=true on the torch code path (threads backend): read back, each worker's compute,
    comm and wait seconds fit in its elapsed time (a collective in flight during the backward pass
    counts once, as OVERLAP), and step_breakdown's reading (overlapped=False) keeps every
    collective whole. (A small transformer in 1 KB buckets; the backward pass is held 20 ms after it
    hands on each bucket, so the collectives it starts run while it still computes on any host; the
    plain reading finds no OVERLAP at all.)"""
    from gradwire.algorithms.buckets import BucketQueue

    hand_on = BucketQueue._hand_on

    def held(self, bucket):
        hand_on(self, bucket)
        time.sleep(0.02)  # the rest of the backward pass, made long enough to overlap

    monkeypatch.setattr(BucketQueue, "_hand_on", held)
    cfg = make_config(task="stdlib-lm:context=16,dim=32,layers=1,heads=2", workers=3,
                      algorithm="sync:overlap=true,bucket_mb=0.001", compressor="powersgd:rank=2",
                      steps=6, eval_every=6, backend="threads", timeout_s=30)
    run(cfg, progress=False)
    recs, clock = read_timeline(cfg.out)
    whole, _ = read_timeline(cfg.out, overlapped=False)
    assert clock == "wall" and not (whole["kind"] == OVERLAP).any() and (recs["kind"] == OVERLAP).any()
    for w, t in per_worker(recs).items():
        mine = recs[recs["worker"] == w]
        assert t["compute_s"] + t["comm_s"] + t["wait_s"] <= mine["end"].max() - mine["start"].min() + 1e-9
        kept = whole[(whole["worker"] == w) & np.isin(whole["kind"], (COMM, WAIT))]
        assert t["comm_s"] + t["wait_s"] + t["overlap_s"] == pytest.approx(float((kept["end"] - kept["start"]).sum()))


def test_shards_of_one_worker_are_not_marked_overlapped(tmp_path):
    """Tensor parallelism: two processes record worker 0 (its shards). Shard 0's collective starts
    while shard 1 still computes; that is not a collective behind shard 0's own computation."""
    folder = tmp_path / FOLDER
    folder.mkdir()
    for process, end in ((0, 1.0), (1, 1.1)):
        rows = [(0, 1, COMPUTE, 0, 0.0, end, 0, 0.0), (0, 1, COMM, 0, end, 1.5, 0, 0.0)]
        (folder / f"rank{process}.bin").write_bytes(np.array(rows, dtype=RECORD).tobytes())
        (folder / f"rank{process}.json").write_text(json.dumps({"clock": "wall", "origin_unix_s": 100.0}))
    recs, _ = read_timeline(tmp_path)
    assert not (recs["kind"] == OVERLAP).any()
    assert per_worker(recs)[0]["comm_s"] == pytest.approx(0.5 + 0.4)  # as recorded


def test_per_worker_totals_on_hand_built_records():
    """Seconds per kind, bytes, dropped computations and the mean staleness of the server's verdicts
    (NaN verdicts, messages that carry none, left out), each worker's own."""

    rows = [(0, 1, COMPUTE, 0, 0.0, 1.0, 0, np.nan), (0, 1, COMM, 0, 1.0, 1.5, 100, np.nan),
            (0, 2, COMPUTE, DROPPED, 1.5, 3.5, 0, np.nan), (1, 1, COMPUTE, 0, 0.0, 0.5, 0, np.nan),
            (0, 1, SERVE, 0, 1.5, 1.5, 0, 2.0), (0, 2, SERVE, 0, 3.5, 3.5, 0, 4.0),
            (0, 3, SERVE, 0, 4.0, 4.0, 0, np.nan), (1, 1, SERVE, 0, 0.5, 0.5, 0, 7.0)]
    totals = per_worker(np.array(rows, dtype=RECORD))
    assert totals[0]["compute_s"] == 3.0 and totals[0]["comm_s"] == 0.5 and totals[0]["bytes"] == 100
    assert totals[0]["dropped"] == 1 and totals[0]["staleness_mean"] == 3.0
    assert totals[1]["compute_s"] == 0.5 and totals[1]["dropped"] == 0 and totals[1]["staleness_mean"] == 7.0
