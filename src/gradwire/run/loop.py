"""The run loop: build everything from a RunConfig, train, evaluate, write the run folder.

Run folder: ``config.json`` (fully resolved, written first), ``steps.jsonl`` (every step's loss and
algorithm figures), ``metrics.jsonl`` (one object per
evaluation, flushed as it is written, so a crash loses nothing already measured),
``summary.json`` (written last, also after a divergence) and PNG plots.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from gradwire.algorithms import ALGORITHMS, CodecConfig, Context, OptimConfig
from gradwire.errors import ConfigError, DivergenceError
from gradwire.run.config import RunConfig, write_json
from gradwire.run.evaluate import evaluate
from gradwire.run.stragglers import STRAGGLERS
from gradwire.run.worker import FlatModel, GradientOracle, WorkerData, hash_seed
from gradwire.tasks import build_partition, build_task
from gradwire.transports.network import NETWORKS
from gradwire.transports.sim import SimClock, SimTransport


def _progress_enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


class Run:
    """Everything one run needs, built from its config (also used by tests and benchmarks)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg.validate()
        torch.set_num_threads(cfg.threads)
        dtype = {"float32": torch.float32, "float64": torch.float64}[cfg.dtype]
        self.task = build_task(cfg.task, num_workers=cfg.workers, seed=cfg.seed, dtype=dtype, data_dir=cfg.data_dir)
        shards = self.task.worker_indices
        if shards is None:
            shards = build_partition(cfg.partition, labels=self.task.y_train, num_workers=cfg.workers, seed=cfg.seed)
        elif cfg.partition != "iid":
            raise ConfigError(f"task {cfg.task!r} fixes each worker's data itself; --partition {cfg.partition!r} "
                              "does not apply (leave it at iid)")
        if len(shards) != cfg.workers:
            raise ConfigError(f"task {cfg.task!r} made data for {len(shards)} workers, not {cfg.workers}")
        batch = None if cfg.batch_size == "full" else int(cfg.batch_size)
        self.shard_sizes = [len(s) for s in shards]
        workers = {r: WorkerData(self.task.x_train[idx], self.task.y_train[idx], batch_size=batch, seed=cfg.seed, rank=r)
                   for r, idx in enumerate(shards)}
        module = self.task.model_fn(torch.Generator().manual_seed(hash_seed(cfg.seed, "model")))
        self.model = FlatModel(module)
        self.oracle = GradientOracle(self.model, self.task.loss_fn, workers, l2=self.task.l2)
        self.clock = SimClock()
        self.transport = SimTransport(cfg.workers, NETWORKS.build(cfg.network), self.clock)
        self.ctx = Context(world_size=cfg.workers, local_ranks=self.transport.local_ranks, transport=self.transport,
                           oracle=self.oracle, stragglers=STRAGGLERS.build(cfg.stragglers, seed=cfg.seed),
                           clock=self.clock, seed=cfg.seed, shard_sizes=tuple(self.shard_sizes))
        self.algorithm = ALGORITHMS.build(cfg.algorithm)
        optim = OptimConfig(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, l1=self.task.l1)
        try:
            self.algorithm.setup(self.ctx, self.model.flatten(), optim,
                                 CodecConfig(compressor=cfg.compressor, error_feedback=cfg.error_feedback))
        except ValueError as e:
            raise ConfigError(f"algorithm {cfg.algorithm!r}: {e}") from None
        self.step = 0

    def train_step(self) -> dict:
        self.step += 1
        self.oracle.step = self.step
        return self.algorithm.step(self.ctx, self.step)

    def evaluate(self) -> dict:
        return evaluate(self.task, self.model, self.algorithm.eval_params())


def run(cfg: RunConfig, *, progress: bool | None = None) -> dict:
    """Train as configured and write the run folder; returns the summary. Raises DivergenceError
    (after writing the metrics so far and a summary saying so) when training blows up."""
    started = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    r = Run(cfg)
    resolved = cfg.to_dict() | {"algorithm_resolved": r.algorithm.spec(), "shard_sizes": r.shard_sizes,
                                "num_parameters": r.model.numel, "evaluates": r.algorithm.evaluates,
                                "torch_version": torch.__version__}
    write_json(out / "config.json", resolved)
    info = r.algorithm.setup_info()
    if info:
        write_json(out / "algorithm.json", info)
    records: list[dict] = []
    status, error = "finished", None
    progress = _progress_enabled() if progress is None else progress
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, desc=cfg.label(), disable=not progress, leave=False, dynamic_ncols=True)
    gradients, window = 0, []
    with open(out / "metrics.jsonl", "w") as metrics, open(out / "steps.jsonl", "w") as steps_log:
        def record(extra: dict) -> None:
            rec = {"step": r.step, "sim_time_s": r.clock.now, "wall_time_s": time.perf_counter() - started,
                   "bytes_sent": r.transport.bytes_sent, "gradients": gradients,
                   "batch_loss": sum(window) / len(window) if window else None} | r.evaluate() | extra
            records.append(rec)
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()

        record({})
        try:
            while r.step < cfg.steps:
                info = r.train_step()
                steps_log.write(json.dumps({"step": r.step, "sim_time_s": r.clock.now,
                                            "bytes_sent": r.transport.bytes_sent} | info) + "\n")
                gradients += int(info.get("gradients", 0))
                window.append(info["loss"])
                bar.update(1)
                if r.step % cfg.eval_every == 0 or r.step == cfg.steps:
                    extras = {k: v for k, v in info.items() if k not in ("loss", "gradients")}
                    record(extras)
                    window.clear()
                    bar.set_postfix(loss=f"{records[-1]['train_loss']:.4g}", acc=f"{records[-1]['test_acc']:.3f}")
        except DivergenceError as e:
            status, error = "diverged", str(e)
            raise
        finally:
            bar.close()
            summary = {"label": cfg.label(), "status": status, "error": error, "steps": r.step,
                       "final": records[-1] if records else None,
                       "best_test_acc": max((x["test_acc"] for x in records), default=None),
                       "bytes_sent": r.transport.bytes_sent, "sim_time_s": r.clock.now,
                       "wall_time_s": time.perf_counter() - started}
            write_json(out / "summary.json", summary)
            if records:
                from gradwire.report.plots import plot_runs

                plot_runs({cfg.label(): records}, out / "curves.png")
    return summary
