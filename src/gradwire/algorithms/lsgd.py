"""Leader SGD (Teng, Gao, Chalus, Choromanska, Goldfarb, Weller 2019, "Leader stochastic gradient
descent for distributed training of deep learning models", NeurIPS).

LSGD replaces EASGD's elastic pull towards the *average* of the workers by a pull towards the
*leader*, the worker with the lowest loss. Its objective keeps the stationary points of f (the
penalty λ/2 ||x_i - x̃||² vanishes at the leader itself), and the update of each worker is

    x_i <- x_i - η g_i(x_i) - λ (x_i - x̃)                    (the LSGD step, Teng et al. 2019, Sec. 3)

applied here as a split step: every step is a local (heavy-ball or Nesterov) SGD step; every
``period`` = τ steps the workers elect the leader, whose parameters alone are broadcast, and each
worker moves λ of the way towards them (x <- lerp(x, x̃, λ)). So λ = 1 makes every worker a copy of
the leader, λ = 0 leaves n independent SGD runs. The leader is the worker with the lowest running
mean of its last ``window`` minibatch losses (ties: the lowest rank), re-elected at every
communication; the authors' scripts average ⌊τ/4⌋ minibatches (at least one), the default here.

Between rounds the authors' code (github.com/yunfei-teng/LSGD) also applies the penalty of the LSGD
objective at every step, as a proximal pull of every worker, the leader included, towards the last
leader snapshot x̃ it received (the leader's own parameters when it led):

    x <- (1 - p/τ) x + (p/τ) x̃,   p = ``prox`` = 0.1           (after every local step)

so the attraction that the round applies once every τ steps is spread over the steps in between.
Before the first round x̃ is the common starting point. ``prox=0`` and ``window=τ`` give the rounds
alone, as gradwire ran LSGD before (tested against trajectories recorded then).

Evaluation (``eval``): ``average``, the mean of the workers' parameters at evaluation, one
allreduce (the authors test this "center variable"; their default and ours); ``leader``, the
leader's parameters as broadcast at the last (global) round; ``each``, every worker's replica
(gathered at rank 0; the metrics are their means). The evaluation's allreduce or gather is not
charged to the run's bytes or simulated time (``replicas.EvaluatedReplicas``).

Multi-leader (``groups`` = G > 1; Teng et al. 2019, the multi-leader objective with a local and a
global attraction): the workers form G equal groups of consecutive ranks; every τ steps each is
pulled with strength λ towards its group's leader, and every ``global_period`` = τ_G steps with
λ_G towards the leader of all workers (``global_window``, default ⌊τ_G/4⌋), and every step each
worker is pulled by p/τ towards its group leader's snapshot and by p_G/τ_G (``global_prox``) towards
the global leader's. ``groups=0`` makes one group per node
(``transport.node_of``), as the paper intends for GPUs of one machine; the simulator is one node,
and a cluster with one worker per node gets one group too (single-leader LSGD), not n groups of one.

``async=true`` (the paper's asynchronous LSGD): workers step at their own pace and a round is
triggered whenever the workers have completed τ·n local steps in total (τ·|group| within a
group), so fast workers take more local steps between rounds than slow ones. Workers report every
local step to a server, which triggers the rounds, elects their leaders from the loss windows of
that moment, and has each leader upload its parameters once and each other member receive them
once, at its next report, and pull (``lsgd_async.py``; the protocol of ``algorithms/protocol.py``,
which both backends run). Each worker keeps the last leader parameters it received (or uploaded)
as its snapshot for the proximal pull. One ``step`` is n reports. Evaluation uses the leader's
parameters as they were last uploaded (the server holds only those: ``eval=leader``, the default
with ``async=true``).
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from gradwire.algorithms.base import Algorithm, nested
from gradwire.algorithms.lsgd_async import GLOBAL_SCOPE, Round, RoundServer
from gradwire.algorithms.optim import require_constant_lr
from gradwire.algorithms.protocol import JOIN, LEAD, PULL, REPORT, UPLOAD, Answer, Message, as_body
from gradwire.algorithms.replicas import (
    EvaluatedReplicas,
    LossWindow,
    Pace,
    Replicas,
    elect,
    mean_or_nan,
    pull_towards,
    register_with_async_key,
    require_plain_codec,
)
from gradwire.spec import require

EVAL_CHOICES = ("average", "leader", "each")


def default_window(period: int) -> int:
    """The authors' election window: the running mean of ⌊τ/4⌋ minibatch losses, at least one."""
    return max(1, period // 4)


class LeaderSGD(Algorithm):
    name = "lsgd"
    default_lr = 0.6  # --lr when not given (docs/defaults.md: 0.8 diverged on mnist1d-cnn on 2 of 5 seeds)
    # on the default task its own step, not 0.6 x the task's 2: 1.6 learned 5 points more there (docs/defaults.md)
    default_lr_on_task = MappingProxyType({"mnist1d-mlp": 1.6})

    def __init__(self, *, pull: float = 0.1, period: int = 4, prox: float = 0.1, window: int = 0, groups: int = 0,
                 global_pull: float = 0.1, global_period: int = 16, global_prox: float = 0.1, global_window: int = 0,
                 eval: str = "", asynchronous: bool = False):
        for key, value in (("pull", pull), ("global_pull", global_pull)):
            require(0 <= value <= 1, f"{key} must be in [0, 1] (the fraction of the way to the leader), "
                    f"got {value}")
        for key, value in (("period", period), ("global_period", global_period)):
            require(value >= 1, f"{key} must be >= 1 (local steps between communications), got {value}")
        for key, value, tau in (("prox", prox, "period"), ("global_prox", global_prox, "global_period")):
            bound = period if key == "prox" else global_period
            require(0 <= value <= bound, f"{key} must be in [0, {tau}={bound}] (each step pulls {key}/{tau} of "
                    f"the way to the leader's snapshot), got {value}")
        for key, value in (("window", window), ("global_window", global_window)):
            require(value >= 0, f"{key} must be >= 1 (minibatch losses in the running mean), or 0 for the "
                    f"authors' period/4; got {value}")
        evaluated = eval or ("leader" if asynchronous else "average")
        require(evaluated in EVAL_CHOICES, f"eval={eval!r}: valid choices are {', '.join(EVAL_CHOICES)}")
        require(not asynchronous or evaluated == "leader",
                f"eval={eval} does not apply with async=true: the server holds only the leader's parameters "
                "(valid choice: leader)")
        require(groups >= 0, f"groups must be >= 1, or 0 for one group per node; got {groups}")
        self.pull, self.period, self.groups_arg = pull, period, groups
        self.global_pull, self.global_period, self.asynchronous = global_pull, global_period, asynchronous
        self.prox, self.global_prox = prox, global_prox
        self.window_size, self.global_window = window or default_window(period), global_window or default_window(
            global_period)
        self.evaluates = evaluated

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_plain_codec(codec, "lsgd")
        if self.asynchronous:
            require_constant_lr(optim, "lsgd:async=true (each worker's updates, at its own pace, are not the run's "
                                "steps)")
        n, g = ctx.world_size, self.groups_arg
        if g:
            require(g <= n and n % g == 0, f"groups={g} does not divide the {n} workers into equal groups "
                    f"(choose a divisor of {n})")
            self.members = [list(range(k * n // g, (k + 1) * n // g)) for k in range(g)]
        else:
            nodes = sorted({ctx.transport.node_of(r) for r in range(n)})
            self.members = [[r for r in range(n) if ctx.transport.node_of(r) == k] for k in nodes]
            if n > 1 and all(len(m) == 1 for m in self.members):
                # one worker per node: groups of one would elect themselves and leave only the
                # global rounds (λ_G, τ_G) in place of the asked (λ, τ); that is single-leader LSGD
                self.members = [list(range(n))]
        self.multi = len(self.members) > 1
        self.group_of = {r: k for k, m in enumerate(self.members) for r in m}
        self.my_groups = sorted({self.group_of[r] for r in ctx.local_ranks})
        # with one group the group leader is the global leader: one kind of round, (λ, τ)
        self.top_pull, self.top_period, self.top_prox, self.top_window = (
            (self.global_pull, self.global_period, self.global_prox, self.global_window) if self.multi
            else (self.pull, self.period, self.prox, self.window_size))
        self.replicas = Replicas(ctx, params, optim)
        self.leader, self.group_leaders = 0, [m[0] for m in self.members]  # lowest rank until elected
        # async: the leader's parameters as last uploaded live where the server runs (on a real backend
        # process 0; a worker's process neither uses nor checkpoints them)
        self.leader_x = params.clone() if not self.asynchronous or ctx.transport.holds_server else None
        self.model_bytes = params.numel() * params.element_size()
        self.world_size = n
        self.shared_data = ctx.shared_data
        # the leader snapshots each local worker is pulled towards at every step: its group leader's
        # (multi-leader only) and the global leader's, as last received; the start until a round
        start = self.leader_x if not self.asynchronous else None  # sync: one tensor, replaced at rounds
        self.snapshots = {r: {"global": params.clone() if start is None else start} for r in ctx.local_ranks}
        if self.multi:
            for snapshot in self.snapshots.values():
                snapshot["group"] = params.clone()
        if self.asynchronous:
            self.server = RoundServer(self, n)
            self.local_steps = {w: 0 for w in range(n)}  # as reported to the server
            self.info: dict = {}          # this step's figures, at the server
            self.losses: list[float] = []  # ... and its reports' losses
        else:
            self.window = LossWindow(ctx.local_ranks, max(self.window_size, self.top_window))
            self.pace = Pace(ctx)
            self.evaluated = EvaluatedReplicas(ctx, params, self.evaluates)

    @property
    def needs_server(self) -> bool:
        """Asynchronous LSGD counts every worker's local steps at a server (lsgd_async.py)."""
        return self.asynchronous

    def setup_info(self):
        info = {"groups": self.members, "evaluates": {
            "average": "the mean of the workers' parameters at each evaluation (the authors' center variable)",
            "leader": "the global leader, as broadcast at the last global round",
            "each": "every worker's parameters (metrics: their mean)"}[self.evaluates]}
        if not self.shared_data and self.world_size > 1:
            # on fixed shards each worker's running loss is on data it has memorised, so
            # the election picks the best memoriser and everyone is pulled towards a model of one shard
            info["warning"] = ("fixed shards measure shard bias, not the algorithm: each worker elects on its own "
                               "shard's loss (use --partition shared, as the LSGD authors' workers sample the "
                               "whole training set)")
        return info

    # -- communication rounds -------------------------------------------------------------------------

    def _group_round(self, ctx, k: int, info: dict) -> None:
        members = self.members[k]
        scores = {r: self.window.mean(r, self.window_size) for r in members if r in self.replicas.x}
        leader, _ = elect(ctx, scores, members)
        lead, distance = pull_towards(ctx, self.replicas.x, leader, members, self.pull)
        self.group_leaders[k] = leader
        for r in members:
            if r in self.snapshots:
                self.snapshots[r]["group"] = lead
        info.setdefault("group_leader_distance", []).append(distance)

    def _global_round(self, ctx, info: dict) -> None:
        scores = {r: self.window.mean(r, self.top_window) for r in self.replicas.x}
        self.leader, info["leader_loss"] = elect(ctx, scores)
        self.leader_x, info["leader_distance"] = pull_towards(ctx, self.replicas.x, self.leader, None,
                                                              self.top_pull)
        for snapshot in self.snapshots.values():
            snapshot["global"] = self.leader_x

    def _finish_info(self, info: dict) -> dict:
        if "group_leader_distance" in info:
            info["group_leader_distance"] = mean_or_nan(info["group_leader_distance"])
        if self.multi:  # the groups this process takes part in (all of them on the simulator)
            info["group_leaders"] = [self.group_leaders[k] for k in self.my_groups]
        info["leader"] = self.leader
        return info

    # -- steps ----------------------------------------------------------------------------------------

    def step(self, ctx, step):
        return self._sync_step(ctx, step)  # async=true runs in server mode

    def proximal_pull(self, rank: int) -> None:
        """The per-step pull of the authors' code: x <- (1 - p/τ) x + (p/τ) x̃ towards the last
        (group) leader snapshot, and with groups also by p_G/τ_G towards the global leader's (Teng et
        al. 2019, the gradient of the penalty λ/2 ||x - x̃||² of their LSGD objective, one step of it
        spread over the τ steps of a period). Every worker, the leader included."""
        x, snapshot = self.replicas.x[rank], self.snapshots[rank]
        if self.multi and self.prox:
            x.lerp_(snapshot["group"], self.prox / self.period)
        if self.top_prox:
            x.lerp_(snapshot["global"], self.top_prox / self.top_period)

    def _sync_step(self, ctx, step: int) -> dict:
        losses = {}
        for r in ctx.local_ranks:
            losses[r] = self.replicas.sgd_step(ctx, r)
            self.proximal_pull(r)
            self.window.push(r, losses[r])
        self.pace.computed(ctx, step)
        info = {"loss": mean_or_nan(losses.values()), "gradients": ctx.world_size}
        local_round, global_round = self.multi and step % self.period == 0, step % self.top_period == 0
        if local_round:
            # on the simulator the group rounds are priced one after another: exact for the ps
            # network (one server link carries everything), conservative for ring
            for k in self.my_groups:
                self._group_round(ctx, k, info)
        if global_round:
            self._global_round(ctx, info)
        if local_round or global_round:
            self.pace.joined(ctx)
        return self._finish_info(info)

    def round_ended(self, rd: Round, lead: torch.Tensor, info: dict) -> None:
        """Record an asynchronous round whose leader's parameters ``lead`` have come: the leaders,
        and the global leader's copy that evaluation uses."""
        if rd.group is None:
            self.leader, info["leader_loss"] = rd.leader, rd.score
            self.leader_x.copy_(lead)
        else:
            self.group_leaders[rd.group] = rd.leader
        info["rounds"] = info.get("rounds", 0) + 1

    # -- async: the protocol --------------------------------------------------------------------------

    def worker_step(self, ctx, rank, count):
        loss = self.replicas.sgd_step(ctx, rank)
        self.proximal_pull(rank)
        return Message(REPORT, rank, count=count, value=loss)

    def on_message(self, msg, finished):
        w = msg.worker
        if msg.kind == LEAD:
            self.server.lead(w, msg.tag, msg.tensor(self.leader_x), finished, self.info)
            return Answer([self.server.serve(w, finished, self.info)])
        self.local_steps[w] = msg.count
        if not finished:
            self.server.report(w, msg.value)
        answer = Answer([self.server.serve(w, finished, self.info)])
        if finished:
            return answer
        self.losses.append(msg.value)
        if len(self.losses) == self.world_size:
            answer.step = self.info | {"loss": mean_or_nan(self.losses), "gradients": self.world_size,
                                       "leader": self.leader}
            if self.multi:
                answer.step["group_leaders"] = list(self.group_leaders)
            self.info, self.losses = {}, []
        return answer

    def worker_apply(self, ctx, rank, reply):
        x, snapshot = self.replicas.x[rank], self.snapshots[rank]
        scope = "global" if reply.count == GLOBAL_SCOPE else "group"  # which leader (lsgd_async.RoundServer)
        if reply.kind == UPLOAD:  # lead a round: our parameters, as they are now, are the snapshot
            snapshot[scope] = x.clone()
            return Message(LEAD, rank, tag=reply.tag, body=as_body(x))
        if reply.kind == PULL:
            snapshot[scope] = reply.tensor(x).clone()
            x.lerp_(snapshot[scope], reply.value)
        elif reply.kind == JOIN:
            x.copy_(reply.tensor(x))
            for key in snapshot:
                snapshot[key] = x.clone()
        return None

    def join_reply(self, worker):
        self.server.rejoined(worker)
        # a copy: the leader's parameters may change before the send has gone out
        return Message(JOIN, worker, body=as_body(self.leader_x))

    def on_lost(self, worker):
        self.server.lost(worker, self.info)

    def server_summary(self):
        return {"uploads_after_last_step": self.server.late_uploads, "rounds_triggered": dict(self.server.triggered)}

    def before_evaluation(self, ctx):
        if not self.asynchronous:
            self.evaluated.refresh(ctx, self.replicas)

    def eval_params(self):
        return self.leader_x if self.evaluates == "leader" else self.evaluated.params

    def spec(self):  # not spec_of: the group keys (and the resolved groups) only with several groups
        text = f"lsgd:pull={self.pull:g},period={self.period},prox={self.prox:g},window={self.window_size}"
        if self.multi:
            text += (f",groups={len(self.members)},global_pull={self.global_pull:g},"
                     f"global_period={self.global_period},global_prox={self.global_prox:g},"
                     f"global_window={self.global_window}")
        return text + f",eval={self.evaluates}" + (",async=true" if self.asynchronous else "")

    # -- checkpoint -----------------------------------------------------------------------------------

    def per_worker_state(self) -> tuple[str, ...]:
        own = nested("replicas", self.replicas) + ("snapshots",)
        return own if self.asynchronous else own + nested("pace", self.pace) + nested("window", self.window)

    def state_dict(self):
        state = {"replicas": self.replicas.state_dict(), "leader": self.leader,
                 "group_leaders": {str(k): r for k, r in enumerate(self.group_leaders)},
                 "snapshots": {str(r): dict(s) for r, s in self.snapshots.items()}}
        if self.leader_x is not None:
            state["leader_x"] = self.leader_x
        if self.asynchronous:
            state |= {"server": self.server.state_dict(),
                      "local_steps": {str(w): n for w, n in self.local_steps.items()},
                      "info": {k: v for k, v in self.info.items() if k != "leader_loss"},
                      "losses": torch.tensor(self.losses, dtype=torch.float64)}
            if "leader_loss" in self.info:
                state["leader_loss"] = torch.tensor(self.info["leader_loss"], dtype=torch.float64)
        else:
            state |= {"pace": self.pace.state_dict(), "window": self.window.state_dict(),
                      "evaluated": self.evaluated.state_dict()}
        return state

    def load_state_dict(self, state):
        self.replicas.load_state_dict(state["replicas"])
        self.leader = int(state["leader"])
        self.group_leaders = [int(state["group_leaders"][str(k)]) for k in range(len(self.members))]
        if self.leader_x is not None:
            self.leader_x.copy_(state["leader_x"])
        # one tensor shared by every worker's "global" snapshot in the sync form: loaded as copies,
        # which the next round replaces alike
        self.snapshots = {r: {k: t.clone() for k, t in state["snapshots"][str(r)].items()} for r in self.snapshots}
        if self.asynchronous:
            self.server.load_state_dict(state["server"])
            self.local_steps = {w: int(state["local_steps"][str(w)]) for w in self.local_steps}
            self.info = {k: int(v) for k, v in state["info"].items()}
            if "leader_loss" in state:
                self.info["leader_loss"] = float(state["leader_loss"])
            self.losses = state["losses"].tolist()
        else:
            self.pace.load_state_dict(state["pace"])
            self.window.load_state_dict(state["window"])
            self.evaluated.load_state_dict(state["evaluated"])


register_with_async_key(
    "lsgd", LeaderSGD,
    help="Leader SGD (Teng 2019): local steps pulled towards the best worker; multi-leader, async",
    params={"pull": "λ in [0, 1]: fraction of the way to the (group) leader at each round",
            "period": "τ >= 1: local steps between rounds",
            "prox": "p in [0, τ]: every step pulls every worker p/τ of the way to its last leader snapshot "
                    "(the authors' 0.1; 0 = rounds only)",
            "window": "minibatch losses in the running mean that elects the leader (0 = the authors' ⌊τ/4⌋, >= 1)",
            "groups": "G: groups of consecutive ranks, each with a local leader (0 = one per node)",
            "global_pull": "λ_G in [0, 1]: pull towards the global leader (groups > 1 only)",
            "global_period": "τ_G >= 1: steps between global rounds (groups > 1 only)",
            "global_prox": "p_G in [0, τ_G]: per-step pull towards the global leader's snapshot (groups > 1 only)",
            "global_window": "the global election's window (0 = ⌊τ_G/4⌋; groups > 1 only)",
            "eval": "what is evaluated: average (the workers' mean; default), leader, each (every worker); "
                    "async=true: leader only (the default there)",
            "asynchronous": "event-driven: rounds every τ·n local steps in total, fast workers step more"},
    shown_defaults={"eval": "average (leader with async=true)"})
