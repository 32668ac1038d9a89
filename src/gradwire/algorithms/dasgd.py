"""DaSGD: local SGD with delayed averaging (Zhou, Zhang, Li, Liu, Yang, Wang, Huang 2020, "DaSGD:
Squeezing SGD parallelization performance in distributed training using delayed averaging").

Local SGD stops every worker at each averaging until the allreduce has finished. DaSGD starts the
average of the parameters at step t (τ divides t) and keeps stepping locally; the average arrives d
steps later and is merged so that the local progress made meanwhile is kept:

    x_i(t + d) <- (1/n) Σ_j x_j(t) + (x_i(t + d) - x_i(t))

With d = 0 this is local SGD exactly; with d >= 1 the communication runs behind d steps of
computation, and a worker only waits if the allreduce takes longer than those steps. It uses the
transport's non-blocking ``allreduce_mean_start``: on the simulator the collective's time overlaps
the compute time of the following steps (see ``transports/sim.py`` for how the clock treats it);
on the torch backend the collective runs in the background (``async_op``).

Each worker keeps its parameters at t (the snapshot) until the merge, one replica more than local
SGD. d may be at most τ, so at most one average is in flight. A checkpoint taken while one is in
flight stores the snapshots and the average's finish time; on resume the average is started again
from them (an in-flight collective is part of no process's state) through ``Transport.restart``:
the same numbers, counted once, finishing when it first would have. With d > 0 an average stays in
flight across steps (``carries_rounds``), which ``--fault-tolerance`` refuses: a replica that heals
meanwhile would start a collective its peers finished long ago.
Evaluation uses the last merged average (``evaluates = "last_average"``, local SGD's default).
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS, Rounds
from gradwire.algorithms.local_sgd import LocalSGD
from gradwire.algorithms.replicas import carry_progress_, mean_or_nan
from gradwire.spec import require
from gradwire.transports.base import Handle


@ALGORITHMS.register("dasgd", help="DaSGD (Zhou 2020): local SGD whose average is applied d steps late, "
                     "communication hidden behind computation",
                     params={"period": "τ >= 1: local steps between averagings",
                             "delay": "d in [0, τ]: steps between an average's start and merge (0 = local)"})
class DaSGD(LocalSGD):
    name = "dasgd"
    # local SGD's 0.8 (1.6 on mnist1d-mlp) ended in a NaN at step 500 on seed 2 there; 1.4 learns on
    # seeds 0-4 (docs/defaults.md, seventh round)
    default_lr = 0.7

    @property
    def carries_rounds(self) -> bool:
        return self.delay > 0  # the average of step t is merged d steps later

    def __init__(self, *, period: int = 4, delay: int = 1):
        super().__init__(period=period)
        require(0 <= delay <= period,
                f"delay must be in [0, period={period}] (at most one average in flight), got {delay}")
        self.delay = delay

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        self.snapshot = {r: params.clone() for r in ctx.local_ranks}
        self.handle, self.started_at, self.resend, self.finish_s = None, -1, False, None

    def step(self, ctx, step):
        if self.resend:  # resumed from a checkpoint taken while an average was in flight: counted once
            self.handle = ctx.transport.restart(lambda: ctx.transport.allreduce_mean_start(dict(self.snapshot)),
                                                self.finish_s)
            self.resend = False
        info = self.local_steps(ctx, step)
        if self.started_at >= 0 and step == self.started_at + self.delay:
            self._merge(ctx, info)
        if step % self.period == 0:
            for r, x in self.replicas.x.items():
                self.snapshot[r].copy_(x)
            self.handle, self.started_at = ctx.transport.allreduce_mean_start(dict(self.snapshot)), step
            if self.delay == 0:
                self._merge(ctx, info)
        info["in_flight"] = int(self.handle is not None)
        return info

    def evaluated_rounds(self):
        """The last merged average changes d steps after each averaging starts, every τ steps."""
        first_is = f"period={self.period}" + (f" + delay={self.delay}" if self.delay else "")
        return Rounds(first=self.period + self.delay, period=self.period, delay=self.delay, first_is=first_is,
                      round="averaging", remedy="lower period" + (" or delay" if self.delay else ""))

    def _merge(self, ctx, info: dict) -> None:
        average = self.handle.wait()
        self.pace.joined(ctx, self.handle.finish_s)  # a worker waits only if it is ahead of the average
        info["spread"] = mean_or_nan(float(torch.dist(s, average)) for s in self.snapshot.values())
        info["merged_from_step"] = self.started_at
        for r, x in self.replicas.x.items():
            carry_progress_(x, self.snapshot[r], average)  # the average, plus the progress made during the delay
        self.average.copy_(average)
        self.handle, self.started_at = None, -1

    def per_worker_state(self) -> tuple[str, ...]:
        return super().per_worker_state() + ("snapshot",)

    def state_dict(self):
        in_flight = self.handle.finish_state() if self.handle is not None else {}
        return super().state_dict() | {"snapshot": {str(r): t for r, t in self.snapshot.items()},
                                       "started_at": self.started_at} | in_flight

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for r, t in self.snapshot.items():
            t.copy_(state["snapshot"][str(r)])
        self.started_at = int(state["started_at"])
        self.handle, self.resend = None, self.started_at >= 0
        self.finish_s = Handle.finish_of(state)
