"""What the server-mode DiLoCo family (``backup-diloco``, ``async-diloco``) shares: the replica
side, and the server's θ, codec and answers (``ServerDiLoCo``).

Replica i holds the θ of the server's last answer, takes H inner steps of its own optimizer from
there (AdamW as DiLoCo's, Douillard et al. 2023, arXiv:2311.08105, Algorithm 1, or SGD; its state
stays with the replica across rounds) and sends its outer gradient Δ_i = θ - x_i as GRADIENT,
tagged with what the server's answer carried (a round, or a parameter version). The server's
answer (PARAMS or JOIN) restarts it from the new θ. What the server does with the Δ_i is the
algorithm's.

A replica's inner steps are numbered across its phases (its gradients so far): phase k's seconds
are the straggler model's draws of the gradients it takes in that phase, so a phase of any length
(``steps_from_answer``: the server's answer sets the next phase's H_i, async-diloco's DyLU) is
charged its own steps. With a constant H that is the draws (k-1)H+1 .. kH. A replica's inner
optimizer follows --lr-schedule by the run's progress (``PhaseRate``): the schedule spans ``--steps``
× H inner updates (a step of the run is an outer round's worth: H inner steps a replica), and the
j-th inner step of a phase computed for tag t is at position ``schedule_start(t) + j`` (backup-diloco:
(round - 1) H; async-diloco: the version read, in arrivals, times H/n), as DiLoCo's inner optimizer is
by step. So a fast replica does not run past the schedule, a slow one is not held back in it, and a
replica that rejoins (JOIN's tag) continues where the run is. With
``report_seconds`` the message carries those seconds, the replica's measure of its own speed, as
an 8-byte float64 after the codec's payload (``split_report`` on the server).

The server's answer (``ServerAnswers``) is θ itself (``answer=params``), 32 bits a parameter to
every replica every round, or (``answer=change``) θ minus what the replica holds, through the same
codec as the pseudo-gradients: the server keeps each replica's copy (its view) and adds to it what
the answer decodes to, as the replica does, so what a message leaves out stays in the next one's
difference. That is EF21-P's primal compression (Gruntkowska, Tyurin, Richtárik 2023, "EF21-P and
Friends: Improved Theoretical Communication Complexity for Distributed Optimization with
Bidirectional Compression", arXiv:2209.15218: w̃ ← w̃ + C(w − w̃), the workers computing at w̃).
A replica that rejoins is sent θ itself (JOIN), and its view restarts there.
"""

from __future__ import annotations

import dataclasses

import torch

from gradwire.algorithms.base import Algorithm, make_averager
from gradwire.algorithms.diloco import INNER_CHOICES, inner_nesterov
from gradwire.algorithms.optim import AdamW, require_sgd
from gradwire.algorithms.protocol import GRADIENT, JOIN, PARAMS, Message, as_body
from gradwire.algorithms.replicas import Replicas, mean_or_nan
from gradwire.compress.error_feedback import ef_scale
from gradwire.spec import require
from gradwire.transports.base import SERVER


class OuterReplicas:
    """Every local replica of a server-mode DiLoCo: its x_i, inner optimizer, the θ it started
    from and the tag it computes for."""

    def __init__(self, ctx, params: torch.Tensor, optim, *, name: str, inner: str, inner_steps: int,
                 betas: tuple[float, float], eps: float, weight_decay: float, first_tag: int,
                 schedule_start, steps_from_answer: bool = False, report_seconds: bool = False):
        if inner == "adamw":
            require(not optim.momentum and not optim.weight_decay,
                    f"{name} with inner=adamw: --momentum and --weight-decay apply to inner=sgd; AdamW's are "
                    "the spec's beta1, beta2 and weight_decay")
        adamw = None if inner == "sgd" else (
            lambda x: AdamW(x, lr=optim.lr, betas=betas, eps=eps, weight_decay=weight_decay, l1=optim.l1,
                            lr_schedule=optim.lr_schedule, horizon=optim.horizon))
        self.inner_steps = inner_steps
        self.replicas = Replicas(ctx, params, optim, optimizer=adamw)
        for opt in self.replicas.opt.values():  # the schedule by the run's progress, not the replica's count
            opt.rate = PhaseRate(opt.rate)
        self.schedule_start = schedule_start  # tag -> the schedule position of a phase computed for it
        self.held = {r: params.clone() for r in ctx.local_ranks}  # the θ each replica started from
        self.tag = {r: first_tag for r in ctx.local_ranks}         # what it computes for
        self.steps = {r: inner_steps for r in ctx.local_ranks}     # H_i of its current phase
        self.gradients = {r: 0 for r in ctx.local_ranks}           # inner steps taken so far
        self.seconds = {r: 0.0 for r in ctx.local_ranks}           # its last phase's compute seconds
        self.steps_from_answer = steps_from_answer
        self.report_seconds = report_seconds

    def compute_seconds(self, ctx, rank: int, count: int) -> float:
        """The seconds of the phase ``message`` just computed: the straggler draws of its H_i gradients."""
        return self.seconds[rank]

    def message(self, ctx, rank: int, count: int, averager) -> Message:
        """H_i inner steps, then Δ_i = θ - x_i through the averager's codec (key ``outer``), and
        (``report_seconds``) the phase's seconds after it."""
        first, steps = self.gradients[rank], self.steps[rank]
        rate, start = self.replicas.opt[rank].rate, self.schedule_start(self.tag[rank])
        losses = []
        for j in range(steps):
            rate.position = start + j
            losses.append(self.replicas.sgd_step(ctx, rank))
        self.gradients[rank] = first + steps
        self.seconds[rank] = sum(ctx.compute_time(rank, first + j) for j in range(1, steps + 1))
        delta = self.held[rank] - self.replicas.x[rank]
        body = averager.encode(rank, delta, key="outer").buffer
        if self.report_seconds:
            seconds = torch.tensor([self.seconds[rank]], dtype=torch.float64, device=body.device)
            body = torch.cat([body, seconds.view(torch.uint8)])
        return Message(GRADIENT, rank, tag=self.tag[rank], count=count, value=mean_or_nan(losses), body=body)

    def apply(self, rank: int, reply: Message, decode_change=None) -> None:
        """PARAMS or JOIN: the next round starts from θ (x_i <- θ); the inner optimizer's state stays;
        (``steps_from_answer``) the answer's value is the next phase's H_i. With ``decode_change``
        (``answer=change``) a PARAMS answer is the codec's payload of θ's change since what the
        replica holds, added to it (JOIN is θ itself)."""
        if decode_change is not None and reply.kind != JOIN:
            self.held[rank].add_(decode_change(reply.body, self.held[rank]))
        else:
            self.held[rank].copy_(reply.tensor(self.held[rank]))
        self.replicas.x[rank].copy_(self.held[rank])
        self.tag[rank] = reply.tag
        if self.steps_from_answer:
            self.steps[rank] = int(reply.value)

    def state_dict(self) -> dict:
        return {"replicas": self.replicas.state_dict(), "held": {str(r): t for r, t in self.held.items()},
                "tag": {str(r): t for r, t in self.tag.items()},
                "steps": {str(r): n for r, n in self.steps.items()},
                "gradients": {str(r): n for r, n in self.gradients.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.replicas.load_state_dict(state["replicas"])
        for r in self.held:
            self.held[r].copy_(state["held"][str(r)])
            self.tag[r] = int(state["tag"][str(r)])
            self.steps[r] = int(state["steps"][str(r)])
            self.gradients[r] = int(state["gradients"][str(r)])


class PhaseRate:
    """A replica's --lr-schedule rate at the position its phase sets (module docstring), whatever
    its optimizer's own update count (which AdamW's bias correction keeps using)."""

    def __init__(self, rate):
        self.rate, self.position = rate, 0

    def at(self, update: int) -> float:
        return self.rate.at(self.position)


ANSWER_CHOICES = ("params", "change")
ANSWER_HELP = ("what the server answers a replica with: params (θ itself, 32 bits a parameter) or change (θ minus "
               "the replica's copy through --compressor, the server keeping each copy: EF21-P, Gruntkowska 2023)")


class ServerAnswers:
    """The body of the server's answers (module docstring): θ itself, or its change since each
    replica's copy through the codec (``change``: the copies, ``views``, are created as a replica is
    first answered, from the parameters every replica starts with). EF21-P's rule needs a
    contractive compressor: an unbiased one of variance ω ≥ 1 (rand-k, QSGD) is sent the change
    scaled by 1/(1 + ω), as error feedback scales its input (``compress.error_feedback.ef_scale``);
    unscaled, the copies' distance to θ grows by about √ω a round."""

    def __init__(self, kind: str, theta: torch.Tensor, averager, generator: torch.Generator):
        self.kind, self.theta, self.averager, self.gen = kind, theta, averager, generator
        self.start = theta.clone() if kind == "change" else None  # what every replica holds before its first answer
        self.views: dict[int, torch.Tensor] = {}

    def body(self, worker: int, whole: bool = False) -> torch.Tensor:
        """Worker ``worker``'s answer body; ``whole``: θ itself whatever the kind (JOIN)."""
        if self.kind == "params" or whole:
            if self.kind == "change":
                self.views[worker] = self.theta.clone()
            return as_body(self.theta)
        view = self.views.setdefault(worker, self.start.clone())
        change = self.theta - view
        scale = ef_scale(self.averager.compressor, change.numel())  # a contraction, as error feedback's
        payload = self.averager.compressor.encode(change.mul_(scale) if scale != 1.0 else change,
                                                  generator=self.gen).buffer
        view.add_(self.averager.decode(payload, view))  # as the replica will (OuterReplicas.apply)
        return payload

    def state_dict(self) -> dict:
        if self.kind == "params":
            return {}
        return {"start": self.start, "views": {str(w): v for w, v in self.views.items()},
                "generator": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if self.kind == "params":
            return
        self.start.copy_(state["start"])
        self.views = {int(w): v.clone() for w, v in state["views"].items()}
        self.gen.set_state(state["generator"])


def split_report(body: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A message body sent with ``report_seconds``: the codec's payload and the phase's seconds."""
    # copied: a float64 view needs an offset divisible by 8, and the payload's length need not be one
    return body[:-8], float(body[-8:].clone().view(torch.float64))


class ServerDiLoCo(Algorithm):
    """A server-mode DiLoCo: replicas take H inner steps (``OuterReplicas``) and send their Δ; the
    server keeps θ, decodes each Δ with the averager's codec and answers with θ (PARAMS, or JOIN to
    a replica that rejoins), tagged with ``tag``; evaluation uses θ. A subclass states what the
    server does with the Δ (``on_message``) and what its answers are tagged with."""

    evaluates = "server"
    needs_server = True
    default_compressor = "none"  # pseudo-gradients travel as they are unless --compressor says otherwise
    default_lr = 1e-2  # the inner AdamW's --lr when not given, as DiLoCo's (docs/defaults.md)
    lr_scales_with_task = False  # AdamW's step is in the parameters' units, not the gradient's
    first_tag = 0      # the tag a replica computes for before any answer
    adapts_inner_steps = False  # True: replicas report their phase's seconds, the answers set their next H_i

    def inner_settings(self, *, inner_steps: int, inner: str, beta1: float, beta2: float, eps: float,
                       weight_decay: float, answer: str = "params") -> None:
        require(inner_steps >= 1, f"inner_steps must be >= 1 (inner steps a replica takes per message), got "
                                  f"{inner_steps}")
        require(inner in INNER_CHOICES, f"inner={inner!r}: valid choices are {', '.join(INNER_CHOICES)}")
        require(answer in ANSWER_CHOICES, f"answer={answer!r}: valid choices are {', '.join(ANSWER_CHOICES)}")
        self.inner_steps, self.inner, self.betas, self.eps, self.weight_decay = (
            inner_steps, inner, (beta1, beta2), eps, weight_decay)
        self.answer_kind = answer

    @property
    def nesterov_instead(self):
        return inner_nesterov(self.name, self.inner)

    @property
    def schedule_updates_per_step(self) -> int:
        return self.inner_steps

    def combination_notes(self, compressor):
        """``answer=change`` through an unbiased codec: its answers are scaled to a contraction
        (``ServerAnswers``), so the replicas' copies follow θ slowly (measured: 2-bit pquant diverged at
        H = 20, docs/time_to_accuracy.md's thirteenth pass). Through a biased one (sign, top-k) with
        outer momentum: the copies lag θ's amplified moves (docs/low_communication.md's table)."""
        from gradwire.averaging import build_method
        from gradwire.compress import Compressor

        codec = build_method(compressor)
        if self.answer_kind != "change" or not isinstance(codec, Compressor) or codec.summable:
            return ()  # θ answered, a method of its own, or a cast (fp16: as good as θ, the docs' table)
        # scaled (ef_scale) where its variance bound ω >= 1 at the model's size, unknown here: as at a million
        if ef_scale(codec, 10**6) == 1.0:
            lr, momentum = self.outer_lr, self.outer_momentum
            if codec.unbiased or momentum == 0:
                return ()
            return (f"answer=change sends the server's answers through {compressor!r}, a lossy codec, with outer "
                    f"momentum {momentum:g}: θ moves about outer_lr / (1 - outer_momentum) = {lr / (1 - momentum):.3g} "
                    "times a round's mean change, and each replica's copy lags it (default task, 100 steps, one seed: "
                    "1 bit both ways 0.540 test accuracy against 0.632 with 1 bit up only; with outer_lr=1,"
                    "outer_momentum=0 0.623; docs/low_communication.md)",)
        return (f"answer=change sends the server's answers through {compressor!r}, an unbiased codec: where its "
                "variance ω at the model's size is >= 1 they are scaled by 1/(1 + ω) to keep EF21-P's copies bounded, "
                "so each replica's copy follows θ slowly (2-bit pquant diverged at H = 20 on stdlib-lm); a biased "
                "codec such as sign:scaled=true or chunked-topk keeps them closer, the closest without outer "
                "momentum (outer_momentum=0)",)

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_sgd(optim, f"{self.name} (its inner optimizer is the spec's inner=, its outer one the server's)")
        # the replicas' schedule spans --steps rounds of H inner updates (the warm-up check's count too)
        optim = dataclasses.replace(optim, horizon=optim.horizon * self.schedule_updates_per_step)
        self.workers = OuterReplicas(ctx, params, optim, name=self.name, inner=self.inner, inner_steps=self.inner_steps,
                                     betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                     first_tag=self.first_tag, schedule_start=self.schedule_start,
                                     steps_from_answer=self.adapts_inner_steps, report_seconds=self.adapts_inner_steps)
        self.averager = make_averager(ctx, codec, default=self.default_compressor)
        # the server's θ and answers (and a subclass's outer state: ``serves``), in the process that
        # holds the server only: a worker's process of a real backend would keep copies it never uses
        self.serves = ctx.transport.holds_server
        self.theta = params.clone() if self.serves else None
        self.answers = ServerAnswers(self.answer_kind, self.theta, self.averager, ctx.generator(SERVER, "answer")) \
            if self.serves else None

    @property
    def tag(self) -> int:
        """What the server's answers carry (a round, a parameter version)."""
        raise NotImplementedError

    def schedule_start(self, tag: int) -> int:
        """Where in --lr-schedule (inner updates from the run's start) a phase computed for ``tag``
        begins: the run's progress when it was answered."""
        raise NotImplementedError

    def compressor_spec(self):
        return self.averager.spec()

    def compute_seconds(self, ctx, rank, count):
        return self.workers.compute_seconds(ctx, rank, count)

    def worker_step(self, ctx, rank, count):
        return self.workers.message(ctx, rank, count, self.averager)

    def worker_apply(self, ctx, rank, reply):
        self.workers.apply(rank, reply, self.averager.decode if self.answer_kind == "change" else None)
        return None

    def answer(self, worker: int, kind: int = PARAMS) -> Message:
        return Message(kind, worker, tag=self.tag, body=self.answers.body(worker, whole=kind == JOIN))

    def state_dict(self) -> dict:
        """The codec and the local replicas; where this process holds the server, θ, the answers
        and the subclass's server state (``server_only_state``) too."""
        state = {"codec": self.averager.state_dict(), **self.workers.state_dict()}
        if self.serves:
            state |= {"theta": self.theta, "answers": self.answers.state_dict(), **self.server_only_state()}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.averager.load_state_dict(state["codec"])
        self.workers.load_state_dict(state)
        if self.serves:
            self.theta.copy_(state["theta"])
            self.answers.load_state_dict(state.get("answers", {}))
            self.load_server_only_state(state)

    def server_only_state(self) -> dict:
        """The subclass's server state (its outer optimizer, the round or arrivals in progress)."""
        raise NotImplementedError

    def load_server_only_state(self, state: dict) -> None:
        raise NotImplementedError

    def join_reply(self, worker):
        return self.answer(worker, JOIN)

    def eval_params(self):
        return self.theta

    def step(self, ctx, step):
        raise NotImplementedError(f"{self.name} runs in server mode (needs_server)")
