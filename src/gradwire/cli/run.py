"""``gradwire run``: train once and write a run folder."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from gradwire.cli.flags import add_run_flags, config_from_args, fresh_out, out_given
from gradwire.cli.supervise import die_with
from gradwire.config import read_config_file
from gradwire.errors import AlreadyFinished, ConfigError, Stopped
from gradwire.fault.launch import DIE_WITH_ENV
from gradwire.report.run_folder import require_named

EPILOG = """examples:
  gradwire run --task mnist1d-cnn --workers 8 --algorithm sync:backups=2 --stragglers tail:p=0.05,slowdown=10
  gradwire run --task mnist1d-mlp --compressor qsgd:levels=4 --error-feedback --network ring:mbps=100
  gradwire run --task synthetic-logreg:l1=0.001 --algorithm diana --batch-size full --dtype float64
  gradwire run --config run.yaml --steps 2000      (flags override the file)
Spec strings are name or name:key=value,...; `gradwire list` shows every name and parameter."""


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="train once and write a run folder", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Train a task on N workers with one algorithm; writes config.json, "
                       "metrics.jsonl, summary.json and curves.png into --out.")
    add_run_flags(p)
    p.set_defaults(command_main=main)


def _setting(key: str, value) -> str:
    """One set-up choice as text: a nested mapping as ``key: k v; k v`` (``a=b`` one level down), a list
    comma-separated (no Python reprs on the terminal)."""
    def flat(v) -> str:
        if isinstance(v, dict):
            return " ".join(f"{k}={flat(x)}" for k, x in v.items())
        if isinstance(v, list | tuple):
            return ", ".join(flat(x) for x in v)
        return str(v)

    if isinstance(value, dict):
        return f"{key}: " + "; ".join(f"{k} {flat(v)}" for k, v in value.items())
    return f"{key}={flat(value)}"


def describe_setup(algorithm: str, info: dict, workers: int) -> str:
    """An algorithm's set-up choices: scalars on one line, per-worker lists as a small table."""
    per_worker = {k: v for k, v in info.items() if isinstance(v, list) and len(v) == workers}
    scalars = ", ".join(_setting(k, v) for k, v in info.items() if k not in per_worker)
    lines = [f"{algorithm} set-up: {scalars}"]
    if per_worker:
        def cell(v):
            return f"{v:.4g}" if isinstance(v, float) else str(v)

        lines.append("  worker " + " ".join(f"{k:>12}" for k in per_worker))
        for w in range(workers):
            lines.append(f"  {w:>6} " + " ".join(f"{cell(v[w]):>12}" for v in per_worker.values()))
    return "\n".join(lines)


def _ended_by(stop: Stopped) -> BaseException | None:
    """The failure a stop interrupted, or None: a signal that lands while a failed run ends (its
    summary written, its process group left) raises Stopped there, which replaces the failure; the
    failure is the Stopped's context (torchrun's SIGTERM to every process once a peer died, so that
    a peer's CommunicationError came out as "stopped before training began")."""
    seen = stop.__context__
    while seen is not None and isinstance(seen, KeyboardInterrupt):
        seen = seen.__context__
    return seen


def _failed_then_stopped(cfg, failure: BaseException, stop: Stopped, reports: bool) -> int:
    """The failure's own line first (and exit code: 4 for a communication error, as cli/__init__.py
    gives it), then one line for the stop that came while the run ended."""
    from gradwire.errors import CommunicationError, ConfigError, DivergenceError

    codes = ((ConfigError, "error", 2), (DivergenceError, "diverged", 3),
             (CommunicationError, "communication error", 4))
    what, code = next(((w, c) for kind, w, c in codes if isinstance(failure, kind)),
                      (f"failed: {type(failure).__name__}", 1))
    print(f"gradwire run: {what}: {failure}", file=sys.stderr)
    summary = Path(cfg.out) / "summary.json"
    status = json.loads(summary.read_text()) if reports and summary.is_file() else {}
    written = (f"{summary} says {status.get('status')} at step {status.get('steps')}"
               if status.get("status") not in (None, "running") else "rank 0 writes the summary")
    print(f"gradwire run: then stopped by {signal.Signals(stop.signum).name} while the run ended ({written})",
          file=sys.stderr)
    return code


def main(ns) -> int:
    launcher = os.environ.pop(DIE_WITH_ENV, None)  # not handed on to processes this run starts
    if launcher is not None:
        die_with(int(launcher))
    cfg = config_from_args(ns)
    if out_given(ns):
        require_named(cfg.out)  # before check_values probes the folder: --out / and --out . are refused
    cfg = cfg.check_values()  # before torch is imported: a mistyped value is reported at once
    keys = read_config_file(ns.config) if ns.config else {}
    variants = keys.get("variants")
    if "seeds" in keys and not variants and getattr(ns, "seed", None) is None:  # one of the seeds ran silently
        raise ConfigError(f"seeds={keys['seeds']!r} in {ns.config} is gradwire compare's key: `gradwire compare "
                          f"--config {ns.config}` runs each seed; a run has one seed: give seed: S in the file, or "
                          "--seed S (--seeds)")
    if variants:  # a comparison's file: its common keys make the run
        seeds = f" and seeds {keys['seeds']}" if "seeds" in keys else ""
        print(f"gradwire run: {ns.config} lists {len(variants) if isinstance(variants, list) else 'its'} variants"
              f"{seeds}, which `gradwire compare` runs; this is one run of the file's common keys"
              f"{f' (seed {cfg.seed})' if seeds else ''}", file=sys.stderr)
    if not out_given(ns):
        cfg = cfg.replace(out=fresh_out(cfg.label(), cfg))
    from gradwire.run.loop import run

    reports = not (cfg.backend == "torch" and os.environ.get("RANK", "0") != "0")  # rank 0 reports for the group
    try:
        summary = run(cfg)
    except AlreadyFinished as e:
        if reports:
            print(f"gradwire run: {e}")
        return 0
    except Stopped as e:
        if e.step is not None:  # stopped in training: the summary's line (cli/__init__.py)
            raise
        failure = _ended_by(e)
        if failure is not None:  # the run had failed, and the stop landed while it ended (torchrun stops the others)
            return _failed_then_stopped(cfg, failure, e, reports)
        # stopped while the run was built (its data, the torch backend's rendezvous): no folder of it
        # was written, on any rank (it said "metrics so far are in the run folder")
        print(f"gradwire run: stopped by {signal.Signals(e.signum).name} before training began (while the run "
              "was built: its data, its processes' rendezvous); nothing of it was written", file=sys.stderr)
        return 128 + e.signum
    if not reports:
        return 0
    info_path = Path(cfg.out) / "algorithm.json"
    if info_path.exists():
        print(describe_setup(cfg.algorithm, json.loads(info_path.read_text()), cfg.workers))
    final = summary["final"]
    parts = [f"{k}={final[k]:.4g}" for k in ("train_loss", "test_acc", "suboptimality") if final.get(k) is not None]
    mb = summary["bytes_sent"] / 1e6
    print(f"{summary['label']}: {summary['steps']} steps, {' '.join(parts)}, {mb:.3f} MB sent, "
          f"{summary['sim_time_s']:.2f} s {'simulated' if cfg.backend == 'sim' else 'elapsed'}, "
          f"{summary['wall_time_s']:.1f} s wall -> {cfg.out}")
    if summary.get("lost_workers"):
        reasons = "; ".join(f"worker {w}: {why}" for w, why in summary["lost_reasons"].items())
        print(f"lost {len(summary['lost_workers'])} worker(s) during the run, finished with the rest ({reasons})")
    return 0
