"""Synchronous SGD with backup workers (Chen, Pan, Monga, Bengio, Jozefowicz 2016,
"Revisiting distributed synchronous SGD", Algorithm 2).

N + b workers compute a gradient at the same parameters; the first N to finish are averaged and
the b slowest are dropped, so a step lasts as long as the N-th order statistic of the compute
times (plus communication) instead of the maximum. b = 0 is plain synchronous SGD: one allreduce
(or allgather of compressed payloads) per step. With a compressor, each worker's gradient is
encoded (optionally with error feedback) and the payloads are decoded and averaged.

With b > 0 a server collects the gradients, as in the paper (``algorithms/protocol.py``): a worker
sends GRADIENT tagged with the step it computed for; the first N of step t are averaged and
applied, and each of them is answered PARAMS with x_{t+1}. A gradient that arrives for an earlier
step is late: counted in ``dropped``, never applied, and its worker is answered at once with the
current parameters, so a straggler skips ahead instead of replaying the steps it missed (nothing
cancels a computation under way: the late gradient is computed and sent in full, as on real
machines). Both backends run this protocol (``gradwire/servers/``).
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, Codec
from gradwire.algorithms.optim import make_optimizer
from gradwire.algorithms.protocol import JOIN, PARAMS, Answer, GradientWorkers, Message, as_body
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
        self.opt = make_optimizer(self.x, optim)
        self.codec = Codec(ctx, codec, default=self.default_compressor, mean_only=not self.needs_server)
        if self.needs_server:
            self.need = ctx.world_size - self.backups
            self.current = 1     # the server's step in progress
            self.arrived: dict[int, tuple[torch.Tensor, float, int]] = {}  # its gradients so far
            self.late: list[int] = []
            self.workers = GradientWorkers(ctx.local_ranks, params, first_tag=1)  # tag: the step

    @property
    def needs_server(self) -> bool:
        """With backups a server takes the first N arrivals; plain sync needs none."""
        return self.backups > 0

    def compressor_spec(self):
        return self.codec.spec()

    def setup_info(self):
        return self.codec.aggregator.setup_info() if self.codec.aggregator is not None else {}

    def aggregate(self, buffers: dict[int, torch.Tensor]) -> torch.Tensor:
        """Mean of the winners' decoded payloads, summed in rank order (as the collectives in
        ``step`` sum)."""
        return self.codec.decode_mean(buffers, self.x)

    # -- with backups: the server's protocol ----------------------------------------------------------

    def worker_step(self, ctx, rank, count):
        return self.workers.message(ctx, rank, count, self.codec)

    def _params(self, worker: int, step: int) -> Message:
        return Message(PARAMS, worker, tag=step, body=as_body(self.x))

    def on_message(self, msg, finished):
        if finished or msg.tag != self.current:  # late: never applied; catch up with x_t now
            if not finished:
                self.late.append(msg.worker)
            return Answer([self._params(msg.worker, self.current)], dropped=True)
        self.arrived[msg.worker] = (msg.body, msg.value, msg.count)
        if len(self.arrived) < self.need:
            return Answer()
        winners = sorted(self.arrived)
        self.opt.apply(self.aggregate({w: self.arrived[w][0] for w in winners}))
        info = {"loss": sum(self.arrived[w][1] for w in winners) / self.need, "gradients": self.need,
                "dropped": len(self.late), "winners": winners,
                "winner_counts": [self.arrived[w][2] for w in winners], "late": sorted(self.late)}
        self.current += 1
        replies = [self._params(w, self.current) for w in self.arrived]  # in arrival order
        self.arrived, self.late = {}, []
        return Answer(replies, info)

    def worker_apply(self, ctx, rank, reply):
        self.workers.apply(rank, reply)
        return None

    def join_reply(self, worker):
        return Message(JOIN, worker, tag=self.current, body=as_body(self.x))

    def step(self, ctx, step):  # b = 0 (with backups the server-mode driver runs the protocol above)
        ctx.compute_all(step)
        losses, grads = {}, {}
        for r in ctx.local_ranks:
            losses[r], grads[r] = ctx.gradient(r, self.x)
        self.opt.apply(self.codec.mean(ctx.transport, grads))
        return {"loss": sum(losses.values()) / max(len(losses), 1), "gradients": ctx.world_size, "dropped": 0}

    def eval_params(self):
        return self.x

    def state_dict(self):
        state = {"x": self.x, "opt": self.opt.state_dict(), "codec": self.codec.state_dict()}
        if self.needs_server:
            state["server"] = {"current": self.current, "late": list(self.late),
                               "arrived": [{"worker": w, "body": b, "loss": torch.tensor(loss, dtype=torch.float64),
                                            "count": c}
                                           for w, (b, loss, c) in self.arrived.items()],
                               "workers": self.workers.state_dict()}
        return state

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
        self.codec.load_state_dict(state["codec"])
        if self.needs_server:
            s = state["server"]
            self.current, self.late = int(s["current"]), [int(w) for w in s["late"]]
            self.arrived = {int(e["worker"]): (e["body"].clone(), float(e["loss"]), int(e["count"]))
                            for e in s["arrived"]}
            self.workers.load_state_dict(s["workers"])


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


