"""Hybrid parallelism in a run (``gradwire run --backend torch --tensor-parallel LAYOUT``): tensor
parallelism inside each group of P processes, gradwire's data-parallel algorithms and compressors
across the groups.

``--workers`` counts data-parallel workers; the run needs workers x P processes. Process g is
tensor-parallel rank ``g % P`` of worker ``g // P`` (:mod:`gradwire.parallel.mesh`). Every process
hosts its worker's shard: its FlatModel is the shard, so the algorithm, its compressor and its
state work on the shard as on any flat model, and the transport's collectives run over the
data-parallel group of the processes holding the same shard (``TorchTransport(workers=...)``).
All P processes of a worker draw the same batch (the same seed and worker rank); 2-D / 2.5-D
models take their block of it.

Bytes per step are exact: after each step the transport sums (``sum_step_counters``, one all-reduce
of bookkeeping, not counted) the data-parallel bytes (each group's first member's count) and the
tensor-parallel bytes (each group leader's counters), so ``bytes_sent`` is the whole run's on every
process; ``tp_bytes``, ``dp_bytes`` and ``tp_layer_bytes`` (per layer, this step) go into
steps.jsonl and, at evaluation steps, metrics.jsonl. Rank 0 evaluates the dense model gathered from
its group's shards (uncounted, as evaluation is everywhere in gradwire).
"""

from __future__ import annotations

import os

import torch

from gradwire.errors import ConfigError
from gradwire.parallel.layout import parse_layout
from gradwire.parallel.lm import parallel_lm
from gradwire.parallel.mesh import Mesh
from gradwire.tasks.oracle import FlatModel


class TensorParallelRun:
    """What ``--tensor-parallel`` adds to a :class:`~gradwire.run.loop.Run`."""

    def __init__(self, cfg):
        from gradwire.transports.groups import process_rank
        from gradwire.transports.torch_dist import init_from_env, local_device

        self.layout = layout = parse_layout(cfg.tensor_parallel)
        world = os.environ.get("WORLD_SIZE", "1")
        need = cfg.processes(server=False)  # tensor parallelism runs the collective algorithms only
        if not world.isdigit() or int(world) != need:  # before any process group exists
            raise ConfigError(f"--tensor-parallel {layout.spec()} with --workers {cfg.workers} needs workers x P = "
                              f"{need} processes but {world} were started (WORLD_SIZE); start {need} "
                              f"(gradwire launch --nproc-per-node {need}) or leave --workers out of gradwire launch")
        init_from_env(cfg.timeout_s, local_device(cfg.device))
        self.mesh = Mesh(layout, world_size=need, rank=process_rank(), timeout_s=cfg.timeout_s)
        self.workers = (self.mesh.dp_group.pg, self.mesh.dp_group.ranks)  # the transport's collectives
        self.labels: list[str] = []  # of the per-layer counters: the model's (set by shard)
        self._seen: dict[str, int] = {}
        self.dense: FlatModel | None = None
        self.dense_params: torch.Tensor | None = None

    def shard(self, dense: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """This process's shard of the dense model (which the first rank of each tensor-parallel
        group keeps, to put the gathered shards in; rank 0 evaluates it)."""
        model = parallel_lm(self.mesh, dense)
        self.model = model
        self.labels = model.labels()
        if self.mesh.tp.index == 0:  # where the shards are gathered; the others drop the dense model
            self.dense = FlatModel(dense.to(device))
        return model

    @property
    def loss_fn(self):
        return self.model.loss

    def step_bytes(self, transport, before: int) -> dict:
        """Make ``transport.bytes_sent`` the whole run's after a step that began at ``before``;
        returns this step's figures."""
        counts = self.mesh.counter.bytes
        layer = [counts.get(k, 0) - self._seen.get(k, 0) for k in self.labels]
        other = self.mesh.counter.total - sum(self._seen.values()) - sum(layer)
        self._seen = dict(counts)
        t = transport.sum_step_counters(before, [other, *layer])  # the transport's worker 0 is dp_group's first
        tp_bytes = sum(t[1:])
        return {"dp_bytes": t[0], "tp_bytes": tp_bytes, "tp_layer_bytes": dict(zip(self.labels, t[2:]))}

    def gather(self, params: torch.Tensor) -> None:
        """Every process, at evaluation steps: the dense parameters at rank 0 from its group's shards."""
        rows = params if params.dim() == 2 else params.unsqueeze(0)
        gathered = [self.model.gather_dense(row, self.dense and self.dense.module) for row in rows]
        if self.mesh.rank == 0:
            self.dense_params = torch.stack(gathered) if params.dim() == 2 else gathered[0]
