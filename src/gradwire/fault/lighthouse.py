"""``python -m gradwire.fault.lighthouse``: a torchft Lighthouse for a ``--fault-tolerance`` job.

    python -m gradwire.fault.lighthouse --bind 0.0.0.0:29510 --min-replicas 2

prints its address, then serves until SIGTERM or SIGINT. The replicas point at it with
``--fault-tolerance torchft:...,lighthouse=HOST:29510`` (docs/fault_tolerance.md).
"""

from __future__ import annotations

import argparse
import signal
import sys

from gradwire.transports.ft_spec import require_torchft


def main(argv: list[str] | None = None) -> int:
    # SIGTERM and SIGINT are blocked before any thread starts (torch's, the server's: they inherit
    # the mask) and taken with sigwait: a handler would run only once the main thread woke, and a
    # signal that the kernel hands to another thread does not wake it (a stop once went unheard);
    # one sent before the wait, right after the address is printed, stays pending until it
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    p = argparse.ArgumentParser(prog="python -m gradwire.fault.lighthouse", description=__doc__.splitlines()[0])
    p.add_argument("--bind", default="0.0.0.0:29510", help="HOST:PORT to listen on (port 0: a free one)")
    p.add_argument("--min-replicas", type=int, default=1, help="a quorum needs at least this many replicas")
    p.add_argument("--join-timeout-ms", type=int, default=3000,
                   help="how long a quorum waits for a live replica that has not asked yet")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000,
                   help="a replica silent this long is left out of the next quorum")
    ns = p.parse_args(argv)
    if ns.min_replicas < 1 or ns.join_timeout_ms < 0 or ns.heartbeat_timeout_ms < 1:
        p.error("--min-replicas and --heartbeat-timeout-ms must be >= 1, --join-timeout-ms >= 0")
    require_torchft()
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=ns.bind, min_replicas=ns.min_replicas, join_timeout_ms=ns.join_timeout_ms,
                              heartbeat_timeout_ms=ns.heartbeat_timeout_ms)
    print(f"gradwire lighthouse: listening on {server.address()}", flush=True)
    signal.sigwait(stop)
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
