"""The tensor-parallel layout of a run, ``1d:p=P | 2d:q=Q | 2.5d:q=Q,d=D`` (``--tensor-parallel``),
checked against the processes and the model before any process group exists
(:mod:`gradwire.parallel.mesh` builds the groups). The layout itself is a value of the run
config, parsed there (``gradwire.config.parse_layout``: its size is in the process count)."""

from __future__ import annotations

from gradwire.config import LAYOUTS, Layout, parse_layout  # noqa: F401  (re-exported: the config's value)
from gradwire.errors import ConfigError


def check_layout(layout: Layout, *, world_size: int, dim: int, heads: int, vocab: int | None = None,
                 batch: int | None = None) -> int:
    """The number of data-parallel groups, after checking that ``layout`` fits ``world_size``
    processes and a transformer of width ``dim`` with ``heads`` heads (and ``vocab`` outputs, and a
    per-group ``batch`` of sequences); ConfigError otherwise -- before any process group exists."""
    P = layout.size
    if world_size % P:
        raise ConfigError(f"tensor_parallel={layout.spec()} needs P={P} processes per group, but "
                          f"{world_size} processes are not a multiple of {P}: start a multiple of {P}")
    split = layout.p if layout.kind == "1d" else layout.q
    if dim % split or heads % split:
        raise ConfigError(f"tensor_parallel={layout.spec()} splits the hidden size and the heads {split} ways: "
                          f"dim={dim} and heads={heads} must be multiples of {split}")
    if vocab is not None and layout.summa and vocab % layout.q:
        raise ConfigError(f"tensor_parallel={layout.spec()} splits the vocabulary {layout.q} ways: "
                          f"vocab={vocab} is not a multiple of {layout.q}")
    if batch is not None and layout.summa and batch % (layout.q * layout.d):
        raise ConfigError(f"tensor_parallel={layout.spec()} splits each batch of sequences d*q = "
                          f"{layout.q * layout.d} ways: batch_size={batch} is not a multiple of it")
    return world_size // P


def check_full_batch(layout: Layout, shard_sizes: list[int]) -> None:
    """With ``--batch-size full`` a worker's batch is its whole shard, which 2-D / 2.5-D split into
    d·q blocks of sequences: every shard must be a multiple of d·q (else sequences would be dropped
    and the loss scaled by the share kept); ConfigError naming the shards otherwise."""
    ways = layout.q * layout.d
    if not layout.summa or not any(size % ways for size in shard_sizes):
        return
    worker = next(w for w, size in enumerate(shard_sizes) if size % ways)
    raise ConfigError(f"tensor_parallel={layout.spec()} splits each batch of sequences d*q = {ways} ways, and "
                      f"batch_size='full' makes a worker's batch its whole shard: worker {worker}'s "
                      f"{shard_sizes[worker]} sequences are not a multiple of {ways} (shards: {shard_sizes}); "
                      f"pass --batch-size with a multiple of {ways}")


