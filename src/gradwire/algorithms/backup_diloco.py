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
  it missed (x_i <- θ) and keeps its inner optimizer. ``late=buffer``: **buffered** into the round in
  progress, weighted by FedBuff's staleness factor 1/√(1 + s) (Nguyen, Malik, Zhan, Yousefpour,
  Rabbat, Malek, Huba 2022, "Federated Learning with Buffered Asynchronous Aggregation",
  arXiv:2106.06639, Algorithm 1: the server's buffer holds K updates, each scaled by 1/√(1 + its
  staleness), and steps on their sum / K): when the round's N-th fresh pseudo-gradient arrives, the
  outer gradient is (Σ_fresh Δ_i + Σ_late Δ_j / √(1 + s_j)) / (N + L), L the late ones buffered in
  the round, and DiLoCo's outer Nesterov step takes it. A round then uses the late replicas' work
  instead of discarding it, with the outer momentum applied once per round as DiLoCo's.

Fully asynchronous outer rounds (Liu et al. 2024, "Asynchronous Local-SGD Training for Language
Modeling", arXiv:2401.09135: delayed Nesterov momentum) are ``async-diloco`` (async_diloco.py).
Measured under ``tail`` at 16 workers (docs/low_communication.md): ``drop`` with a smaller outer
momentum (0.8) is what settles the rounds; ``stale`` and ``buffer`` made the test loss jump more.

The protocol runs on both backends' server-mode drivers (``gradwire/servers/``): the simulator
charges a message the sum of its H inner steps' straggler draws (``compute_seconds``), and the
torch backend sleeps each draw before each inner gradient (the same draws). One step of the run is
one outer round. Evaluation uses the server's θ.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, OptimConfig
from gradwire.algorithms.diloco import DILOCO_PARAMS, OUTER_LR, OUTER_MOMENTUM, OUTER_WARMUP, outer_step
from gradwire.algorithms.optim import HeavyBall
from gradwire.algorithms.outer_replicas import ANSWER_HELP, ServerDiLoCo
from gradwire.algorithms.protocol import Answer
from gradwire.spec import require

LATE_RULES = ("drop", "stale", "buffer")
BACKUP_DILOCO_PARAMS = {"backups": "b >= 0: replicas whose pseudo-gradients each round drops (the last to arrive)",
                        "late": "a late pseudo-gradient: drop (Chen 2016), stale (applied at once at rate α/(N s), "
                                "s its staleness in rounds: Zhang 2016) or buffer (in the round in progress's mean, "
                                "weighted 1/sqrt(1+s): FedBuff, Nguyen 2022)"} | {
    key: DILOCO_PARAMS[key] for key in ("inner_steps", "outer_lr", "outer_momentum", "outer_warmup", "inner",
                                        "beta1", "beta2", "eps", "weight_decay")} | {
    "inner_steps": "H >= 1: inner steps a replica takes before it sends its pseudo-gradient",
    "answer": ANSWER_HELP}


@ALGORITHMS.register("backup-diloco", help="DiLoCo whose outer round averages the first n - b pseudo-gradients "
                     "(backup replicas, as Chen 2016's backup workers); late ones dropped; a --steps step is one "
                     "outer round (H inner steps a replica)",
                     params=BACKUP_DILOCO_PARAMS)
class BackupDiLoCo(ServerDiLoCo):
    name = "backup-diloco"
    first_tag = 1  # rounds count from 1

    def __init__(self, *, backups: int = 1, late: str = "drop", inner_steps: int = 10, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, outer_warmup: int = OUTER_WARMUP, inner: str = "adamw",
                 beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.1, answer: str = "params"):
        require(backups >= 0, f"backups must be >= 0, got {backups}")
        require(late in LATE_RULES, f"late={late!r}: valid choices are {', '.join(LATE_RULES)}")
        self.inner_settings(inner_steps=inner_steps, inner=inner, beta1=beta1, beta2=beta2, eps=eps,
                            weight_decay=weight_decay, answer=answer)
        require(outer_lr > 0, f"outer_lr must be > 0, got {outer_lr}")
        require(0 <= outer_momentum < 1, f"outer_momentum must be in [0, 1), got {outer_momentum}")
        require(outer_warmup >= 0, f"outer_warmup must be >= 0 (outer rounds of momentum ramp), got {outer_warmup}")
        self.backups, self.late_rule = backups, late
        self.outer_lr, self.outer_momentum, self.outer_warmup = outer_lr, outer_momentum, outer_warmup

    def setup(self, ctx, params, optim, codec):
        require(self.backups < ctx.world_size,
                f"backups={self.backups} leaves no replica to average with {ctx.world_size} workers")
        super().setup(ctx, params, optim, codec)
        self.outer = HeavyBall(self.theta, OptimConfig(lr=self.outer_lr, momentum=self.outer_momentum,
                                                       nesterov=self.outer_momentum > 0)) if self.serves else None
        self.need = ctx.world_size - self.backups
        self.current = 1
        self.arrived: dict[int, tuple[torch.Tensor, float, int]] = {}
        self.late: list[int] = []
        self.buffered: list[tuple[torch.Tensor, int]] = []  # late=buffer: (Δ_j / sqrt(1 + s_j), s_j) of this round

    @property
    def tag(self) -> int:
        return self.current  # the round a replica computes for

    def schedule_start(self, tag):
        return (tag - self.first_tag) * self.inner_steps  # round t's phase: after t - 1 rounds of H

    def min_workers(self):
        return self.backups + 1  # the b backups and at least one to aggregate

    def workers_needed(self):
        return self.need  # each round averages N replicas' pseudo-gradients

    # -- the server ---------------------------------------------------------------------------------

    def on_message(self, msg, finished):
        if finished or msg.tag != self.current:  # late: skip ahead to θ now
            if finished:
                return Answer([self.answer(msg.worker)], dropped=True)
            self.late.append(msg.worker)
            staleness = self.current - msg.tag
            if self.late_rule == "drop":  # Chen et al. 2016
                return Answer([self.answer(msg.worker)], dropped=True, staleness=staleness)
            if self.late_rule == "buffer":  # Nguyen et al. 2022 (FedBuff): into this round's mean, scaled 1/sqrt(1+s)
                self.buffered.append((self.averager.decode(msg.body, self.theta) / (1 + staleness) ** 0.5,
                                      staleness))
                return Answer([self.answer(msg.worker)], staleness=staleness)
            # Zhang et al. 2016: the rate divided by the staleness; one of N contributions; no momentum
            self.theta.sub_(self.averager.decode(msg.body, self.theta), alpha=self.outer_lr / (self.need * staleness))
            return Answer([self.answer(msg.worker)], staleness=staleness)
        self.arrived[msg.worker] = (msg.body, msg.value, msg.count)
        if len(self.arrived) < self.need:
            return Answer()
        winners = sorted(self.arrived)
        outer_gradient = self.averager.decode_mean({w: self.arrived[w][0] for w in winners}, self.theta)
        if self.buffered:  # FedBuff: (Σ fresh + Σ scaled late) / (N + L); the fresh mean times N is their sum
            total = outer_gradient * self.need
            for delta, _ in self.buffered:
                total += delta
            outer_gradient = total / (self.need + len(self.buffered))
        outer_step(self.outer, outer_gradient, self.outer_momentum, self.outer_warmup)
        info = {"loss": sum(self.arrived[w][1] for w in winners) / self.need, "gradients": self.need * self.inner_steps,
                "dropped": len(self.late) if self.late_rule == "drop" else 0, "winners": winners,
                "late": sorted(self.late), "buffered": len(self.buffered),
                "outer_gradient_norm": float(outer_gradient.norm())}
        self.current += 1
        replies = [self.answer(w) for w in self.arrived]  # in arrival order
        self.arrived, self.late, self.buffered = {}, [], []
        return Answer(replies, info)

    def server_only_state(self):
        return {"outer": self.outer.state_dict(),
                "server": {"current": self.current, "late": list(self.late),
                           "buffered": [{"delta": d, "staleness": st} for d, st in self.buffered],
                           "arrived": [{"worker": w, "body": b, "loss": torch.tensor(loss, dtype=torch.float64),
                                        "count": c} for w, (b, loss, c) in self.arrived.items()]}}

    def load_server_only_state(self, state):
        self.outer.load_state_dict(state["outer"])
        s = state["server"]
        self.current, self.late = int(s["current"]), [int(w) for w in s["late"]]
        self.buffered = [(e["delta"].clone(), int(e["staleness"])) for e in s.get("buffered", [])]
        self.arrived = {int(e["worker"]): (e["body"].clone(), float(e["loss"]), int(e["count"])) for e in s["arrived"]}
