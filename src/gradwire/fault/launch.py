"""``gradwire launch --nproc-per-node N -- run ... --fault-tolerance torchft:...``: N replicas on
this machine and, unless the spec names one, a Lighthouse for them in the launcher's process.

Unlike a torchrun group, the replicas are independent processes: one that dies is restarted (up
to ``--max-restarts`` times per replica; it recovers from a peer, docs/fault_tolerance.md) while
the others keep training. Replica K writes ``OUT/replica-K``; its spec gets ``replica=K`` and the
Lighthouse's address. The run's settings are checked as ``gradwire run`` checks them, with the
replica count as ``--workers``, before anything starts; a replica that exits 2 (a ConfigError:
bad input, which a restart cannot fix) is not restarted. The launcher exits 0 once every replica
has finished with 0, 2 when every one that failed exited 2, 1 when one failed otherwise with no
restart left, 128 + the signal when stopped by SIGTERM or SIGINT (forwarded to every replica).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gradwire.errors import ConfigError
from gradwire.report.run_folder import refuse_existing, require_named
from gradwire.transports.ft_spec import parse, require_torchft

CONFIG_ERROR_EXIT = 2  # gradwire's exit status for bad input (cli/__init__.py)
# this launcher's pid, in each replica's environment: `gradwire run` reads it and ends with SIGTERM
# when the launcher dies (cli/supervise.py's die_with), so a killed launcher leaves no replica running
DIE_WITH_ENV = "GRADWIRE_DIE_WITH"


def launch_replicas(ns, run_args: list[str], cfg, check) -> int:
    """Start a Lighthouse (unless the spec names one) and ``ns.nproc_per_node`` replicas of ``gradwire
    run``; ``check(cfg)`` is every check ``gradwire run`` makes (the caller's ``check_combination``: the
    run layer sits above this one), applied with the replica count before anything starts."""
    require_torchft()
    ft = parse(cfg.fault_tolerance)
    if "replica=" in cfg.fault_tolerance:
        raise ConfigError("gradwire launch numbers the replicas itself: drop replica= from --fault-tolerance")
    if str(ns.nnodes) != "1":
        raise ConfigError("--fault-tolerance under gradwire launch runs the replicas of one node (--nnodes 1); on "
                          "several machines start each replica with gradwire run and one Lighthouse")
    n = ns.nproc_per_node
    if n < 1:
        raise ConfigError(f"--nproc-per-node {n} must be >= 1")
    if ns.max_restarts < 0:
        raise ConfigError(f"--max-restarts {ns.max_restarts} must be >= 0")
    # every check gradwire run makes, with the replica count, before a Lighthouse or a replica starts
    # (the spec has no Lighthouse yet when this launcher starts one: any address stands in for it)
    probe = cfg.fault_tolerance if ft.lighthouse else f"{cfg.fault_tolerance},lighthouse={ft.host}:1"
    check(cfg.replace(backend="torch", workers=n, fault_tolerance=probe))
    # and each replica's folder (a refusal found by one replica came after the others had started)
    require_named(cfg.out)
    for k in range(n):
        refuse_existing(Path(cfg.out) / f"replica-{k}", overwrite=cfg.overwrite, resume=cfg.resuming)
    lighthouse, spec = None, cfg.fault_tolerance
    if not ft.lighthouse:
        from torchft.coordination import LighthouseServer

        lighthouse = LighthouseServer(bind=f"{ft.host}:0", min_replicas=ft.min_replicas, join_timeout_ms=3000,
                                      heartbeat_timeout_ms=max(1000, 10 * ft.heartbeat_ms))
        spec += f",lighthouse={ft.host}:{lighthouse.address().rsplit(':', 1)[1]}"
        print(f"gradwire launch: Lighthouse at {ft.host}:{lighthouse.address().rsplit(':', 1)[1]}", file=sys.stderr)
    restarts = dict.fromkeys(range(n), 0)

    def start(k: int, again: bool) -> subprocess.Popen:
        env = dict(os.environ, TORCHELASTIC_RESTART_COUNT=str(restarts[k]),  # the run's restart count
                   **{DIE_WITH_ENV: str(os.getpid())})
        args = [*run_args, "--backend", "torch", "--workers", str(n), "--fault-tolerance", f"{spec},replica={k}",
                "--out", os.path.join(cfg.out, f"replica-{k}")] + (["--overwrite"] if again else [])
        return subprocess.Popen([sys.executable, "-u", "-m", "gradwire", "run", *args], env=env)

    procs = {k: start(k, False) for k in range(n)}
    done: dict[int, int] = {}
    stop = []
    old = {s: signal.signal(s, lambda signum, _: stop.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while len(done) < n and not stop:
            for k, p in procs.items():
                if k in done or p.poll() is None:
                    continue
                if p.returncode == CONFIG_ERROR_EXIT:
                    print(f"gradwire launch: replica {k} exited with {p.returncode} (bad input, its message is "
                          "above); not restarted", file=sys.stderr)
                    done[k] = p.returncode
                elif p.returncode != 0 and restarts[k] < ns.max_restarts:
                    restarts[k] += 1
                    print(f"gradwire launch: replica {k} ended with {p.returncode}; restarting it ({restarts[k]} of "
                          f"{ns.max_restarts}); it recovers from a peer", file=sys.stderr)
                    procs[k] = start(k, True)
                else:
                    done[k] = p.returncode
            time.sleep(0.1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(stop[0] if stop else signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:  # uninterruptible sleep outlasts even SIGKILL: say so, go on
                    print(f"gradwire launch: process {p.pid} did not exit 30 s after SIGKILL; left running",
                          file=sys.stderr)
        if lighthouse is not None:
            lighthouse.shutdown()
    if stop:
        print(f"gradwire launch: stopped by {signal.Signals(stop[0]).name}", file=sys.stderr)
        return 128 + stop[0]
    failed = {k: c for k, c in done.items() if c != 0}
    if failed:
        print("gradwire launch: error: " + "; ".join(f"replica {k} exited with {c}" for k, c in sorted(failed.items())),
              file=sys.stderr)
        return CONFIG_ERROR_EXIT if set(failed.values()) == {CONFIG_ERROR_EXIT} else 1
    return 0
