"""The update rules shared by the gradient-averaging algorithms, chosen by ``--optimizer``.

Heavy-ball SGD, as torch.optim.SGD without dampening: v <- β v + (g + wd·x); x <- x - γ v; with
``nesterov`` the step is x <- x - γ (g + wd·x + β v), Nesterov momentum in the form torch.optim
uses (Sutskever, Martens, Dahl, Hinton 2013, "On the importance of initialization and momentum in
deep learning", ICML, eqs. (3)-(4); the LSGD authors train with it, Teng et al. 2019). Then the
proximal step of the L1 term, x <- soft(x, γ·l1) (proximal SGD; Parikh & Boyd 2014, §4.2). Kept
here rather than in torch.optim so the prox is part of the same update and the whole state is one
tensor in the checkpoint.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import OptimConfig, soft_threshold_
from gradwire.spec import Registry, parse_spec, require

OPTIMIZERS = Registry("optimizer")


class HeavyBall:
    def __init__(self, params: torch.Tensor, cfg: OptimConfig):
        self.x, self.cfg = params, cfg
        self.velocity = torch.zeros_like(params) if cfg.momentum else None

    def apply(self, grad: torch.Tensor) -> None:
        """Update the parameters in place with the aggregated gradient ``grad`` (not kept)."""
        cfg = self.cfg
        if cfg.weight_decay:
            grad = grad.add(self.x, alpha=cfg.weight_decay)
        if self.velocity is not None:
            velocity = self.velocity.mul_(cfg.momentum).add_(grad)
            grad = grad.add(velocity, alpha=cfg.momentum) if cfg.nesterov else velocity
        self.x.sub_(grad, alpha=cfg.lr)
        soft_threshold_(self.x, cfg.lr * cfg.l1)

    def state_dict(self) -> dict:
        return {} if self.velocity is None else {"velocity": self.velocity}

    def load_state_dict(self, state: dict) -> None:
        if self.velocity is not None:
            self.velocity.copy_(state["velocity"])


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, "Decoupled weight decay
    regularization", ICLR, Algorithm 2; Adam: Kingma & Ba 2015, Algorithm 1), in the form
    torch.optim.AdamW uses, on one flat vector:

        x <- x (1 - γ λ);  m <- β1 m + (1 - β1) g;  v <- β2 v + (1 - β2) g²
        x <- x - γ m / (1 - β1^t) / (sqrt(v / (1 - β2^t)) + ε)

    then the proximal step of the task's L1 term, as HeavyBall. DiLoCo's inner optimizer
    (Douillard et al. 2023). The state (m, v and the step count t) is part of the checkpoint."""

    def __init__(self, params: torch.Tensor, *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, l1: float = 0.0):
        self.x, self.lr, self.betas, self.eps, self.weight_decay, self.l1 = params, lr, betas, eps, weight_decay, l1
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)
        self.steps = 0

    def apply(self, grad: torch.Tensor) -> None:
        """One AdamW step on the parameters in place with gradient ``grad`` (not kept)."""
        beta1, beta2 = self.betas
        self.steps += 1
        if self.weight_decay:
            self.x.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias1, bias2 = 1 - beta1 ** self.steps, 1 - beta2 ** self.steps
        denominator = (self.exp_avg_sq / bias2).sqrt_().add_(self.eps)
        self.x.addcdiv_(self.exp_avg, denominator, value=-self.lr / bias1)
        soft_threshold_(self.x, self.lr * self.l1)

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps = int(state["steps"])


@OPTIMIZERS.register("sgd", help="SGD with heavy-ball (or Nesterov) momentum: --lr, --momentum, --nesterov, "
                     "--weight-decay (added to the gradient, as torch.optim.SGD)")
class SGDRule:
    def make(self, x: torch.Tensor, optim: OptimConfig) -> HeavyBall:
        return HeavyBall(x, optim)


@OPTIMIZERS.register("adamw", help="AdamW on the averaged gradient (as torch.optim.AdamW): --lr, and --weight-decay as "
                     "its decoupled decay; --momentum must stay 0",
                     params={"beta1": "first-moment decay β1", "beta2": "second-moment decay β2 (0.95 is "
                             "common for language models)", "eps": "ε added to the denominator"})
class AdamWRule:
    def __init__(self, *, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        require(0 <= beta1 < 1, f"beta1={beta1} must be in [0, 1)")
        require(0 <= beta2 < 1, f"beta2={beta2} must be in [0, 1)")
        require(eps > 0, f"eps={eps} must be > 0")
        self.betas, self.eps = (beta1, beta2), eps

    def make(self, x: torch.Tensor, optim: OptimConfig) -> AdamW:
        return AdamW(x, lr=optim.lr, betas=self.betas, eps=self.eps, weight_decay=optim.weight_decay, l1=optim.l1)


def make_optimizer(x: torch.Tensor, optim: OptimConfig) -> HeavyBall | AdamW:
    """The update rule ``optim.optimizer`` names, updating the flat vector ``x`` in place."""
    return OPTIMIZERS.build(optim.optimizer).make(x, optim)


def require_sgd(optim: OptimConfig, who: str) -> None:
    """For an algorithm whose update is its own (DIANA, signSGD, DiLoCo): refuse ``--optimizer adamw``."""
    require(parse_spec(optim.optimizer)[0] == "sgd",
            f"{who} applies its own update rule, so --optimizer {optim.optimizer!r} does not apply to it; "
            "leave --optimizer at sgd")
