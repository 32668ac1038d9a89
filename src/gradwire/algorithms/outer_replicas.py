"""The replica side of the server-mode DiLoCo family (``backup-diloco``, ``async-diloco``).

Replica i holds the θ of the server's last answer, takes H inner steps of its own optimizer from
there (AdamW as DiLoCo's, Douillard et al. 2023, arXiv:2311.08105, Algorithm 1, or SGD; its state
stays with the replica across rounds) and sends its outer gradient Δ_i = θ - x_i as GRADIENT,
tagged with what the server's answer carried (a round, or a parameter version). The server's
answer (PARAMS or JOIN) restarts it from the new θ. What the server does with the Δ_i is the
algorithm's.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.optim import AdamW
from gradwire.algorithms.protocol import GRADIENT, Message
from gradwire.algorithms.replicas import Replicas, mean_or_nan
from gradwire.spec import require


class OuterReplicas:
    """Every local replica of a server-mode DiLoCo: its x_i, inner optimizer, the θ it started
    from and the tag it computes for."""

    def __init__(self, ctx, params: torch.Tensor, optim, *, name: str, inner: str, inner_steps: int,
                 betas: tuple[float, float], eps: float, weight_decay: float, first_tag: int):
        if inner == "adamw":
            require(not optim.momentum and not optim.weight_decay,
                    f"{name} with inner=adamw: --momentum and --weight-decay apply to inner=sgd; AdamW's are "
                    "the spec's beta1, beta2 and weight_decay")
        adamw = None if inner == "sgd" else (
            lambda x: AdamW(x, lr=optim.lr, betas=betas, eps=eps, weight_decay=weight_decay, l1=optim.l1))
        self.inner_steps = inner_steps
        self.replicas = Replicas(ctx, params, optim, optimizer=adamw)
        self.held = {r: params.clone() for r in ctx.local_ranks}  # the θ each replica started from
        self.tag = {r: first_tag for r in ctx.local_ranks}         # what it computes for

    def compute_seconds(self, ctx, rank: int, count: int) -> float:
        """A message follows H inner steps: the straggler draws of gradients (count-1)H+1 .. count·H."""
        first = (count - 1) * self.inner_steps
        return sum(ctx.compute_time(rank, first + j) for j in range(1, self.inner_steps + 1))

    def message(self, ctx, rank: int, count: int, averager) -> Message:
        """H inner steps, then Δ_i = θ - x_i through the averager's codec (key ``outer``)."""
        losses = [self.replicas.sgd_step(ctx, rank) for _ in range(self.inner_steps)]
        delta = self.held[rank] - self.replicas.x[rank]
        return Message(GRADIENT, rank, tag=self.tag[rank], count=count, value=mean_or_nan(losses),
                       body=averager.encode(rank, delta, key="outer").buffer)

    def apply(self, rank: int, reply: Message) -> None:
        """PARAMS or JOIN: the next round starts from θ (x_i <- θ); the inner optimizer's state stays."""
        theta = reply.tensor(self.held[rank])
        self.held[rank].copy_(theta)
        self.replicas.x[rank].copy_(theta)
        self.tag[rank] = reply.tag

    def state_dict(self) -> dict:
        return {"replicas": self.replicas.state_dict(), "held": {str(r): t for r, t in self.held.items()},
                "tag": {str(r): t for r, t in self.tag.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.replicas.load_state_dict(state["replicas"])
        for r in self.held:
            self.held[r].copy_(state["held"][str(r)])
            self.tag[r] = int(state["tag"][str(r)])
