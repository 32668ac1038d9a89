"""MuLoCo: DiLoCo with Muon as the inner optimizer and quantised outer deltas with error feedback.

"MuLoCo: Muon is a practical inner optimizer for DiLoCo" (2025),
arXiv:2505.23725: DiLoCo's loop (Douillard et al. 2023, Algorithm 1; ``diloco.py``) with
the inner AdamW replaced by Muon on the weight matrices, and the outer deltas compressed to 2 bits
with error feedback. Muon (Jordan, Jin, Boza, You, Cesista, Newhouse, Bernstein 2024, "Muon: an
optimizer for hidden layers in neural networks", blog post) on a matrix W with gradient G:

    B <- μ B + G;   U = G + μ B (Nesterov) or B
    O = NewtonSchulz5(U / ||U||_F)       (five iterations X <- a X + (b A + c A²) X, A = X Xᵀ,
                                          (a, b, c) = (3.4445, -4.7750, 2.0315): an approximate
                                          orthogonalisation U ≈ O S of the update's singular values)
    W <- (1 - ηλ) W - η max(1, rows/cols)^½ O

The other tensors (biases, 1-D parameters) take AdamW at ``--lr``. Deviation: Muon's authors keep
embeddings and the output layer on AdamW too; here every 2-D tensor takes Muon (the flat model
does not say which matrix is an embedding). The
model's tensor shapes come from the task (``ctx.param_shapes``); each tensor is a contiguous range
of the flat vector, so each optimizer works on a view.

The outer deltas go through the averager with error feedback: by default ``pquant:p=inf,block=32``
(the ternary symbols of a 2-bit quantiser, 1.6 bits each plus a float32 scale per 32: 2.6 bits a
parameter; blocks of 64, 2.1 bits, learned 1.4 points less on the default task, docs/defaults.md), residuals
kept per replica (``--error-feedback`` is implied; another ``--compressor`` may be named).

Defaults: Muon's η 0.02 and μ 0.95 (Nesterov) as its authors give them; the outer step is
DiLoCo's Nesterov SGD at 0.7 but with momentum 0.5, not 0.9: on digits-mlp (4 workers, H = 10)
momentum 0.9 with the ternary deltas' error feedback diverged (train loss 8.8 after 600 steps),
0.5 trained (0.037 after 300), and 0.9 with fp16 deltas (no residual) trained too (0.041).
Muon's η is constant by default (``--lr-schedule`` schedules the AdamW part only); with
``muon_lr_ratio=R`` it is R times --lr and follows --lr-schedule update by update, as the AdamW
part does, so that one rate (a learning-rate search's) sets and schedules both. H = 20 inner steps and the
AdamW part's --lr 0.01 (DiLoCo's) are the defaults that learned best on the default task
(docs/defaults.md).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from gradwire.algorithms.base import ALGORITHMS
from gradwire.algorithms.diloco import DILOCO_PARAMS, OUTER_WARMUP, DiLoCo
from gradwire.algorithms.optim import AdamW, ScheduledRate
from gradwire.spec import require

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024


def newton_schulz(u: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of Muon on a matrix (in its own dtype)."""
    a, b, c = NS_COEFFICIENTS
    tall = u.shape[0] > u.shape[1]
    x = u.T if tall else u
    x = x / (x.norm() + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


class Muon:
    """Muon on one matrix view of the flat parameters (state: the momentum buffer and the update
    count, which a scheduled η (``lr_schedule``, as ``ScheduledRate``) is indexed by)."""

    def __init__(self, w: torch.Tensor, *, lr: float, momentum: float, nesterov: bool, weight_decay: float,
                 lr_schedule: str = "constant", horizon: int = 0):
        self.w, self.momentum, self.nesterov, self.weight_decay = w, momentum, nesterov, weight_decay
        self.rate = ScheduledRate(lr, lr_schedule, horizon)  # η of each update
        self.buffer = torch.zeros_like(w)
        self.scale = math.sqrt(max(1.0, w.shape[0] / w.shape[1]))
        self.steps = 0

    def apply(self, grad: torch.Tensor) -> None:
        lr = self.rate.at(self.steps)
        self.steps += 1
        self.buffer.mul_(self.momentum).add_(grad)
        update = grad.add(self.buffer, alpha=self.momentum) if self.nesterov else self.buffer
        if self.weight_decay:
            self.w.mul_(1 - lr * self.weight_decay)
        self.w.add_(newton_schulz(update), alpha=-lr * self.scale)

    def state_dict(self) -> dict:
        return {"buffer": self.buffer, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.copy_(state["buffer"])
        self.steps = int(state.get("steps", 0))  # checkpoints from before the count: a constant η needs none


class MuonAdamW:
    """Muon on every 2-D tensor of a flat vector, AdamW on the others; ``apply`` takes the flat gradient."""

    def __init__(self, x: torch.Tensor, shapes, *, muon, adamw):
        self.parts = []
        start = 0
        for shape in shapes:
            size = math.prod(shape)
            view = x[start: start + size]
            rule = muon(view.view(shape)) if len(shape) == 2 else adamw(view)
            self.parts.append((start, size, tuple(shape), rule))
            start += size
        require(start == x.numel(), f"the model's tensor shapes cover {start} of its {x.numel()} parameters")

    def apply(self, grad: torch.Tensor) -> None:
        for start, size, shape, rule in self.parts:
            g = grad[start: start + size]
            rule.apply(g.view(shape) if isinstance(rule, Muon) else g)

    def state_dict(self) -> dict:
        return {str(i): rule.state_dict() for i, (_, _, _, rule) in enumerate(self.parts)}

    def load_state_dict(self, state: dict) -> None:
        for i, (_, _, _, rule) in enumerate(self.parts):
            rule.load_state_dict(state[str(i)])


MULOCO_PARAMS = {
    "inner_steps": "H >= 1: inner steps (Muon on the matrices, AdamW on the rest) per outer round",
    "outer_lr": DILOCO_PARAMS["outer_lr"],
    "outer_momentum": DILOCO_PARAMS["outer_momentum"],
    "outer_warmup": DILOCO_PARAMS["outer_warmup"],
    "muon_lr": "η of Muon on the weight matrices (Muon's authors: 0.02), constant; other tensors: AdamW at --lr",
    "muon_lr_ratio": "R > 0: Muon's η is R·--lr instead of muon_lr, scheduled by --lr-schedule as the AdamW part "
                     "(0: muon_lr, constant)",
    "muon_momentum": "Muon's momentum μ (Muon's authors: 0.95)",
    "nesterov": "Muon's Nesterov form U = G + μ B (Muon's authors: true)",
    "beta1": "AdamW β1 of the non-matrix tensors",
    "beta2": "AdamW β2 of the non-matrix tensors",
    "eps": DILOCO_PARAMS["eps"],
    "weight_decay": "decoupled weight decay λ of both inner optimizers",
}


@ALGORITHMS.register("muloco", help="MuLoCo (arXiv:2505.23725): DiLoCo with Muon inside and ternary (2-bit class) "
                     "outer deltas with error feedback", params=MULOCO_PARAMS)
class MuLoCo(DiLoCo):
    name = "muloco"
    default_compressor = "pquant:p=inf,block=32"

    def __init__(self, *, inner_steps: int = 20, outer_lr: float = 0.7, outer_momentum: float = 0.5,
                 outer_warmup: int = OUTER_WARMUP, muon_lr: float = 0.02, muon_lr_ratio: float = 0.0,
                 muon_momentum: float = 0.95, nesterov: bool = True, beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum,
                         outer_warmup=outer_warmup, inner="adamw",
                         beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        require(math.isfinite(muon_lr) and muon_lr > 0, f"muon_lr must be a finite number > 0, got {muon_lr}")
        require(math.isfinite(muon_lr_ratio) and muon_lr_ratio >= 0,
                f"muon_lr_ratio must be a finite number >= 0 (0: muon_lr, constant), got {muon_lr_ratio}")
        require(0 <= muon_momentum < 1, f"muon_momentum must be in [0, 1), got {muon_momentum}")
        self.muon_lr, self.muon_lr_ratio, self.muon_momentum, self.nesterov = muon_lr, muon_lr_ratio, muon_momentum, \
            nesterov

    def setup(self, ctx, params, optim, codec):
        require(bool(ctx.param_shapes), f"{self.name} needs the model's tensor shapes (Muon works on matrices)")
        self.shapes = ctx.param_shapes
        super().setup(ctx, params, optim, dataclasses.replace(codec, error_feedback=True))

    def _inner_optimizer(self, optim):
        scheduled = self.muon_lr_ratio > 0
        rate = dict(lr=self.muon_lr_ratio * optim.lr, lr_schedule=optim.lr_schedule, horizon=optim.horizon) \
            if scheduled else dict(lr=self.muon_lr)

        def muon(w):
            return Muon(w, momentum=self.muon_momentum, nesterov=self.nesterov, weight_decay=self.weight_decay,
                        **rate)

        def adamw(x):
            return AdamW(x, lr=optim.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                         l1=optim.l1, lr_schedule=optim.lr_schedule, horizon=optim.horizon)

        return lambda x: MuonAdamW(x, self.shapes, muon=muon, adamw=adamw)
