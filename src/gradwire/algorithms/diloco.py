"""DiLoCo and Streaming DiLoCo: local optimisation with an outer optimizer on the averaged
parameter change.

**DiLoCo** (Douillard, Feng, Rusu, Chhaparwal, Kuncoro, Kuncoro, Ranzato, Szlam, Shen 2023,
"DiLoCo: Distributed Low-Communication Training of Language Models", arXiv:2311.08105,
Algorithm 1). Every worker i starts a round from the shared parameters θ, takes H inner steps of
its own optimizer (AdamW in the paper; its state m, v stays with the worker across rounds), and
the round ends with one collective, the mean of the *outer gradients*:

    Δ_i = θ - x_i                      (x_i: worker i's parameters after its H inner steps)
    Δ   = (1/n) Σ_i Δ_i
    θ  <- OuterOpt(θ, Δ)               (Nesterov momentum SGD; paper: lr 0.7, momentum 0.9)
    x_i <- θ

With an outer SGD step of learning rate 1 and no momentum θ becomes the workers' mean, local
SGD; with also H = 1 and plain SGD inside it is synchronous SGD, and with one worker it is the inner
optimizer alone (both tested). From a random start the papers' outer step (η = 0.7, μ = 0.9: θ moves
about η/(1-μ) = 7 times the averaged change) overshoots in the first rounds; ``outer_warmup=W``
ramps μ from 0 over the first W rounds (default 10; docs/diloco.md, "From a random start").
Under a decaying --lr-schedule the inner steps shrink but a constant outer step still multiplies their
average by about η/(1-μ); ``outer_schedule=inner`` gives the round sent after inner step t the outer
rate η_t = η f(t-1), f the schedule's factor of that round's last inner update, so the outer step
warms up and anneals with the inner one. The averaged change already shrinks with the inner rate,
so this anneals θ's movement twice (∝ f²): on stdlib-lm it learned worse than the constant outer rate
(docs/diloco.md, "Annealing the outer step"), hence the default ``constant``.
θ changes only at round ends, so evaluations move onto them (``evaluates_at``). The outer gradients go
through gradwire's averager: ``--compressor`` (with ``--error-feedback``, one residual per fragment)
compresses them as it compresses gradients elsewhere.

**Streaming DiLoCo** (Douillard, Donchev, Rush, Kale, Rusu, Ranzato, Szlam, Shen, et al. 2025,
"Streaming DiLoCo with overlapping communication: Towards a Distributed Free Lunch",
arXiv:2501.18512, Sections 2.2-2.4) changes three things, none of which changes the bytes of a
round, only when they travel:

1. *Fragments.* The parameters are cut into P fragments; fragment p has its own outer round, at
   the steps t with (t - t_p) mod H = 0, offsets t_p = ⌊p H / P⌋ staggered across the H steps, so
   at most about 1/P of the model is on the wire at any moment (the paper's peak bandwidth cut).
   Here a fragment is a contiguous, equally sized range of the flat parameter vector (the paper
   groups whole transformer blocks; the outer optimizer is element-wise, so only which elements
   travel together differs).
2. *Overlap.* Fragment p's outer gradient, sent at step t, is used at step t + τ: the workers
   keep training meanwhile, and the communication costs time only where it outlasts those τ
   steps. The merge mixes the worker's own parameters, which moved on for τ steps, with the new
   global ones: x_{i,p} <- α x_{i,p} + (1 - α) θ_p (the paper's α; α = 0 discards the τ local
   steps, α = 0.5 is the paper's choice; gradwire's default is 0, which learned better with
   τ = 1 on the default task: docs/defaults.md). ``merge=carry`` instead keeps those τ steps'
   progress on top of the new global parameters, DaSGD's delayed-averaging rule (Zhou et al. 2020;
   ``dasgd.py``) applied to the outer step: x_{i,p} <- θ_p + (x_{i,p} - x_{i,p}(t)), x_{i,p}(t)
   the parameters the worker sent from. With outer η 1 and no momentum θ_p is then the average of
   the sent parameters, and the round is DaSGD's. Nothing of the local steps is discarded or
   halved, so a round can travel without the steps that α's mixing costs (docs/time_to_accuracy.md).
3. *Quantised outer gradients* (the paper sends 4-bit floats): any gradwire compressor, e.g.
   ``--compressor qsgd:levels=8`` or ``fp16``.

**Eager updates** (``eager=true``; Kale, Douillard, Donchev 2025, "Eager Updates For Overlapped
Communication and Computation in DiLoCo", arXiv:2502.12996): the outer step no longer waits for the
average. Each worker i keeps its own outer parameters θ_i and outer momentum; when fragment p's round
k starts, worker i sends Δ_i^k = θ_{i,p} - x_{i,p} as above and at once takes its outer step on the
proxy

    Δ̃_i^k = (1/n) Δ_i^k + (1/n) Σ_{j≠i} Δ_j^{k-1}

(its own fresh outer gradient in place of its share of the average that has not arrived, the
others' shares from the previous round's average, which has; zero before the first arrival), then
restarts from it, x_{i,p} <- θ_{i,p} (α does not apply). The round's average, arriving τ <= H steps
later, only supplies the next round's Σ_{j≠i} term: n Δ̄^k minus the worker's own payload as the
others decoded it. Same collectives and bytes as plain overlapped rounds. We could not retrieve the
paper's equation text (four searches, the last reading a review page that reproduces its figures
and tables but not its Algorithm 3); this rule is established from its summary ("a mixture of the
current local outer gradient with the delayed mixture of all other replicas' outer gradients"):
docs/low_communication.md, "Eager updates".
The replicas' θ_i differ by their last local term; evaluation uses the lowest local rank's (rank 0's).

One class does both: DiLoCo is Streaming DiLoCo with one fragment, no overlap and α = 0 (also
tested against the streaming form). The workers' replicas, their inner optimizers and the pace of
workers stepping on their own are local SGD's (``replicas.py``); a fragment in flight is a
non-blocking collective (``CompressedMean.start_payloads``, as DaSGD's ``allreduce_mean_start``): on the
simulator its time overlaps the next τ steps' compute. Evaluation uses the global θ
(``evaluates = "global"``), which every process holds.

A checkpoint keeps, for each fragment in flight, the payloads each local worker sent (already
encoded, so residuals and random streams are untouched on resume); the collective is started
again from them after a resume: the same numbers, its bytes sent twice (as DaSGD).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, OptimConfig, Rounds, make_averager, nested
from gradwire.algorithms.optim import AdamW, HeavyBall, ScheduledRate, require_sgd
from gradwire.algorithms.placement import on_device, outer_copy
from gradwire.algorithms.replicas import Pace, Replicas, carry_progress_, mean_or_nan
from gradwire.spec import require
from gradwire.transports.base import Handle

INNER_CHOICES = ("adamw", "sgd")
OUTER_SCHEDULES = ("constant", "inner")

def outer_momentum_at(momentum: float, warmup: int, round_index: int) -> float:
    """μ of outer round ``round_index`` (0-based): ramped linearly from 0 over ``warmup`` rounds,
    then constant. The ramp moves the long-run step multiplier η/(1-μ) from η up to the papers'
    η/(1-μ) while the parameters change fastest (docs/diloco.md, "From a random start")."""
    if not warmup:
        return momentum
    return momentum * min(1.0, round_index / warmup)


def outer_step(outer: HeavyBall, outer_gradient, momentum: float, warmup: int, lr: float | None = None) -> None:
    """One Nesterov SGD step of the outer optimizer ``outer``; its round count (in its state, so in
    the checkpoint) decides the momentum of the warm-up ramp; ``lr``, when given, is this round's outer
    rate (``outer_schedule=inner``), else the constant η. Every DiLoCo-family outer loop steps here."""
    if warmup and momentum:
        outer.cfg = replace(outer.cfg, momentum=outer_momentum_at(momentum, warmup, outer.steps))
    if lr is not None:
        outer.rate.base = lr  # the outer optimizer's schedule is constant: its rate is this base
    outer.apply(outer_gradient)


DILOCO_PARAMS = {
    "inner_steps": "H >= 1: inner steps per outer round (paper: 500; 1 with inner=sgd, outer_lr=1 and "
                   "outer_momentum=0 is synchronous SGD)",
    "outer_lr": "outer learning rate η (paper: 0.7); θ moves about η/(1-μ) times the averaged change "
                "(docs/diloco.md)",
    "outer_momentum": "outer Nesterov momentum in [0, 1) (paper: 0.9; 0 = plain outer SGD)",
    "outer_warmup": "W >= 0 outer rounds over which the outer momentum ramps linearly from 0 to outer_momentum "
                    "(round k uses μ·min(1, k/W); 0 = the papers' constant μ): the first rounds, whose changes are "
                    "the largest, are not amplified by η/(1-μ) (docs/diloco.md)",
    "outer_schedule": "constant: every round at η; inner: η times the --lr-schedule factor of the round's last inner "
                      "update, so the outer step anneals with the inner rate and η/(1-μ) times the averaged change "
                      "shrinks with it (docs/diloco.md, \"Annealing the outer step\")",
    "inner": "inner optimizer: adamw (lr from --lr; paper) or sgd (--lr, --momentum, --nesterov, --weight-decay)",
    "beta1": "inner AdamW β1 (paper: 0.9)",
    "beta2": "inner AdamW β2 (paper: 0.95)",
    "eps": "inner AdamW ε",
    "weight_decay": "inner AdamW decoupled weight decay λ (paper: 0.1)",
}
STREAMING_PARAMS = DILOCO_PARAMS | {
    "inner_steps": "H >= 1: inner steps between two rounds of a fragment (paper: 100)",
    "fragments": "P in [1, H]: fragments of the parameters, synchronised at staggered steps",
    "overlap": "τ in [0, H]: inner steps a fragment's outer gradient travels before it is merged",
    "alpha": "α in [0, 1]: merge weight of the local parameters, x <- α x + (1-α) θ (paper: 0.5; "
             "the default: docs/defaults.md); 0 with overlap = inner_steps is refused with merge=mix (nothing would "
             "be learned)",
    "eager": "true: eager updates (Kale et al. 2025, arXiv:2502.12996): each worker steps at once on its own fresh "
             "outer gradient mixed with the others' from the previous round's average (alpha does not apply)",
    "merge": "how a round that travelled τ steps is merged: mix (x <- α x + (1-α) θ, the paper's) or carry "
             "(x <- θ + the progress since the round was sent: DaSGD's delayed averaging; needs overlap >= 1, "
             "alpha does not apply)",
}
MERGES = ("mix", "carry")


def inner_nesterov(name: str, inner: str) -> str | None:
    """``Algorithm.nesterov_instead`` of a DiLoCo whose inner optimizer is ``inner``: --momentum and
    --nesterov are the inner SGD's; AdamW keeps moments of its own (the outer step is Nesterov already)."""
    if inner == "sgd":
        return None
    return (f"its inner optimizer is AdamW (inner=adamw), whose moments are the spec's beta1 and beta2, and its outer "
            f"step is Nesterov already (outer_momentum); --momentum and --nesterov apply to inner=sgd "
            f"(--algorithm {name}:inner=sgd --momentum 0.9 --nesterov)")


# The outer step's defaults (docs/diloco.md, "From a random start"): Nesterov's long-run step multiplier
# is η/(1-μ) (v -> Δ/(1-μ) at a steady Δ, and the step is η(Δ + μ v)); the papers' 0.7/0.9 moves θ by
# about 7x the averaged change, tuned for hundreds of rounds from a pretrained start (Douillard et al.
# 2023, arXiv:2311.08105, Section 3 and Table 5). Short runs from random weights overshoot with it.
OUTER_LR, OUTER_MOMENTUM, OUTER_WARMUP = 0.7, 0.9, 10  # the papers' η and μ, μ ramped over 10 rounds


class StreamingDiLoCo(Algorithm):
    name = "streaming-diloco"
    scatters_mean = True
    evaluates = "global"
    default_compressor = "none"
    default_lr = 1e-2  # the inner AdamW's --lr when not given (docs/defaults.md; DiLoCo and its kin inherit it)
    lr_scales_with_task = False  # AdamW's step is in the parameters' units, not the gradient's

    def __init__(self, *, inner_steps: int = 20, outer_lr: float = OUTER_LR, outer_momentum: float = OUTER_MOMENTUM,
                 outer_warmup: int = OUTER_WARMUP, inner: str = "adamw", beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.1, fragments: int = 4, overlap: int = 1,
                 alpha: float = 0.0, eager: bool = False, outer_schedule: str = "constant", merge: str = "mix"):
        require(inner_steps >= 1, f"inner_steps must be >= 1 (inner steps per outer round), got {inner_steps}")
        require(math.isfinite(outer_lr) and outer_lr > 0, f"outer_lr must be a finite number > 0, got {outer_lr}")
        require(0 <= outer_momentum < 1, f"outer_momentum must be in [0, 1), got {outer_momentum}")
        require(outer_warmup >= 0, f"outer_warmup must be >= 0 (outer rounds of momentum ramp), got {outer_warmup}")
        require(inner in INNER_CHOICES, f"inner={inner!r}: valid choices are {', '.join(INNER_CHOICES)}")
        require(outer_schedule in OUTER_SCHEDULES,
                f"outer_schedule={outer_schedule!r}: valid choices are {', '.join(OUTER_SCHEDULES)}")
        require(0 <= beta1 < 1, f"beta1 must be in [0, 1), got {beta1}")
        require(0 <= beta2 < 1, f"beta2 must be in [0, 1), got {beta2}")
        require(math.isfinite(eps) and eps > 0, f"eps must be a finite number > 0, got {eps}")
        require(math.isfinite(weight_decay) and weight_decay >= 0,
                f"weight_decay must be a finite number >= 0, got {weight_decay}")
        require(1 <= fragments <= inner_steps,
                f"fragments must be in [1, inner_steps={inner_steps}] (one staggered offset each), got {fragments}")
        require(0 <= overlap <= inner_steps, f"overlap must be in [0, inner_steps={inner_steps}] (at most one "
                f"round of a fragment in flight), got {overlap}")
        require(0 <= alpha <= 1, f"alpha must be in [0, 1] (weight of the local parameters at a merge), got {alpha}")
        require(merge in MERGES, f"merge={merge!r}: valid choices are {', '.join(MERGES)}")
        require(merge == "mix" or (alpha == 0 and not eager),
                f"merge=carry keeps the local progress whole: alpha (={alpha:g}) and eager apply to merge=mix only")
        require(merge == "mix" or overlap > 0,
                "merge=carry carries the progress made while a round travels; with overlap=0 a round is merged "
                "on the step it is sent and there is none: give overlap >= 1")
        # α = 0 discards the τ inner steps a fragment's round is in flight; at τ = H that is all of them:
        # the merge resets x to θ on the step the next round starts, which then sends Δ = 0, and nothing
        # is learned (eager rounds restart from their own θ_i instead and do not merge)
        require(alpha > 0 or overlap < inner_steps or eager or merge == "carry",
                f"alpha=0 with overlap={overlap} = inner_steps discards every inner step (each merge resets the "
                "replicas to θ on the step the next round starts, so every round sends a zero outer gradient): "
                "use alpha > 0 (the paper's 0.5), overlap < inner_steps, merge=carry or eager=true")
        self.inner_steps, self.outer_lr, self.outer_momentum = inner_steps, outer_lr, outer_momentum
        self.outer_warmup = outer_warmup
        self.inner, self.betas, self.eps, self.weight_decay = inner, (beta1, beta2), eps, weight_decay
        self.fragments, self.overlap, self.alpha, self.merge = fragments, overlap, alpha, merge
        self.eager = bool(eager)
        self.outer_schedule = outer_schedule

    # -- setup ------------------------------------------------------------------------------------

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_sgd(optim, f"{self.name} (its inner optimizer is the spec's inner=, its outer one Nesterov)")
        if self.inner == "adamw":
            require(not optim.momentum and not optim.weight_decay,
                    f"{self.name} with inner=adamw: --momentum and --weight-decay apply to inner=sgd; AdamW's are "
                    f"the spec's beta1, beta2 and weight_decay")
        require(self.fragments <= params.numel(),
                f"fragments={self.fragments} exceeds the model's {params.numel()} parameters")
        self.replicas = Replicas(ctx, params, optim, optimizer=self._inner_optimizer(optim))
        self.pace = Pace(ctx)
        # the global parameters θ, the same in every process; with its outer momentum and the codec's
        # residuals on the workers' device, or in CPU memory (--outer-state cpu: placement.py)
        self.theta = outer_copy(params, ctx.outer_state)
        n, p_count = params.numel(), self.fragments
        bounds = [p * n // p_count for p in range(p_count + 1)]
        self.ranges = [(bounds[p], bounds[p + 1]) for p in range(p_count)]
        self.offsets = [p * self.inner_steps // p_count for p in range(p_count)]
        outer = OptimConfig(lr=self.outer_lr, momentum=self.outer_momentum, nesterov=self.outer_momentum > 0)
        # outer_schedule=inner: the inner --lr-schedule's factor by update (1 under the constant schedule)
        self.schedule = ScheduledRate(1.0, optim.lr_schedule, optim.horizon) if self.outer_schedule == "inner" else None
        self.outer = [HeavyBall(self.theta[a:b], outer) for a, b in self.ranges]  # views into θ
        self.averager = make_averager(on_device(ctx, self.theta.device), codec, default=self.default_compressor)
        # fragment -> {"started_at", "payloads", "handle", and with merge=carry "sent": the x_{i,p} sent from}
        self.in_flight: dict[int, dict] = {}
        self.resend = False
        if self.eager:  # each worker's own θ_i and outer momentum; θ (evaluated) is the lowest local rank's
            first = min(ctx.local_ranks)
            self.thetas = {r: self.theta if r == first else outer_copy(params, ctx.outer_state)
                           for r in ctx.local_ranks}
            self.eager_outer = {r: self.outer if r == first else [HeavyBall(t[a:b], outer) for a, b in self.ranges]
                                for r, t in self.thetas.items()}
            self.others = {r: torch.zeros_like(self.theta) for r in ctx.local_ranks}  # (1/n) Σ_{j≠i} Δ_j^{k-1}

    def _inner_optimizer(self, optim: OptimConfig):
        if self.inner == "sgd":
            return None  # the replicas' heavy ball with --lr, --momentum, --nesterov, --weight-decay
        return lambda x: AdamW(x, lr=optim.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                               l1=optim.l1, lr_schedule=optim.lr_schedule, horizon=optim.horizon)

    @property
    def nesterov_instead(self):
        return inner_nesterov(self.name, self.inner)

    @property
    def carries_rounds(self) -> bool:
        """Fragments in flight over τ > 0 steps, or (eager) each replica's own outer parameters."""
        return self.overlap > 0 or self.eager

    def compressor_spec(self):
        return self.averager.spec()

    def setup_info(self):
        return {"fragments": [{"elements": [a, b], "offset": t} for (a, b), t in zip(self.ranges, self.offsets)]}

    # -- one inner step, and the fragments' rounds that fall on it ----------------------------------

    def due(self, fragment: int, step: int) -> bool:
        """Whether ``fragment`` starts an outer round after inner step ``step``."""
        return (step - self.offsets[fragment]) % self.inner_steps == 0

    def step(self, ctx, step):
        if self.resend:  # resumed with rounds in flight: start them again from their payloads, counted once
            for p in sorted(self.in_flight):
                entry = self.in_flight[p]
                entry["handle"] = ctx.transport.restart(lambda p=p: self._payloads_mean(ctx, p), entry.pop("finish_s"))
            self.resend = False
        losses = [self.replicas.sgd_step(ctx, r) for r in ctx.local_ranks]
        self.pace.computed(ctx, step)
        info = {"loss": mean_or_nan(losses), "gradients": ctx.world_size}
        merged = []
        for p in sorted(self.in_flight):
            if self.in_flight[p]["started_at"] + self.overlap == step:
                self._merge(ctx, p, info)
                merged.append(p)
        for p in range(self.fragments):
            if self.due(p, step):
                self._start(ctx, p, step)
                if self.overlap == 0:
                    self._merge(ctx, p, info)
                    merged.append(p)
        if merged:
            info["merged"] = merged
        info["in_flight"] = len(self.in_flight)
        return info

    def _start(self, ctx, p: int, step: int) -> None:
        """Send fragment p's outer gradients Δ_i = θ_p - x_{i,p} (Douillard et al. 2023, Alg. 1)."""
        a, b = self.ranges[p]
        thetas = self.thetas if self.eager else dict.fromkeys(self.replicas.x, self.theta)
        deltas = {r: thetas[r][a:b] - x[a:b].to(self.theta.device) for r, x in self.replicas.x.items()}
        proxies = {r: d / ctx.world_size + self.others[r][a:b] for r, d in deltas.items()} if self.eager else None
        self.in_flight[p] = {"started_at": step, "payloads": self.averager.payloads(deltas, key=f"fragment{p}")}
        if self.carries_progress:  # the parameters each worker sent from: its progress is measured from them
            self.in_flight[p]["sent"] = {r: x[a:b].clone() for r, x in self.replicas.x.items()}
        self._start_collective(ctx, p)
        for r, proxy in (proxies or {}).items():  # eager: the outer step at once, on the proxy
            outer_step(self.eager_outer[r][p], proxy, self.outer_momentum, self.outer_warmup, self.outer_lr_at(step))
            self.replicas.x[r][a:b].copy_(self.thetas[r][a:b])

    def _start_collective(self, ctx, p: int) -> None:
        self.in_flight[p]["handle"] = self._payloads_mean(ctx, p)

    def _payloads_mean(self, ctx, p: int):
        a, b = self.ranges[p]
        return self.averager.start_payloads(ctx.transport, self.in_flight[p]["payloads"], self.theta[a:b],
                                            key=f"fragment{p}")

    @property
    def carries_progress(self) -> bool:
        """merge=carry with rounds that travel: each worker's progress since it sent is kept at the merge."""
        return self.merge == "carry" and self.overlap > 0

    def _merge(self, ctx, p: int, info: dict) -> None:
        """The averaged outer gradient of fragment p has arrived: the outer step on θ_p, then each
        worker's x_{i,p} <- α x_{i,p} + (1 - α) θ_p (Douillard et al. 2025; α = 0: x_{i,p} <- θ_p), or
        with merge=carry x_{i,p} <- θ_p + (x_{i,p} - x_{i,p}(t)) (DaSGD's rule: ``carry_progress_``)."""
        a, b = self.ranges[p]
        entry = self.in_flight.pop(p)
        outer_gradient = entry["handle"].wait()
        self.pace.joined(ctx, entry["handle"].finish_s)  # a worker waits only if it is ahead of the result
        info.setdefault("outer_gradient_norm", []).append(float(outer_gradient.norm()))
        if self.eager:  # the others' share, for the next round's proxy: Δ̄ minus what this worker sent
            for r in self.replicas.x:
                own = self.averager.decode_payload(entry["payloads"][r], outer_gradient)
                self.others[r][a:b] = outer_gradient - own / ctx.world_size
            return
        self._outer_step(p, outer_gradient, entry["started_at"])
        theta = self.theta[a:b]
        if self.carries_progress:
            for r, x in self.replicas.x.items():
                carry_progress_(x[a:b], entry["sent"][r], theta.to(x.device))
            return
        for x in self.replicas.x.values():
            x[a:b].lerp_(theta.to(x.device), 1 - self.alpha)  # exact copy of θ_p at α = 0 (lerp: exact at 1)

    def outer_momentum_at(self, round_index: int) -> float:
        return outer_momentum_at(self.outer_momentum, self.outer_warmup, round_index)

    def outer_lr_at(self, step: int) -> float | None:
        """The outer rate of the round sent after inner step ``step`` (1-based): None (the constant η)
        unless ``outer_schedule=inner``, then η f(step - 1), f the --lr-schedule's factor of that
        round's last inner update (update ``step - 1``, 0-based), the rate its inner steps ended at."""
        return None if self.schedule is None else self.outer_lr * self.schedule.at(step - 1)

    def _outer_step(self, p: int, outer_gradient, step: int) -> None:
        outer_step(self.outer[p], outer_gradient, self.outer_momentum, self.outer_warmup, self.outer_lr_at(step))

    def round_ends(self, step: int) -> bool:
        """Whether every fragment has merged the round that ends after inner step ``step``: the
        last fragment's merge (offset t_{P-1}, τ steps in flight). For DiLoCo: step % H == 0."""
        return step >= self.offsets[-1] + self.overlap and \
            (step - self.offsets[-1] - self.overlap) % self.inner_steps == 0

    def evaluated_rounds(self):
        """θ changes first when the first fragment's round is merged (eager: when it starts, the outer step
        taken at once): fragment 1's at ⌊H/P⌋ (offset t_1), with one fragment at H, then τ steps in flight.
        With one fragment every later round changes the whole of θ H steps after the last; staggered
        fragments change it piecemeal (no period)."""
        delay = 0 if self.eager else self.overlap
        if self.fragments == 1:
            first_round, first_is = self.inner_steps, f"inner_steps={self.inner_steps}"
        else:
            first_round = self.inner_steps // self.fragments  # offset t_1 = ⌊H/P⌋: the first fragment due
            first_is = f"inner_steps/fragments={self.inner_steps}/{self.fragments}"
            if self.inner_steps % self.fragments:
                first_is = f"⌊{first_is}⌋"
        if delay:
            first_is += f" + overlap={delay}"
        return Rounds(first=first_round + delay, period=self.inner_steps if self.fragments == 1 else None,
                      delay=delay, first_is=first_is, round="outer round",
                      remedy="lower inner_steps" + (" or overlap" if delay else ""))

    def eval_params(self):
        return self.theta

    # -- checkpoints ------------------------------------------------------------------------------

    def per_worker_state(self) -> tuple[str, ...]:
        return nested("replicas", self.replicas) + nested("pace", self.pace) + nested("codec", self.averager)

    def state_dict(self):
        return {"replicas": self.replicas.state_dict(), "pace": self.pace.state_dict(), "theta": self.theta,
                "outer": {str(p): o.state_dict() for p, o in enumerate(self.outer)},
                "codec": self.averager.state_dict(),
                "in_flight": {str(p): {"started_at": e["started_at"], **e["handle"].finish_state(),
                                       "payloads": {str(r): t for r, t in e["payloads"].items()},
                                       **({"sent": {str(r): t for r, t in e["sent"].items()}} if "sent" in e else {})}
                              for p, e in self.in_flight.items()},
                **({"eager": self._eager_state()} if self.eager else {})}

    def _eager_state(self) -> dict:
        return {str(r): {"theta": self.thetas[r], "others": self.others[r],
                         "outer": {str(p): o.state_dict() for p, o in enumerate(self.eager_outer[r])}}
                for r in self.thetas}

    def load_state_dict(self, state):
        self.replicas.load_state_dict(state["replicas"])
        self.pace.load_state_dict(state["pace"])
        self.theta.copy_(state["theta"])
        for p, o in enumerate(self.outer):
            o.load_state_dict(state["outer"][str(p)])
        self.averager.load_state_dict(state["codec"])
        device = self.theta.device  # byte payloads load on the CPU (checkpoint.floats_to moves floats only)
        self.in_flight = {int(p): {"started_at": int(e["started_at"]), "finish_s": Handle.finish_of(e),
                                   "payloads": {int(r): t.to(device) for r, t in e["payloads"].items()}}
                          for p, e in state["in_flight"].items()}
        for p, e in state["in_flight"].items():
            if self.carries_progress:
                require("sent" in e, "this checkpoint's rounds in flight were merged with merge=mix; resume it "
                        "with merge=mix (merge=carry needs the parameters each worker sent from)")
                self.in_flight[int(p)]["sent"] = {r: e["sent"][str(r)].to(x.device)
                                                  for r, x in self.replicas.x.items()}
        self.resend = bool(self.in_flight)
        if self.eager:
            for r, saved in state["eager"].items():
                r = int(r)
                self.thetas[r].copy_(saved["theta"])
                self.others[r].copy_(saved["others"])
                for p, o in enumerate(self.eager_outer[r]):
                    o.load_state_dict(saved["outer"][str(p)])


class DiLoCo(StreamingDiLoCo):
    """DiLoCo: Streaming DiLoCo with one fragment, no overlap and α = 0 (module docstring)."""

    name = "diloco"

    def __init__(self, *, inner_steps: int = 10, outer_lr: float = OUTER_LR, outer_momentum: float = OUTER_MOMENTUM,
                 outer_warmup: int = OUTER_WARMUP, inner: str = "adamw", beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.1, outer_schedule: str = "constant"):
        super().__init__(inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum,
                         outer_warmup=outer_warmup, inner=inner, beta1=beta1, beta2=beta2, eps=eps,
                         weight_decay=weight_decay, fragments=1, overlap=0, alpha=0.0, outer_schedule=outer_schedule)

    def setup_info(self):
        return {}

    def evaluates_at(self, step: int, eval_every: int, steps: int) -> bool:
        """DiLoCo's θ changes only at round ends: evaluate it only where a round has just ended
        (mid-round θ is the last round's, so an evaluation there would credit steps θ has not
        seen): the first round end at or after each multiple of ``eval_every``, and the last step.
        (Streaming DiLoCo keeps the plain schedule: its fragments merge every H/P steps.)"""
        if step == steps:
            return True
        if not self.round_ends(step):
            return False
        previous = max(step - self.inner_steps, 0)  # the round end before this one
        return step // eval_every > previous // eval_every


ALGORITHMS.register("streaming-diloco", help="Streaming DiLoCo (Douillard 2025): DiLoCo on P fragments at staggered "
                    "steps, each round overlapped with τ inner steps", params=STREAMING_PARAMS)(StreamingDiLoCo)
ALGORITHMS.register("diloco", help="DiLoCo (Douillard 2023): H inner AdamW steps, then outer Nesterov SGD on the "
                    "averaged parameter change", params=DILOCO_PARAMS)(DiLoCo)
