"""The per-test CPU-time plugin (tests/cpu_times.py): its rows, and the summary's ranking."""

import json

import pytest

from tests.cpu_times import summarize

pytest_plugins = ["pytester"]


@pytest.mark.multiprocess  # the inner test starts a process
def test_each_test_gets_a_row_with_its_children_cpu(pytester, tmp_path):
    pytester.makepyfile(test_spin="""
        import subprocess, sys
        def test_child():
            subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
        def test_nothing():
            pass
    """)
    out = tmp_path / "cpu.jsonl"
    pytester.runpytest_inprocess("-p", "tests.cpu_times", "--cpu-times", str(out)).assert_outcomes(passed=2)
    rows = {r["test"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"test_child", "test_nothing"}
    assert rows["test_child"]["children_s"] > 0.01 and rows["test_nothing"]["children_s"] == 0
    assert all(r["cpu_s"] == pytest.approx(r["self_s"] + r["children_s"], abs=2e-3) for r in rows.values())


def test_summary_ranks_tests_and_files_by_cpu(tmp_path):
    path = tmp_path / "cpu.jsonl"
    rows = [("a.py::x", 1.0), ("b.py::y", 5.0), ("a.py::z", 4.5)]
    path.write_text("".join(json.dumps({"test": t, "cpu_s": c, "self_s": c, "children_s": 0.0, "wall_s": c}) + "\n"
                            for t, c in rows))
    text = summarize(str(path))
    assert "3 tests, 0.2 CPU-min in all" in text
    tests = text.split("costliest files")[0]
    assert tests.index("b.py::y") < tests.index("a.py::z") < tests.index("a.py::x")
    assert text.split("costliest files")[1].split()[2:4] == ["5.5", "a.py"]
