"""Starting the tensor-parallel scenarios of harness.py: one process per rank from a forkserver
that has imported torch and gradwire once (a fresh interpreter per process would import torch
again in each, several seconds apiece on 2 cores), a FileStore, every exit code checked."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.forked import CONTEXT as _ctx  # its server imported torch, gradwire and harness.py

_clock = time.monotonic  # the deadline's clock (a test replaces it)


def run_scenario(scenario: str, world: int, tmp_path: Path, timeout_s: float = 120) -> list[dict]:
    """Every rank's result (its byte counters) of ``scenario`` on ``world`` gloo processes; fails
    the test when a process fails, exits non-zero or is still running ``timeout_s`` after the start
    (one deadline for all: waiting ``timeout_s`` for each in turn would let a hang take world times
    as long)."""
    from tests.parallel.harness import child

    store = tmp_path / "store"
    procs = [_ctx.Process(target=child, args=(scenario, rank, world, str(store), str(tmp_path)))
             for rank in range(world)]
    try:  # however the wait ends (pytest-timeout's exception included), no rank is left running
        for p in procs:
            p.start()
        deadline = _clock() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - _clock()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world, f"{scenario}: exit codes {codes} (stderr above)"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
