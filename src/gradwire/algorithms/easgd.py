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
reports every local step to the master (the server of ``algorithms/protocol.py``): a bare
REPORT, or after every τ of its own steps a REPORT carrying x_i, which the master answers with e
after applying it to x̃ (``elastic_at_center``): read and write at one moment, as the master's
lock makes it in the paper. Other reports are answered GO. An exchange delays only that worker's
next step. Both backends run this protocol (``gradwire/servers/``). One ``step`` is n reports.

Evaluation (``eval``) uses the center x̃ (``center``, the default), or, as LSGD and local SGD can
(so that comparisons evaluate like for like), the workers' mean at evaluation (``average``) or
every worker (``each``); see ``replicas.EvaluatedReplicas``. The asynchronous form evaluates the
center only: its master holds nothing else.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import Algorithm, Rounds, nested
from gradwire.algorithms.optim import require_constant_lr
from gradwire.algorithms.protocol import ELASTIC, GO, JOIN, REPORT, Answer, Message, as_body
from gradwire.algorithms.replicas import (
    EvaluatedReplicas,
    Pace,
    Replicas,
    mean_or_nan,
    register_with_async_key,
    require_plain_codec,
)
from gradwire.spec import require

EVAL_CHOICES = ("center", "average", "each")


class EASGD(Algorithm):
    name = "easgd"
    default_lr = 0.8  # --lr when not given (docs/defaults.md)

    def __init__(self, *, alpha: float = 0.0, beta: float = 0.9, period: int = 2, eval: str = "center",
                 asynchronous: bool = False):
        require(0 <= alpha <= 1, f"alpha must be in [0, 1] (0 = beta / workers), got {alpha}")
        require(0 <= beta <= 1, f"beta must be in [0, 1], got {beta}")
        require(period >= 1, f"period must be >= 1 (local steps between communications), got {period}")
        require(eval in EVAL_CHOICES, f"eval={eval!r}: valid choices are {', '.join(EVAL_CHOICES)}")
        require(not asynchronous or eval == "center", f"eval={eval} does not apply with async=true: the master "
                "holds only the center (valid choice: center)")
        self.alpha_arg, self.beta, self.period, self.asynchronous = alpha, beta, period, asynchronous
        self.evaluates = eval

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_plain_codec(codec, "easgd")
        if self.asynchronous:
            require_constant_lr(optim, "easgd:async=true (each worker's updates, at its own pace, are not the run's "
                                "steps)")
        self.alpha = self.alpha_arg or self.beta / ctx.world_size
        self.replicas = Replicas(ctx, params, optim)
        # async: the master's x̃ lives where the master runs (on a real backend process 0; a worker's
        # process neither uses nor checkpoints it)
        self.center = params.clone() if not self.asynchronous or ctx.transport.holds_server else None
        self.world_size = ctx.world_size
        if self.asynchronous:
            self.local_steps = {w: 0 for w in range(ctx.world_size)}  # as reported to the master
            self.round: dict = {"losses": [], "exchanges": 0, "distances": []}  # this step's, at the master
        else:
            self.pace = Pace(ctx)
            if self.evaluates != "center":
                self.evaluated = EvaluatedReplicas(ctx, params, self.evaluates)

    @property
    def needs_server(self) -> bool:
        """Asynchronous EASGD has a master holding x̃ (a process of its own on a real backend)."""
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
        return self._sync_step(ctx, step)  # async=true runs in server mode

    def _sync_step(self, ctx, step: int) -> dict:
        x = self.replicas.x
        losses = [self.replicas.sgd_step(ctx, r) for r in ctx.local_ranks]
        self.pace.computed(ctx, step)
        info = {"loss": mean_or_nan(losses), "gradients": ctx.world_size}
        if step % self.period == 0:
            mean = ctx.transport.allreduce_mean(dict(x))
            info["center_distance"] = mean_or_nan(float(torch.dist(t, self.center)) for t in x.values())
            for t in x.values():
                t.lerp_(self.center, self.alpha)   # eq. (5), with x̃ from before the round
            self.center.lerp_(mean.to(self.center.dtype), self.beta)  # eq. (6)
            self.pace.joined(ctx)
        return info

    # -- async: the protocol --------------------------------------------------------------------------

    def worker_step(self, ctx, rank, count):
        loss = self.replicas.sgd_step(ctx, rank)
        body = as_body(self.replicas.x[rank]) if self.exchange_due(count) else None
        return Message(REPORT, rank, count=count, value=loss, body=body)

    def on_message(self, msg, finished):
        w, answer = msg.worker, Answer()
        self.local_steps[w] = msg.count
        if msg.body is None:
            answer.replies.append(Message(GO, w))
        else:  # an exchange, answered even after the last step
            elastic = self.elastic_at_center(msg.tensor(self.center))
            self.round["distances"].append(float(elastic.norm()) / self.alpha if self.alpha else 0.0)
            self.round["exchanges"] += 1
            answer.replies.append(Message(ELASTIC, w, body=as_body(elastic)))
        if finished:
            return answer
        self.round["losses"].append(msg.value)
        if len(self.round["losses"]) == self.world_size:
            answer.step = {"loss": mean_or_nan(self.round["losses"]), "gradients": self.world_size,
                           "exchanges": self.round["exchanges"]}
            if self.round["distances"]:
                answer.step["center_distance"] = mean_or_nan(self.round["distances"])
            self.round = {"losses": [], "exchanges": 0, "distances": []}
        return answer

    def worker_apply(self, ctx, rank, reply):
        x = self.replicas.x[rank]
        if reply.kind == ELASTIC:
            x.sub_(reply.tensor(x))
        elif reply.kind == JOIN:  # fresh momentum, from the center
            x.copy_(reply.tensor(x))
        return None

    def join_reply(self, worker):
        return Message(JOIN, worker, body=as_body(self.center))

    def before_evaluation(self, ctx):
        if self.evaluates != "center":
            self.evaluated.refresh(ctx, self.replicas)

    def evaluated_rounds(self):
        """The center (eval=center) changes at each communication, every τ steps (synchronous form; the
        asynchronous one exchanges as each worker's own count reaches τ, not at a step known before)."""
        if self.evaluates != "center" or self.asynchronous:
            return None
        return Rounds(first=self.period, period=self.period, delay=0, first_is=f"period={self.period}",
                      round="communication round",
                      remedy="lower period, or evaluate the workers' mean (easgd:eval=average)")

    def eval_params(self):
        return self.center if self.evaluates == "center" else self.evaluated.params

    def spec(self):  # not spec_of: alpha as resolved at setup (0 -> beta / workers), eval and async only when set
        return (f"easgd:alpha={self.alpha:g},beta={self.beta:g},period={self.period}"
                + (f",eval={self.evaluates}" if self.evaluates != "center" else "")
                + (",async=true" if self.asynchronous else ""))

    def per_worker_state(self) -> tuple[str, ...]:
        return nested("replicas", self.replicas) + (() if self.asynchronous else nested("pace", self.pace))

    def state_dict(self):
        state = {"replicas": self.replicas.state_dict()}
        if self.center is not None:
            state["center"] = self.center
        if self.asynchronous:
            state["local_steps"] = {str(w): n for w, n in self.local_steps.items()}
            state["round"] = {"losses": torch.tensor(self.round["losses"], dtype=torch.float64),
                              "exchanges": self.round["exchanges"],
                              "distances": torch.tensor(self.round["distances"], dtype=torch.float64)}
        else:
            state["pace"] = self.pace.state_dict()
            if self.evaluates != "center":
                state["evaluated"] = self.evaluated.state_dict()
        return state

    def load_state_dict(self, state):
        self.replicas.load_state_dict(state["replicas"])
        if self.center is not None:
            self.center.copy_(state["center"])
        if self.asynchronous:
            self.local_steps = {w: int(state["local_steps"][str(w)]) for w in self.local_steps}
            r = state["round"]
            self.round = {"losses": r["losses"].tolist(), "exchanges": int(r["exchanges"]),
                          "distances": r["distances"].tolist()}
        else:
            self.pace.load_state_dict(state["pace"])
            if self.evaluates != "center":
                self.evaluated.load_state_dict(state["evaluated"])


register_with_async_key(
    "easgd", EASGD, help="elastic averaging SGD (Zhang 2015): workers tied to a center variable; sync, async",
    params={"alpha": "elastic pull α of a worker towards the center, in [0, 1] (0 = beta / workers)",
            "beta": "moving rate β of the center towards the workers' mean, in [0, 1] (paper: 0.9)",
            "period": "τ >= 1: local steps between elastic rounds (async: each worker's own steps; the default: "
                      "docs/defaults.md)",
            "eval": "what is evaluated: center (default), average (the workers' mean), each (every worker); "
                    "async=true: center only",
            "asynchronous": "event-driven asynchronous EASGD: each worker exchanges with the master alone"})
