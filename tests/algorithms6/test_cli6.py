"""Bad input to the adaptive algorithms reaches the user as one line and exit code 2."""

import subprocess
import sys

import pytest


def gw(*args):
    p = subprocess.run([sys.executable, "-m", "gradwire", *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args, needle", [
    (["--algorithm", "dagc:budget=1.5"], "budget must be in (0, 1]"),
    (["--algorithm", "dagc:budget=0"], "budget must be in (0, 1]"),
    (["--algorithm", "dagc", "--compressor", "topk:ratio=0.1"], "dagc chooses its own compressors"),
    (["--algorithm", "dqsgd:bits_budget=4", "--error-feedback"], "dqsgd takes no --error-feedback"),
    (["--algorithm", "dqsgd"], "needs exactly one of error_bound"),
    (["--algorithm", "dagc:budget=0.1", "--workers", "12", "--partition", "dirichlet:alpha=0.01,skew=20"],
     "would get no data"),
])
def test_one_line_exit_2(tmp_path, data_dir, args, needle):
    code, _, err = gw("run", "--task", "digits-mlp", "--steps", "1", *args, "--out", str(tmp_path / "o"),
                      "--data-dir", str(data_dir))
    assert code == 2, err
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
