"""DiLoCo with backup replicas: each outer round proceeds with the first N = n - b pseudo-gradients.

DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1) ends a round with the mean of every
replica's outer gradient, so a round lasts as long as the slowest replica's H inner steps. Under a
heavy-tailed straggler model one slow inner step in any of n replicas delays everyone. Synchronous
SGD has the cure (Chen, Pan, Monga, Bengio, Jozefowicz 2016, "Revisiting distributed synchronous
SGD", arXiv:1604.00981, Algorithm 2): b backup workers, the first N gradients of a step averaged,
the rest dropped. Here the same protocol carries DiLoCo's pseudo-gradients:

- replica i starts a round from the θ of the server's last answer, takes H inner steps of its own
  optimizer (AdamW; its moments stay with it across rounds, dropped or not) and sends
  Δ_i = θ - x_i as GRADIENT, tagged with the round it started from;
- the server averages the first N of round t (summed in rank order), takes the outer Nesterov step
  θ <- OuterOpt(θ, mean Δ) as DiLoCo does, and answers each of the N with PARAMS (θ, t + 1);
- a pseudo-gradient tagged with an earlier round is late. ``late=drop`` (default): **dropped**,
  never applied (Chen et al. 2016's rule), counted in ``dropped``. ``late=stale``: applied at once
  as one of N contributions with a staleness-dependent rate, θ <- θ - α Δ_i / (N s), s = the rounds
  since the θ it started from (>= 1): the learning rate divided by the staleness of Zhang, Gupta,
  Lian, Liu (2016), "Staleness-aware Async-SGD for Distributed Deep Learning", arXiv:1511.05950;
  plain SGD, the outer momentum untouched (momentum on stale updates is what Liu et al. 2024 found
  harmful). Either way its replica is answered at once with the current θ, so it skips the rounds
  it missed (x_i <- θ) and keeps its inner optimizer.

Fully asynchronous outer rounds (Liu et al. 2024, "Asynchronous Local-SGD Training for Language
Modeling", arXiv:2401.09135: delayed Nesterov momentum, dynamic local steps) are not built here.

The protocol runs on both backends' server-mode drivers (``gradwire/servers/``): the simulator
charges a message the sum of its H inner steps' straggler draws (``compute_seconds``), and the
torch backend sleeps each draw before each inner gradient (the same draws). One step of the run is
one outer round. Evaluation uses the server's θ.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, OptimConfig, make_averager
from gradwire.algorithms.diloco import DILOCO_PARAMS, INNER_CHOICES, OUTER_LR, OUTER_MOMENTUM, OUTER_WARMUP, outer_step
from gradwire.algorithms.optim import AdamW, HeavyBall, require_constant_lr, require_sgd
from gradwire.algorithms.protocol import GRADIENT, JOIN, PARAMS, Answer, Message, as_body
from gradwire.algorithms.replicas import Replicas, mean_or_nan
from gradwire.spec import require

LATE_RULES = ("drop", "stale")
BACKUP_DILOCO_PARAMS = {"backups": "b >= 0: replicas whose pseudo-gradients each round drops (the last to arrive)",
                        "late": "a late pseudo-gradient: drop (Chen 2016) or stale (applied at rate α/(N s), "
                                "s its staleness in rounds: Zhang 2016)"} | {
    key: DILOCO_PARAMS[key] for key in ("inner_steps", "outer_lr", "outer_momentum", "outer_warmup", "inner",
                                        "beta1", "beta2", "eps", "weight_decay")} | {
    "inner_steps": "H >= 1: inner steps a replica takes before it sends its pseudo-gradient"}


@ALGORITHMS.register("backup-diloco", help="DiLoCo whose outer round averages the first n - b pseudo-gradients "
                     "(backup replicas, as Chen 2016's backup workers); late ones dropped", params=BACKUP_DILOCO_PARAMS)
class BackupDiLoCo(Algorithm):
    name = "backup-diloco"
    evaluates = "server"
    needs_server = True
    default_compressor = "none"
    default_lr = 1e-2  # the inner AdamW's --lr when not given, as DiLoCo's (docs/defaults.md)

    def __init__(self, *, backups: int = 1, late: str = "drop", inner_steps: int = 10, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, outer_warmup: int = OUTER_WARMUP, inner: str = "adamw",
                 beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.1):
        require(backups >= 0, f"backups must be >= 0, got {backups}")
        require(late in LATE_RULES, f"late={late!r}: valid choices are {', '.join(LATE_RULES)}")
        self.late_rule = late
        require(inner_steps >= 1, f"inner_steps must be >= 1 (inner steps per outer round), got {inner_steps}")
        require(outer_lr > 0, f"outer_lr must be > 0, got {outer_lr}")
        require(0 <= outer_momentum < 1, f"outer_momentum must be in [0, 1), got {outer_momentum}")
        require(inner in INNER_CHOICES, f"inner={inner!r}: valid choices are {', '.join(INNER_CHOICES)}")
        self.backups, self.inner_steps = backups, inner_steps
        require(outer_warmup >= 0, f"outer_warmup must be >= 0 (outer rounds of momentum ramp), got {outer_warmup}")
        self.outer_lr, self.outer_momentum, self.outer_warmup = outer_lr, outer_momentum, outer_warmup
        self.inner, self.betas, self.eps, self.weight_decay = inner, (beta1, beta2), eps, weight_decay

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require(self.backups < ctx.world_size,
                f"backups={self.backups} leaves no replica to average with {ctx.world_size} workers")
        require_sgd(optim, f"{self.name} (its inner optimizer is the spec's inner=, its outer one Nesterov)")
        require_constant_lr(optim, f"{self.name} (replicas step at their own pace: no shared step count)")
        if self.inner == "adamw":
            require(not optim.momentum and not optim.weight_decay,
                    f"{self.name} with inner=adamw: --momentum and --weight-decay apply to inner=sgd; AdamW's are "
                    "the spec's beta1, beta2 and weight_decay")
        adamw = None if self.inner == "sgd" else (
            lambda x: AdamW(x, lr=optim.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                            l1=optim.l1))
        self.replicas = Replicas(ctx, params, optim, optimizer=adamw)
        self.held = {r: params.clone() for r in ctx.local_ranks}  # the θ each replica started its round from
        self.tag = {r: 1 for r in ctx.local_ranks}                # the round it computes for
        self.theta = params.clone()                               # the server's θ
        self.outer = HeavyBall(self.theta, OptimConfig(lr=self.outer_lr, momentum=self.outer_momentum,
                                                       nesterov=self.outer_momentum > 0))
        self.averager = make_averager(ctx, codec, default=self.default_compressor)
        self.need = ctx.world_size - self.backups
        self.current = 1
        self.arrived: dict[int, tuple[torch.Tensor, float, int]] = {}
        self.late: list[int] = []

    def compressor_spec(self):
        return self.averager.spec()

    def compute_seconds(self, ctx, rank, count):
        """A message follows H inner steps: the straggler draws of gradients (count-1)H+1 .. count·H."""
        first = (count - 1) * self.inner_steps
        return sum(ctx.compute_time(rank, first + j) for j in range(1, self.inner_steps + 1))

    # -- a replica ----------------------------------------------------------------------------------

    def worker_step(self, ctx, rank, count):
        losses = [self.replicas.sgd_step(ctx, rank) for _ in range(self.inner_steps)]
        delta = self.held[rank] - self.replicas.x[rank]
        return Message(GRADIENT, rank, tag=self.tag[rank], count=count, value=mean_or_nan(losses),
                       body=self.averager.encode(rank, delta, key="outer").buffer)

    def worker_apply(self, ctx, rank, reply):
        """PARAMS or JOIN: the next round starts from θ (x_i <- θ); the inner optimizer's state stays."""
        theta = reply.tensor(self.held[rank])
        self.held[rank].copy_(theta)
        self.replicas.x[rank].copy_(theta)
        self.tag[rank] = reply.tag
        return None

    # -- the server ---------------------------------------------------------------------------------

    def _params(self, worker: int, kind: int = PARAMS) -> Message:
        return Message(kind, worker, tag=self.current, body=as_body(self.theta))

    def on_message(self, msg, finished):
        if finished or msg.tag != self.current:  # late: skip ahead to θ now
            if finished:
                return Answer([self._params(msg.worker)], dropped=True)
            self.late.append(msg.worker)
            staleness = self.current - msg.tag
            if self.late_rule == "drop":  # Chen et al. 2016
                return Answer([self._params(msg.worker)], dropped=True, staleness=staleness)
            # Zhang et al. 2016: the rate divided by the staleness; one of N contributions; no momentum
            self.theta.sub_(self.averager.decode(msg.body, self.theta), alpha=self.outer_lr / (self.need * staleness))
            return Answer([self._params(msg.worker)], staleness=staleness)
        self.arrived[msg.worker] = (msg.body, msg.value, msg.count)
        if len(self.arrived) < self.need:
            return Answer()
        winners = sorted(self.arrived)
        outer_gradient = self.averager.decode_mean({w: self.arrived[w][0] for w in winners}, self.theta)
        outer_step(self.outer, outer_gradient, self.outer_momentum, self.outer_warmup)
        info = {"loss": sum(self.arrived[w][1] for w in winners) / self.need, "gradients": self.need * self.inner_steps,
                "dropped": len(self.late) if self.late_rule == "drop" else 0, "winners": winners,
                "late": sorted(self.late),
                "outer_gradient_norm": float(outer_gradient.norm())}
        self.current += 1
        replies = [self._params(w) for w in self.arrived]  # in arrival order
        self.arrived, self.late = {}, []
        return Answer(replies, info)

    def join_reply(self, worker):
        return self._params(worker, JOIN)

    def eval_params(self):
        return self.theta

    def state_dict(self):
        return {"theta": self.theta, "outer": self.outer.state_dict(), "codec": self.averager.state_dict(),
                "replicas": self.replicas.state_dict(), "held": {str(r): t for r, t in self.held.items()},
                "tag": {str(r): t for r, t in self.tag.items()},
                "server": {"current": self.current, "late": list(self.late),
                           "arrived": [{"worker": w, "body": b, "loss": torch.tensor(loss, dtype=torch.float64),
                                        "count": c} for w, (b, loss, c) in self.arrived.items()]}}

    def load_state_dict(self, state):
        self.theta.copy_(state["theta"])
        self.outer.load_state_dict(state["outer"])
        self.averager.load_state_dict(state["codec"])
        self.replicas.load_state_dict(state["replicas"])
        for r in self.held:
            self.held[r].copy_(state["held"][str(r)])
            self.tag[r] = int(state["tag"][str(r)])
        s = state["server"]
        self.current, self.late = int(s["current"]), [int(w) for w in s["late"]]
        self.arrived = {int(e["worker"]): (e["body"].clone(), float(e["loss"]), int(e["count"])) for e in s["arrived"]}

    def step(self, ctx, step):
        raise NotImplementedError(f"{self.name} runs in server mode (needs_server)")
