"""The simulator's server-mode driver: the protocol's messages in simulated-event order.

Every worker computes, then sends its message to the server; the message arrives its upload time
later (the network model's price for its bytes). On a star (``ps``) the uploads queue on the server's
link in the order they are ready, and the replies on its other direction (``ServerLink``): a message
ready while the link carries another waits for it. The server handles arrivals
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
from gradwire.transports.network import ServerLink

READY, ARRIVED = 0, 1  # an upload's two events: ready to go onto the server's link; at the server


class SimulatedServer(Driver):
    """The driver of a server-mode algorithm on the simulator; its state (the messages in flight,
    the computations started) joins the run's checkpoint as ``simulated_server``."""

    def __init__(self, parts: DriverParts):
        super().__init__(parts)
        ctx = self.ctx
        # uploads in flight: (time, worker, bytes, READY or ARRIVED), in time order (ties by worker)
        self.queue: list[tuple[float, int, int, int]] = []
        self.counts = {w: 0 for w in ctx.local_ranks}    # computations each worker has started
        self.started = False
        network = ctx.transport.network
        self.up, self.down = ServerLink(network), ServerLink(network)  # into the server, out of it

    def _compute(self, w: int, ready: float) -> None:
        """Worker w starts its next computation at simulated time ``ready``."""
        self.counts[w] += 1
        msg = self.algo.worker_step(self.ctx, w, self.counts[w])
        done = ready + self.algo.compute_seconds(self.ctx, w, self.counts[w])
        self.ctx.timeline.add(w, COMPUTE, ready, done, step=self.counts[w])
        self._send(msg, done)

    def _send(self, msg: Message, at: float) -> None:
        """Worker ``msg.worker``'s message is ready at ``at``; it goes onto the server's link when its turn
        comes (``_upload``, in event order)."""
        self.ctx.transport.send(msg.to_wire(), msg.worker, SERVER)
        heapq.heappush(self.queue, (at, msg.worker, msg.nbytes, READY))

    def _upload(self, w: int, ready: float, nbytes: int) -> None:
        arrival = self.up.arrival(ready, nbytes)
        self.ctx.timeline.add(w, COMM, ready, arrival, step=self.counts[w])
        heapq.heappush(self.queue, (arrival, w, nbytes, ARRIVED))

    def _deliver(self, reply: Message, at: float) -> None:
        """The server sends ``reply`` at ``at``; its worker applies it on arrival and goes on."""
        self.ctx.transport.send(reply.to_wire(), SERVER, reply.worker)
        w = reply.worker
        arrival = self.down.arrival(at, reply.nbytes)
        self.ctx.timeline.add(w, COMM, at, arrival, step=self.counts[w], nbytes=reply.nbytes)
        received = Message.from_wire(self.ctx.transport.recv(reply.nbytes, SERVER, w))
        follow = self.algo.worker_apply(self.ctx, w, received)
        if follow is None:
            self._compute(w, arrival)
        else:
            follow.count = self.counts[w]
            self._send(follow, arrival)

    def step(self, step: int) -> dict:
        if not self.started:  # every worker starts from the initial parameters
            self.started = True
            for w in self.ctx.local_ranks:
                self._compute(w, self.ctx.clock.now)
        clock = self.ctx.clock
        while True:
            at, w, nbytes, event = heapq.heappop(self.queue)
            if event == READY:
                self._upload(w, at, nbytes)
                continue
            clock.now = max(clock.now, at)
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
            "queue": [{"arrival": torch.tensor(a, dtype=torch.float64), "worker": w, "nbytes": n, "event": e}
                      for a, w, n, e in sorted(self.queue)],
            "links_free_s": torch.tensor([self.up.free_s, self.down.free_s], dtype=torch.float64),
            "counts": {str(w): c for w, c in self.counts.items()}, "started": int(self.started)}}

    def load_state_dict(self, state: dict, stepdir: Path | None = None) -> None:
        state = state["simulated_server"]
        # older checkpoints: every message in flight had arrived's time, links free
        self.queue = [(float(e["arrival"]), int(e["worker"]), int(e["nbytes"]), int(e.get("event", ARRIVED)))
                      for e in state["queue"]]
        self.up.free_s, self.down.free_s = (float(t) for t in state.get("links_free_s", torch.zeros(2)))
        heapq.heapify(self.queue)
        self.counts = {w: int(state["counts"][str(w)]) for w in self.counts}
        self.started = bool(state["started"])
