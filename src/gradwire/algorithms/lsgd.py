"""Leader SGD (Teng, Gao, Chalus, Choromanska, Goldfarb, Weller 2019, "Leader stochastic gradient
descent for distributed training of deep learning models", NeurIPS).

LSGD replaces EASGD's elastic pull towards the *average* of the workers by a pull towards the
*leader*, the worker with the lowest loss. Its objective keeps the stationary points of f (the
penalty λ/2 ||x_i - x̃||² vanishes at the leader itself), and the update of each worker is

    x_i <- x_i - η g_i(x_i) - λ (x_i - x̃)                    (the LSGD step, Teng et al. 2019, Sec. 3)

applied here as a split step: every step is a local (heavy-ball) SGD step; every ``period`` = τ
steps the workers elect the leader, whose parameters alone are broadcast, and each worker moves λ
of the way towards them (x <- lerp(x, x̃, λ)). So λ = 1 makes every worker a copy of the leader,
λ = 0 leaves n independent SGD runs. The leader is the worker with the lowest running mean of
its last τ minibatch losses (ties: the lowest rank), re-elected at every communication.

Multi-leader (``groups`` = G > 1; Teng et al. 2019, the multi-leader objective with a local and a
global attraction): the workers form G equal groups of consecutive ranks; every τ steps each is
pulled with strength λ towards its group's leader, and every ``global_period`` = τ_G steps with
λ_G towards the leader of all workers (window τ_G). ``groups=0`` makes one group per node
(``transport.node_of``), as the paper intends for GPUs of one machine; the simulator is one node,
and a cluster with one worker per node gets one group too (single-leader LSGD), not n groups of one.

``async=true`` (the paper's asynchronous LSGD): workers step at their own pace and a round is
triggered whenever the workers have completed τ·n local steps in total (τ·|group| within a
group), so fast workers take more local steps between rounds than slow ones. Who leads a round
is decided when it is triggered, from the loss windows of that moment (``AsyncRounds``, one
object that the simulator and the torch backend's coordinator both run). Workers report every
local step to a coordinator (a header each way, ``replicas.HEADER_BYTES``); in a round the
leader uploads its parameters once and every other member receives them once, at the end of its
current step, and pulls. The simulator runs this event-driven (a round happens at the moment of
its trigger, holding its members' next steps until it has ended) and prices exactly these
messages; on the torch backend (``gradwire/run/coordinator.py``) each member pulls when it next
reports, towards the parameters the leader had when it heard of the round. One ``step`` is n
gradient computations. Evaluation uses the leader's parameters as they were broadcast at the
last (global) round: every process holds that copy (on the torch backend, the coordinator).
"""

from __future__ import annotations

import dataclasses

import torch

from gradwire.algorithms.base import Algorithm
from gradwire.algorithms.replicas import (
    HEADER_BYTES,
    LocalSteps,
    LossWindow,
    Pace,
    Replicas,
    elect,
    mean_of,
    pull_towards,
    register_with_async_key,
    require_plain_codec,
)
from gradwire.spec import require


@dataclasses.dataclass
class Round:
    """One asynchronous communication round: ``group`` None is a global round."""

    id: int
    group: int | None
    members: list[int]
    leader: int
    score: float   # the leader's running loss, as elected (float32)
    weight: float  # how far each member moves towards the leader


def _f32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


class AsyncRounds:
    """When the rounds of asynchronous LSGD happen and who leads them: fed every local step as it
    completes (worker, minibatch loss), in the order the steps complete. A worker in ``lost`` is
    no longer elected."""

    def __init__(self, algo: LeaderSGD, n: int):
        self.algo = algo
        self.window = LossWindow(range(n), max(algo.period, algo.top_period))
        self.done, self.group_done, self.next_id = 0, [0] * len(algo.members), 1
        self.lost: set[int] = set()

    def _round(self, group: int | None, members: list[int], window: int, weight: float) -> Round:
        # scores rounded to float32 as the synchronous election sends them, so ties break alike
        scores = {r: _f32(self.window.mean(r, window)) for r in members if r not in self.lost}
        leader = min(scores, key=lambda r: (scores[r], r))
        self.next_id += 1
        return Round(self.next_id - 1, group, list(members), leader, scores[leader], weight)

    def completed(self, rank: int, loss: float) -> list[Round]:
        """Worker ``rank`` finished a local step with this loss: the rounds that triggers, in order."""
        algo, rounds = self.algo, []
        self.window.push(rank, loss)
        self.done += 1
        k = algo.group_of[rank]
        self.group_done[k] += 1
        if algo.multi and self.group_done[k] % (algo.period * len(algo.members[k])) == 0:
            rounds.append(self._round(k, algo.members[k], algo.period, algo.pull))
        if self.done % (algo.top_period * len(self.window.values)) == 0:
            everyone = sorted(self.window.values)
            rounds.append(self._round(None, everyone, algo.top_period, algo.top_pull))
        return rounds

    def state_dict(self) -> dict:
        return {"window": self.window.state_dict(), "done": self.done, "next_id": self.next_id,
                "group_done": {str(k): d for k, d in enumerate(self.group_done)}}

    def load_state_dict(self, state: dict) -> None:
        self.window.load_state_dict(state["window"])
        self.done, self.next_id = int(state["done"]), int(state["next_id"])
        self.group_done = [int(state["group_done"][str(k)]) for k in range(len(self.group_done))]


class LeaderSGD(Algorithm):
    name = "lsgd"
    evaluates = "leader"

    def __init__(self, *, pull: float = 0.1, period: int = 4, groups: int = 0, global_pull: float = 0.1,
                 global_period: int = 16, asynchronous: bool = False):
        for key, value in (("pull", pull), ("global_pull", global_pull)):
            require(0 <= value <= 1, f"{key} must be in [0, 1] (the fraction of the way to the leader), "
                    f"got {value}")
        for key, value in (("period", period), ("global_period", global_period)):
            require(value >= 1, f"{key} must be >= 1 (local steps between communications), got {value}")
        require(groups >= 0, f"groups must be >= 1, or 0 for one group per node; got {groups}")
        self.pull, self.period, self.groups_arg = pull, period, groups
        self.global_pull, self.global_period, self.asynchronous = global_pull, global_period, asynchronous

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_plain_codec(codec, "lsgd")
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
        self.top_pull, self.top_period = ((self.global_pull, self.global_period) if self.multi
                                          else (self.pull, self.period))
        self.replicas = Replicas(ctx, params, optim)
        self.leader, self.group_leaders = 0, [m[0] for m in self.members]  # lowest rank until elected
        self.leader_x = params.clone()
        self.model_bytes = params.numel() * params.element_size()
        if self.asynchronous:
            self.rounds = AsyncRounds(self, n)
            self.busy_until = {r: 0.0 for r in ctx.local_ranks}  # end of the last round a worker joined
            self.events = LocalSteps(ctx, self.replicas)  # the simulator's event queue
        else:
            self.window = LossWindow(ctx.local_ranks, max(self.period, self.top_period))
            self.pace = Pace(ctx)

    server_protocol = "coordinator"  # async on a real backend: gradwire/run/coordinator.py

    @property
    def needs_server(self) -> bool:
        """Asynchronous LSGD counts every worker's local steps: on a real backend a coordinator
        process does (gradwire/run/coordinator.py)."""
        return self.asynchronous

    def setup_info(self):
        return {"groups": self.members,
                "evaluates": "the global leader, as broadcast at the last global round"}

    # -- communication rounds -------------------------------------------------------------------------

    def _group_round(self, ctx, k: int, info: dict) -> None:
        members = self.members[k]
        scores = {r: self.window.mean(r, self.period) for r in members if r in self.replicas.x}
        leader, _ = elect(ctx, scores, members)
        _, distance = pull_towards(ctx, self.replicas.x, leader, members, self.pull)
        self.group_leaders[k] = leader
        info.setdefault("group_leader_distance", []).append(distance)

    def _global_round(self, ctx, info: dict) -> None:
        scores = {r: self.window.mean(r, self.top_period) for r in self.replicas.x}
        self.leader, info["leader_loss"] = elect(ctx, scores)
        self.leader_x, info["leader_distance"] = pull_towards(ctx, self.replicas.x, self.leader, None,
                                                              self.top_pull)

    def _finish_info(self, info: dict) -> dict:
        if "group_leader_distance" in info:
            info["group_leader_distance"] = mean_of(info["group_leader_distance"])
        if self.multi:  # the groups this process takes part in (all of them on the simulator)
            info["group_leaders"] = [self.group_leaders[k] for k in self.my_groups]
        info["leader"] = self.leader
        return info

    # -- steps ----------------------------------------------------------------------------------------

    def step(self, ctx, step):
        return self._async_step(ctx) if self.asynchronous else self._sync_step(ctx, step)

    def _sync_step(self, ctx, step: int) -> dict:
        losses = {}
        for r in ctx.local_ranks:
            losses[r] = self.replicas.sgd_step(ctx, r)
            self.window.push(r, losses[r])
        self.pace.computed(ctx, step)
        info = {"loss": mean_of(losses.values()), "gradients": ctx.world_size}
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

    def round_ended(self, rd: Round, lead: torch.Tensor, info: dict, distance: float | None = None) -> None:
        """Record a round whose leader's parameters ``lead`` have been sent (simulator and
        coordinator alike): the leaders, and the global leader's copy that evaluation uses."""
        if rd.group is None:
            self.leader, info["leader_loss"] = rd.leader, rd.score
            self.leader_x.copy_(lead)
            if distance is not None:
                info["leader_distance"] = distance
        else:
            self.group_leaders[rd.group] = rd.leader
            if distance is not None:
                info.setdefault("group_leader_distance", []).append(distance)
        info["rounds"] = info.get("rounds", 0) + 1

    def _sim_round(self, ctx, rd: Round, now: float, info: dict) -> float:
        """A round at simulated time ``now``: the leader uploads its parameters (a header and the
        model, answered by a header), the coordinator sends them to every other member (the body of
        its next answer). Returns when the round has ended."""
        post = ctx.transport.post
        lead = self.replicas.x[rd.leader].clone()
        seconds = post(HEADER_BYTES + self.model_bytes, rd.leader, -1) + post(HEADER_BYTES, -1, rd.leader)
        distance = mean_of(float(torch.dist(self.replicas.x[m], lead)) for m in rd.members)
        for m in rd.members:
            if m != rd.leader:
                seconds += post(self.model_bytes, -1, m)
                self.replicas.x[m].lerp_(lead, rd.weight)
        self.round_ended(rd, lead, info, distance)
        end = now + seconds
        for m in rd.members:  # a round holds its members' next step until it has ended
            self.busy_until[m] = max(self.busy_until[m], end)
        return end

    def _async_step(self, ctx) -> dict:
        self.events.begin(ctx)
        info, losses = {}, []
        post = ctx.transport.post
        for _ in range(ctx.world_size):
            finish, r, loss = self.events.complete(ctx)
            losses.append(loss)
            now = finish + post(HEADER_BYTES, r, -1) + post(HEADER_BYTES, -1, r)  # the report and its answer
            for rd in self.rounds.completed(r, loss):
                now = self._sim_round(ctx, rd, now, info)
            self.events.start(ctx, r, max(now, self.busy_until[r]))
        return self._finish_info(info | {"loss": mean_of(losses), "gradients": ctx.world_size})

    def eval_params(self):
        return self.leader_x

    def spec(self):
        text = f"lsgd:pull={self.pull:g},period={self.period}"
        if self.multi:
            text += (f",groups={len(self.members)},global_pull={self.global_pull:g},"
                     f"global_period={self.global_period}")
        return text + (",async=true" if self.asynchronous else "")

    # -- checkpoint -----------------------------------------------------------------------------------

    def state_dict(self):
        state = {"replicas": self.replicas.state_dict(), "leader": self.leader, "leader_x": self.leader_x,
                 "group_leaders": {str(k): r for k, r in enumerate(self.group_leaders)}}
        if self.asynchronous:
            state |= {"events": self.events.state_dict(), "rounds": self.rounds.state_dict(),
                      "busy_until": {str(r): torch.tensor(t, dtype=torch.float64)
                                     for r, t in self.busy_until.items()}}
        else:
            state |= {"pace": self.pace.state_dict(), "window": self.window.state_dict()}
        return state

    def load_state_dict(self, state):
        self.replicas.load_state_dict(state["replicas"])
        self.leader = int(state["leader"])
        self.group_leaders = [int(state["group_leaders"][str(k)]) for k in range(len(self.members))]
        self.leader_x.copy_(state["leader_x"])
        if self.asynchronous:
            self.events.load_state_dict(state["events"])
            self.rounds.load_state_dict(state["rounds"])
            self.busy_until = {r: float(state["busy_until"][str(r)]) for r in self.busy_until}
        else:
            self.pace.load_state_dict(state["pace"])
            self.window.load_state_dict(state["window"])


register_with_async_key(
    "lsgd", LeaderSGD,
    help="Leader SGD (Teng 2019): local steps pulled towards the best worker; multi-leader, async",
    params={"pull": "λ in [0, 1]: fraction of the way to the (group) leader at each round",
            "period": "τ >= 1: local steps between rounds; also the window of the running loss",
            "groups": "G: groups of consecutive ranks, each with a local leader (0 = one per node)",
            "global_pull": "λ_G in [0, 1]: pull towards the global leader (groups > 1 only)",
            "global_period": "τ_G >= 1: steps between global rounds (groups > 1 only)",
            "asynchronous": "event-driven: rounds every τ·n local steps in total, fast workers step more"})
