"""The run's folder (report/run_folder.py writes it): what config.json records beside the config,
and the summary written last."""

from __future__ import annotations

from pathlib import Path

import torch

from gradwire.errors import ConfigError
from gradwire.report.run_folder import RunFolder, read_json_or_empty


def open_run_folder(run, resumed: bool) -> RunFolder:
    """The folder of ``run``, opened (written only by the writing process); a resumed run keeps its
    rows up to the checkpoint's step (its metrics row there only where this run evaluates: a
    finished run continued to more steps evaluated its old last step only because it was last)."""
    folder = RunFolder(run.cfg.out, enabled=run.is_writer, curves=run.cfg.curves)
    algorithm = run.algorithm
    if resumed:
        check_resolved_as_before(run.cfg.out, algorithm)
    folder.open(run.cfg.to_dict() | {"algorithm_resolved": algorithm.spec(),
                                     "compressor_resolved": algorithm.compressor_spec() or "none",
                                     "shard_sizes": run.shard_sizes,
                                     "num_parameters": run.model.numel, "evaluates": algorithm.evaluates,
                                     "torch_version": torch.__version__},
                algorithm.setup_info(), run.step if resumed else None,
                evaluates_at_resumed_step=algorithm.evaluates_at(run.step, run.cfg.eval_every, run.cfg.steps))
    return folder


def check_resolved_as_before(out, algorithm) -> None:
    """A resumed run must run what its first part ran: the algorithm and compressor as resolved (defaults
    filled in) are those config.json recorded, else ConfigError naming both (a gradwire whose defaults
    changed would otherwise continue the checkpoint with other settings, and overwrite the record). Every
    process that can read config.json checks (one folder on one node: all of them); a record from before
    these keys were written is not checked."""
    ran = read_json_or_empty(Path(out) / "config.json")
    now = {"algorithm_resolved": algorithm.spec(), "compressor_resolved": algorithm.compressor_spec() or "none"}
    for key, spec in now.items():
        before = ran.get(key)
        if before is not None and before != spec:
            raise ConfigError(f"the checkpoint in {out} ran {key.split('_')[0]} {before!r}, which this gradwire "
                              f"resolves to {spec!r} (its defaults changed): resume it with the gradwire that "
                              "wrote it, or start afresh with another --out or --overwrite")


def summary(run, folder: RunFolder, status: str, error: str | None, resumed: bool, extra: dict,
            trained_bytes: int) -> dict:
    """summary.json's content: ``extra`` (a stop's or the driver's entries) and the run's totals.
    ``bytes_sent`` is ``trained_bytes``, the ledger's count when the last step ended (the last
    metrics row's, the same on the simulator and a real backend); ``finish_bytes`` what the driver's
    end sent after it (a real server answering the messages still in flight with STOP, the
    goodbyes and releases: servers/real.py), counted in the same ledger."""
    records = folder.records
    return extra | {"label": run.cfg.label(), "status": status, "error": error, "steps": run.step,
                    "resumed": bool(resumed),
                    "resumed_from_step": run.resumed_from if resumed else None,
                    "final": records[-1] if records else None,
                    "best_test_acc": max((x["test_acc"] for x in records), default=None),
                    "bytes_sent": trained_bytes, "finish_bytes": run.transport.bytes_sent - trained_bytes,
                    "comm_time_s": run.transport.comm_time_s,
                    "sim_time_s": run.clock.now, "wall_time_s": run.wall_time()}
