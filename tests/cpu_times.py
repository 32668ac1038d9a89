"""CPU seconds per test, this process's and its finished children's (every process a test started
and waited for, torchrun's ranks included), for finding what makes the suite slow on 2 shared cores
where wall times measure the neighbours:

    .venv/bin/python -m pytest -p tests.cpu_times --cpu-times cpu.jsonl -n 3 --dist load
    .venv/bin/python -m tests.cpu_times cpu.jsonl          # the 25 costliest tests and files

Each line of the file is {"test", "cpu_s", "self_s", "children_s", "wall_s"}; xdist's workers append
to the same file (one short write each). A process forked from ``tests.forked``'s server is that
server's child, not the test's: its CPU is not in the test's line (the server's shows in nobody's).
The whole suite's CPU, forked processes included, is the machine's: ``/proc/stat`` before and after
on an otherwise idle machine."""

from __future__ import annotations

import json
import resource
import sys
import time
from collections import defaultdict

import pytest


def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="FILE", help="append each test's CPU seconds to FILE (JSON lines)")


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-times")
    if not path:
        yield
        return
    (me0, kids0), wall0 = _cpu(), time.perf_counter()
    yield
    (me1, kids1), wall1 = _cpu(), time.perf_counter()
    row = {"test": item.nodeid, "cpu_s": round(me1 - me0 + kids1 - kids0, 3), "self_s": round(me1 - me0, 3),
           "children_s": round(kids1 - kids0, 3), "wall_s": round(wall1 - wall0, 3)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def summarize(path: str, top: int = 25) -> str:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    files: dict[str, float] = defaultdict(float)
    for r in rows:
        files[r["test"].split("::")[0]] += r["cpu_s"]
    total = sum(r["cpu_s"] for r in rows)
    lines = [f"{len(rows)} tests, {total / 60:.1f} CPU-min in all", "", "costliest tests (CPU s, of which children):"]
    lines += [f"{r['cpu_s']:8.1f} {r['children_s']:8.1f}  {r['test']}"
              for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]]
    lines += ["", "costliest files (CPU s):"]
    lines += [f"{s:8.1f}  {f}" for f, s in sorted(files.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(sys.argv[1]))
