"""``gradwire launch``: torchrun's own launcher and rendezvous, with the command line built for you.

Every process runs ``gradwire run --backend torch``; ``--workers`` is the number of processes, less
one when the algorithm has a server (it takes a process of its own). The run command line is read
with ``gradwire run``'s own parser and config file (``--algorithm X``, ``--algorithm=X`` or a
``--config`` file count alike). Nothing of ours listens on a port: the rendezvous is torchrun's
(``torch.distributed.run.main``).

torchrun starts a supervisor per process (``gradwire/cli/supervise.py``), which runs ``gradwire run``
as its child: with a server, a worker process that dies is lost, not fatal (torchrun would stop
the whole group for it) unless a restart is left; killing the launcher kills every process; a
restarted group (``--max-restarts``) resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from gradwire.cli.flags import config_from_args, file_keys, run_parser

# the files through which the supervised processes tell the launcher and later attempts that a run
# refused its configuration (exit 2) and that rank 0 claimed the run folder (cli/supervise.py)
from gradwire.cli.supervise import CLAIMED_ENV, REFUSED_ENV
from gradwire.errors import AlreadyFinished, ConfigError

EPILOG = """examples:
  gradwire launch --nproc-per-node 4 -- run --task mnist1d-cnn --algorithm diana --steps 500 --out runs/d4
  gradwire launch --nproc-per-node 4 -- run --config run.yaml      # 3 workers if run.yaml's algorithm has a server
  # two machines, 2 processes each (run the same line on both, --node-rank 0 and 1):
  gradwire launch --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint HOST:29400 -- run ...
  # restart the whole group up to 3 times after a failure, resuming from the last checkpoint:
  gradwire launch --nproc-per-node 2 --max-restarts 3 -- run --checkpoint-every 50 ...
Everything after -- is a `gradwire run` command line; --backend torch and --workers (the processes,
less one for the server of sync:backups=b, async, easgd:async=true, lsgd:async=true) are added.
Faults: any failure stops every process, except that with a server a worker process that dies
is lost and the others finish the run. --max-restarts R restarts the group up to R times (a lost
worker too: the group comes back whole; the last attempt carries on without it); each restarted
attempt gets --resume-or-start (unless the run command says --resume, --resume-or-start or --no-resume itself)
once an earlier attempt claimed the run folder: it continues from the last checkpoint, or starts again
from step 0 when none was saved yet. A configuration the run refuses (exit 2) is not restarted, and
launch exits 2; what can be checked before torchrun starts (the configuration, the run folder) is.
Killing the launcher (SIGTERM, SIGINT, SIGKILL) stops every process it started."""


def run_options(run_args: list[str]):
    """The run command line as ``gradwire run`` reads it: (the resolved RunConfig, the keys given
    as flags, the keys the --config file sets that the flags leave to it: ``file_keys``)."""
    ns = run_parser("gradwire run", add_help=True).parse_args(run_args)  # a bad flag: run's own message, exit 2
    flags = {k for k in vars(ns) if k != "config"}
    in_file = {str(k).replace("-", "_") for k in file_keys(ns)}
    return config_from_args(ns), flags, in_file


def _note(text: str) -> None:
    print(f"gradwire launch: note: {text}", file=sys.stderr, flush=True)


def torchrun_argv(ns) -> list[str]:
    """torchrun's own command line for ``gradwire launch`` (its launcher and rendezvous, not ours)."""
    from gradwire.run.combination import TooFewWorkers, check_combination

    rest = list(ns.rest or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest or rest[0] != "run":
        raise ConfigError("launch needs a run command after --, e.g. gradwire launch --nproc-per-node 2 -- run ...")
    if ns.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node {ns.nproc_per_node} must be >= 1")
    if ns.max_restarts < 0:
        raise ConfigError(f"--max-restarts {ns.max_restarts} must be >= 0")
    nodes = str(ns.nnodes).split(":")  # N or MIN:MAX, as torchrun reads it
    if len(nodes) > 2 or not all(n.isdigit() and int(n) >= 1 for n in nodes) or int(nodes[0]) > int(nodes[-1]):
        raise ConfigError(f"--nnodes {ns.nnodes!r} must be a number of nodes >= 1, or a range MIN:MAX with 1 <= MIN "
                          "<= MAX")
    run_args = rest[1:]
    cfg, flags, in_file = run_options(run_args)
    if "out" in flags | in_file:
        from gradwire.report.run_folder import require_named

        require_named(cfg.out)  # before the checks below probe the folder (--out / is refused)
    if "backend" in flags and cfg.backend != "torch":
        raise ConfigError(f"launch runs --backend torch; drop --backend {cfg.backend} from the run command")
    # --workers is counted below from the processes; until then the check takes one worker (a task's
    # samples per worker, say, are checked again once the count is known)
    server = check_combination(cfg.replace(backend="torch", **({} if "workers" in flags else {"workers": 1})),
                               workers_counted="workers" in flags).needs_server
    if not str(ns.nnodes).isdigit():
        if "workers" not in flags:
            raise ConfigError(f"--nnodes {ns.nnodes} is a range: pass --workers explicitly in the run command")
    else:
        total = int(ns.nnodes) * ns.nproc_per_node
        started = f"{total} are started (--nnodes {ns.nnodes} x --nproc-per-node {ns.nproc_per_node})"
        workers, left = cfg.workers_for(total, server)
        if left:  # P processes per worker (docs/tensor_parallel.md)
            size = cfg.tensor_parallel_size()
            raise ConfigError(f"--tensor-parallel {cfg.tensor_parallel} needs P={size} processes per worker, but "
                              f"{started}: start a multiple of {size}")
        if "workers" in flags and cfg.workers != workers:
            extra = " plus one server process" if server else ""
            need = cfg.processes(server)
            raise ConfigError(f"--workers {cfg.workers}{extra} needs {need} processes but "
                              f"{started}; leave --workers out (launch counts it) or start {need}")
        if workers < 1:  # (server: one process is the server's, and nothing is left for a worker)
            raise ConfigError(f"algorithm {cfg.algorithm!r} has a server, which takes a process of its own: one "
                              f"worker needs 2 processes but {started}")
        if "workers" not in flags:
            if "workers" in in_file and cfg.workers != workers:
                _note(f"--workers {workers} ({total} processes{', one of them the server' if server else ''}) "
                      f"replaces workers: {cfg.workers} of the config file")
            run_args += ["--workers", str(workers)]
            cfg = cfg.replace(workers=workers)
    try:
        check_combination(cfg.replace(backend="torch"))  # with the worker count the run will have
    except TooFewWorkers as e:
        if "workers" in flags:
            raise
        counted = f"{cfg.workers} worker{'s' if cfg.workers != 1 else ''}{' and the server' if server else ''}"
        raise ConfigError(f"--nproc-per-node {ns.nproc_per_node} starts {counted}, but {e}") from None
    if "out" in flags | in_file:  # (a default --out is a fresh folder)
        check_folder(cfg.replace(backend="torch"), single_node=str(ns.nnodes) == "1")
    if "backend" not in flags:
        run_args += ["--backend", "torch"]
    supervisor = ["-m", "gradwire.cli.supervise", "--launcher-pid", str(os.getpid())]
    if server:
        supervisor.append("--server-algorithm")  # its worker processes may be lost
    if ns.max_restarts > 0 and not {"resume", "resume_or_start"} & (flags | in_file):
        supervisor.append("--resume-on-restart")
        if not cfg.checkpoint_every:
            _note(f"--max-restarts {ns.max_restarts} without --checkpoint-every: a restarted group starts "
                  "again from step 0")
    argv = ["--nproc-per-node", str(ns.nproc_per_node), "--nnodes", str(ns.nnodes),
            "--max-restarts", str(ns.max_restarts)]
    if ns.local_addr:
        argv += ["--local-addr", ns.local_addr]
    if ns.rdzv_endpoint:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", ns.rdzv_endpoint, "--rdzv-id", ns.rdzv_id,
                 "--node-rank", str(ns.node_rank)]
    elif str(ns.nnodes) == "1":
        argv += ["--standalone"]  # rendezvous on a free local port
    else:
        raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
    return argv + supervisor + [sys.executable, "-u", "-m", "gradwire", "run", *run_args]


def check_folder(cfg, *, single_node: bool) -> None:
    """The run folder's checks, before torchrun starts anything: a folder holding a run is replaced
    only with --overwrite or continued with --resume (a refusal found by the started processes came
    back, under --max-restarts, as a restarted attempt that resumed the old run), and --resume finds
    something to continue. On several nodes the folder is rank 0's, wherever that lands: only the
    first check, which a folder absent here passes."""
    from gradwire.report.run_folder import refuse_existing, require_named
    from gradwire.run.combination import resolved
    from gradwire.run.loop import check_resume

    require_named(cfg.out)
    refuse_existing(Path(cfg.out), overwrite=cfg.overwrite, resume=cfg.resuming)
    if single_node:
        check_resume(resolved(cfg))  # AlreadyFinished: nothing to start


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="train on torch.distributed: start `run` on N processes via torchrun",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Start a `gradwire run --backend torch` group with torchrun's launcher "
                       "and rendezvous (gloo on CPU, NCCL on GPU). Rank 0 writes the run folder.")
    p.add_argument("--nproc-per-node", type=int, required=True, help="worker processes on this node")
    p.add_argument("--nnodes", default="1", help="number of nodes, or a range MIN:MAX (default 1)")
    p.add_argument("--node-rank", type=int, default=0,
                   help="this node's index (multi-node; the c10d rendezvous may order nodes itself)")
    p.add_argument("--rdzv-endpoint", default="", help="HOST:PORT of the rendezvous (multi-node)")
    p.add_argument("--rdzv-id", default="gradwire", help="job id shared by all nodes")
    p.add_argument("--ifname", default="", help="network interface for gloo/NCCL traffic "
                   "(sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)")
    p.add_argument("--local-addr", default="", help="this node's address as the rendezvous should see it")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart the group this often after a failure (restarted attempts resume from the last "
                        "checkpoint)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- run [run flags]")
    p.set_defaults(command_main=main)


def main(ns) -> int:
    """``gradwire launch``: one time stamp for the group's default --out (kept across restarts), then
    :func:`start_group`."""
    os.environ.setdefault("GRADWIRE_RUN_STAMP", time.strftime("%Y%m%d-%H%M%S"))
    return start_group(ns)


def start_group(ns) -> int:
    """Start the torchrun group (or, with --fault-tolerance, the replicas and a Lighthouse); the exit code."""
    rest = list(ns.rest or [])
    rest = rest[1:] if rest[:1] == ["--"] else rest
    if rest[:1] == ["run"]:  # --fault-tolerance, as a flag or in the --config file: replicas and a Lighthouse
        cfg = run_options(rest[1:])[0]
        if cfg.fault_tolerance != "none":
            from gradwire.fault.launch import launch_replicas
            from gradwire.run.combination import check_combination

            return launch_replicas(ns, rest[1:], cfg, check_combination)
    try:
        argv = torchrun_argv(ns)
    except AlreadyFinished as e:  # --resume of a run that finished its --steps: nothing to start
        print(f"gradwire launch: {e}")
        return 0
    notes = Path(tempfile.mkdtemp(prefix="gradwire-launch-"))
    refused, claimed = notes / "refused", notes / "claimed"
    os.environ[REFUSED_ENV] = str(refused)  # a process that refuses its configuration says so here
    if str(ns.nnodes) == "1":  # rank 0's claim of the run folder says so here (every supervisor sees it)
        os.environ[CLAIMED_ENV] = str(claimed)
    try:
        return _torchrun(ns, argv, refused)
    finally:
        for name in (REFUSED_ENV, CLAIMED_ENV):
            os.environ.pop(name, None)
        shutil.rmtree(notes, ignore_errors=True)


def _torchrun(ns, argv: list[str], refused: Path) -> int:
    if ns.ifname:  # the children inherit the environment
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = ns.ifname
    # torchrun sets OMP_NUM_THREADS=1 for its children when it is unset, with a banner each time; a
    # gradwire run sets its own threads (--threads), so the banner says nothing to our users
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # torchrun logs every failed process (at ERROR: "failed (exitcode: 2) local_rank: ..."); a refusal
    # is said once below, so those records say nothing more
    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    quiet = _SkipWhileRefused(refused)
    log.addFilter(quiet)
    try:
        return _run_torchrun(ns, argv, refused)
    finally:
        log.removeFilter(quiet)


class _SkipWhileRefused(logging.Filter):
    """Drops log records once a process has refused its configuration (``refused`` exists)."""

    def __init__(self, refused: Path):
        super().__init__()
        self.refused = refused

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.refused.exists()


def _run_torchrun(ns, argv: list[str], refused: Path) -> int:
    """torchrun's main on ``argv``; how it ended, in one line, and the exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except SignalException as e:  # torchrun has already stopped every process (SIGTERM, then SIGKILL)
        name = signal.Signals(e.sigval).name
        print(f"gradwire launch: stopped by {name}; every process was told to stop", file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:  # Ctrl-C before this node's first processes started: in the rendezvous
        # (torchrun's handlers, which raise SignalException, are installed when its processes start, and
        # stay: a stop between restarted attempts is a SignalException too)
        said = ("before its processes started (in the rendezvous); nothing of the run was written"
                if str(ns.nnodes) == "1" else "while no process of this node was running (in the rendezvous)")
        print(f"gradwire launch: stopped by SIGINT {said}", file=sys.stderr)
        return 128 + signal.SIGINT
    except ChildFailedError as e:
        if refused.exists():  # exit 2: a process refused its configuration; no restart
            for line in dict.fromkeys(refused.read_text().splitlines()):  # each process's line, each once
                print(line, file=sys.stderr)
            print("gradwire launch: error: the run refused its configuration (exit 2, its message above); no "
                  "restarted attempt ran it", file=sys.stderr)
            return 2
        failures = "; ".join(f"rank {rank} exited with {f.exitcode}" for rank, f in e.failures.items())
        print(f"gradwire launch: error: worker processes failed ({failures}); see their messages above",
              file=sys.stderr)
        return 1
    return 0
