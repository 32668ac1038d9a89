"""The simulator's server-mode driver: the protocol's messages in simulated-event order.

Every worker computes, then sends its message to the server; the message arrives its upload time
later (the network model's price for its bytes, ``transport.send``). The server handles arrivals
in time order (ties by worker) and sends its replies; a worker that receives one applies it and
computes its next step (or sends at once what the reply asked for, e.g. a leader's upload). A
computation runs on what the worker holds when it starts; nothing touches a worker's state in
between (only replies do, and a worker has one message in flight at a time), so the gradient is
computed when the computation starts and lands ``compute_time`` later. The clock follows the
server: it reads the arrival time of the message being handled. A step ends when the algorithm
says so (``Answer.step``), e.g. after N winners (sync with backups) or n arrivals (async).

The timeline (``ctx.timeline``) gets each computation, upload and reply with its simulated times,
and the server's handling of each message (``SERVE``: instantaneous here, with the algorithm's
verdict: dropped, staleness).
"""

from __future__ import annotations

import heapq
from pathlib import Path

import torch

from gradwire.algorithms.protocol import Message
from gradwire.report.timeline import COMM, COMPUTE, DROPPED, SERVE
from gradwire.servers.driver import Driver, DriverParts
from gradwire.transports.base import SERVER


class SimulatedServer(Driver):
    """The driver of a server-mode algorithm on the simulator; its state (the messages in flight,
    the computations started) joins the run's checkpoint as ``simulated_server``."""

    def __init__(self, parts: DriverParts):
        super().__init__(parts)
        ctx = self.ctx
        self.queue: list[tuple[float, int, int]] = []  # (arrival at the server, worker, bytes) in flight
        self.counts = {w: 0 for w in ctx.local_ranks}    # computations each worker has started
        self.started = False

    def _compute(self, w: int, ready: float) -> None:
        """Worker w starts its next computation at simulated time ``ready``."""
        self.counts[w] += 1
        msg = self.algo.worker_step(self.ctx, w, self.counts[w])
        done = ready + self.algo.compute_seconds(self.ctx, w, self.counts[w])
        self.ctx.timeline.add(w, COMPUTE, ready, done, step=self.counts[w])
        self._send(msg, done)

    def _send(self, msg: Message, at: float) -> None:
        sent = self.ctx.transport.send(msg.to_wire(), msg.worker, SERVER)
        self.ctx.timeline.add(msg.worker, COMM, at, at + sent.duration_s, step=self.counts[msg.worker])
        heapq.heappush(self.queue, (at + sent.duration_s, msg.worker, msg.nbytes))

    def _deliver(self, reply: Message, at: float) -> None:
        """The server sends ``reply`` at ``at``; its worker applies it on arrival and goes on."""
        sent = self.ctx.transport.send(reply.to_wire(), SERVER, reply.worker)
        w = reply.worker
        self.ctx.timeline.add(w, COMM, at, at + sent.duration_s, step=self.counts[w], nbytes=reply.nbytes)
        received = Message.from_wire(self.ctx.transport.recv(reply.nbytes, SERVER, w))
        follow = self.algo.worker_apply(self.ctx, w, received)
        if follow is None:
            self._compute(w, at + sent.duration_s)
        else:
            follow.count = self.counts[w]
            self._send(follow, at + sent.duration_s)

    def step(self, step: int) -> dict:
        if not self.started:  # every worker starts from the initial parameters
            self.started = True
            for w in self.ctx.local_ranks:
                self._compute(w, self.ctx.clock.now)
        clock = self.ctx.clock
        while True:
            arrival, w, nbytes = heapq.heappop(self.queue)
            clock.now = max(clock.now, arrival)
            msg = Message.from_wire(self.ctx.transport.recv(nbytes, w, SERVER))
            answer = self.algo.on_message(msg, finished=False)
            self.ctx.timeline.add(w, SERVE, clock.now, clock.now, step=msg.count, nbytes=nbytes,
                                  flags=DROPPED if answer.dropped else 0, value=answer.staleness)
            for reply in answer.replies:
                self._deliver(reply, clock.now)
            if answer.step is not None:
                return answer.step

    def state_dict(self) -> dict:
        return {"simulated_server": {
            "queue": [{"arrival": torch.tensor(a, dtype=torch.float64), "worker": w, "nbytes": n}
                      for a, w, n in sorted(self.queue)],
            "counts": {str(w): c for w, c in self.counts.items()}, "started": int(self.started)}}

    def load_state_dict(self, state: dict, stepdir: Path | None = None) -> None:
        state = state["simulated_server"]
        self.queue = [(float(e["arrival"]), int(e["worker"]), int(e["nbytes"])) for e in state["queue"]]
        heapq.heapify(self.queue)
        self.counts = {w: int(state["counts"][str(w)]) for w in self.counts}
        self.started = bool(state["started"])
