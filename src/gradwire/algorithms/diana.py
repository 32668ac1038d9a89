"""DIANA: compressing gradient *differences* (Mishchenko, Gorbunov, Takáč, Richtárik 2019,
"Distributed learning with compressed gradient differences", Algorithm 1).

Worker i keeps a memory h_i and sends Δ̂_i = Q(g_i - h_i); every worker (acting as the master,
so no extra hop is needed) forms

    ĝ = h + (1/n) Σ_i Δ̂_i,   v <- β v + ĝ,   x <- prox_{γR}(x - γ v),   h <- h + α (1/n) Σ_i Δ̂_i

and worker i sets h_i <- h_i + α Δ̂_i, so h stays the mean of the h_i. As x -> x*, h_i learns
∇f_i(x*) and the compressed differences vanish: the quantization noise goes to zero and DIANA
converges to the exact optimum where quantized SGD without memory (DQGD) stalls. The paper's
step for the memory is α <= 1/(ω+1) (Theorem 2); that is the default.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, make_averager, nested, soft_threshold_
from gradwire.algorithms.optim import require_constant_lr, require_sgd
from gradwire.spec import require


@ALGORITHMS.register("diana", help="DIANA: quantized gradient differences with per-worker memory (Mishchenko 2019)",
                     params={"alpha": "memory step α (0 = 1/(ω+1) from the compressor)",
                             "momentum": "heavy-ball β of the master update (overrides --momentum when > 0)"})
class DIANA(Algorithm):
    # the paper's p-norm quantization (Mishchenko 2019) in blocks of 64 (docs/defaults.md: as DQ-GD's)
    default_compressor = "pquant:p=inf,block=64"
    name = "diana"
    default_lr = 0.4  # --lr when not given (docs/defaults.md): 0.8 learned little on the CNN
    # on the default task its own step, not 0.4 x the task's 2: 1.2 learned 1.6 points more there on ten held-out
    # seeds (docs/defaults.md, tenth round)
    default_lr_on_task = MappingProxyType({"mnist1d-mlp": 1.2})

    def __init__(self, *, alpha: float = 0.0, momentum: float = 0.0):
        require(0 <= alpha <= 1, f"alpha must be in [0, 1] (0 = automatic), got {alpha}")
        require(0 <= momentum < 1, f"momentum must be in [0, 1), got {momentum}")
        self.alpha_arg, self.momentum_arg = alpha, momentum

    @property
    def nesterov_instead(self):
        return "its master update is heavy-ball momentum of its own (--momentum, or diana:momentum=β)"

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require(not codec.error_feedback, "diana takes no --error-feedback: its memories h_i already correct "
                "the compression error (use sync with --error-feedback for error feedback)")
        require_sgd(optim, "diana (heavy-ball momentum of its own on the master)")
        require_constant_lr(optim, "diana (its own update on the master)")
        require(not optim.nesterov, "diana's master update is heavy-ball momentum of its own: --nesterov does not "
                "apply (leave it off)")
        self.averager = make_averager(ctx, codec, default=self.default_compressor)
        omega = self.averager.compressor.omega(params.numel())
        self.alpha = self.alpha_arg or (1.0 / (1.0 + omega) if omega is not None else 0.5)
        self.beta = self.momentum_arg or optim.momentum
        self.x = params.clone()
        self.h = torch.zeros_like(params)
        self.h_i = {r: torch.zeros_like(params) for r in ctx.local_ranks}
        self.v = torch.zeros_like(params)

    def step(self, ctx, step):
        ctx.compute_all(step)
        losses, packets, mine = {}, {}, {}
        for r in ctx.local_ranks:
            losses[r], g = ctx.gradient(r, self.x)
            packets[r] = self.averager.encode(r, g.sub_(self.h_i[r]))
            mine[r] = self.averager.decode(packets[r].buffer, g)
            self.h_i[r].add_(mine[r], alpha=self.alpha)
        gathered = ctx.transport.allgather({r: p.buffer for r, p in packets.items()},
                                           size=self.averager.compressor.nbytes(self.x.numel(), self.x.dtype))
        delta = torch.zeros_like(self.x)
        for r in sorted(gathered):
            delta += mine[r] if r in mine else self.averager.decode(gathered[r], self.x)
        delta.div_(len(gathered))
        g_hat = self.h + delta
        if self.optim.weight_decay:
            g_hat.add_(self.x, alpha=self.optim.weight_decay)
        self.v.mul_(self.beta).add_(g_hat)
        self.x.sub_(self.v, alpha=self.optim.lr)
        soft_threshold_(self.x, self.optim.lr * self.optim.l1)
        self.h.add_(delta, alpha=self.alpha)
        return {"loss": sum(losses.values()) / len(losses), "gradients": len(gathered)}

    def eval_params(self):
        return self.x

    def compressor_spec(self):
        return self.averager.spec()

    def spec(self):  # not spec_of: alpha and momentum as resolved at setup
        return f"diana:alpha={self.alpha:g},momentum={self.beta:g}"

    def per_worker_state(self) -> tuple[str, ...]:
        return ("h_i",) + nested("codec", self.averager)

    def state_dict(self):
        return {"x": self.x, "h": self.h, "v": self.v, "h_i": {str(r): t for r, t in self.h_i.items()},
                "codec": self.averager.state_dict()}

    def load_state_dict(self, state):
        for name in ("x", "h", "v"):
            getattr(self, name).copy_(state[name])
        for r, t in self.h_i.items():
            t.copy_(state["h_i"][str(r)])
        self.averager.load_state_dict(state["codec"])
