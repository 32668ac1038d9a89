"""``--algorithm sync --compressor powersgd:rank=R`` on the simulator: bytes by the transport's rule,
bitwise resume, the algorithms that refuse it, and ``gradwire list``."""

from __future__ import annotations

import json

import pytest
import torch

from gradwire.cli import main
from gradwire.errors import ConfigError
from gradwire.run.loop import run
from tests.helpers import read_jsonl, states_equal

# digits-mlp: weights 64x64 and 10x64 (both compressed at rank 2), biases of 64 and 10
MLP = dict(task="digits-mlp", workers=3, steps=12, eval_every=4, lr=0.05, momentum=0.9)
SHAPES = [(64, 64), (64,), (10, 64), (10,)]


def wire_bytes(rank: int) -> int:
    """What each worker contributes per step: (n + m) r floats per compressed matrix (P in the first
    allreduce, Q in the second), numel floats per other tensor (in the first), 4 bytes each."""
    compressed = (64 + 64) * rank + (10 + 64) * min(rank, 10)
    return 4 * (compressed + 64 + 10)


@pytest.mark.parametrize("network, rule", [
    ("ring:mbps=100,latency_ms=1", lambda nbytes, n: 2 * (n - 1) * nbytes),  # ring allreduce, every rank
    ("ps:mbps=100,latency_ms=1", lambda nbytes, n: 2 * n * nbytes),          # up to the server and back
])
@pytest.mark.parametrize("rank", [1, 2])
def test_bytes_per_step_follow_the_formula(make_config, tmp_path, network, rule, rank):
    summary = run(make_config(MLP, out=f"b{rank}", network=network, compressor=f"powersgd:rank={rank}"),
                  progress=False)
    plain = run(make_config(MLP, out=f"p{rank}", network=network), progress=False)
    assert summary["bytes_sent"] == MLP["steps"] * rule(wire_bytes(rank), MLP["workers"])
    dense = 4 * sum(torch.Size(s).numel() for s in SHAPES)
    assert plain["bytes_sent"] == MLP["steps"] * rule(dense, MLP["workers"])
    assert summary["bytes_sent"] < plain["bytes_sent"] / 5  # 4810 floats against 478 at rank 2
    info = json.loads((tmp_path / f"b{rank}" / "algorithm.json").read_text())["powersgd"]
    assert info == {"compressed": {"0": rank, "2": rank}, "uncompressed": ["1", "3"],
                    "floats_per_worker_step": wire_bytes(rank) // 4, "bytes_per_worker_step": wire_bytes(rank),
                    "floats_uncompressed": 4810}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_sixteen_bit_factors_halve_the_bytes_and_still_train(make_config, dtype):
    spec = f"powersgd:rank=2,dtype={dtype}"
    half = run(make_config(MLP, out=dtype, network="ring", compressor=spec), progress=False)
    full = run(make_config(MLP, out="fp32", network="ring", compressor="powersgd:rank=2"), progress=False)
    assert half["bytes_sent"] * 2 == full["bytes_sent"] == MLP["steps"] * 2 * (MLP["workers"] - 1) * wire_bytes(2)
    assert half["final"]["train_loss"] == pytest.approx(full["final"]["train_loss"], rel=0.02)


def test_bytes_per_worker_do_not_grow_with_workers(make_config):
    per_worker = []
    for workers in (2, 4, 8):
        s = run(make_config(MLP, out=f"w{workers}", workers=workers, network="ring", compressor="powersgd:rank=2"),
                progress=False)
        per_worker.append(s["bytes_sent"] / MLP["steps"] / (2 * (workers - 1)))
    assert per_worker == [wire_bytes(2)] * 3


@pytest.mark.parametrize("algorithm, compressor", [
    ("sync", "powersgd:rank=2"),
    ("sync", "powersgd:rank=2,alternate=true,start_step=1"),       # ACP-SGD: P and Q steps on either side
    (f"sync:overlap=true,bucket_mb={700 * 4 / 2**20}", "powersgd:rank=2"),  # bucket by bucket (3 buckets)
])
def test_resume_is_bitwise_exact(make_config, tmp_path, algorithm, compressor):
    kw = dict(MLP, steps=30, eval_every=5, checkpoint_every=10, compressor=compressor, algorithm=algorithm,
              stragglers="lognormal:sigma=0.5")
    run(make_config(kw, out="whole"), progress=False)
    run(make_config(kw, out="split", steps=25), progress=False)  # "crashes" after step 25
    summary = run(make_config(kw, out="split", resume=True), progress=False)
    assert summary["resumed"]

    def final(folder):
        step = (folder / "checkpoint" / "latest").read_text().strip()
        return torch.load(folder / "checkpoint" / step / "sim.pt", weights_only=True)["state"]

    whole, split = final(tmp_path / "whole"), final(tmp_path / "split")
    memory = whole["algorithm"]["codec"]["powersgd"]
    assert sorted(memory["q"]) == ["0", "2"] and sorted(memory["errors"]) == ["0", "1", "2"]
    assert sorted(memory["p"]) == (["0", "2"] if "alternate" in compressor else [])
    assert memory["step"] == 30
    assert states_equal(whole, split)
    rows = [read_jsonl(tmp_path / f / "metrics.jsonl") for f in ("whole", "split")]
    for r in rows[0] + rows[1]:
        r.pop("wall_time_s"), r.pop("eval_time_s")
    assert rows[0] == rows[1]


def test_error_feedback_flag_is_redundant_unless_it_contradicts(make_config):
    a = run(make_config(MLP, out="a", compressor="powersgd:rank=1"), progress=False)
    b = run(make_config(MLP, out="b", compressor="powersgd:rank=1", error_feedback=True), progress=False)
    assert a["final"]["train_loss"] == b["final"]["train_loss"] and a["bytes_sent"] == b["bytes_sent"]
    with pytest.raises(ConfigError, match="--error-feedback contradicts powersgd"):
        run(make_config(MLP, out="c", compressor="powersgd:error_feedback=false", error_feedback=True),
            progress=False)


@pytest.mark.parametrize("algorithm", ["sync:backups=1", "diana", "async"])
def test_algorithms_that_cannot_run_it_refuse_in_one_line(make_config, algorithm):
    with pytest.raises(ConfigError, match="averages gradients by allreduce itself: it runs with sync") as info:
        run(make_config(MLP, out="r", algorithm=algorithm, compressor="powersgd:rank=2"), progress=False)
    assert "\n" not in str(info.value)


def test_unknown_compressor_lists_both_kinds(make_config):
    with pytest.raises(ConfigError, match=r"valid compressors are compressors: .*qsgd.*; averagers: powersgd"):
        make_config(MLP, compressor="powersgdd").validate()


def test_gradwire_list_shows_it(capsys):
    assert main(["list", "averagers"]) == 0
    text = capsys.readouterr().out
    assert "powersgd" in text and "rank (int, default 1)" in text and "Vogels 2019" in text
