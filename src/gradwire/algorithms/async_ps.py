"""Asynchronous parameter-server SGD (Hogwild-style PS SGD; Dean et al. 2012, "Large scale
distributed deep networks", Downpour SGD; staleness as in Ho et al. 2013).

Each worker pulls the server's parameters, computes a gradient, pushes it (compressed if asked),
and pulls again without waiting for the others; the server applies every gradient the moment it
arrives. A gradient computed on parameters of version v and applied at version t has staleness
t - v. With ``max_staleness=s`` a gradient staler than s is dropped (counted, never applied) and
its worker pulls fresh parameters.

The protocol (``algorithms/protocol.py``): a worker sends GRADIENT (tagged with the parameter
version it read, the loss as its value, the compressed gradient as its body); the server applies
it (``server_apply``) and answers PARAMS with the current parameters and their version, which the
worker computes at next. Both backends run exactly this (``gradwire/servers/``): the simulator in
arrival order on its clock (a gradient arrives compute + upload seconds after its worker received
parameters), a real backend in the order the messages reach the server. One ``step`` is one round
of ``world_size`` arrivals, so step k has consumed the same number of gradients as k steps of
sync. Each gradient is applied with the full learning rate.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, make_averager
from gradwire.algorithms.optim import make_optimizer, require_constant_lr
from gradwire.algorithms.protocol import JOIN, PARAMS, Answer, GradientWorkers, Message, as_body
from gradwire.spec import require


@ALGORITHMS.register("async", help="asynchronous parameter-server SGD; stale gradients beyond a bound dropped",
                     params={"max_staleness": "drop gradients staler than this many updates (-1 = never)"})
class AsyncSGD(Algorithm):
    name = "async"
    default_lr = 0.2  # --lr when not given (docs/defaults.md); stale gradients want smaller steps
    lr_scales_with_task = False  # its step is bounded by the gradients' staleness (docs/defaults.md)
    evaluates = "server"

    def __init__(self, *, max_staleness: int = -1):
        require(max_staleness >= -1, f"max_staleness must be >= 0, or -1 for unbounded; got {max_staleness}")
        self.max_staleness = max_staleness

    needs_server = True
    default_compressor = "none"  # gradients travel as they are unless --compressor says otherwise

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        self.world_size = ctx.world_size
        require_constant_lr(optim, "async (its server applies every worker's gradient, world_size updates a step)")
        # the server's parameters and optimizer, in the process that holds the server only
        self.serves = ctx.transport.holds_server
        self.x = params.clone() if self.serves else None
        self.opt = make_optimizer(self.x, optim) if self.serves else None
        self.averager = make_averager(ctx, codec)
        self.version = 0
        self.workers = GradientWorkers(ctx.local_ranks, params, first_tag=0)  # tag: the version read
        self.round: list[tuple[float, int | None]] = []           # this step's (loss, staleness)

    def compressor_spec(self):
        return self.averager.spec()

    def server_apply(self, buffer, read_version: int) -> int | None:
        """Apply one gradient unless it is staler than max_staleness; returns its staleness, or
        None when it was dropped."""
        stale = self.version - read_version
        if self.max_staleness >= 0 and stale > self.max_staleness:
            return None
        self.opt.apply(self.averager.decode(buffer, self.x))
        self.version += 1
        return stale

    def worker_step(self, ctx, rank, count):
        return self.workers.message(ctx, rank, count, self.averager)

    def _params(self, worker: int) -> Message:
        return Message(PARAMS, worker, tag=self.version, body=as_body(self.x))

    def on_message(self, msg, finished):
        if finished:  # after the last step: nothing more is applied
            return Answer([self._params(msg.worker)])
        stale = self.version - msg.tag
        self.round.append((msg.value, self.server_apply(msg.body, msg.tag)))
        answer = Answer([self._params(msg.worker)], dropped=self.round[-1][1] is None, staleness=stale)
        if len(self.round) == self.world_size:
            staleness = [s for _, s in self.round if s is not None]
            answer.step = {"loss": sum(loss for loss, _ in self.round) / len(self.round),
                           "gradients": len(staleness), "dropped": len(self.round) - len(staleness),
                           "staleness_mean": sum(staleness) / max(len(staleness), 1),
                           "staleness_max": max(staleness, default=0)}
            self.round = []
        return answer

    def worker_apply(self, ctx, rank, reply):
        self.workers.apply(rank, reply)
        return None

    def join_reply(self, worker):
        return Message(JOIN, worker, tag=self.version, body=as_body(self.x))

    def step(self, ctx, step):
        raise NotImplementedError("async runs in server mode (gradwire/servers/)")

    def eval_params(self):
        return self.x

    def state_dict(self):
        """The codec and the local workers; where this process holds the server, its parameters,
        optimizer, version and the step's arrivals too."""
        state = {"codec": self.averager.state_dict(), "workers": self.workers.state_dict()}
        if self.serves:
            state |= {"x": self.x, "opt": self.opt.state_dict(), "version": self.version,
                      "round": [{"loss": torch.tensor(loss, dtype=torch.float64), "staleness": -1 if s is None else s}
                                for loss, s in self.round]}
        return state

    def load_state_dict(self, state):
        self.averager.load_state_dict(state["codec"])
        self.workers.load_state_dict(state["workers"])
        if self.serves:
            self.x.copy_(state["x"])
            self.opt.load_state_dict(state["opt"])
            self.version = int(state["version"])
            self.round = [(float(e["loss"]), None if int(e["staleness"]) < 0 else int(e["staleness"]))
                          for e in state["round"]]
