"""The run's evaluator: a metrics.jsonl row at step 0 and at each of the algorithm's evaluation
steps, with the time spent evaluating kept apart from the time spent training.

Every process calls it at the same steps (with ``--tensor-parallel`` each gathers its shard of
the dense model); the writing process alone evaluates and writes the row.
"""

from __future__ import annotations

import time

from gradwire.algorithms.optim import ScheduledRate
from gradwire.report.run_folder import RunFolder
from gradwire.tasks.evaluate import evaluate


def evaluate_model(run) -> dict:
    """The run's model at the parameters its algorithm evaluates (the dense model gathered at rank
    0 with --tensor-parallel, every process having called gather)."""
    if run.tensor_parallel:
        return evaluate(run.task, run.tensor_parallel.dense, run.tensor_parallel.dense_params)
    return evaluate(run.task, run.model, run.algorithm.eval_params())


class Evaluator:
    def __init__(self, run, folder: RunFolder):
        self.run, self.folder = run, folder
        cfg = run.cfg
        self.rate = ScheduledRate(cfg.lr, cfg.lr_schedule, cfg.steps)

    def scheduled_lr(self) -> dict:
        """Under a schedule, the rate of the step's (last) update; at step 0 the first's."""
        return {} if self.rate.constant else {"lr": self.rate.at(max(self.run.step - 1, 0))}

    def record(self, extra: dict) -> None:
        r = self.run
        if r.tensor_parallel:  # every process: rank 0 evaluates the dense model its group holds
            r.tensor_parallel.gather(r.algorithm.eval_params())
        if not r.is_writer:
            return
        # wall_time_s is taken before this evaluation and eval_time_s sums the earlier ones, so
        # wall_time_s - eval_time_s is the time spent training
        now = time.perf_counter()
        row = {"step": r.step, "sim_time_s": r.clock.now, "wall_time_s": r.wall_time(),
               "eval_time_s": r.eval_s, "bytes_sent": r.transport.bytes_sent, "gradients": r.gradients,
               "batch_loss": sum(r.window) / len(r.window) if r.window else None} | evaluate_model(r)
        r.eval_s += time.perf_counter() - now
        # evaluated: whose parameters (the model, the workers' average, ...)
        self.folder.metrics(row | {"evaluated": r.algorithm.evaluates} | self.scheduled_lr() | extra)
