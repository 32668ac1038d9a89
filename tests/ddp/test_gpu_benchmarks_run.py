"""The GPU figures' commands still run end to end, in their small CPU modes (the figures themselves
need a GPU: docs/gpu.md)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_codecs_small_prints_a_row_per_codec(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_codecs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    gpu_codecs.main(["--device", "cpu", "--small", "--size", "1000", "--kernels", "torch"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    codecs = [row.split(" | ")[0][2:] for row in rows]
    assert codecs == [*gpu_codecs.SPECS[:10], "torch.topk(\\|x\\|, k)", *gpu_codecs.SPECS[10:]]
    sign = next(row for row in rows if row.startswith("| sign | torch"))
    assert sign.split(" | ")[6] == "1.000"  # bits per element


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_ddp_hook_benchmark_small_runs_on_gloo():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_hook.py"), "--small", "--only", "none",
                           "--only", "torch allreduce_hook"], capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["configuration", "plain DDP", "torch allreduce_hook", "none"]


def test_gpu_figures_script_names_commands_that_exist(capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_figures
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert gpu_figures.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(gpu_figures.COMMANDS) >= 4
    for _, _, command in gpu_figures.COMMANDS:
        paths = [c for c in command[1:] if c.startswith(("tests/", "benchmarks/"))]
        assert paths and all((ROOT / c).exists() for c in paths), command
    # each group fits one call of the device tool (600 s), with room for the machine's start
    for group in gpu_figures.GROUPS:
        assert sum(limit for g, limit, _ in gpu_figures.COMMANDS if g == group) <= 540, group


@pytest.mark.multiprocess  # it starts processes: the fast tier leaves it out
def test_gpu_figures_streams_into_out_and_ends_a_command_at_its_limit(tmp_path, monkeypatch, capsys):
    """What the device tool brings back is $OUT: the file is there, line by line as the commands
    print, a command past its limit is ended with its children and recorded as such, and the
    children find gradwire on PYTHONPATH."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_figures
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    slow = ("import subprocess, sys, time; print('started', flush=True); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    shows = "import os; print('path', os.environ['PYTHONPATH'].split(os.pathsep)[0])"
    monkeypatch.setattr(gpu_figures, "COMMANDS", [("tests", 30, [sys.executable, "-c", shows]),
                                                  ("tests", 2, [sys.executable, "-c", slow])])
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_figures.main(["--only", "tests"]) == 1
    text = (tmp_path / "gpu-figures.md").read_text()
    assert f"path {ROOT / 'src'}" in text and "exit code 0" in text
    assert "started" in text and "(ended after its limit of 2 s)" in text and "exit code 124" in text


def test_ddp_hook_benchmark_blocks_give_every_configuration_every_place():
    """The --ratio blocks rotate: over ``count`` blocks each configuration takes each place once,
    and (three or more) none runs two blocks back to back, across rounds too."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ddp_hook
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for count in (2, 3, 4):
        orders = [ddp_hook.block_order(count, b) for b in range(3 * count)]
        for place in range(count):
            assert sorted(order[place] for order in orders[:count]) == list(range(count))
        if count >= 3:
            runs = [i for order in orders for i in order]
            assert all(a != b for a, b in zip(runs, runs[1:], strict=False))
