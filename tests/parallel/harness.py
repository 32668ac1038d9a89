"""What each process of the tensor-parallel tests runs (``child``, started by spawn.py). Every
process joins a gloo group through a FileStore, checks its shards against the dense single-process
module computed in the same process (float64, ``assert_close``), writes its byte counters to
``OUT/rankR.json`` and exits 0; any failure exits non-zero with the message on stderr. The test
(test_equality.py) checks every exit code and the bytes.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing import assert_close

from gradwire.parallel.comm import piece_rows
from gradwire.parallel.lm import parallel_lm, shard_of
from gradwire.parallel.mesh import Mesh, parse_layout
from gradwire.parallel.tp1d import ColumnParallelLinear, RowParallelLinear
from gradwire.parallel.tp2p5d import Linear2p5D, sequence_block
from gradwire.tasks.models import transformer_lm

F64 = torch.float64
TINY = dict(vocab=16, context=6, dim=8, layers=1, heads=4)  # the LM of the equality checks
TOKENS, IN, HID, OUT = 8, 8, 12, 4  # the linear-layer checks: 8 rows (2 sequences of 4) per group


def counted(mesh: Mesh) -> dict:
    return dict(mesh.counter.bytes)


def check_1d_pair(layout: str, world: int, rank: int) -> dict:
    """Column-parallel IN->HID then row-parallel HID->OUT equals the dense pair, outputs and every
    gradient; returns the bytes counted."""
    mesh = Mesh(parse_layout(layout), world_size=world, rank=rank, timeout_s=60)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, TOKENS // 2, IN, generator=g, dtype=F64)
    dense1, dense2 = torch.nn.Linear(IN, HID, dtype=F64), torch.nn.Linear(HID, OUT, dtype=F64)
    for p in (*dense1.parameters(), *dense2.parameters()):
        p.data = torch.randn(p.shape, generator=g, dtype=F64)
    col, row = ColumnParallelLinear(IN, HID, mesh, dtype=F64), RowParallelLinear(HID, OUT, mesh, dtype=F64)
    col.label, row.label = "column", "row"
    p, n = mesh.i, mesh.layout.p
    rows = torch.arange(p * HID // n, (p + 1) * HID // n)
    held = slice(*piece_rows(OUT, [n], [p]))  # the row layer's bias: used whole, held split
    with torch.no_grad():
        col.weight.copy_(dense1.weight[rows]), col.bias.copy_(dense1.bias[rows])
        row.weight.copy_(dense2.weight[:, rows]), row.bias.copy_(dense2.bias[held])
    xs = x.clone().requires_grad_()
    y = row(F.gelu(col(xs)))
    xd = x.clone().requires_grad_()
    yd = dense2(F.gelu(dense1(xd)))
    assert_close(y, yd)
    y.square().sum().backward()
    yd.square().sum().backward()
    assert_close(xs.grad, xd.grad)
    assert_close(col.weight.grad, dense1.weight.grad[rows])
    assert_close(col.bias.grad, dense1.bias.grad[rows])
    assert_close(row.weight.grad, dense2.weight.grad[:, rows])
    assert_close(row.bias.grad, dense2.bias.grad[held])
    return counted(mesh)


def check_summa_linear(layout: str, world: int, rank: int) -> dict:
    """Linear2p5D IN->HID equals nn.Linear on this group's batch: output blocks and the gradients of
    the input, the weight and the bias blocks (summed over depth: the depth all-reduce)."""
    mesh = Mesh(parse_layout(layout), world_size=world, rank=rank, timeout_s=60)
    q, d = mesh.layout.q, mesh.layout.d
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2 * q * d, 3, IN, generator=g, dtype=F64)  # 2 sequences of 3 tokens per block
    dense = torch.nn.Linear(IN, HID, dtype=F64)
    dense.weight.data = torch.randn(HID, IN, generator=g, dtype=F64)
    layer = Linear2p5D(IN, HID, mesh, dtype=F64)
    layer.label = "summa"
    with torch.no_grad():
        layer.weight.copy_(shard_of("head.weight", dense.weight, mesh.layout, mesh.i, mesh.j, mesh.k))
        layer.bias.copy_(shard_of("head.bias", dense.bias, mesh.layout, mesh.i, mesh.j, mesh.k))
    feats = torch.arange(mesh.i * IN // q, (mesh.i + 1) * IN // q)
    xs = sequence_block(x, mesh)[..., feats].clone().requires_grad_()
    y = layer(xs)
    xd = x.clone().requires_grad_()
    yd = dense(xd)
    out_feats = torch.arange(mesh.i * HID // q, (mesh.i + 1) * HID // q)
    assert_close(y, sequence_block(yd, mesh)[..., out_feats])
    weights = torch.randn(yd.shape, generator=g, dtype=F64)  # a loss that weighs every output
    (y * sequence_block(weights, mesh)[..., out_feats]).sum().backward()
    (yd * weights).sum().backward()
    assert_close(xs.grad, sequence_block(xd.grad, mesh)[..., feats])
    assert_close(layer.weight.grad, shard_of("head.weight", dense.weight.grad, mesh.layout, mesh.i, mesh.j, mesh.k))
    assert_close(layer.bias.grad, shard_of("head.bias", dense.bias.grad, mesh.layout, mesh.i, mesh.j, mesh.k))
    return counted(mesh)


def check_lm(layout: str, world: int, rank: int, steps: int = 0) -> dict:
    """The whole tiny LM (embeddings, layer norms, attention, MLP, read-out, loss): loss and every
    parameter's gradient equal the dense model's on the same batch; then ``steps`` SGD steps
    (momentum 0.9) equal dense training on the same global batches, parameter by parameter."""
    mesh = Mesh(parse_layout(layout), world_size=world, rank=rank, timeout_s=60)
    dense = transformer_lm(torch.Generator().manual_seed(3), dtype=F64, **TINY)
    model = parallel_lm(mesh, dense)
    g = torch.Generator().manual_seed(4)
    opt_tp = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    opt_dense = torch.optim.SGD(dense.parameters(), lr=0.5, momentum=0.9)
    for step in range(steps + 1):
        tokens = torch.randint(0, TINY["vocab"], (4, TINY["context"] + 1), generator=g)
        x, y = tokens[:, :-1], tokens[:, 1:]
        opt_tp.zero_grad(), opt_dense.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        dense_loss = F.cross_entropy(dense(x).reshape(-1, TINY["vocab"]), y.reshape(-1))
        dense_loss.backward()
        assert_close(loss, dense_loss)
        dense_params = dict(dense.named_parameters())
        for name, p in model.named_parameters():
            want = shard_of(name, dense_params[name].grad, mesh.layout, mesh.i, mesh.j, mesh.k)
            assert_close(p.grad, want, msg=lambda m, name=name, step=step: f"{layout} step {step} {name}: {m}")
        opt_tp.step(), opt_dense.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = model.gather_dense(flat, dense)
    if mesh.tp.index == 0:
        assert_close(gathered, torch.cat([p.detach().reshape(-1) for p in dense.parameters()]))
    return counted(mesh)


def four(world: int, rank: int) -> dict:
    return {"1d:p=4 pair": check_1d_pair("1d:p=4", world, rank),
            "1d:p=2 pair": check_1d_pair("1d:p=2", world, rank),
            "2d:q=2 linear": check_summa_linear("2d:q=2", world, rank),
            "2.5d:q=2,d=1 linear": check_summa_linear("2.5d:q=2,d=1", world, rank),
            "1d:p=4 lm": check_lm("1d:p=4", world, rank),
            "1d:p=2 lm": check_lm("1d:p=2", world, rank),
            "2d:q=2 lm": check_lm("2d:q=2", world, rank),
            "2.5d:q=2,d=1 lm": check_lm("2.5d:q=2,d=1", world, rank)}


HYBRID_TASK = "stdlib-lm:dim=8,layers=1,heads=2,context=6,train_bytes=4000,val_bytes=700"


def hybrid_config(out: str, **changes):
    """dp 2 x tp 1d:p=2 with a hard-threshold compressor (element-wise and deterministic, so
    compressing each shard is compressing the whole gradient; not summable, so the simulator and
    gloo combine it alike): the same run as the simulator's 2 workers without --tensor-parallel."""
    from gradwire.config import RunConfig

    return RunConfig(task=HYBRID_TASK, workers=2, compressor="threshold:tau=0.002", dtype="float64", steps=3,
                     eval_every=3, batch_size=4, lr=0.1, out=out, timeout_s=60).replace(**changes)


def hybrid(world: int, rank: int, out: str) -> None:
    """In these processes (last: the run leaves the process group), ``gradwire run --backend torch``
    with four: --tensor-parallel 1d:p=2 --workers 2 (a compressor across the workers); with eight:
    --tensor-parallel 2.5d:q=2,d=2 --workers 1 (the whole training through the run path)."""
    from gradwire.run.loop import run

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    if world == 4:
        cfg = hybrid_config(str(Path(out, "hybrid")), backend="torch", tensor_parallel="1d:p=2")
    else:
        cfg = one_worker_config(str(Path(out, "hybrid")), backend="torch", tensor_parallel="2.5d:q=2,d=2")
    run(cfg, progress=False)


COMPRESSED_RUNS = {  # layout, workers, compressor: a compressor that looks at the whole shard
    "four": [("1d:p=2", 2, "qsgd:levels=7"), ("1d:p=2", 2, "topk:ratio=0.1"), ("2d:q=2", 1, "qsgd:levels=7")],
    "eight": [("2.5d:q=2,d=2", 1, "topk:ratio=0.1")],
}
UNCOMPRESSED_RUN = ("1d:p=2", 2, "none")  # its data-parallel bytes are known exactly
FULL_BATCH_RUN = ("1d:p=2", 2, "none", "full")  # each worker's batch is its whole shard


def short_run(layout: str, workers: int, compressor: str, world: int, rank: int, out: str,
              batch_size: int | str = 4) -> dict:
    """Three steps of ``gradwire run --backend torch --tensor-parallel layout`` (each step's
    ``dp_bytes`` and ``tp_layer_bytes``; the workers' shard sizes), then a loss on a fixed batch:
    the tensor-parallel model's, and the dense model's gathered from the shards. Where the ranks of
    a worker disagreed on a tensor they all use whole (an embedding, a norm, a bias: a compressor
    that is not element-wise, compressing each rank's copy with its own shard, made them), the two
    would differ; in 1-D every rank computes the whole loss, so the ranks' values must be
    bit-identical too."""
    from gradwire.run.loop import Run

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    cfg = hybrid_config(str(Path(out, f"short-{layout}-{compressor}-{batch_size}")), backend="torch",
                        tensor_parallel=layout, workers=workers, compressor=compressor, batch_size=batch_size)
    r = Run(cfg)
    start = r.algorithm.eval_params().clone()
    steps = [r.train_step() for _ in range(3)]
    flat = r.algorithm.eval_params()
    tp = r.tensor_parallel
    tokens = torch.randint(0, 256, (4, 7), generator=torch.Generator().manual_seed(5))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        tp_loss = tp.model.loss(r.model.load(flat)(x), y)
        losses = tp.mesh.tp.gather(tp_loss.reshape(1).contiguous(), 0, label=None)
        dense_flat = tp.model.gather_dense(flat, tp.dense and tp.dense.module)
        draw = torch.rand(1, generator=r.ctx.generator(r.ctx.local_ranks[0], "compress")).item()
        result = {"moved": bool((flat != start).any()), "tp_loss": tp_loss.item(), "compress_draw": draw,
                  "dp_bytes": [s["dp_bytes"] for s in steps], "tp_layer_bytes": [s["tp_layer_bytes"] for s in steps],
                  "shard_sizes": r.shard_sizes}
        if tp.mesh.tp.index == 0:
            dense = tp.dense.load(dense_flat)
            result |= {"tp_losses": [v.item() for v in losses],
                       "dense_loss": F.cross_entropy(dense(x).reshape(-1, 256), y.reshape(-1)).item()}
    return result


def short_runs(scenario: str, world: int, rank: int, out: str) -> None:
    runs = COMPRESSED_RUNS[scenario] + ([UNCOMPRESSED_RUN, FULL_BATCH_RUN] if scenario == "four" else [])
    results = {" ".join(map(str, c)): short_run(*c[:3], world, rank, out, *c[3:]) for c in runs}
    Path(out, f"short-runs-rank{rank}.json").write_text(json.dumps(results))


def one_worker_config(out: str, **changes):
    """One worker, uncompressed, 4 sequences per step (one per 2.5-D [2,2,2] block)."""
    return hybrid_config(out, workers=1, compressor="none", steps=4, eval_every=2).replace(**changes)


def eight(world: int, rank: int) -> dict:
    return {"2.5d:q=2,d=2 linear": check_summa_linear("2.5d:q=2,d=2", world, rank),
            "2.5d:q=2,d=2 lm training": check_lm("2.5d:q=2,d=2", world, rank, steps=3)}


SCENARIOS = {"four": four, "eight": eight}


def child(scenario: str, rank: int, world: int, store_path: str, out: str) -> None:
    """One process of ``scenario`` (the target of the test's forkserver processes)."""
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timeout)
    try:
        result = SCENARIOS[scenario](world, rank)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
        short_runs(scenario, world, rank, out)
        dist.barrier()
        hybrid(world, rank, out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
