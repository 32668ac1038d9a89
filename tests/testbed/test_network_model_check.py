"""benchmarks/network_model_check.py end to end on two namespaces: what it reports is what the run's
ledger, the bed's interfaces and gradwire's ring model say (no timing is asserted: the figures are
the benchmark's, docs/time_to_accuracy.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.test_testbed import netns_ok  # noqa: F401  (the fixture: root and namespaces, or skip)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "network_model_check.py"
GRADIENT_BYTES = 137_216 * 4  # stdlib-lm:dim=64,layers=2,heads=2 in float32


@pytest.mark.timeout(240)
def test_reports_the_ledger_the_wire_and_the_ring_model(netns_ok, tmp_path):  # noqa: F811
    from gradwire.transports.network import RingNetwork

    out = tmp_path / "nm"
    p = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "2", "--mbps", "200", "--case-steps", "6",
                        "--timeout-s", "180", "--out", str(out)], capture_output=True, text=True, timeout=230)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (r,) = json.loads((out / "results.json").read_text())
    assert (r["nodes"], r["mbps"], r["steps"]) == (2, 200.0, 6)
    # one allreduce of the whole gradient a step: 2(n-1)·B in the ledger
    assert r["payload_bytes"] == GRADIENT_BYTES and r["ledger_bytes"] == 2 * 1 * GRADIENT_BYTES * 6
    # the interfaces carried the payload and the frames' headers on top: never less than the ledger
    assert r["wire_bytes"] > r["ledger_bytes"] and 0 < r["wire_over_ledger"] < 0.2
    assert r["model_s"] == RingNetwork(mbps=200, latency_ms=0).allreduce(GRADIENT_BYTES, 2).time_s
    assert r["measured_s"] > 0 and r["model_error"] == r["model_s"] / r["measured_s"] - 1
    assert "| 2 | 200 | allreduce | 50 ms |" in (out / "results.md").read_text()


@pytest.mark.timeout(240)
def test_reports_the_scatter_route_s_two_alltoalls(netns_ok, tmp_path):  # noqa: F811
    """--collective scatter: the 1-bit sign message's mean by its chunks' owners, one slot of each half
    of the gradient's signs (and a float32 scale) in each of two all-to-alls a step."""
    from gradwire.transports.network import RingNetwork

    out = tmp_path / "nm"
    p = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "2", "--mbps", "200", "--case-steps", "6",
                        "--collective", "scatter", "--timeout-s", "180", "--out", str(out)],
                       capture_output=True, text=True, timeout=230)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (r,) = json.loads((out / "results.json").read_text())
    slot = GRADIENT_BYTES // 4 // 2 // 8 + 4
    assert (r["collective"], r["payload_bytes"]) == ("scatter", slot)
    assert r["ledger_bytes"] == 2 * (2 * 1 * slot) * 6
    assert r["wire_bytes"] > r["ledger_bytes"]
    assert r["model_s"] == 2 * RingNetwork(mbps=200, latency_ms=0).alltoall(slot, 2).time_s
    assert r["measured_s"] > 0 and "| 2 | 200 | two all-to-alls | 50 ms |" in (out / "results.md").read_text()


def test_refuses_too_few_steps():
    p = subprocess.run([sys.executable, str(SCRIPT), "--case-steps", "2"], capture_output=True, text=True, timeout=60)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and last == ("network_model_check.py: error: --case-steps must be > 3 "
                                          "(the first 3 steps are left out), got 2")
