"""The two test tiers, one flag apart: ``make test`` runs everything, ``make check`` runs
``-m "not multiprocess"`` (the tests that stay in this process).

A test is marked ``multiprocess`` when its function, one of its fixtures, or a function of the test
package that they call reaches a spawn helper (the names in SPAWNERS) or the subprocess and
multiprocessing modules: the rule follows the code, so a new test that calls ``gw(...)`` is in the
slow tier without anyone remembering a marker. The rule reads names, not behaviour, so the fast tier
also guards at run time: a process started there fails the test with a line saying to mark it.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing.process
import os
import subprocess
import types

import pytest

# The helpers of tests/ that start processes, by module and name; and the modules whose use means a
# process is started (``subprocess.run``, ``mp.get_context``).
SPAWNERS = {
    "tests.helpers": {"gw"},
    "tests.backends.processes": {"launch", "ranks", "sim_and_torch", "spawn"},
    "tests.forked": {"Forked", "start_replica"},
    "tests.parallel.spawn": {"run_scenario"},
    "tests.ddp.ddp_harness": {"launch"},
}
SPAWNING_MODULES = {"subprocess", "multiprocessing", "torch.multiprocessing"}
MARK = "multiprocess"


def _names(code: types.CodeType):
    """Every global or attribute name a code object (and the functions nested in it) refers to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def spawns(fn, seen: set | None = None) -> bool:
    """Whether ``fn`` refers to a spawn helper, directly or through functions of the test package."""
    seen = set() if seen is None else seen
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    scope = getattr(fn, "__globals__", {})
    names = set(_names(code))
    referred = [scope.get(name) for name in names]
    if names & SPAWNING_MODULES:  # imported inside the function: ``import subprocess``
        return True
    for name in names:  # ``from tests.x import helper`` inside the function: the helper, from its module
        if name.startswith("tests."):
            module = importlib.import_module(name)
            referred += [getattr(module, other, None) for other in names]
    for obj in referred:
        if isinstance(obj, types.ModuleType):
            if obj.__name__ in SPAWNING_MODULES:
                return True
            continue
        module = getattr(obj, "__module__", None) or ""
        if getattr(obj, "__name__", None) in SPAWNERS.get(module, ()):
            return True
        if module.startswith("tests.") and isinstance(obj, types.FunctionType) and spawns(obj, seen):
            return True
    return False


def _fixture_functions(item):
    for defs in getattr(item, "_fixtureinfo", None).name2fixturedefs.values():
        for fixturedef in defs:
            yield fixturedef.func


def mark_multiprocess(items) -> None:
    """Add the ``multiprocess`` marker to every collected test that reaches a spawn helper."""
    for item in items:
        if item.get_closest_marker(MARK) is not None or not isinstance(item, pytest.Function):
            continue
        if spawns(item.function) or any(spawns(f) for f in _fixture_functions(item)):
            item.add_marker(MARK)


def longest_first(items) -> None:
    """Under xdist (whose workers collect, and hand tests out in the order collected), put the long
    tests first (marked ``slow``, then ``multiprocess``), each group in its collected order, so that the
    30-70 s ones start while every worker is busy instead of one of them finishing the run alone while
    the others wait. A plain ``pytest`` keeps the modules' order (and their module-scoped fixtures)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item) -> int:
        return 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker(MARK) else 2
    items.sort(key=rank)  # stable: the collected order within each group


def fast_tier(config) -> bool:
    """Whether this session leaves the multiprocess tests out (``-m "not multiprocess"``)."""
    return "not multiprocess" in (config.option.markexpr or "")


def forbid_processes(monkeypatch, nodeid: str) -> None:
    """Make starting a process fail the test: it belongs in the multiprocess tier."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"{nodeid} starts a process but is not marked multiprocess: mark it "
                             f"(pytestmark = pytest.mark.multiprocess) or name its helper in tests/tiers.py SPAWNERS")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
