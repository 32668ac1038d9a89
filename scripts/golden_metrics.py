"""Golden check: the simulator's metrics of the demo and of every examples/*.yaml variant.

A refactoring must not change what the simulator computes. This script runs every variant of
every example config through the command line (``gradwire compare``), and writes, per variant,
its ``metrics.jsonl`` with the one machine-dependent field (``wall_time_s``) removed, plus a
digest file. Run it before and after a change and compare:

    python scripts/golden_metrics.py record runs/golden-before          # on the old commit
    python scripts/golden_metrics.py record runs/golden-after           # on the new one
    python scripts/golden_metrics.py diff runs/golden-before runs/golden-after [--rename OLD=NEW ...]

``diff`` prints each variant as IDENTICAL or CHANGED (with the first differing line) and exits 1
when any changed. ``--jobs`` runs that many configs at once (default 2, this machine's cores).

``record-algorithms FOLDER`` records, in the same layout (so ``diff`` compares it), every
registered algorithm with its defaults, and the server-mode variants of sync, EASGD and LSGD, in
process through ``gradwire.run.loop.run``: on the simulator (4 workers, 6 steps, a checkpoint every
3, then the same run resumed from step 6's checkpoint to step 9),
and each server-mode algorithm also on the threads backend with one worker (the protocol over the
real backend's code path; one worker keeps the message order, hence the metrics, deterministic).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MACHINE_FIELDS = ("wall_time_s", "eval_time_s")  # measured on the machine, not computed by the simulator


def stripped(metrics: Path, machine_fields: tuple[str, ...] = MACHINE_FIELDS) -> str:
    rows = []
    for line in metrics.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            for key in machine_fields:
                row.pop(key, None)
            rows.append(json.dumps(row, sort_keys=True))
    return "".join(r + "\n" for r in rows)


def run_config(config: Path, out: Path) -> str:
    cmd = [sys.executable, "-m", "gradwire", "compare", "--config", str(config), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return f"{config.name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return f"{config.name}: ok"


def record(folder: Path, jobs: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    configs = sorted((ROOT / "examples").glob("*.yaml"))
    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(lambda c: run_config(c, folder / "runs" / c.stem), configs):
            print(line, flush=True)
    digests = {}
    for metrics in sorted((folder / "runs").glob("*/*/metrics.jsonl")):
        text = stripped(metrics)
        name = f"{metrics.parent.parent.name}/{metrics.parent.name}"
        (folder / "metrics").mkdir(exist_ok=True)
        (folder / "metrics" / (name.replace("/", "__") + ".jsonl")).write_text(text)
        digests[name] = hashlib.sha256(text.encode()).hexdigest()
    (folder / "digests.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} variants recorded in {folder}")
    return 0


def record_algorithms(folder: Path) -> int:
    from gradwire.algorithms import ALGORITHMS
    from gradwire.config import RunConfig
    from gradwire.errors import ConfigError
    from gradwire.run.loop import run

    runs = folder / "runs" / "algorithms"
    base = dict(task="digits-logreg", workers=4, steps=6, batch_size=16, eval_every=2, checkpoint_every=3,
                data_dir=str(ROOT / "data-cache"))
    server_modes = ["sync:backups=1", "easgd:async=true", "lsgd:async=true"]  # the defaults' server-mode variants
    for spec in ALGORITHMS.names() + server_modes:
        name = spec.replace(":", "-").replace("=", "-")
        cfg = RunConfig(algorithm=spec, out=str(runs / f"sim-{name}"), curves=False, **base)
        run(cfg, progress=False)
        run(cfg.replace(steps=9, resume=True), progress=False)  # from step 6's checkpoint
        if ALGORITHMS.build(spec).needs_server or spec == "sync":
            threads = cfg.replace(backend="threads", workers=1, out=str(runs / f"threads-{name}"), timeout_s=30.0)
            try:
                run(threads, progress=False)
            except ConfigError as e:  # e.g. backups that one worker cannot have
                print(f"{spec}: threads backend left out: {e}")
        print(f"{spec}: ok", flush=True)
    digests = {}
    (folder / "metrics").mkdir(parents=True, exist_ok=True)
    for metrics in sorted(runs.glob("*/metrics.jsonl")):
        real = metrics.parent.name.startswith("threads-")  # its clock is the wall clock
        text = stripped(metrics, MACHINE_FIELDS + (("sim_time_s",) if real else ()))
        name = f"algorithms/{metrics.parent.name}"
        (folder / "metrics" / (name.replace("/", "__") + ".jsonl")).write_text(text)
        digests[name] = hashlib.sha256(text.encode()).hexdigest()
    (folder / "digests.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} runs recorded in {folder}")
    return 0


def diff(before: Path, after: Path, renames: list[str]) -> int:
    """``renames``: OLD=NEW pairs of example file stems renamed between the two recordings."""
    moved = dict(r.split("=", 1) for r in renames)
    a = {"/".join([moved.get(k.split("/")[0], k.split("/")[0]), k.split("/", 1)[1]]): v
         for k, v in json.loads((before / "digests.json").read_text()).items()}
    back = {new: old for old, new in moved.items()}
    b = json.loads((after / "digests.json").read_text())
    changed = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"MISSING   {name} (only in {'after' if name in b else 'before'})")
            changed += 1
            continue
        if a[name] == b[name]:
            print(f"IDENTICAL {name}")
            continue
        changed += 1
        file = name.replace("/", "__") + ".jsonl"
        stem, rest = name.split("/", 1)
        old_file = f"{back.get(stem, stem)}/{rest}".replace("/", "__") + ".jsonl"
        old = (before / "metrics" / old_file).read_text().splitlines()
        new = (after / "metrics" / file).read_text().splitlines()
        first = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y), min(len(old), len(new)))
        print(f"CHANGED   {name}: first difference at row {first}")
    print(f"{len(set(a) | set(b)) - changed} identical, {changed} changed")
    return 1 if changed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="run every example variant and record its metrics")
    r.add_argument("folder", type=Path)
    r.add_argument("--jobs", type=int, default=2)
    a = sub.add_parser("record-algorithms", help="run every algorithm in process and record its metrics")
    a.add_argument("folder", type=Path)
    d = sub.add_parser("diff", help="compare two recorded folders")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="an example file renamed between the recordings (its stem, without .yaml)")
    ns = p.parse_args()
    if ns.command == "record-algorithms":
        return record_algorithms(ns.folder)
    return record(ns.folder, ns.jobs) if ns.command == "record" else diff(ns.before, ns.after, ns.rename)


if __name__ == "__main__":
    sys.exit(main())
