"""Every config in examples/ is valid: each variant builds its task, partition, algorithm,
compressor, straggler and network models (a typo there would only show minutes into a compare)."""

from pathlib import Path

import pytest

from gradwire.cli import build_parser
from gradwire.cli.compare import variants_of
from gradwire.run.loop import Run

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"demo.yaml", "local_updates.yaml", "local_updates_shared.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_variant_of_an_example_builds(path, tmp_path, data_dir):
    parser = build_parser()
    ns = parser.parse_args(["compare", "--config", str(path), "--out", str(tmp_path), "--data-dir", str(data_dir)])
    _, variants = variants_of(ns)
    assert len(variants) >= 2
    for cfg in variants:
        Run(cfg)  # raises ConfigError naming whatever does not fit (with its own --steps: a round must fit in them)
