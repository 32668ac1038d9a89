"""Bad tensor-parallel input gets one clear line and a non-zero exit before any process group exists
(single process: torch.distributed is never initialised here)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from gradwire.cli import main
from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.parallel.layout import Layout, check_layout, parse_layout
from gradwire.parallel.tp2p5d import sequence_block
from gradwire.run.combination import check_combination

LM = "stdlib-lm:dim=8,layers=1,heads=2,context=6,train_bytes=4000,val_bytes=700"


@pytest.mark.parametrize("text, layout", [("1d:p=4", Layout("1d", p=4)), ("2d:q=2", Layout("2d", q=2)),
                                          ("2.5d:q=2,d=2", Layout("2.5d", q=2, d=2))])
def test_layouts_parse(text, layout):
    assert parse_layout(text) == layout
    assert layout.spec() == text
    assert layout.size == {"1d": 4, "2d": 4, "2.5d": 8}[layout.kind]


@pytest.mark.parametrize("text, message", [
    ("3d:q=2", "unknown layout '3d'; valid: 1d:p=P | 2d:q=Q | 2.5d:q=Q,d=D"),
    ("2.5d:q=2", "layout 2.5d takes exactly q=, d="),
    ("1d:p=0", "p=0 must be a positive integer"),
    ("2d:q=x", "q=x must be a positive integer"),
])
def test_bad_layout(text, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
        parse_layout(text)


def test_sizes_checked_against_the_processes_and_the_model():
    with pytest.raises(ConfigError, match="P=8 processes per group, but 12 processes are not a multiple of 8"):
        check_layout(parse_layout("2.5d:q=2,d=2"), world_size=12, dim=8, heads=2)
    with pytest.raises(ConfigError, match="dim=10 and heads=2 must be multiples of 4"):
        check_layout(parse_layout("1d:p=4"), world_size=4, dim=10, heads=2)
    with pytest.raises(ConfigError, match="dim=12 and heads=3 must be multiples of 2"):
        check_layout(parse_layout("2d:q=2"), world_size=4, dim=12, heads=3)
    with pytest.raises(ConfigError, match="vocab=255 is not a multiple of 2"):
        check_layout(parse_layout("2d:q=2"), world_size=4, dim=8, heads=2, vocab=255)
    with pytest.raises(ConfigError, match="batch_size=6 is not a multiple of it"):
        check_layout(parse_layout("2.5d:q=2,d=2"), world_size=8, dim=8, heads=2, batch=6)
    assert check_layout(parse_layout("2.5d:q=2,d=2"), world_size=16, dim=8, heads=2, vocab=256, batch=8) == 2


def test_run_refuses_a_world_that_does_not_match(monkeypatch, tmp_path):
    """--workers 2 x 2.5d (P=8) needs 16 processes; torchrun started 6: refused before init."""
    from gradwire.parallel.hybrid import TensorParallelRun

    monkeypatch.setenv("WORLD_SIZE", "6")
    cfg = RunConfig(task=LM, backend="torch", workers=2, tensor_parallel="2.5d:q=2,d=2", batch_size=4,
                    out=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="needs workers x P = 16 processes but 6 were started"):
        TensorParallelRun(cfg.validate())
    assert not dist.is_initialized()


@pytest.mark.parametrize("args, message", [
    (["--tensor-parallel", "2d:q=3"], "dim=8 and heads=2 must be multiples of 3"),
    (["--tensor-parallel", "2d:q=2", "--backend", "sim"], "needs --backend torch"),
    (["--tensor-parallel", "1d:p=2", "--task", "digits-mlp"], "task 'digits-mlp' has none"),
    (["--tensor-parallel", "1d:p=2", "--algorithm", "async"], "algorithm 'async' has a server"),
    (["--tensor-parallel", "1d:p=2", "--algorithm", "sync:overlap=true"], "use overlap=false"),
    (["--tensor-parallel", "1d:p=2", "--optimizer", "muon"], "orthogonalises each weight matrix whole"),
    (["--tensor-parallel", "2.5d:q=2,d=2", "--algorithm", "muloco"], "updates each weight matrix whole (Muon)"),
    (["--tensor-parallel", "2d:q=2", "--workers", "1", "--batch-size", "full"],
     "worker 0's 571 sequences are not a multiple of 2"),
])
def test_cli_says_one_line(args, message, tmp_path, capsys):
    argv = ["run", "--task", LM, "--backend", "torch", "--out", str(tmp_path / "r"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not dist.is_initialized()


@pytest.mark.parametrize("algorithm", ["sync", "sync:overlap=false", "streaming-diloco", "local:period=2"])
def test_collective_algorithms_pass_the_check(algorithm, tmp_path):
    """Only sync's overlap=true is refused; Streaming DiLoCo's own `overlap` (tau steps) is not it."""
    check_combination(RunConfig(task=LM, backend="torch", workers=2, tensor_parallel="1d:p=2", algorithm=algorithm,
                                batch_size=4, out=str(tmp_path / "run")))


@pytest.mark.parametrize("layout, workers, refused", [
    ("2.5d:q=2,d=2", 1, None),  # 572 sequences: 4 blocks of 143
    ("2.5d:q=2,d=2", 2, "worker 0's 286 sequences are not a multiple of 4 (shards: [286, 286])"),
    ("2d:q=2", 2, None),
    ("1d:p=2", 1, None),  # 1-D does not split the batch
])
def test_a_full_batch_must_split_into_d_times_q_blocks_of_sequences(layout, workers, refused, tmp_path):
    """--batch-size full makes each worker's batch its whole shard; 2-D / 2.5-D split it d*q ways, so
    every shard must be a multiple of d*q (else sequences are dropped and the loss scaled by the
    share kept: 570/571 of the dense loss with 571 sequences under 2d:q=2)."""
    task = LM.replace("train_bytes=4000", "train_bytes=4004")  # 572 windows of 7 bytes
    cfg = RunConfig(task=task, backend="torch", workers=workers, tensor_parallel=layout, batch_size="full",
                    out=str(tmp_path / "run"))
    if refused is None:
        check_combination(cfg)
        return
    with pytest.raises(ConfigError, match=re.escape(refused) + r"; pass --batch-size with a multiple of 4 "
                                          r"\(--tensor-parallel\)$"):
        check_combination(cfg)


def test_sequence_block_refuses_a_batch_that_does_not_split():
    """The run's last guard (the config check refuses such batches first): no sequence left out."""
    mesh = SimpleNamespace(layout=parse_layout("2.5d:q=2,d=2"), j=1, k=1)
    assert sequence_block(torch.arange(8), mesh).tolist() == [6, 7]  # block k*q + j = 3 of 4
    with pytest.raises(ValueError, match="9 sequences are not a multiple of 4"):
        sequence_block(torch.arange(9), mesh)


def test_a_checkpoint_resumes_only_under_its_layout(tmp_path):
    """Each process's state is its shard, which the layout decides: 1d:p=4 and 2d:q=2 x 1 worker
    both write rank0-3.pt; resuming one under the other names the layouts. A checkpoint from before
    the key was kept had no layout."""
    from gradwire import checkpoint

    config = RunConfig(task=LM, backend="torch", workers=1, tensor_parallel="1d:p=4", batch_size=4, lr=0.1,
                       momentum=0.0, lr_schedule="constant").to_dict()
    stepdir = checkpoint.save(tmp_path / "checkpoint", 3, "rank0", {"x": torch.zeros(2)}, config)
    assert checkpoint.load(stepdir, "rank0", config)[0] == 3
    with pytest.raises(ConfigError, match=r"tensor_parallel: checkpoint '1d:p=4' vs now '2d:q=2'"):
        checkpoint.load(stepdir, "rank0", config | {"tensor_parallel": "2d:q=2"})
    plain = config | {"tensor_parallel": ""}
    stepdir = checkpoint.save(tmp_path / "older", 3, "rank0", {"x": torch.zeros(2)}, plain)
    payload = checkpoint.read(stepdir / "rank0.pt")  # rewritten as before the key was kept
    del payload["config"]["tensor_parallel"]
    payload["sha256"] = checkpoint.digest(payload)
    torch.save(payload, stepdir / "rank0.pt")
    assert checkpoint.load(stepdir, "rank0", plain)[0] == 3
    with pytest.raises(ConfigError, match=r"tensor_parallel: checkpoint '' vs now '1d:p=4'"):
        checkpoint.load(stepdir, "rank0", config)


def test_launch_refuses_a_process_count_that_is_not_a_multiple_of_p(tmp_path, capsys):
    argv = ["launch", "--nproc-per-node", "6", "--", "run", "--task", LM, "--tensor-parallel", "2.5d:q=2,d=2",
            "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs P=8 processes per worker, but 6 are started" in err and err.count("\n") == 1, err
