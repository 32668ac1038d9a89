"""``make test``'s way of spreading tests over processes finishes a run in which a process dies.

The suite ran with ``--dist loadgroup`` until CI waited out its 90 minutes at 98 % of the tests: a
C++ thread's abort had killed one pytest-xdist worker (tests/ddp/conftest.py has that cause), and
pytest-xdist 3.8.0's group scheduler never ends a run once a worker has died (it sends the dead
worker's finished tests again as empty lists, gives a replacement worker a single test, which a
worker never runs before it knows the next one, and runs the test that killed the worker again;
pytest-xdist issues 1323, 1327, 1378). Its groups did nothing here either: under pytest 9 the group
name it appends to a test's id is lost, so no ``xdist_group`` ever kept tests together. ``--dist load``
has none of the three faults. This test runs a small suite of its own, whose tests end their process
with ``os._exit``, with the flags the Makefile gives ``make test``: the run ends, each dead test is
reported failed once, and every other test passes exactly once. (With ``--dist loadgroup`` both
cases hang: checked by hand.) And a test stuck where pytest-timeout's signal cannot reach it is
ended, with its worker, by faulthandler (pyproject.toml), so that the run goes on."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]

SUITE = {
    "test_early.py": "import os\ndef test_e1(): pass\ndef test_e2(): os._exit(3)\ndef test_e3(): pass\n",
    "test_plain.py": "\n".join(f"def test_p{i}():\n    pass\n" for i in range(8)),
    # the last test: the dead worker holds more finished tests than the survivors have left to run
    "test_zz_last.py": "import os\ndef test_z():\n    os._exit(4)\n",
}
DIED = {"test_e2", "test_z"}
PASSED = {"test_e1", "test_e3", *(f"test_p{i}" for i in range(8))}


def make_test_dist() -> str:
    """The ``--dist`` mode of the Makefile's ``test`` recipe."""
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    return re.search(r"--dist[ =](\w+)", recipe).group(1)


def outcomes(stdout: str) -> dict[str, list[str]]:
    """Each test's outcomes, by function name, from the verbose lines of a run with workers."""
    found: dict[str, list[str]] = {}
    for outcome, name in re.findall(r"\[gw\d+\] \[ *\d+%\] (PASSED|FAILED) \S+\.py::(\w+)", stdout):
        found.setdefault(name, []).append(outcome)
    return found


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers", [1, 2])  # 1: the replacement worker is the only one left
def test_a_run_whose_workers_die_ends_and_runs_every_other_test_once(tmp_path, workers):
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", "-n", str(workers), "--dist", make_test_dist(), "-v",
               "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
               str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    found = outcomes(done.stdout)
    assert done.returncode == 1, done.stdout[-3000:]
    expected = {**{name: ["PASSED"] for name in PASSED}, **{name: ["FAILED"] for name in DIED}}
    assert found == expected, done.stdout[-3000:]
    assert f"{len(DIED)} failed, {len(PASSED)} passed" in done.stdout


HANGS = '''
import signal, time
def test_before(): pass
def test_hangs_where_no_signal_reaches_it():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as a C call that never returns to Python
    time.sleep(60)
def test_after(): pass
'''


def settings() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_every_test_is_ended_by_its_own_timeout_before_the_process_is_killed():
    """faulthandler (pyproject.toml) ends a worker whose test outlives every timeout: longer than
    pytest-timeout's default and than any test's own ``@pytest.mark.timeout``, or it would cut them."""
    ini = settings()
    assert ini["faulthandler_exit_on_timeout"] is True
    marks = {f"{path.relative_to(ROOT)}: {m}" : m for path in (ROOT / "tests").rglob("*.py")
             for m in re.findall(r"mark\.timeout\(([^)]*)\)", path.read_text())}
    # a number, so that this test can read it (an expression such as 5 * WAIT_S once hid 1,500 s)
    assert all(m.isdigit() for m in marks.values()), [where for where, m in marks.items() if not m.isdigit()]
    longest = max(int(m) for m in marks.values())
    assert ini["faulthandler_timeout"] > max(ini["timeout"], longest), (ini, longest)


@pytest.mark.timeout(150)
def test_a_test_that_no_signal_can_stop_ends_its_worker_and_the_run_goes_on(tmp_path):
    """pytest-timeout's signal never reaches a test stuck in C code: faulthandler's watchdog thread
    then ends the worker (here after 3 s, in the suite after the timeout pyproject.toml sets), and
    the run goes on without it."""
    (tmp_path / "test_hang.py").write_text(HANGS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfaulthandler_timeout = 3\nfaulthandler_exit_on_timeout = true\n"
                                         "timeout = 1\n")
    command = [sys.executable, "-m", "pytest", "-n", "1", "--dist", make_test_dist(), "-v", "-p", "no:cacheprovider",
               "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=50,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert outcomes(done.stdout) == {"test_before": ["PASSED"], "test_hangs_where_no_signal_reaches_it": ["FAILED"],
                                     "test_after": ["PASSED"]}, done.stdout[-3000:]
    assert "Timeout (0:00:03)!" in done.stderr + done.stdout  # faulthandler's dump, with every thread's stack
