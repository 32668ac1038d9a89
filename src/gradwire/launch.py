"""``gradwire launch``: torchrun's own launcher and rendezvous, with the command line built for you.

Every process runs ``gradwire run --backend torch``; ``--workers`` is the number of processes, less
one when the algorithm has a server (it takes a process of its own). Nothing of ours listens on a
port: the rendezvous is torchrun's (``torch.distributed.run.main``).
"""

from __future__ import annotations

import os
import sys

from gradwire.errors import ConfigError

EPILOG_LAUNCH = """examples:
  gradwire launch --nproc-per-node 4 -- run --task mnist1d-cnn --algorithm diana --steps 500 --out runs/d4
  # two machines, 2 processes each (run the same line on both, --node-rank 0 and 1):
  gradwire launch --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint HOST:29400 -- run ...
  # restart the whole group up to 3 times after a failure; resume from the last checkpoint:
  gradwire launch --nproc-per-node 2 --max-restarts 3 -- run --checkpoint-every 50 --resume ...
Everything after -- is a `gradwire run` command line; --backend torch and --workers are added."""


def torchrun_argv(ns) -> list[str]:
    """torchrun's own command line for ``gradwire launch`` (its launcher and rendezvous, not ours)."""
    rest = list(ns.rest or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest or rest[0] != "run":
        raise ConfigError("launch needs a run command after --, e.g. gradwire launch --nproc-per-node 2 -- run ...")
    if ns.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node {ns.nproc_per_node} must be >= 1")
    if not str(ns.nnodes).isdigit() and "--workers" not in rest:
        raise ConfigError(f"--nnodes {ns.nnodes} is a range: pass --workers explicitly in the run command")
    run_args = rest[1:]
    if "--backend" not in run_args:
        run_args += ["--backend", "torch"]
    if "--workers" not in run_args:
        total = int(ns.nnodes) * ns.nproc_per_node
        run_args += ["--workers", str(total - int(_needs_server(run_args)))]
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
    return argv + ["-m", "gradwire", "run", *run_args]


def _needs_server(run_args: list[str]) -> bool:
    """Whether the run's algorithm has a server, which takes a process of its own on torch."""
    from gradwire.algorithms import ALGORITHMS

    spec = run_args[run_args.index("--algorithm") + 1] if "--algorithm" in run_args[:-1] else "sync"
    return ALGORITHMS.build(spec).needs_server


def cmd_launch(ns) -> int:
    argv = torchrun_argv(ns)
    if ns.ifname:  # the children inherit the environment
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = ns.ifname
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as e:
        failures = "; ".join(f"rank {rank} exited with {f.exitcode}" for rank, f in e.failures.items())
        print(f"gradwire launch: error: worker processes failed ({failures}); see their messages above",
              file=sys.stderr)
        return 1
    return 0
