"""Synchronous SGD with backup workers (Chen, Pan, Monga, Bengio, Jozefowicz 2016,
"Revisiting distributed synchronous SGD", Algorithm 2).

N + b workers compute a gradient at the same parameters; the first N to finish are averaged and
the b slowest are dropped, so a step lasts as long as the N-th order statistic of the compute
times (plus communication) instead of the maximum. b = 0 is plain synchronous SGD. On the
simulated cluster a dropped worker's computation is cancelled when the new parameters arrive, so
every worker starts each step together. With a compressor, each worker's gradient is encoded
(optionally with error feedback) and the payloads are gathered and decoded.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, Codec, fastest
from gradwire.algorithms.optim import HeavyBall
from gradwire.spec import require


@ALGORITHMS.register("sync", help="synchronous SGD; the b slowest workers of each step are dropped (Chen 2016)",
                     params={"backups": "number of backup workers b (gradients dropped per step)"})
class SyncSGD(Algorithm):
    name = "sync"
    default_compressor = "none"

    def __init__(self, *, backups: int = 0):
        require(backups >= 0, f"backups must be >= 0, got {backups}")
        self.backups = backups

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require(self.backups < ctx.world_size,
                f"backups={self.backups} leaves no worker to aggregate with {ctx.world_size} workers")
        self.x = params.clone()
        self.opt = HeavyBall(self.x, optim)
        self.codec = Codec(ctx, codec, default=self.default_compressor)

    @property
    def needs_server(self) -> bool:
        """With backups, a real backend runs a parameter server that takes the first N arrivals
        (gradwire/run/ps.py); plain sync needs none (an allreduce or allgather)."""
        return self.backups > 0

    def aggregate(self, buffers: dict[int, torch.Tensor]) -> torch.Tensor:
        """Mean of the winners' decoded payloads (the parameter server's reduction; the
        collectives in ``step`` compute the same sum in the same order)."""
        return self.codec.mean_of(buffers, self.x)

    def step(self, ctx, step):
        times = ctx.compute_times(step)
        winners = fastest(times, ctx.world_size - self.backups)
        ctx.wait_compute(max(times[r] for r in winners))  # the N-th order statistic
        losses, grads = {}, {}
        for r in winners:
            if r in ctx.local_ranks:
                losses[r], grads[r] = ctx.gradient(r, self.x)
        mean = self.codec.mean(ctx.transport, grads, winners)
        self.opt.apply(mean)
        return {"loss": sum(losses.values()) / max(len(losses), 1), "gradients": len(winners),
                "dropped": ctx.world_size - len(winners)}

    def eval_params(self):
        return self.x

    def spec(self):
        return f"sync:backups={self.backups}"

    def state_dict(self):
        return {"x": self.x, "opt": self.opt.state_dict(), "codec": self.codec.state_dict()}

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
        self.codec.load_state_dict(state["codec"])


@ALGORITHMS.register("dqgd", help="quantized gradient descent without memory (Khirirat 2018): the baseline DIANA fixes",
                     params={})
class DQGD(SyncSGD):
    """x <- x - γ (1/n) Σ_i Q(∇f_i(x)) (Khirirat, Feyzmahdavian, Johansson 2018, eq. (5)).

    With heterogeneous workers ∇f_i(x*) ≠ 0, so the quantization variance ω||∇f_i(x*)||² does
    not vanish at the optimum and the iterates stall at a noise floor proportional to γ."""

    name = "dqgd"
    default_compressor = "pquant:p=inf"

    def __init__(self):
        super().__init__(backups=0)

    def spec(self):
        return "dqgd"


