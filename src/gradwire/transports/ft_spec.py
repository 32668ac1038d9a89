"""``--fault-tolerance``: the spec string and the checks that refuse settings that cannot work.

``torchft:min_replicas=2,timeout_s=30,quorum_timeout_s=60,lighthouse=HOST:PORT,replica=K`` runs
this process as replica ``K`` (0 <= K < --workers) of a torchft job: a Lighthouse at ``HOST:PORT``
forms a quorum of the live replicas at every step (docs/fault_tolerance.md). ``none`` (the
default) is the plain torch backend.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass

from gradwire.errors import ConfigError
from gradwire.spec import convert, parse_spec

INSTALL = "pip install 'gradwire[ft]'"
KEYS = ("min_replicas", "start_replicas", "timeout_s", "quorum_timeout_s", "heartbeat_ms", "lighthouse", "replica",
        "host", "max_retries")


@dataclass(frozen=True)
class FaultTolerance:
    min_replicas: int = 1        # a step commits only with at least this many replicas in its quorum
    start_replicas: int = 0      # replicas the first step waits for (0: every one of --workers)
    timeout_s: float = 30.0      # a collective, a should_commit vote, a state transfer
    quorum_timeout_s: float = 60.0  # the longest wait for a quorum, and for the replicas a step needs
    heartbeat_ms: int = 100      # how often a replica tells the Lighthouse it lives
    lighthouse: str = ""         # HOST:PORT of the Lighthouse (gradwire launch starts one)
    replica: int = 0             # this process's replica index = its worker rank and data shard
    host: str = "127.0.0.1"      # the address this replica's servers advertise to its peers
    max_retries: int = 10        # retries of a step whose commit vote failed (max_retries + 1 failed votes in
                                 # a row end the run: torchft's own meaning of it)

    @property
    def lighthouse_url(self) -> str:
        return self.lighthouse if "://" in self.lighthouse else f"http://{self.lighthouse}"


def parse(spec: str) -> FaultTolerance | None:
    """The spec as a record (None for ``none``); ConfigError naming the bad key or value."""
    name, raw = parse_spec(spec)
    if name == "none" and not raw:
        return None
    if name != "torchft":
        raise ConfigError(f"fault_tolerance={spec!r}: valid choices are none, torchft:min_replicas=N,timeout_s=S,"
                          "lighthouse=HOST:PORT,replica=K")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"fault_tolerance={spec!r}: unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
    types = {f: type(getattr(FaultTolerance(), f)) for f in KEYS}
    ft = FaultTolerance(**{k: convert(v, types[k], what=f"fault_tolerance key {k}") for k, v in raw.items()})
    if ft.lighthouse:
        address = ft.lighthouse.split("://", 1)[-1]  # (http://HOST:PORT as torchft writes it is fine too)
        host, colon, port = address.rpartition(":")
        if not (colon and host and "/" not in address and port.isascii() and port.isdigit()
                and 1 <= int(port) <= 65535):
            raise ConfigError(f"fault_tolerance lighthouse={ft.lighthouse!r} must be HOST:PORT with a port in "
                              "[1, 65535], e.g. lighthouse=127.0.0.1:29510")
    return ft


def require_torchft() -> None:
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError(f"--fault-tolerance torchft needs the torchft package, which is not installed: {INSTALL}")


def check(spec: str, *, workers: int, backend: str, step_timeout_s: float, needs_server: bool,
          tensor_parallel: str, carries_rounds: bool = False) -> FaultTolerance | None:
    """Every check of a ``--fault-tolerance`` spec against the run, one line each."""
    ft = parse(spec)
    if ft is None:
        return None
    require_torchft()
    if backend != "torch":
        raise ConfigError(f"fault_tolerance={spec!r} needs --backend torch, not {backend!r}")
    if needs_server or tensor_parallel:
        raise ConfigError(f"fault_tolerance={spec!r} runs allreduce algorithms of one process per replica; "
                          "server-mode algorithms and --tensor-parallel are not supported with it")
    if carries_rounds:
        raise ConfigError(f"fault_tolerance={spec!r}: the algorithm keeps a collective round in flight across "
                          "steps (streaming-diloco with overlap > 0 or eager=true, dasgd with delay > 0), which a "
                          "quorum change would cut; use streaming-diloco with overlap=0 and no eager (or diloco), "
                          "or dasgd:delay=0 (or local)")
    if not ft.lighthouse:
        raise ConfigError(f"fault_tolerance={spec!r} needs lighthouse=HOST:PORT (gradwire launch "
                          "--fault-tolerance starts one)")
    if not 1 <= ft.min_replicas <= workers:
        raise ConfigError(f"fault_tolerance min_replicas={ft.min_replicas} must be in [1, --workers {workers}]")
    if not (ft.start_replicas == 0 or ft.min_replicas <= ft.start_replicas <= workers):
        raise ConfigError(f"fault_tolerance start_replicas={ft.start_replicas} must be 0 (every replica) or in "
                          f"[min_replicas {ft.min_replicas}, --workers {workers}]")
    if not 0 <= ft.replica < workers:
        raise ConfigError(f"fault_tolerance replica={ft.replica} must be in [0, --workers {workers})")
    if not (0 < ft.timeout_s <= threading.TIMEOUT_MAX and 0 < ft.quorum_timeout_s <= threading.TIMEOUT_MAX
            and ft.heartbeat_ms > 0 and ft.max_retries >= 0):
        raise ConfigError(f"fault_tolerance={spec!r}: timeouts must be > 0 and finite (at most "
                          f"{threading.TIMEOUT_MAX:g} s), heartbeat_ms > 0, max_retries >= 0")
    if ft.heartbeat_ms >= 1000 * ft.timeout_s:
        # deaths are decided by the Lighthouse (a replica silent for its heartbeat_timeout_ms is left
        # out), which must hear a live one more often than that; a dead one is left out within one
        # quorum request (at most timeout_s) only if heartbeat_timeout_ms < timeout_s
        raise ConfigError(f"fault_tolerance heartbeat_ms={ft.heartbeat_ms} must be shorter than timeout_s="
                          f"{ft.timeout_s:g} s: the Lighthouse's heartbeat_timeout_ms must lie between the two (above "
                          "it a live replica is left out between heartbeats; below timeout_s a dead one is left out "
                          "within one quorum request)")
    if ft.quorum_timeout_s < ft.timeout_s:
        raise ConfigError(f"fault_tolerance quorum_timeout_s={ft.quorum_timeout_s:g} is shorter than timeout_s="
                          f"{ft.timeout_s:g}: a quorum waits for the slowest replica's last step (a collective "
                          "of up to timeout_s), so it would give up on live replicas")
    if ft.timeout_s > step_timeout_s:
        raise ConfigError(f"fault_tolerance timeout_s={ft.timeout_s:g} exceeds --timeout-s {step_timeout_s:g}: "
                          "the run would give up on a step before torchft's collective timeout could report it")
    return ft
