"""The one place that chooses a run's driver (servers/driver.py) and builds it from its parts.

- an algorithm without a server: every worker steps together (``CollectiveDriver``), or under
  ``--fault-tolerance`` one torchft replica's committed steps (:class:`FaultTolerantDriver`);
- a server-mode algorithm on the simulator: ``SimulatedServer``;
- a server-mode algorithm on a real backend: ``RealServer`` on process 0, ``RealWorker`` on the
  process of each worker.
"""

from __future__ import annotations

from collections.abc import Callable

from gradwire.config import RunConfig
from gradwire.servers.driver import CollectiveDriver, Driver, DriverParts
from gradwire.servers.real import RealServer, RealWorker
from gradwire.servers.simulated import SimulatedServer


class FaultTolerantDriver(Driver):
    """One replica of a torchft job (fault/replica.py): a quorum, the step, a vote to commit it;
    its step number is the quorum's committed steps + 1 (a healed replica jumps ahead)."""

    def __init__(self, parts: DriverParts, replica):
        super().__init__(parts)
        self.replica = replica

    def step(self, step: int) -> dict:
        return self.replica.step()

    def start(self, evaluate) -> None:
        """Step 0's evaluation waits for the first quorum: a replica that joins a job under way
        (restarted, or added) has no step 0 of its own, and skips it (fault/replica.py)."""
        self.replica.at_start = evaluate


def build_driver(cfg: RunConfig, parts: DriverParts, *, process_zero: bool,
                 replica: Callable[[DriverParts], object] | None = None) -> Driver:
    """The driver of this process; ``process_zero``: the process a real server runs on;
    ``replica(parts)`` builds the torchft replica driver under ``--fault-tolerance``."""
    if parts.algorithm.needs_server:
        if cfg.backend == "sim":
            return SimulatedServer(parts)
        return RealServer(parts) if process_zero else RealWorker(parts)
    if cfg.fault_tolerance != "none":
        return FaultTolerantDriver(parts, replica(parts))
    return CollectiveDriver(parts)
