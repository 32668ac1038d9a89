"""A small comparison (sync with a backup worker under a heavy tail, async, DaSGD) written once by
``gradwire compare`` for the report tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradwire.cli import main

VARIANTS = ("sync:backups=1", "async", "dasgd:period=2,delay=1")


@pytest.fixture(scope="session")
def comparison(tmp_path_factory, data_dir) -> Path:
    root = tmp_path_factory.mktemp("report") / "cmp"
    args = ["compare", "--task", "digits-logreg", "--workers", "4", "--steps", "8", "--eval-every", "4",
            "--batch-size", "16", "--stragglers", "tail:p=0.3,slowdown=6", "--data-dir", str(data_dir),
            "--out", str(root)]
    for v in VARIANTS:
        args += ["--variant", f"--algorithm {v}"]
    assert main(args) == 0
    return root
