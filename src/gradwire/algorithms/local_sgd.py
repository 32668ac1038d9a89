"""Local SGD, also called periodic or model averaging (Stich 2019, "Local SGD converges fast and
communicates little", ICLR, Algorithm 1; Lin, Stich, Patel, Jaggi 2020, "Don't use large
mini-batches, use local SGD", ICLR).

Every worker takes local (heavy-ball) SGD steps on its own replica, and every ``period`` = τ steps
the replicas are replaced by their average, one allreduce of the parameters:

    x_i <- x_i - γ g_i(x_i)  at every step;   x_i <- (1/n) Σ_j x_j  when τ divides the step.

Momentum buffers stay local (Lin et al. 2020 do the same): averaging them as well would double the
bytes. τ = 1 without momentum is synchronous SGD; with momentum too, since averaging is linear.
Between averagings fast workers run ahead of slow ones, so a round waits for the slowest worker's
*sum* of τ compute times rather than τ times the slowest step.

Evaluation (``eval``) uses the average of the last round (``last_average``, the default: every
process holds it, no communication), or, as LSGD and EASGD can (so comparisons evaluate like for
like), the workers' mean at the evaluation step (``average``, which equals ``last_average`` at a
round) or every worker (``each``); see ``replicas.EvaluatedReplicas``.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, Rounds, nested
from gradwire.algorithms.replicas import EvaluatedReplicas, Pace, Replicas, mean_or_nan, require_plain_codec
from gradwire.spec import require

EVAL_CHOICES = ("last_average", "average", "each")


@ALGORITHMS.register("local", help="local SGD (Stich 2019): local steps, parameters averaged every τ steps",
                     params={"period": "τ >= 1: local steps between averagings (1 = synchronous SGD)",
                             "eval": "what is evaluated: last_average (the last round's; default), average (the "
                                     "workers' mean at evaluation), each (every worker)"})
class LocalSGD(Algorithm):
    name = "local"
    default_lr = 0.8  # --lr when not given (docs/defaults.md) (dasgd inherits it)

    def __init__(self, *, period: int = 4, eval: str = "last_average"):
        require(period >= 1, f"period must be >= 1 (local steps between averagings), got {period}")
        require(eval in EVAL_CHOICES, f"eval={eval!r}: valid choices are {', '.join(EVAL_CHOICES)}")
        self.period, self.evaluates = period, eval

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_plain_codec(codec, self.name)
        self.replicas = Replicas(ctx, params, optim)
        self.pace = Pace(ctx)
        self.average = params.clone()
        if self.evaluates != "last_average":
            self.evaluated = EvaluatedReplicas(ctx, params, self.evaluates)

    def local_steps(self, ctx, step: int) -> dict:
        losses = [self.replicas.sgd_step(ctx, r) for r in ctx.local_ranks]
        self.pace.computed(ctx, step)
        return {"loss": mean_or_nan(losses), "gradients": ctx.world_size}

    def adopt(self, average: torch.Tensor, info: dict) -> None:
        """Every local replica becomes ``average``; records how far apart they had drifted."""
        info["spread"] = mean_or_nan(float(torch.dist(x, average)) for x in self.replicas.x.values())
        for x in self.replicas.x.values():
            x.copy_(average)
        self.average.copy_(average)

    def step(self, ctx, step):
        info = self.local_steps(ctx, step)
        if step % self.period == 0:
            self.adopt(ctx.transport.allreduce_mean(dict(self.replicas.x)), info)
            self.pace.joined(ctx)
        return info

    def before_evaluation(self, ctx):
        if self.evaluates != "last_average":
            self.evaluated.refresh(ctx, self.replicas)

    def evaluated_rounds(self):
        """The last average (eval=last_average) changes at each averaging, every τ steps; the workers'
        mean or each worker at every step."""
        if self.evaluates != "last_average":
            return None
        return Rounds(first=self.period, period=self.period, delay=0, first_is=f"period={self.period}",
                      round="averaging", remedy="lower period, or evaluate the workers' mean (local:eval=average)")

    def eval_params(self):
        return self.average if self.evaluates == "last_average" else self.evaluated.params

    def per_worker_state(self) -> tuple[str, ...]:
        return nested("replicas", self.replicas) + nested("pace", self.pace)

    def state_dict(self):
        state = {"replicas": self.replicas.state_dict(), "pace": self.pace.state_dict(), "average": self.average}
        if self.evaluates != "last_average":
            state["evaluated"] = self.evaluated.state_dict()
        return state

    def load_state_dict(self, state):
        self.replicas.load_state_dict(state["replicas"])
        self.pace.load_state_dict(state["pace"])
        self.average.copy_(state["average"])
        if self.evaluates != "last_average":
            self.evaluated.load_state_dict(state["evaluated"])
