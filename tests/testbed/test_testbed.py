"""The namespace test bed (scripts/testbed.py): the tc limit is real, gradwire runs across the
namespaces, and nothing is left behind, after a clean run or a SIGTERM.

Needs root and permission to create network namespaces; skips, with the reason, without them.
Every namespace is named with a prefix unique to this test session, so parallel runs cannot
collide and the leftover checks look at our names only.
"""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import read_jsonl

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "testbed.py"
PREFIX = f"gwt-{os.getpid()}-{secrets.token_hex(2)}"


def namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].startswith(prefix)]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (the launchers carry the prefix as --rdzv-id)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def netns_ok():
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root (network namespaces and qdiscs)")
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("the test bed needs iproute2 (ip, tc)")
    probe = f"{PREFIX}-probe"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {p.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    yield
    # Whatever a failed test left (the tests below check that nothing is left, before this runs).
    subprocess.run([sys.executable, str(SCRIPT), "--cleanup", PREFIX], capture_output=True, timeout=60)


def run_testbed(*args: str, prefix: str, timeout: float) -> subprocess.CompletedProcess:
    """Run the script; past ``timeout``, SIGTERM it (so that it tears down) rather than SIGKILL."""
    cmd = [sys.executable, str(SCRIPT), "--prefix", prefix, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.timeout(60)
def test_check_measures_the_tc_limit(netns_ok):
    prefix = f"{PREFIX}-c"
    p = run_testbed("--check", "--nodes", "2", "--mbps", "50", "--json", prefix=prefix, timeout=30)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    mbps = report["pair"]["mbps"]
    # TCP over Ethernet carries at most 1448 of every 1514 bytes that tbf counts: about 96%.
    assert 40.0 <= mbps <= 60.0, report
    assert namespaces(prefix) == []


@pytest.mark.timeout(180)
def test_gradwire_runs_across_namespaces(netns_ok, tmp_path, data_dir):
    prefix = f"{PREFIX}-r"
    out = tmp_path / "run"
    p = run_testbed("--nodes", "2", "--mbps", "50", "--timeout-s", "120", "--", "run", "--task", "digits-logreg",
                "--steps", "5", "--eval-every", "5", "--out", str(out), "--data-dir", str(data_dir),
                "--timeout-s", "60", prefix=prefix, timeout=140)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 5] and rows[-1]["bytes_sent"] > 0
    bed = json.loads((out / "testbed" / "testbed.json").read_text())
    assert bed["exit_codes"] == [0, 0] and bed["addresses"] == ["10.77.0.10", "10.77.0.11"]
    assert json.loads((out / "config.json").read_text())["workers"] == 2
    assert namespaces(prefix) == [] and processes_mentioning(prefix) == []


@pytest.mark.timeout(240)
def test_sigterm_tears_everything_down(netns_ok, tmp_path, data_dir):
    prefix = f"{PREFIX}-s"
    cmd = [sys.executable, str(SCRIPT), "--prefix", prefix, "--nodes", "2", "--timeout-s", "100", "--", "run",
           "--task", "digits-logreg", "--steps", "100000", "--out", str(tmp_path / "run"),
           "--data-dir", str(data_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the pipes are read only at the end: the run prints little, far below a pipe's buffer
        metrics = tmp_path / "run" / "metrics.jsonl"
        # until the workers are training, however long a loaded machine takes to start them (the test is
        # about the teardown; the test's own timeout bounds the wait), or until the bed gave up
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not metrics.exists() and proc.poll() is None:
            time.sleep(0.2)
        assert metrics.exists() and len(namespaces(prefix)) == 3, f"no training within 180 s (exit {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "namespaces deleted" in err
    assert namespaces(prefix) == [] and processes_mentioning(prefix) == []


def load_script():
    return helpers.load_script(SCRIPT, "gradwire_testbed_script")


@pytest.mark.timeout(30)
def test_refuses_without_root(monkeypatch, capsys):
    script = load_script()
    monkeypatch.setattr(script.os, "geteuid", lambda: 1000)  # the same check, whoever runs the tests
    assert script.main(["--check"]) == 2
    assert "needs root" in capsys.readouterr().err
    assert script.main(["--nodes", "2", "--", "run", "--steps", "5"]) == 2


@pytest.mark.timeout(30)
def test_torchrun_mode_command_line(monkeypatch, capsys):
    """`-- torchrun SCRIPT ARGS` runs torchrun itself on every node, with the rendezvous `gradwire
    launch` gets (no root needed to check the command line and the usage errors)."""
    script = load_script()
    cfg = script.BedConfig(nodes=3, mbps=100, prefix="gw-x")
    argv = script.node_argv(cfg, 2, "torchrun", ["bench.py", "--steps", "5"])
    assert argv[1:4] == ["-m", "torch.distributed.run", "--nnodes"]
    assert argv[-3:] == ["bench.py", "--steps", "5"]
    flags = dict(zip(argv[3:-3:2], argv[4:-3:2], strict=False))
    assert flags["--rdzv-endpoint"] == "10.77.0.10:29400" and flags["--node-rank"] == "2"
    assert flags["--rdzv-backend"] == "c10d" and flags["--rdzv-id"] == "gw-x"
    run = script.node_argv(cfg, 2, "run", ["--steps", "5"])
    assert run[1:4] == ["-m", "gradwire", "launch"] and run[-3:] == ["run", "--steps", "5"]
    monkeypatch.setattr(script.os, "geteuid", lambda: 0)
    monkeypatch.setattr(script.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    assert script.main(["--nodes", "2", "--", "torchrun"]) == 2  # no script: usage error, nothing built
    assert "needs a script" in capsys.readouterr().err
