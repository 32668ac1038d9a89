"""The server-side update shared by the gradient-averaging algorithms.

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
