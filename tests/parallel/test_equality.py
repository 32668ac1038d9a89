"""Tensor-parallel layers and the language model against the dense single-process module (float64,
assert_close, in the spawned processes: tests/parallel/harness.py), and every byte they send
against gradwire.parallel.cost. Two spawns: four gloo processes run 1-D P=4 and P=2 (two groups),
2-D [2,2] and 2.5-D [2,2,1]; eight run 2.5-D [2,2,2], layer and language-model training."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gradwire.parallel import cost
from gradwire.parallel.mesh import parse_layout
from tests.parallel.harness import HID, IN, OUT, TINY, TOKENS
from tests.parallel.spawn import run_scenario

F64 = 8


def total(results: list[dict], key: str) -> Counter:
    """The byte counters of check ``key`` summed over every process."""
    out: Counter = Counter()
    for r in results:
        out.update(r[key])
    return out


@pytest.fixture(scope="module")
def four_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("four")


@pytest.fixture(scope="module")
def four(four_dir):
    return run_scenario("four", 4, four_dir)


@pytest.fixture(scope="module")
def eight_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("eight")


@pytest.fixture(scope="module")
def eight(eight_dir):
    return run_scenario("eight", 8, eight_dir)


@pytest.mark.parametrize("layout, groups", [("1d:p=4", 1), ("1d:p=2", 2)])
def test_1d_pair_bytes(four, layout, groups):
    """Equal outputs and gradients were checked in the processes; the bytes: one all-reduce of the
    row layer's output forward and one of the column layer's input gradient backward, per group,
    and the row layer's bias assembled from its pieces (held split over the group)."""
    p = parse_layout(layout).p
    row = cost.row_parallel(p, TOKENS, OUT, F64) + cost.held_1d(p, OUT * F64)
    assert total(four, f"{layout} pair") == {"row": groups * row,
                                             "column": groups * cost.column_parallel(p, TOKENS, IN, F64)}
    assert cost.row_parallel(4, TOKENS, OUT, F64) == 2 * 3 * 8 * 4 * 8  # by hand: 2(P-1)·T·out·e
    assert cost.held_1d(4, OUT * F64) == 3 * 4 * 8  # by hand: every piece to the P-1 others, (P-1)·out·e


@pytest.mark.parametrize("layout", ["2d:q=2", "2.5d:q=2,d=1"])
def test_2d_linear_bytes(four, layout):
    q = 2
    tokens = 2 * q * 3  # 2 sequences of 3 tokens per block
    assert total(four, f"{layout} linear") == {"summa": cost.summa_linear(q, 1, tokens, IN, HID, F64)}
    # by hand, 3(q-1)(A + W) + bias 2(q-1)·out: A = 12·8, W = 8·12
    assert cost.summa_linear(q, 1, tokens, IN, HID, F64) == (3 * (96 + 96) + 2 * 12) * 8


def test_2p5d_depth_2_linear_bytes(eight):
    """Depth 2: the weight gradient's all-reduce across depth is there (2(d-1)·W) and counted."""
    tokens = 2 * 4 * 3
    assert total(eight, "2.5d:q=2,d=2 linear") == {"summa": cost.summa_linear(2, 2, tokens, IN, HID, F64)}
    # by hand: 3(q-1)(A + dW) + 2(d-1)W + bias 2(qd-1)·out, A = 24·8, W = 8·12
    assert cost.summa_linear(2, 2, tokens, IN, HID, F64) == (3 * (192 + 2 * 96) + 2 * 96 + 2 * 3 * 12) * 8


@pytest.mark.parametrize("layout, groups", [("1d:p=4", 1), ("1d:p=2", 2), ("2d:q=2", 1), ("2.5d:q=2,d=1", 1)])
def test_lm_bytes_per_layer(four, layout, groups):
    """The whole LM's step (forward and backward) per layer, equal to cost.lm_step_bytes."""
    want = cost.lm_step_bytes(parse_layout(layout), batch=4, context=TINY["context"], dim=TINY["dim"],
                              layers=TINY["layers"], vocab=TINY["vocab"], e=F64)
    assert total(four, f"{layout} lm") == {k: groups * v for k, v in want.items()}


def test_2p5d_lm_training_bytes(eight):
    """Four steps (one checked, three trained) of the 2.5-D [2,2,2] LM, equal to dense training
    in the processes; bytes: four steps' worth."""
    want = cost.lm_step_bytes(parse_layout("2.5d:q=2,d=2"), batch=4, context=TINY["context"], dim=TINY["dim"],
                              layers=TINY["layers"], vocab=TINY["vocab"], e=F64)
    assert total(eight, "2.5d:q=2,d=2 lm training") == {k: 4 * v for k, v in want.items()}


def test_hybrid_dp_x_tp_equals_data_parallel_run(four, four_dir, tmp_path):
    """dp 2 x tp 1d:p=2 with a compressor (run by the four processes, gradwire run --backend torch
    --tensor-parallel 1d:p=2) trains as the simulator's 2 workers on the dense model: the same
    evaluations; bytes per step: the layers' exactly (cost), plus the compressed shards'."""
    from gradwire.run.loop import run
    from tests.helpers import read_jsonl
    from tests.parallel.harness import hybrid_config

    folder = four_dir / "hybrid"
    sim = tmp_path / "sim"
    run(hybrid_config(str(sim)), progress=False)
    got, want = read_jsonl(folder / "metrics.jsonl"), read_jsonl(sim / "metrics.jsonl")
    assert [m["step"] for m in got] == [m["step"] for m in want] == [0, 3]
    assert want[1]["train_loss"] < want[0]["train_loss"] - 0.1  # it trains, so equality means something
    for g, w in zip(got, want):
        for key in ("train_loss", "test_loss", "test_acc", "train_acc"):
            torch.testing.assert_close(g[key], w[key], rtol=1e-9, atol=1e-12)
    steps = read_jsonl(folder / "steps.jsonl")
    tp = cost.lm_step_bytes(parse_layout("1d:p=2"), batch=4, context=6, dim=8, layers=1, vocab=256, e=F64)
    for s in steps:
        assert s["tp_layer_bytes"] == {k: 2 * v for k, v in tp.items()}  # two tensor-parallel groups
        assert s["tp_bytes"] == sum(s["tp_layer_bytes"].values())
        assert s["dp_bytes"] > 0
    assert steps[-1]["bytes_sent"] == sum(s["dp_bytes"] + s["tp_bytes"] for s in steps)


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario, world", [("four", 4), ("eight", 8)])
def test_compressed_runs_keep_every_shared_tensor_one_value(scenario, world, request):
    """After three steps with QSGD or top-k across the workers (compressors that look at the whole
    shard), the tensor-parallel model computes what the dense model gathered from its shards
    computes, in every worker: the ranks that use a tensor whole (1-D: embeddings, norms, read-out,
    row-parallel biases; SUMMA: biases, norms, embeddings over column and depth, weight blocks over
    depth) agree on it. Before each was held once, each rank compressed its own copy with its own
    shard and the copies drifted apart (1-D: 5.75e-3 in embed.weight after 3 QSGD steps)."""
    import json

    from tests.parallel.harness import COMPRESSED_RUNS

    request.getfixturevalue(scenario)  # the processes ran (and the module fixture keeps their folder)
    folder = request.getfixturevalue(f"{scenario}_dir")
    ranks = [json.loads((folder / f"short-runs-rank{r}.json").read_text()) for r in range(world)]
    for layout, workers, compressor in COMPRESSED_RUNS[scenario]:
        key = f"{layout} {workers} {compressor}"
        P = parse_layout(layout).size
        assert all(r[key]["moved"] for r in ranks), key  # it trained, so agreement means something
        for first in range(0, world, P):  # each worker's first tensor-parallel rank
            got = ranks[first][key]
            torch.testing.assert_close(got["tp_loss"], got["dense_loss"], rtol=1e-12, atol=0, msg=key)
            if parse_layout(layout).kind == "1d":  # every rank computed the whole loss on its own
                assert len(set(got["tp_losses"])) == 1, (key, got["tp_losses"])
            # each rank's compressor draws its own random numbers (one stream per tensor-parallel rank:
            # a worker's shards were rounded with the same draws, correlated)
            draws = [ranks[first + t][key]["compress_draw"] for t in range(P)]
            assert len(set(draws)) == P, (key, draws)


def test_uncompressed_data_parallel_bytes_are_exact(four, four_dir):
    """dp 2 x tp 1d:p=2, uncompressed: each step all-reduces every process's shard over its
    data-parallel group, and the P shards of a worker hold every element of the dense model once,
    so the whole run sends 2·(workers-1)·N·e per step (N the dense model's parameters), counted once
    (by each data-parallel group's first member), whatever P."""
    import json

    from gradwire.tasks.language import transformer_sizes
    from gradwire.tasks.models import transformer_lm
    from gradwire.transports import ledger
    from tests.parallel.harness import HYBRID_TASK, UNCOMPRESSED_RUN

    sizes = transformer_sizes(HYBRID_TASK)
    dense = transformer_lm(torch.Generator().manual_seed(0), dtype=torch.float64, **sizes)
    n = sum(p.numel() for p in dense.parameters())
    # by hand: embed 256·8 + position 6·8 + two norms 4·8 + qkv 24·8+24 + out 8·8+8 + MLP 32·8+32 and 8·32+8
    # + final norm 2·8 + head 256·8+256
    assert n == 2048 + 48 + 32 + 216 + 72 + 288 + 264 + 16 + 2304 == 5288
    key = " ".join(map(str, UNCOMPRESSED_RUN))
    for r in range(4):
        got = json.loads((four_dir / f"short-runs-rank{r}.json").read_text())[key]["dp_bytes"]
        assert got == [ledger.allreduce(n * F64, 2)] * 3 == [84608] * 3, (r, got)


def test_a_full_batch_records_every_layer_bytes(four, four_dir):
    """dp 2 x tp 1d:p=2 with --batch-size full: every step's per-layer bytes are the layers' own,
    each tensor-parallel group working on its worker's whole shard (the labels come from the
    model's layers, not from a cost table drawn for a batch the run does not fix)."""
    import json

    from tests.parallel.harness import FULL_BATCH_RUN

    got = json.loads((four_dir / "short-runs-rank0.json").read_text())[" ".join(map(str, FULL_BATCH_RUN))]
    assert sorted(got["shard_sizes"]) == [285, 286]  # LM's 571 sequences, split iid
    want: Counter = Counter()
    for sequences in got["shard_sizes"]:  # one tensor-parallel group per worker
        want.update(cost.lm_step_bytes(parse_layout("1d:p=2"), batch=sequences, context=6, dim=8, layers=1,
                                       vocab=256, e=F64))
    assert "blocks.0.attention.qkv" in want and "blocks.0.mlp.0" in want
    assert got["tp_layer_bytes"] == [dict(want)] * 3


def test_one_worker_2p5d_run_equals_dense_training(eight, eight_dir, tmp_path):
    """gradwire run --tensor-parallel 2.5d:q=2,d=2 --workers 1 on the eight processes trains as the
    simulator's one worker on the dense model: every step's loss and every evaluation (a
    data-parallel group of one must not fall back to the whole world's collectives)."""
    from gradwire.run.loop import run
    from tests.helpers import read_jsonl
    from tests.parallel.harness import one_worker_config

    folder = eight_dir / "hybrid"
    sim = tmp_path / "sim"
    run(one_worker_config(str(sim)), progress=False)
    steps, sim_steps = read_jsonl(folder / "steps.jsonl"), read_jsonl(sim / "steps.jsonl")
    assert len(steps) == 4
    torch.testing.assert_close([s["loss"] for s in steps], [s["loss"] for s in sim_steps], rtol=1e-9, atol=0)
    got, want = read_jsonl(folder / "metrics.jsonl"), read_jsonl(sim / "metrics.jsonl")
    assert [m["step"] for m in got] == [m["step"] for m in want] == [0, 2, 4]
    for g, w in zip(got, want):
        for key in ("train_loss", "test_loss", "test_acc"):
            torch.testing.assert_close(g[key], w[key], rtol=1e-9, atol=1e-12)
    tp = cost.lm_step_bytes(parse_layout("2.5d:q=2,d=2"), batch=4, context=6, dim=8, layers=1, vocab=256, e=F64)
    assert all(s["tp_layer_bytes"] == tp and s["dp_bytes"] == 0 for s in steps)
