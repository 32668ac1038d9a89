"""The rule that puts a test in the multiprocess tier (tests/tiers.py) sees each way a test reaches
a spawn helper, and leaves the in-process tests alone."""

import subprocess

from tests import tiers
from tests.helpers import gw, read_jsonl


def calls_gw():
    gw("--version")


def calls_a_helper_that_calls_gw():
    calls_gw()


def imports_the_launcher_inside():
    from tests.backends.processes import launch

    launch(2, [], "out", "data")


def runs_subprocess():
    subprocess.run(["true"])


def imports_subprocess_inside():
    import subprocess as sp

    sp.run(["true"])


def stays_in_process(tmp_path):
    return read_jsonl(tmp_path / "metrics.jsonl")


def test_each_way_of_reaching_a_spawn_helper_is_seen(request):
    # looked up by name, so that this test itself refers to no spawner and stays in the fast tier
    for name in ("calls_gw", "calls_a_helper_that_calls_gw", "imports_the_launcher_inside", "runs_subprocess",
                 "imports_subprocess_inside"):
        assert tiers.spawns(globals()[name]), name
    assert not tiers.spawns(stays_in_process)
    assert request.node.get_closest_marker(tiers.MARK) is None
