"""signSGD: the workers' signs voted at rank 0 (Bernstein, Zhao, Azizzadenesheli, Anandkumar 2019,
"signSGD with majority vote is communication efficient and fault tolerant", Algorithm 1), Signum when
momentum > 0, the default: at batch 32 the vote of plain signs is too noisy to learn as well
(docs/defaults.md).

Each worker sends the sign of its (momentum) gradient, 1 bit per element, to rank 0, which acts as
the parameter server and tallies the votes. What it sends back, again 1 bit per element, is ``down``:

- ``vote``: the sign of the votes' sum, the papers' majority vote. Ties (possible with an even number
  of workers) vote +1, as the 1-bit wire format has no zero. Every worker applies x <- x - γ_k·vote.
- ``ef``, the default: the votes' mean t (each element in [-1, 1]: how far the workers agree) plus
  rank 0's residual e, sent as the scaled sign ``sign:scaled=true`` (s·sign(u), s the mean |u|: 4
  bytes more than the vote), and the residual kept: u = t + e, e <- u - s·sign(u); every worker
  applies x <- x - γ_k·s·sign(u). This is the server side of error-compensated compression in both
  directions (Tang, Yu, Lian, Zhang, Liu 2019, "DoubleSqueeze: Parallel stochastic gradient descent
  with double-pass error-compensated compression", ICML; Zheng, Huang, Kwok 2019, "Communication-
  efficient distributed blockwise momentum SGD with error-feedback", NeurIPS), on the workers' plain
  votes: the workers still send signs alone, and over steps the residual passes on how strongly they
  agreed, which the majority's sign drops. s is near 1 after the first ~100 steps on the default task,
  so each step still moves every coordinate by about γ_k; what changes is the direction: where the
  workers split, sign(u) alternates as e swings, and the coordinate moves back and forth about where
  the votes' mean takes it instead of drifting with every tie. On the default task it learns 6 points
  more than the vote on the table's seeds, 8 on held-out ones (docs/defaults.md, tenth round). With
  one worker t = ±1, so s = 1, e stays 0, and the reply is that worker's sign: plain Signum at --lr.

γ_k is --lr under --lr-schedule at update k. The defaults decay the rate linearly to 0 at the last
step (``default_lr_schedule``: a sign moves every coordinate by the full rate whatever its gradient, so
a constant rate large enough to learn in 500 steps keeps the parameters jumping at the end): --lr 0.02
with ``down=ef`` (a split coordinate goes back and forth instead of drifting, so a larger rate holds),
0.003 with ``down=vote``; momentum β 0.8 for both (the vote learned most with 0.9, its default until the
tenth round: ``signsgd:down=vote,momentum=0.9`` gives those defaults).

One bit a coordinate with each worker's magnitude kept, by a scale and error feedback on every worker
(EF-signSGD, Karimireddy et al. 2019), is sync's compressor instead: ``gradwire run --compressor
sign:scaled=true --error-feedback`` (docs/defaults.md, "What limits signSGD").
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, soft_threshold_
from gradwire.algorithms.optim import ScheduledRate, require_sgd
from gradwire.compress import Packet
from gradwire.compress import build as build_compressor
from gradwire.errors import ConfigError
from gradwire.spec import require

DOWN_CHOICES = ("ef", "vote")


@ALGORITHMS.register("signsgd", help="signSGD: workers' signs voted at rank 0 (Bernstein 2019), sent back with the "
                     "server's error feedback (down=ef) or as the majority's sign (down=vote); Signum with momentum",
                     params={"momentum": "worker-side momentum β (Signum; the default: docs/defaults.md); "
                                         "0 = plain signSGD",
                             "down": "rank 0's 1-bit reply: ef (the votes' mean plus its residual as a scaled sign, "
                                     "the residual kept; the default) or vote (the majority's sign, the paper's)"})
class SignSGD(Algorithm):
    name = "signsgd"
    # --lr when not given (docs/defaults.md, tenth round): the step of down=ef is s·sign(u), s the mean |u|;
    # down=vote moves every coordinate by --lr, and takes 0.003 (__init__)
    default_lr = 2e-2
    default_lr_schedule = "linear"  # --lr-schedule when not given: decayed to 0 at the last step (docs/defaults.md)
    lr_scales_with_task = False  # a sign's step is in the parameters' units, not the gradient's

    def __init__(self, *, momentum: float = 0.8, down: str = "ef"):
        require(0 <= momentum < 1, f"momentum must be in [0, 1), got {momentum}")
        require(down in DOWN_CHOICES, f"down={down!r}: valid choices are {', '.join(DOWN_CHOICES)}")
        self.momentum, self.down = momentum, down
        if down == "vote":
            self.default_lr = 3e-3  # docs/defaults.md, sixth round: the vote's best with the linear decay

    @property
    def nesterov_instead(self):
        return f"it takes its momentum from its own spec (signsgd:momentum=β, {self.momentum:g} here)"

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_sgd(optim, "signsgd (x <- x - γ·rank 0's reply)")
        require(not optim.nesterov, "signsgd takes its momentum from its own spec (signsgd:momentum=β): --nesterov "
                "does not apply (leave it off)")
        require(not optim.momentum, f"signsgd takes its momentum from its own spec (signsgd:momentum=β, "
                f"{self.momentum:g} here): --momentum {optim.momentum:g} does not apply (leave it off)")
        require(codec.compressor in ("none", "sign") and not codec.error_feedback,
                "signsgd sends signs by definition: leave --compressor and --error-feedback unset")
        self.sign = build_compressor("sign")
        self.reply = build_compressor("sign:scaled=true") if self.down == "ef" else self.sign
        self.x = params.clone()
        # down=ef: rank 0's residual e, on the process that tallies the votes (rank 0's)
        self.residual = torch.zeros_like(params) if self.down == "ef" and 0 in ctx.local_ranks else None
        self.m = {r: torch.zeros_like(params) for r in ctx.local_ranks} if self.momentum else None
        self.rate = ScheduledRate(optim.lr, optim.lr_schedule, optim.horizon)  # γ_k: --lr by --lr-schedule
        self.updates = 0

    def step(self, ctx, step):
        ctx.compute_all(step)
        losses, buffers = {}, {}
        for r in ctx.local_ranks:
            losses[r], g = ctx.gradient(r, self.x)
            if self.m is not None:  # Signum: m <- β m + (1-β) g
                g = self.m[r].mul_(self.momentum).add_(g, alpha=1 - self.momentum)
            buffers[r] = self.sign.encode(g).buffer
        size = self.sign.nbytes(self.x.numel(), self.x.dtype)
        at_server = ctx.transport.gather(buffers, dst=0, size=size)
        reply = None
        if at_server is not None:
            votes = torch.zeros_like(self.x)
            for r in sorted(at_server):
                votes += self.sign.decode(Packet(at_server[r], self.x.shape, self.x.dtype))
            reply = self._reply(votes, len(at_server))
        reply = ctx.transport.broadcast(reply, src=0, size=self.reply.nbytes(self.x.numel(), self.x.dtype))
        direction = self.reply.decode(Packet(reply, self.x.shape, self.x.dtype))  # the vote, or s·sign(u)
        lr = self.rate.at(self.updates)
        self.updates += 1
        if self.optim.weight_decay:
            direction.add_(self.x, alpha=self.optim.weight_decay)
        self.x.sub_(direction, alpha=lr)
        soft_threshold_(self.x, lr * self.optim.l1)
        return {"loss": sum(losses.values()) / len(losses), "gradients": ctx.world_size}

    def _reply(self, votes: torch.Tensor, voters: int) -> torch.Tensor:
        """Rank 0's message from the sum of ``voters`` votes of ±1: the majority's sign (+0.5 sends a
        tie as +1), or (down=ef) the scaled sign of their mean plus the residual, which keeps the rest."""
        if self.down == "vote":
            return self.sign.encode(votes.add_(0.5)).buffer
        u = self.residual.add_(votes, alpha=1 / voters)
        packet = self.reply.encode(u)
        u.sub_(self.reply.decode(packet))  # e <- u - s·sign(u)
        return packet.buffer

    def compressor_spec(self):
        up = self.sign.spec()
        return up if self.down == "vote" else f"{up} up, {self.reply.spec()} down (rank 0's error feedback)"

    def eval_params(self):
        return self.x

    def per_worker_state(self) -> tuple[str, ...]:
        return ("m",) if self.m is not None else ()

    def state_dict(self):
        out = {"x": self.x, "updates": self.updates}
        if self.residual is not None:
            out["residual"] = self.residual
        if self.m is not None:
            out["m"] = {str(r): t for r, t in self.m.items()}
        return out

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        self.updates = int(state.get("updates", 0))  # a checkpoint from before --lr-schedule: constant
        if self.residual is not None:
            if "residual" not in state:  # a checkpoint of the vote, from before down=ef was the default
                raise ConfigError("this checkpoint holds no residual of rank 0 (signsgd:down=ef): it was written "
                                  "by a gradwire before down=ef was the default (signsgd then meant "
                                  "down=vote,momentum=0.9): resume it with the gradwire that wrote it, or start "
                                  "afresh")
            self.residual.copy_(state["residual"])
        if self.m is not None:
            for r, t in self.m.items():
                t.copy_(state["m"][str(r)])
