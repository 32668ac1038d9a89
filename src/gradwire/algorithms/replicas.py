"""Pieces shared by the algorithms that keep one model replica per worker (LSGD, EASGD, local SGD,
DaSGD): the replicas and their optimizers, running losses, leader election, the pull towards a
broadcast model, and the simulated pace of workers that step on their own.

Everything here touches ``ctx.local_ranks`` only; what a worker needs from the others goes through
``ctx.transport`` collectives. So the same code runs with every worker in one process (the
simulator) and with one worker per process (the torch backend).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from gradwire.algorithms.base import ALGORITHMS, CodecConfig
from gradwire.algorithms.optim import make_optimizer
from gradwire.report.timeline import COMPUTE
from gradwire.spec import require


def require_plain_codec(codec: CodecConfig, name: str) -> None:
    require(codec.compressor == "none" and not codec.error_feedback,
            f"{name} exchanges parameters uncompressed: --compressor and --error-feedback do not apply")


def register_with_async_key(name: str, cls, *, help: str, params: dict[str, str],
                            shown_defaults: dict[str, str] | None = None) -> None:
    """Register ``cls`` (which takes ``asynchronous=``) so that its spec key is ``async``: a Python
    keyword cannot be a parameter name, so the entry's parameter is renamed after registration."""
    ALGORITHMS.register(name, help=help, params=params, shown_defaults=shown_defaults)(cls)
    entry = ALGORITHMS.entry(name)
    entry.params["async"] = dataclasses.replace(entry.params.pop("asynchronous"), name="async")
    entry.factory = lambda **kw: cls(**{("asynchronous" if k == "async" else k): v for k, v in kw.items()})


def carry_progress_(x: torch.Tensor, sent: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
    """A delayed average merged so that the progress made while it travelled is kept (DaSGD, Zhou et
    al. 2020): x <- average + (x - sent), ``sent`` the parameters the average was taken from; in place."""
    return x.sub_(sent).add_(average)


def mean_or_nan(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


class Replicas:
    """x_i and the heavy-ball state of every local worker (momentum stays local: only parameters
    are exchanged, as in local SGD and EASGD). ``optimizer(x)``, when given, builds another local
    optimizer for a replica x (DiLoCo's inner AdamW): anything with ``apply(grad)`` and a state dict."""

    def __init__(self, ctx, params: torch.Tensor, optim, optimizer=None):
        self.x = {r: params.clone() for r in ctx.local_ranks}
        make = optimizer or (lambda x: make_optimizer(x, optim))
        self.opt = {r: make(self.x[r]) for r in ctx.local_ranks}

    def sgd_step(self, ctx, rank: int) -> float:
        """One local step x_i <- x_i - γ (heavy-ball, or the given optimizer) g_i(x_i); returns the
        minibatch loss."""
        loss, grad = ctx.gradient(rank, self.x[rank])
        self.opt[rank].apply(grad)
        return loss

    def per_worker_state(self) -> tuple[str, ...]:
        return ("x", "opt")

    def state_dict(self) -> dict:
        return {"x": {str(r): t for r, t in self.x.items()},
                "opt": {str(r): o.state_dict() for r, o in self.opt.items()}}

    def load_state_dict(self, state: dict) -> None:
        for r in self.x:
            self.x[r].copy_(state["x"][str(r)])
            self.opt[r].load_state_dict(state["opt"][str(r)])


@contextlib.contextmanager
def uncharged(ctx):
    """Communication that serves evaluation only, kept out of the run's bytes, communication time and
    simulated clock: what a run reports is what training costs, however often it is evaluated."""
    now = ctx.clock.now
    try:
        with ctx.transport.uncounted():  # its clock is rewound: not on the timeline either
            yield
    finally:
        ctx.clock.now = now  # a wall clock ignores this: real time passed


class EvaluatedReplicas:
    """What evaluation uses when it is the workers' replicas themselves (``eval=`` of LSGD, EASGD and
    local SGD, so that comparisons evaluate like for like):

    - ``average``: the mean of every worker's parameters at the evaluation step, one allreduce (the
      "center variable" the LSGD authors test, Teng et al. 2019; their code all-reduces the
      workers' parameters before each test);
    - ``each``: every worker's parameters, gathered at rank 0 as a (workers × parameters) stack;
      ``tasks.evaluate`` evaluates each row and reports the means (and ``test_acc_each``).

    ``refresh`` runs on every process at evaluation steps (``Algorithm.before_evaluation``); its
    communication is not charged to the run (``uncharged``). Before the first refresh every worker
    still holds the common starting point, which ``params`` is then."""

    def __init__(self, ctx, params: torch.Tensor, how: str):
        self.how = how
        self.params = params.clone() if how != "each" else params.repeat(ctx.world_size, 1)

    def refresh(self, ctx, replicas: Replicas) -> None:
        if self.how == "average":
            with uncharged(ctx):
                self.params.copy_(ctx.transport.allreduce_mean(dict(replicas.x)))
        elif self.how == "each":
            like = self.params[0]
            nbytes = like.numel() * like.element_size()
            with uncharged(ctx):
                gathered = ctx.transport.gather({r: x.view(torch.uint8) for r, x in replicas.x.items()}, 0,
                                                size=nbytes)
            for r, buffer in (gathered or {}).items():  # None where rank 0 is not local
                self.params[r].copy_(buffer.view(like.dtype))

    def state_dict(self) -> dict:
        return {"params": self.params}

    def load_state_dict(self, state: dict) -> None:
        self.params.copy_(state["params"])


class LossWindow:
    """Each local worker's last ``size`` minibatch losses, for the running averages that elect
    leaders (a window rather than one minibatch, so one lucky batch does not crown a worker)."""

    def __init__(self, ranks, size: int):
        self.size = size
        self.values = {r: torch.zeros(size, dtype=torch.float64) for r in ranks}
        self.count = {r: 0 for r in ranks}

    def push(self, rank: int, loss: float) -> None:
        self.values[rank][self.count[rank] % self.size] = loss
        self.count[rank] += 1

    def mean(self, rank: int, window: int) -> float:
        """Mean of the last ``window`` losses (fewer at the start; +inf before any)."""
        n = min(window, self.size, self.count[rank])
        if n == 0:
            return math.inf
        last = [(self.count[rank] - 1 - k) % self.size for k in range(n)]
        return float(self.values[rank][last].mean())

    def per_worker_state(self) -> tuple[str, ...]:
        return ("values", "count")

    def state_dict(self) -> dict:
        return {"values": {str(r): v for r, v in self.values.items()},
                "count": {str(r): n for r, n in self.count.items()}}

    def load_state_dict(self, state: dict) -> None:
        for r in self.values:
            self.values[r].copy_(state["values"][str(r)])
            self.count[r] = int(state["count"][str(r)])


def elect(ctx, scores: dict[int, float], ranks=None) -> tuple[int, float]:
    """The participant with the lowest score (ties: the lowest rank). Each local participant's score
    crosses the wire as 4 bytes (float32), so every process compares the same rounded values."""
    buffers = {r: torch.tensor([s], dtype=torch.float32).view(torch.uint8) for r, s in scores.items()}
    gathered = ctx.transport.allgather(buffers, ranks, size=4)
    values = {r: float(b.view(torch.float32)[0]) for r, b in gathered.items()}
    leader = min(values, key=lambda r: (values[r], r))
    return leader, values[leader]


def pull_towards(ctx, x: dict[int, torch.Tensor], src: int, ranks,
                 weight: float) -> tuple[torch.Tensor, float]:
    """Broadcast ``src``'s parameters to the participants; each local one moves ``weight`` of the
    way towards them, x <- x + w (x_src - x) (``lerp``, exact at w = 0 and w = 1). Returns a copy of
    the broadcast parameters and the mean distance of the local participants to them before the pull.
    The parameters travel as their raw bytes, whose size every participant knows."""
    like = next(iter(x.values()))
    nbytes = like.numel() * like.element_size()
    buffer = x[src].view(torch.uint8) if src in x else torch.empty(nbytes, dtype=torch.uint8)
    lead = ctx.transport.broadcast(buffer, src, ranks, size=nbytes).view(like.dtype).clone()
    mine = [r for r in x if ranks is None or r in ranks]
    distance = mean_or_nan(float(torch.dist(x[r], lead)) for r in mine)
    for r in mine:
        if r != src:
            x[r].lerp_(lead, weight)
    return lead, distance


class Pace:
    """Simulated time of workers that take local steps between communications.

    ``ready[r]`` is when local worker r finishes its latest step. The clock is kept at the latest of
    them: the moment every worker has finished the current step, which is when a blocking
    collective can start. Between communications fast workers run ahead instead of waiting for the
    slowest at every step (the point of local updates under stragglers).
    """

    def __init__(self, ctx):
        self.ready = {r: ctx.clock.now for r in ctx.local_ranks}

    def computed(self, ctx, step: int) -> None:
        """Every local worker has computed its ``step``-th gradient."""
        for r in self.ready:
            start = self.ready[r]
            self.ready[r] += ctx.compute_time(r, step)
            if ctx.timeline.simulated:
                ctx.timeline.add(r, COMPUTE, start, self.ready[r])
        ctx.wait_compute(max(0.0, max(self.ready.values()) - ctx.clock.now))

    def joined(self, ctx, until: float | None = None) -> None:
        """The local workers waited for a communication that ended at ``until`` (default: now)."""
        until = ctx.clock.now if until is None else until
        for r in self.ready:
            self.ready[r] = max(self.ready[r], until)

    def per_worker_state(self) -> tuple[str, ...]:
        return ("ready",)

    def state_dict(self) -> dict:
        return {"ready": {str(r): torch.tensor(t, dtype=torch.float64) for r, t in self.ready.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.ready = {r: float(state["ready"][str(r)]) for r in self.ready}
