"""The algorithm contract, and the pieces that algorithms share.

An algorithm owns the model parameters (one flat vector, or one per worker where the algorithm
keeps replicas), asks :class:`Context` for gradients and compute times, and speaks to other
workers only through ``ctx.transport``. It never imports torch.distributed: the same class runs
on the simulated cluster and on the torch backend.

``step(ctx, step)`` performs one step of the algorithm (each worker's next gradient and what follows
it: an aggregation, or a local or inner step) and returns a dict of per-step figures for the metrics
(``loss``: mean minibatch loss of the workers that computed).

An algorithm whose ``needs_server`` is true (backup workers, the asynchronous ones) is run by a
server-mode driver instead of ``step``: it states its protocol in ``worker_step``, ``on_message``
and ``worker_apply`` (``algorithms/protocol.py``), and the drivers (``gradwire/servers/``) carry
the messages on the simulator or on a real backend.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import torch

from gradwire.algorithms.protocol import Answer, Message
from gradwire.averaging import Averager, build_averager
from gradwire.report.timeline import COMPUTE, NULL_TIMELINE, Timeline
from gradwire.seeding import hash_seed
from gradwire.spec import Registry, Specced
from gradwire.tasks.oracle import GradientOracle
from gradwire.transports.base import Transport
from gradwire.transports.clocks import Clock
from gradwire.transports.stragglers import Stragglers

ALGORITHMS = Registry("algorithm")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 0.1              # step size γ
    momentum: float = 0.0        # heavy-ball momentum β
    nesterov: bool = False       # Nesterov momentum: step along g + β v instead of v (needs β > 0)
    weight_decay: float = 0.0    # extra L2 decay added to the aggregated gradient
    l1: float = 0.0              # the task's L1 weight: a proximal step x <- soft(x, lr*l1)
    optimizer: str = "sgd"       # update rule spec (algorithms/optim.py OPTIMIZERS): sgd or adamw:beta2=...
    lr_schedule: str = "constant"  # how lr changes over the updates (optim.py LR_SCHEDULES): constant, cosine, linear
    horizon: int = 0             # the updates a schedule spans (the run's --steps); unused by constant
    shapes: tuple = ()           # the model's tensors in the flat vector's order (muon finds the matrices)
    roles: tuple = ()            # each tensor's part: hidden, output, embedding, vector (muon:matrices=hidden)


@dataclass(frozen=True)
class CodecConfig:
    compressor: str = "none"     # compressor spec (gradwire.compress)
    error_feedback: bool = False # keep per-worker residuals (Seide 2014; Karimireddy 2019)
    # error feedback sends a non-contractive compressor's input scaled by 1/(1+ω) (compress/error_feedback.py);
    # False: unscaled, for a method whose paper specifies it so (MuLoCo)
    scaled_error_feedback: bool = True
    compressed_mean: str = "gather"  # the compressed mean's route (averaging/compressed.py): gather or scatter
    owner_compressor: str = ""  # scatter: the owners' codec ("" for compressor's)


@dataclass
class Context:
    """What an algorithm may use: workers, transport, gradients, compute times, the clock."""

    world_size: int
    local_ranks: tuple[int, ...]
    transport: Transport
    oracle: GradientOracle
    stragglers: Stragglers       # compute seconds per (worker, its step count)
    clock: Clock                 # simulated seconds, or real ones on a real backend
    seed: int
    shard_sizes: tuple[int, ...] = ()  # training samples held by each worker (data-aware algorithms)
    shared_data: bool = False    # every worker samples the whole training set (--partition shared)
    device: torch.device = torch.device("cpu")  # where the workers' tensors live (--device)
    outer_state: str = "device"  # DiLoCo family: its outer state on the device, or in (pinned) cpu memory
    inject_delays: bool = False  # real backends: sleep each straggler draw before computing
    param_shapes: tuple[torch.Size, ...] = ()  # the model's tensors, in the flat vector's order (PowerSGD)
    param_roles: tuple[str, ...] = ()  # each tensor's part: hidden, output, embedding, vector (tasks.oracle)
    backward_collectives: bool = False  # the backward pass runs collectives itself (tensor parallelism)
    gradient_counts: dict = field(default_factory=dict)
    timeline: Timeline = NULL_TIMELINE  # per-worker intervals (report/timeline.py); the run sets it

    def gradient(self, rank: int, params: torch.Tensor, on_ready=None) -> tuple[float, torch.Tensor]:
        """Worker ``rank``'s minibatch loss and gradient at ``params``; ``on_ready(i, grad_i)`` is
        called as each tensor's gradient completes during the backward pass (``FlatModel``)."""
        real = self.timeline.enabled and not self.timeline.simulated  # real time: measure the computation
        start = self.clock.now if real else 0.0
        if self.inject_delays:  # the torch backend makes the straggler model real
            count = self.gradient_counts.get(rank, 0) + 1  # 1-based, as the simulator's step numbers
            self.gradient_counts[rank] = count
            time.sleep(self.stragglers.time(rank, count))
        out = self.oracle(rank, params, on_ready) if on_ready is not None else self.oracle(rank, params)
        if real:
            self.timeline.add(rank, COMPUTE, start, self.clock.now)
        return out

    def compute_times(self, step: int) -> np.ndarray:
        """Every worker's compute time for its ``step``-th step (seconds)."""
        return self.stragglers.times(self.world_size, step)

    def compute_time(self, rank: int, count: int) -> float:
        return self.stragglers.time(rank, count)

    def wait_compute(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def compute_all(self, step: int) -> None:
        """Every worker computes its ``step``-th gradient; the step waits for the slowest."""
        self.compute_for(self.compute_times(step))

    def compute_for(self, seconds) -> None:
        """Every local worker r computes for ``seconds[r]`` from now; the clock waits for the slowest
        (the simulator's timeline records each worker's computation)."""
        if self.timeline.simulated:
            now = self.clock.now
            for r in self.local_ranks:
                self.timeline.add(r, COMPUTE, now, now + float(seconds[r]))
        self.wait_compute(max(seconds))

    def generator(self, rank: int, purpose: str) -> torch.Generator:
        """A seeded random stream on the workers' device (CUDA draws need a CUDA generator)."""
        return torch.Generator(device=self.device).manual_seed(hash_seed(self.seed, purpose, rank))


def soft_threshold_(x: torch.Tensor, tau: float) -> torch.Tensor:
    """In place: prox of tau·||x||_1 (soft thresholding)."""
    if tau > 0:
        mag = x.abs().sub_(tau).clamp_(min=0)
        x.copy_(x.sign().mul_(mag))
    return x


def make_averager(ctx: Context, cfg: CodecConfig, *, default: str = "none", mean_only: bool = False) -> Averager:
    """The averager of ``--compressor`` (``default`` when it is "none") for the context's local
    workers. Only an algorithm that averages through ``Averager.mean`` alone says
    ``mean_only=True``; the others also handle compressed payloads (a
    :class:`~gradwire.averaging.CompressedMean`), so averagers that are no byte compressor
    (PowerSGD) are refused at setup."""
    spec = cfg.compressor if cfg.compressor != "none" else default
    return build_averager(spec, workers=ctx.local_ranks, seed=ctx.seed, shapes=ctx.param_shapes,
                          error_feedback=cfg.error_feedback, generator=lambda r: ctx.generator(r, "compress"),
                          payloads=not mean_only, scaled_error_feedback=cfg.scaled_error_feedback,
                          route=cfg.compressed_mean, world_size=ctx.world_size,
                          owner_generator=lambda r: ctx.generator(r, "compress-owner"),
                          owner_compressor=cfg.owner_compressor)


def nested(key: str, component) -> tuple[str, ...]:
    """The per-worker paths of ``component`` (an averager, the local replicas: anything with
    ``per_worker_state``) as paths of the state that holds its state at ``key``."""
    return tuple(f"{key}/{path}" for path in component.per_worker_state())


@dataclass(frozen=True)
class Rounds:
    """When the parameters an algorithm evaluates change, for one whose evaluated parameters change only
    at its rounds (``Algorithm.evaluated_rounds``): first after step ``first``, then every ``period``
    steps (None: not all at once, as Streaming DiLoCo's staggered fragments), each change holding the
    work of the steps up to ``delay`` steps before it (a round that travels before it is merged).
    ``first_is`` says what sets ``first`` (``inner_steps=20``), ``round`` names a round, ``remedy`` the
    spec change that brings the first one sooner: gradwire.run.combination refuses a run of fewer
    than ``first`` steps (it would evaluate the initial model) and notes an incomplete last round."""

    first: int
    period: int | None
    delay: int
    first_is: str
    round: str
    remedy: str

    def last_change(self, steps: int) -> int:
        """The last step of a ``steps``-step run (at least ``first``) after which the evaluated
        parameters change; the step itself where ``period`` is None (no note: no --steps avoids it)."""
        if self.period is None:
            return steps
        return self.first + (steps - self.first) // self.period * self.period


class Algorithm(Specced, ABC):
    """Base class; subclasses are registered in ALGORITHMS with their spec parameters."""

    name = "?"
    evaluates = "model"
    # the compressor its averager uses when --compressor is "none" ("none": gradients travel as they
    # are); None: the algorithm has no averager (it sends parameters, or chooses its compressors itself)
    default_compressor: str | None = None  # which parameters evaluation uses (recorded in the metrics)
    # whether its messages go through the averager's own collectives alone (``mean``, ``start_payloads``),
    # so that --compressed-mean scatter can route them (averaging/compressed.py); not where they go to
    # a server, are gathered whole (backups, combine rules) or are encoded by the algorithm itself
    scatters_mean: bool = False
    # --lr, --momentum and --lr-schedule when they are not given (gradwire.run.combination.resolved): chosen per
    # algorithm so that each learns on the default task in the default steps (docs/defaults.md)
    default_lr: float = 0.05
    default_momentum: float = 0.0
    default_lr_schedule: str = "constant"
    # whether --lr left out is default_lr times the task's default_lr_scale (tasks/base.py): true where
    # --lr scales a gradient step; false where it is a step in the parameters' own units (AdamW's,
    # a sign's) or bounded by something other than the task (async's staleness); docs/defaults.md
    lr_scales_with_task: bool = True
    # --lr left out on the tasks named here (under --optimizer sgd), instead of default_lr times the task's scale:
    # for an algorithm whose safe step differs between tasks more than the tasks' scales say (measured,
    # docs/defaults.md; Leader SGD: 1.6 on mnist1d-mlp, where its CNN-safe 0.6 x 2 learns 5 points less)
    default_lr_on_task: Mapping[str, float] = MappingProxyType({})

    def setup(self, ctx: Context, params: torch.Tensor, optim: OptimConfig, codec: CodecConfig) -> None:
        self.optim = optim

    @abstractmethod
    def step(self, ctx: Context, step: int) -> dict: ...

    @property
    def carries_rounds(self) -> bool:
        """Whether state of one collective round stays in flight across steps (a fault-tolerant
        quorum that changes between steps would cut it; transports/ft_spec.py refuses it)."""
        return False

    @property
    def averages_during_backward(self) -> bool:
        """Whether it averages during the backward pass whatever the run (``sync:overlap=true``):
        tensor parallelism refuses it (gradwire.run.combination), since its backward pass runs the
        tensor-parallel collectives too."""
        return False

    @property
    def updates_whole_matrices(self) -> bool:
        """Whether its update of a weight matrix needs the whole matrix (Muon's Newton-Schulz
        orthogonalisation inside MuLoCo): tensor parallelism, where a process holds a block of each,
        refuses it (gradwire.run.combination)."""
        return False

    @property
    def nesterov_instead(self) -> str | None:
        """None where --momentum and --nesterov set the momentum of its update (the heavy ball of
        --optimizer sgd); otherwise what sets its momentum instead: gradwire.run.combination refuses
        --nesterov with it in one line, rather than ask for the --momentum that it would refuse next."""
        return None

    @property
    def schedule_updates_per_step(self) -> int:
        """The updates of each worker's optimizer that --lr-schedule counts per step of the run: 1,
        or H for the server-mode DiLoCo family, whose step is an outer round of H inner steps a
        replica (its schedule spans --steps × H updates)."""
        return 1

    def combination_notes(self, compressor: str) -> tuple[str, ...]:
        """Notes on stderr for a combination that runs but is unlikely what the user wants (with
        --compressor ``compressor``), said once by ``gradwire run``; none by default."""
        return ()

    def compressor_spec(self) -> str | None:
        """The compressor that really runs (``compressor_resolved`` in config.json), defaults
        included; None when the algorithm compresses nothing (it sends parameters or dense
        gradients as they are)."""
        return None

    def setup_info(self) -> dict:
        """Choices made at setup worth showing the user (e.g. per-worker ratios); written to
        ``algorithm.json`` in the run folder and printed by ``gradwire run``."""
        return {}

    def close(self) -> None:  # noqa: B027 - most hold nothing to release
        """The run is over (finished or not): release what ``setup`` or ``step`` started (threads)."""

    def evaluates_at(self, step: int, eval_every: int, steps: int) -> bool:
        """Whether the run evaluates after ``step`` (every process decides alike): every
        ``eval_every`` steps and at the last. An algorithm whose evaluated parameters change only at
        round ends (DiLoCo) moves its evaluations onto them."""
        return step % eval_every == 0 or step == steps

    def evaluated_rounds(self) -> Rounds | None:
        """When ``eval_params()`` changes, for an algorithm whose evaluated parameters change only at its
        rounds (DiLoCo's θ, local SGD's last average), known from its spec before set-up; None for one
        whose evaluated parameters move at every step (the server-mode DiLoCo family's steps are its
        rounds)."""
        return None

    def before_evaluation(self, ctx: Context) -> None:  # noqa: B027 - most evaluate what every process holds
        """Every process calls this at an evaluation step, before rank 0 evaluates ``eval_params()``:
        an algorithm that evaluates something it must first gather (the workers' average) does so here."""

    @abstractmethod
    def eval_params(self) -> torch.Tensor: ...

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    def per_worker_state(self) -> tuple[str, ...]:
        """The paths (``a/b``) in :meth:`state_dict` of the dicts that hold one entry per local
        worker, keyed by its rank: each worker's own memory (residuals, generators, local model,
        momentum), which a recovering replica keeps while it takes every other part from a peer
        (``gradwire.fault.replica.merge_own``). Declared, not inferred from the keys: a dict keyed by
        tensor index (PowerSGD's Q, DiLoCo's outer state) looks the same as one keyed by rank 0,
        and some per-worker dicts are empty until the first step. tests/fault/test_ft_recover.py
        checks, for every algorithm a replica can run, that these are exactly its rank-keyed dicts."""
        return ()

    # -- server mode (algorithms/protocol.py): for algorithms whose needs_server is true --------------

    needs_server = False  # True: a server takes part (a process of its own on a real backend)

    def worker_step(self, ctx: Context, rank: int, count: int) -> Message:
        """Worker ``rank`` computes its ``count``-th gradient (or local step) and returns the message
        it sends to the server."""
        raise NotImplementedError(f"{self.name} has no server mode")

    def compute_seconds(self, ctx: Context, rank: int, count: int) -> float:
        """Simulated seconds worker ``rank`` computes before sending its ``count``-th message: one
        gradient's draw of the straggler model (an algorithm whose message follows several
        gradients, as DiLoCo's H inner steps, sums their draws)."""
        return ctx.compute_time(rank, count)

    def on_message(self, msg: Message, finished: bool) -> Answer:
        """The server handles one message (in arrival order). ``finished``: the run's last step is
        over; answer, but start nothing new."""
        raise NotImplementedError(f"{self.name} has no server mode")

    def worker_apply(self, ctx: Context, rank: int, reply: Message) -> Message | None:
        """Worker ``rank`` applies the server's reply; returns a message to send at once (before
        computing again), or None."""
        raise NotImplementedError(f"{self.name} has no server mode")

    def join_reply(self, worker: int) -> Message:
        """The answer to a worker that rejoins with no state of its own (lost before the checkpoint
        a run resumed from): a JOIN with what it starts from. The driver sets its ``count``, the step
        count the server last heard from the worker (as of the cut), which the worker goes on from."""
        raise NotImplementedError(f"{self.name} has no server mode")

    def on_lost(self, worker: int) -> None:  # noqa: B027 - most protocols have nothing to forget
        """The server learnt that ``worker`` is gone (dead, or silent past the timeout)."""

    def min_workers(self) -> int:
        """The fewest ``--workers`` its spec can run with, known before set-up (backup workers leave
        at least one to aggregate): gradwire.run.combination refuses fewer before anything starts."""
        return 1

    def workers_needed(self) -> int:
        """The fewest live workers a server-mode step can complete with: with fewer, the server fails at
        once (naming the losses) rather than wait for messages that cannot come. 1 for a protocol whose
        steps count arrivals from whoever is alive."""
        return 1

    def server_summary(self) -> dict:
        """Figures for summary.json from the server's side of the protocol."""
        return {}

