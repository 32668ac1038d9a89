"""Asynchronous DiLoCo: the server takes an outer step on every pseudo-gradient the moment it
arrives, with delayed Nesterov momentum (Liu, Chhaparia, Douillard, Kale, Rusu, Shen, Szlam,
Ranzato 2024, "Asynchronous Local-SGD Training for Language Modeling", arXiv:2401.09135).

Synchronous DiLoCo (Douillard et al. 2023, arXiv:2311.08105) waits for every replica's H inner
steps, so each round lasts as long as its slowest replica. Here no replica waits for another: it
sends Δ_i = θ_read - x_i, is answered at once with the server's current θ and its version, and
starts its next H inner steps there (``OuterReplicas``, shared with ``backup-diloco``). A Δ_i read
at version v and applied at version t has staleness t - v.

Liu et al. found the outer Nesterov momentum, applied to every stale pseudo-gradient, is what makes
naive asynchronous Local-SGD fall behind the synchronous one, and propose the delayed Nesterov
(DN) update: momentum moves only every N-th arrival, on the mean of the N buffered Δ, while every
arrival moves θ by its own share. With outer rate η, momentum μ and a buffer b (all at 0 first), the
arrival of Δ, the k-th since the start:

    b <- b + Δ
    k mod N != 0:   θ <- θ - η Δ / N
    k mod N == 0:   m <- μ m + b / N;   θ <- θ - η (Δ / N + μ m);   b <- 0

Over N arrivals computed at one θ this is exactly one Nesterov step (torch.optim.SGD's form,
m <- μ m + g, θ <- θ - η (g + μ m)) on their mean, and N = 1 is Nesterov on every arrival. The
rule is written from the paper's description of DN (its Algorithm 3 as summarised by its abstract
and third-party descriptions; the paper's own box could not be retrieved on this machine: see
docs/low_communication.md). μ ramps over the first ``outer_warmup`` momentum updates as DiLoCo's
(``outer_momentum_at``).

The paper's second proposal, dynamic local updates (DyLU, ``dylu=true``), gives each worker a number
of inner steps proportional to its speed, so that fast and slow workers send at about the same
pace: H_i = ⌊H · v_i / max_j v_j⌋ (at least 1), the fastest worker taking H (our reading of the
paper's rule; its text could not be re-checked here). How the speed is measured is gradwire's
choice: each message carries, after the codec's payload, the seconds its phase's inner steps took
(8 bytes, float64: the straggler model's draws of those steps, which the simulator charges and the
torch backend sleeps, so both backends measure the same numbers). The server keeps each worker's
seconds and inner steps since the start, so v_i = steps_i / seconds_i, and answers with the
worker's next H_i (the answer's value; every worker takes H before its first answer). A worker not
heard from yet has no speed and does not count in the max. The factor v_i / max_j v_j is taken with
1e-9 added before the floor, so that workers of equal speed whose seconds were summed in different
orders still take H. Each Δ is applied as it comes (its number of inner steps does not weight it),
as without DyLU.

The protocol runs on both server-mode drivers (``gradwire/servers/``); the simulator charges a
message the sum of its H (with DyLU, H_i) inner steps' straggler draws. One step of the run is ``world_size``
arrivals (as ``async``), so step k has consumed as many inner steps as k rounds of DiLoCo.
Evaluation uses the server's θ.
"""

from __future__ import annotations

import math

import torch

from gradwire.algorithms.base import ALGORITHMS
from gradwire.algorithms.diloco import DILOCO_PARAMS, OUTER_MOMENTUM, OUTER_WARMUP, outer_momentum_at
from gradwire.algorithms.outer_replicas import ANSWER_HELP, ServerDiLoCo, split_report
from gradwire.algorithms.protocol import PARAMS, Answer
from gradwire.spec import require

# η: DiLoCo's 0.7 with μ = 0.9 moves θ about η/(1-μ) = 7 times the mean change, which a replica
# that reads θ up to a round late turns into oscillation; 0.2 (2 times) learned best of 0.1-0.7 on
# mnist1d-mlp, 8 workers, 50 steps, held-out seed 3 (docs/low_communication.md).
ASYNC_OUTER_LR = 0.2
ASYNC_DILOCO_PARAMS = {key: DILOCO_PARAMS[key] for key in (
    "inner_steps", "outer_lr", "outer_momentum", "outer_warmup", "inner", "beta1", "beta2", "eps", "weight_decay")} | {
    "inner_steps": "H >= 1: inner steps a replica takes before it sends its pseudo-gradient",
    "period": "N >= 0: arrivals per momentum update of the delayed Nesterov rule (Liu et al. 2024); 0 = the "
              "number of workers; 1 = Nesterov on every arrival",
    "outer_lr": "outer learning rate η (0.2: a third of DiLoCo's 0.7, as replicas read θ up to a round late)",
    "outer_warmup": "W >= 0 momentum updates over which the outer momentum ramps linearly from 0 (0 = constant μ)",
    "dylu": "true: dynamic local updates (Liu et al. 2024): worker i takes H_i = floor(H v_i / max_j v_j) inner "
            "steps, v its measured speed; false: every worker takes H",
    "answer": ANSWER_HELP,
}


class DelayedNesterov:
    """The server's outer optimizer: Liu et al. 2024's delayed Nesterov update on θ (in place)."""

    def __init__(self, theta: torch.Tensor, *, lr: float, momentum: float, period: int, warmup: int):
        self.theta, self.lr, self.momentum, self.period, self.warmup = theta, lr, momentum, period, warmup
        self.velocity = torch.zeros_like(theta)
        self.buffer = torch.zeros_like(theta)
        self.arrivals = 0  # pseudo-gradients applied
        self.updates = 0   # momentum updates taken (arrivals // period)

    def apply(self, delta: torch.Tensor) -> None:
        self.arrivals += 1
        self.buffer.add_(delta)
        share = delta / self.period
        if self.arrivals % self.period:
            self.theta.sub_(share, alpha=self.lr)
            return
        mu = outer_momentum_at(self.momentum, self.warmup, self.updates) if self.warmup else self.momentum
        self.updates += 1
        self.velocity.mul_(mu).add_(self.buffer / self.period)
        self.theta.sub_(share.add(self.velocity, alpha=mu), alpha=self.lr)
        self.buffer.zero_()

    def state_dict(self) -> dict:
        return {"velocity": self.velocity, "buffer": self.buffer, "arrivals": self.arrivals, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.velocity.copy_(state["velocity"])
        self.buffer.copy_(state["buffer"])
        self.arrivals, self.updates = int(state["arrivals"]), int(state["updates"])


class WorkerSpeeds:
    """The server's measure of each worker's speed (DyLU): the inner steps it has reported and the
    seconds they took, since the start; and the H_i each worker is computing now."""

    def __init__(self, world_size: int, inner_steps: int):
        self.inner_steps = inner_steps
        self.steps = [0] * world_size
        self.seconds = torch.zeros(world_size, dtype=torch.float64)
        self.assigned = [inner_steps] * world_size  # every worker's first phase takes H

    def report(self, worker: int, steps: int, seconds: float) -> None:
        """Worker ``worker`` took ``seconds`` for its phase of ``steps`` inner steps: its next H_i is
        ⌊H v_i / max_j v_j⌋ (at least 1), v = steps per second over the workers heard from."""
        self.steps[worker] += steps
        self.seconds[worker] += seconds
        per_step = [float(self.seconds[w]) / n for w, n in enumerate(self.steps) if n]
        fraction = min(per_step) / (float(self.seconds[worker]) / self.steps[worker])  # v_i / max_j v_j
        self.assigned[worker] = max(1, math.floor(self.inner_steps * fraction + 1e-9))

    def state_dict(self) -> dict:
        return {"steps": list(self.steps), "seconds": self.seconds, "assigned": list(self.assigned)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = [int(n) for n in state["steps"]]
        self.seconds.copy_(state["seconds"])
        self.assigned = [int(n) for n in state["assigned"]]


@ALGORITHMS.register("async-diloco", help="asynchronous DiLoCo: an outer step on every pseudo-gradient as it arrives, "
                     "with delayed Nesterov momentum (Liu et al. 2024); a --steps step is n arrivals, an outer "
                     "round's worth (H inner steps a replica)",
                     params=ASYNC_DILOCO_PARAMS)
class AsyncDiLoCo(ServerDiLoCo):
    name = "async-diloco"
    # the inner AdamW's, as DiLoCo's (docs/defaults.md: 0.003, at which its outer_lr was tuned in
    # docs/low_communication.md, learned 5 points less on the default task)
    default_lr = 1e-2

    def __init__(self, *, inner_steps: int = 10, period: int = 0, outer_lr: float = ASYNC_OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, outer_warmup: int = OUTER_WARMUP, inner: str = "adamw",
                 beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8, weight_decay: float = 0.1,
                 dylu: bool = False, answer: str = "params"):
        self.inner_settings(inner_steps=inner_steps, inner=inner, beta1=beta1, beta2=beta2, eps=eps,
                            weight_decay=weight_decay, answer=answer)
        require(period >= 0, f"period must be >= 0 (arrivals per momentum update; 0 = the workers), got {period}")
        require(outer_lr > 0, f"outer_lr must be > 0, got {outer_lr}")
        require(0 <= outer_momentum < 1, f"outer_momentum must be in [0, 1), got {outer_momentum}")
        require(outer_warmup >= 0, f"outer_warmup must be >= 0 (momentum updates of ramp), got {outer_warmup}")
        self.period = period
        self.adapts_inner_steps = bool(dylu)
        self.outer_lr, self.outer_momentum, self.outer_warmup = outer_lr, outer_momentum, outer_warmup

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        self.world_size = ctx.world_size
        self.outer = DelayedNesterov(self.theta, lr=self.outer_lr, momentum=self.outer_momentum,
                                     period=self.period or ctx.world_size, warmup=self.outer_warmup) \
            if self.serves else None
        self.round: list[tuple[float, int, int]] = []  # this step's (loss, staleness, inner steps)
        self.speeds = WorkerSpeeds(ctx.world_size, self.inner_steps)

    @property
    def tag(self) -> int:
        return self.outer.arrivals  # the version of θ a replica reads

    def schedule_start(self, tag):
        return tag * self.inner_steps // self.world_size  # n arrivals are a round of H inner steps

    def on_message(self, msg, finished):
        if finished:  # after the last step: nothing more is applied
            return Answer([self.answer(msg.worker)], dropped=True)
        staleness = self.outer.arrivals - msg.tag
        body, steps = msg.body, self.speeds.assigned[msg.worker]
        if self.adapts_inner_steps:
            body, seconds = split_report(body)
            self.speeds.report(msg.worker, steps, seconds)
        self.outer.apply(self.averager.decode(body, self.theta))
        self.round.append((msg.value, staleness, steps))
        answer = Answer([self.answer(msg.worker)], staleness=staleness)
        if len(self.round) == self.world_size:
            stale = [s for _, s, _ in self.round]
            answer.step = {"loss": sum(loss for loss, _, _ in self.round) / len(self.round),
                           "gradients": sum(h for _, _, h in self.round), "dropped": 0,
                           "staleness_mean": sum(stale) / len(stale), "staleness_max": max(stale),
                           "momentum_updates": self.outer.updates,
                           **({"inner_steps_min": min(h for _, _, h in self.round)} if self.adapts_inner_steps else {})}
            self.round = []
        return answer

    def answer(self, worker, kind=PARAMS):
        """θ, and (DyLU) the worker's next H_i as the answer's value."""
        reply = super().answer(worker, kind)
        if self.adapts_inner_steps:
            reply.value = float(self.speeds.assigned[worker])
        return reply

    def server_only_state(self):
        return {"outer": self.outer.state_dict(),
                "round": [{"loss": torch.tensor(loss, dtype=torch.float64), "staleness": s, "steps": h}
                          for loss, s, h in self.round],
                "speeds": self.speeds.state_dict()}

    def load_server_only_state(self, state):
        self.outer.load_state_dict(state["outer"])
        self.round = [(float(e["loss"]), int(e["staleness"]), int(e["steps"])) for e in state["round"]]
        self.speeds.load_state_dict(state["speeds"])
