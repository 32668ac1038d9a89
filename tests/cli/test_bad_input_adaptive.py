"""Bad input to the adaptive compression algorithms (DAGC, DQ-SGD) reaches the user as one line and
exit code 2."""

import pytest

from tests.helpers import gw


@pytest.mark.parametrize("args, needle", [
    (["--algorithm", "dagc:budget=1.5"], "budget must be in (0, 1]"),
    (["--algorithm", "dagc:budget=0"], "budget must be in (0, 1]"),
    (["--algorithm", "dagc", "--compressor", "topk:ratio=0.1"], "dagc chooses its own compressors"),
    (["--algorithm", "dqsgd:bits_budget=4", "--error-feedback"], "dqsgd takes no --error-feedback"),
    (["--algorithm", "dqsgd:error_bound=0.1,levels=3"], "needs exactly one of error_bound"),
    (["--algorithm", "dagc:budget=0.1", "--workers", "12", "--partition", "dirichlet:alpha=0.01,skew=20"],
     "would get no data"),
])
def test_one_line_exit_2(tmp_path, data_dir, args, needle):
    p = gw("run", "--task", "digits-mlp", "--steps", "1", *args, "--out", str(tmp_path / "o"),
           "--data-dir", str(data_dir))
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
