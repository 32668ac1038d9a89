"""Elastic averaging SGD (Zhang, Choromanska, LeCun 2015, "Deep learning with elastic averaging
SGD", NeurIPS): the comparison the LSGD paper makes.

Workers are tied by an elastic force to a *center variable* x̃ (objective Σ_i f(x_i) + ρ/2
||x_i - x̃||², their eq. (2)). With α = ηρ the synchronous update, every τ steps, is

    x_i <- x_i - α (x_i - x̃)                                  (Zhang et al. 2015, eq. (5))
    x̃  <- x̃ + β (mean_i x_i - x̃),   β = pα for p workers     (Zhang et al. 2015, eq. (6))

both with the x_i and x̃ from before the round (the forces are symmetric). As in ``lsgd``, the
gradient step and the elastic step are split: local heavy-ball steps, then the elastic round on
the result, whose only communication is one allreduce of the parameters; every process then holds
the same x̃. The paper fixes β (0.9) and sets α = β/p; ``alpha=0`` does that.

``async=true`` is their asynchronous EASGD (Zhang et al. 2015, Algorithm 1): a worker that has
completed τ of its own local steps reads x̃ from the master, computes the elastic difference
e = α (x_i - x̃), and applies x_i <- x_i - e while the master applies x̃ <- x̃ + e. Here the worker
sends x_i and the master (the coordinator, ``gradwire/run/coordinator.py`` on the torch backend)
computes e, applies it to x̃ and sends e back (``elastic_at_center``): the same arithmetic on
both sides, read and write at one moment, as the master's lock makes it in the paper. Between
exchanges a worker only reports each step (a header each way, ``replicas.HEADER_BYTES``); an
exchange is a model each way and delays only that worker's next step. The simulator runs this
event-driven and prices exactly these messages. One ``step`` is n gradient computations.
Evaluation uses the center x̃ (``evaluates = "center"``).
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import Algorithm
from gradwire.algorithms.replicas import (
    HEADER_BYTES,
    LocalSteps,
    Pace,
    Replicas,
    mean_of,
    register_with_async_key,
    require_plain_codec,
)
from gradwire.spec import require


class EASGD(Algorithm):
    name = "easgd"
    evaluates = "center"

    def __init__(self, *, alpha: float = 0.0, beta: float = 0.9, period: int = 4, asynchronous: bool = False):
        require(0 <= alpha <= 1, f"alpha must be in [0, 1] (0 = beta / workers), got {alpha}")
        require(0 <= beta <= 1, f"beta must be in [0, 1], got {beta}")
        require(period >= 1, f"period must be >= 1 (local steps between communications), got {period}")
        self.alpha_arg, self.beta, self.period, self.asynchronous = alpha, beta, period, asynchronous

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_plain_codec(codec, "easgd")
        self.alpha = self.alpha_arg or self.beta / ctx.world_size
        self.replicas = Replicas(ctx, params, optim)
        self.center = params.clone()
        self.model_bytes = params.numel() * params.element_size()
        if self.asynchronous:
            self.events = LocalSteps(ctx, self.replicas)  # the simulator's event queue
        else:
            self.pace = Pace(ctx)

    server_protocol = "coordinator"  # async on a real backend: gradwire/run/coordinator.py

    @property
    def needs_server(self) -> bool:
        """Asynchronous EASGD has a master holding x̃: on a real backend one more process."""
        return self.asynchronous

    def exchange_due(self, count: int) -> bool:
        """Whether a worker exchanges with the master after its ``count``-th local step."""
        return count % self.period == 0

    def elastic_at_center(self, x_i: torch.Tensor) -> torch.Tensor:
        """The master's side of an exchange: e = α (x_i - x̃), x̃ <- x̃ + e; returns e, which the
        worker subtracts from the x_i it sent."""
        elastic = (x_i - self.center).mul_(self.alpha)
        self.center.add_(elastic)
        return elastic

    def step(self, ctx, step):
        return self._async_step(ctx) if self.asynchronous else self._sync_step(ctx, step)

    def _sync_step(self, ctx, step: int) -> dict:
        x = self.replicas.x
        losses = [self.replicas.sgd_step(ctx, r) for r in ctx.local_ranks]
        self.pace.computed(ctx, step)
        info = {"loss": mean_of(losses), "gradients": ctx.world_size}
        if step % self.period == 0:
            mean = ctx.transport.allreduce_mean(dict(x))
            info["center_distance"] = mean_of(float(torch.dist(t, self.center)) for t in x.values())
            for t in x.values():
                t.lerp_(self.center, self.alpha)   # eq. (5), with x̃ from before the round
            self.center.lerp_(mean.to(self.center.dtype), self.beta)  # eq. (6)
            self.pace.joined(ctx)
        return info

    def _async_step(self, ctx) -> dict:
        self.events.begin(ctx)
        losses, exchanges, distances = [], 0, []
        post = ctx.transport.post
        for _ in range(ctx.world_size):
            finish, r, loss = self.events.complete(ctx)
            losses.append(loss)
            if self.exchange_due(self.events.completed[r]):
                up = post(HEADER_BYTES + self.model_bytes, r, -1)     # x_i to the master
                elastic = self.elastic_at_center(self.replicas.x[r])
                distances.append(float(elastic.norm()) / self.alpha if self.alpha else 0.0)
                self.replicas.x[r].sub_(elastic)
                down = post(HEADER_BYTES + self.model_bytes, -1, r)   # e back
                exchanges += 1
            else:  # the step's report and its answer
                up, down = post(HEADER_BYTES, r, -1), post(HEADER_BYTES, -1, r)
            self.events.start(ctx, r, finish + up + down)
        info = {"loss": mean_of(losses), "gradients": ctx.world_size, "exchanges": exchanges}
        if distances:
            info["center_distance"] = mean_of(distances)
        return info

    def eval_params(self):
        return self.center

    def spec(self):
        return (f"easgd:alpha={self.alpha:g},beta={self.beta:g},period={self.period}"
                + (",async=true" if self.asynchronous else ""))

    def state_dict(self):
        state = {"replicas": self.replicas.state_dict(), "center": self.center}
        if self.asynchronous:
            state["events"] = self.events.state_dict()
        else:
            state["pace"] = self.pace.state_dict()
        return state

    def load_state_dict(self, state):
        self.replicas.load_state_dict(state["replicas"])
        self.center.copy_(state["center"])
        if self.asynchronous:
            self.events.load_state_dict(state["events"])
        else:
            self.pace.load_state_dict(state["pace"])


register_with_async_key(
    "easgd", EASGD, help="elastic averaging SGD (Zhang 2015): workers tied to a center variable; sync, async",
    params={"alpha": "elastic pull α of a worker towards the center, in [0, 1] (0 = beta / workers)",
            "beta": "moving rate β of the center towards the workers' mean, in [0, 1] (paper: 0.9)",
            "period": "τ >= 1: local steps between elastic rounds (async: each worker's own steps)",
            "asynchronous": "event-driven asynchronous EASGD: each worker exchanges with the master alone"})
