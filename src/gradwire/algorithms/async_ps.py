"""Asynchronous parameter-server SGD (Hogwild-style PS SGD; Dean et al. 2012, "Large scale
distributed deep networks", Downpour SGD; staleness as in Ho et al. 2013).

Each worker pulls the server's parameters, computes a gradient, pushes it (compressed if asked),
and pulls again without waiting for the others; the server applies every gradient the moment it
arrives. A gradient computed on parameters of version v and applied at version t has staleness
t - v. With ``max_staleness=s`` a gradient staler than s is dropped (counted, never applied) and
its worker pulls fresh parameters.

The simulator runs this as a discrete-event simulation: a worker's gradient is computed when it
pulls (the parameters it would see), and arrives compute + upload seconds later; the server
handles arrivals in time order (ties by rank). What a worker holds in flight is its pending
payload, so no replica of the model is kept per worker. One ``step`` is one round of
``world_size`` arrivals, so step k has consumed the same number of gradients as k steps of sync.
Each gradient is applied with the full learning rate.
"""

from __future__ import annotations

import heapq

from gradwire.algorithms.base import ALGORITHMS, Algorithm, Codec
from gradwire.algorithms.optim import HeavyBall
from gradwire.spec import require


@ALGORITHMS.register("async", help="asynchronous parameter-server SGD; stale gradients beyond a bound dropped",
                     params={"max_staleness": "drop gradients staler than this many updates (-1 = never)"})
class AsyncSGD(Algorithm):
    name = "async"
    evaluates = "server"

    def __init__(self, *, max_staleness: int = -1):
        require(max_staleness >= -1, f"max_staleness must be >= 0, or -1 for unbounded; got {max_staleness}")
        self.max_staleness = max_staleness

    needs_server = True  # on a real backend: a parameter-server process (gradwire/run/ps.py)

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        self.x = params.clone()
        self.opt = HeavyBall(self.x, optim)
        self.codec = Codec(ctx, codec)
        self.version = 0
        self.model_bytes = params.numel() * params.element_size()
        self.local_steps = {r: 0 for r in ctx.local_ranks}
        self.queue: list = []  # (arrival time, rank, version read, loss, payload)
        self.started = False

    def server_apply(self, buffer, read_version: int) -> int | None:
        """The server's handling of one arrival (simulator and real server alike): apply it unless
        it is staler than max_staleness; returns its staleness, or None when it was dropped."""
        stale = self.version - read_version
        if self.max_staleness >= 0 and stale > self.max_staleness:
            return None
        self.opt.apply(self.codec.decode(buffer, self.x))
        self.version += 1
        return stale

    def _start(self, ctx, rank: int, now: float) -> None:
        """Worker ``rank`` holds the current parameters at ``now``: compute and push."""
        loss, g = ctx.gradient(rank, self.x)
        packet = self.codec.encode(rank, g)
        compute = ctx.compute_time(rank, self.local_steps[rank])
        self.local_steps[rank] += 1
        upload = ctx.transport.post(packet.nbytes, rank, -1)
        heapq.heappush(self.queue, (now + compute + upload, rank, self.version, loss, packet.buffer))

    def step(self, ctx, step):
        if not self.started:  # every worker starts from the initial parameters at time 0
            for r in ctx.local_ranks:
                self._start(ctx, r, 0.0)
            self.started = True
        losses, staleness, dropped = [], [], 0
        for _ in range(ctx.world_size):
            arrival, rank, read_version, loss, buffer = heapq.heappop(self.queue)
            ctx.clock.now = max(ctx.clock.now, arrival)
            losses.append(loss)
            stale = self.server_apply(buffer, read_version)
            if stale is None:
                dropped += 1
            else:
                staleness.append(stale)
            download = ctx.transport.post(self.model_bytes, -1, rank)
            self._start(ctx, rank, ctx.clock.now + download)
        return {"loss": sum(losses) / len(losses), "gradients": len(staleness), "dropped": dropped,
                "staleness_mean": sum(staleness) / max(len(staleness), 1),
                "staleness_max": max(staleness, default=0)}

    def eval_params(self):
        return self.x

    def spec(self):
        return f"async:max_staleness={self.max_staleness}"

    def state_dict(self):
        return {"x": self.x, "opt": self.opt.state_dict(), "codec": self.codec.state_dict(),
                "version": self.version, "started": int(self.started),
                "local_steps": {str(r): n for r, n in self.local_steps.items()},
                "in_flight": [{"arrival": a, "rank": r, "version": v, "loss": loss, "payload": b}
                              for a, r, v, loss, b in sorted(self.queue)]}

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
        self.codec.load_state_dict(state["codec"])
        self.version = int(state["version"])
        self.started = bool(state["started"])
        self.local_steps = {r: int(state["local_steps"][str(r)]) for r in self.local_steps}
        self.queue = [(e["arrival"], e["rank"], e["version"], e["loss"], e["payload"]) for e in state["in_flight"]]
        heapq.heapify(self.queue)
