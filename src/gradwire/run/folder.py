"""The run's folder (report/run_folder.py writes it): what config.json records beside the config,
and the summary written last."""

from __future__ import annotations

import torch

from gradwire.report.run_folder import RunFolder


def open_run_folder(run, resumed: bool) -> RunFolder:
    """The folder of ``run``, opened (written only by the writing process); a resumed run keeps its
    rows up to the checkpoint's step (its metrics row there only where this run evaluates: a
    finished run continued to more steps evaluated its old last step only because it was last)."""
    folder = RunFolder(run.cfg.out, enabled=run.is_writer, curves=run.cfg.curves)
    algorithm = run.algorithm
    folder.open(run.cfg.to_dict() | {"algorithm_resolved": algorithm.spec(),
                                     "compressor_resolved": algorithm.compressor_spec() or "none",
                                     "shard_sizes": run.shard_sizes,
                                     "num_parameters": run.model.numel, "evaluates": algorithm.evaluates,
                                     "torch_version": torch.__version__},
                algorithm.setup_info(), run.step if resumed else None,
                evaluates_at_resumed_step=algorithm.evaluates_at(run.step, run.cfg.eval_every, run.cfg.steps))
    return folder


def summary(run, folder: RunFolder, status: str, error: str | None, resumed: bool, extra: dict) -> dict:
    """summary.json's content: ``extra`` (a stop's or the driver's entries) and the run's totals."""
    records = folder.records
    return extra | {"label": run.cfg.label(), "status": status, "error": error, "steps": run.step,
                    "resumed": bool(resumed),
                    "resumed_from_step": run.resumed_from if resumed else None,
                    "final": records[-1] if records else None,
                    "best_test_acc": max((x["test_acc"] for x in records), default=None),
                    "bytes_sent": run.transport.bytes_sent, "comm_time_s": run.transport.comm_time_s,
                    "sim_time_s": run.clock.now, "wall_time_s": run.wall_time()}
