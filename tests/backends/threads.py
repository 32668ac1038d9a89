"""One worker per thread: a threaded transport that runs an algorithm exactly as the torch backend
would. Each thread hosts one rank, holds only that rank's state, and meets the others in
collectives (subgroups included)."""

from __future__ import annotations

import threading

import torch

from gradwire.algorithms import ALGORITHMS, CodecConfig, Context, OptimConfig
from gradwire.config import RunConfig
from gradwire.run.loop import Run
from gradwire.transports.base import Transport
from gradwire.transports.sim import SimClock


class Hub:
    """Where the threads' contributions meet; each collective is keyed by its participants and by
    how many collectives over those participants the calling rank has entered before."""

    def __init__(self, timeout_s: float = 20.0):
        self.cond, self.slots, self.timeout_s = threading.Condition(), {}, timeout_s

    def meet(self, key, rank: int, payload, needed: list[int]) -> dict:
        with self.cond:
            self.slots.setdefault(key, {})[rank] = payload
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: all(r in self.slots[key] for r in needed), self.timeout_s):
                raise TimeoutError(f"rank {rank}: collective {key} never completed (have {sorted(self.slots[key])})")
            return dict(self.slots[key])


class ThreadTransport(Transport):
    """One rank's view of the hub; free of cost (only the numbers are compared)."""

    def __init__(self, hub: Hub, world_size: int, rank: int):
        super().__init__()
        self.hub, self.world_size, self.rank, self.local_ranks = hub, world_size, rank, (rank,)
        self.seq: dict = {}

    def _meet(self, op: str, ranks, payload, needed=None) -> dict:
        ranks = self.participants(ranks)
        assert self.rank in ranks, f"rank {self.rank} entered a {op} over {ranks}"
        key = (op, tuple(ranks))
        n = self.seq[key] = self.seq.get(key, -1) + 1
        return self.hub.meet(key + (n,), self.rank, payload, ranks if needed is None else needed)

    def allreduce_mean(self, tensors, ranks=None):
        got = self._meet("allreduce", ranks, tensors[self.rank].clone())
        order = sorted(got)
        total = got[order[0]].to(torch.float64 if got[order[0]].dtype == torch.float64 else torch.float32, copy=True)
        for r in order[1:]:
            total += got[r]
        return total.div_(len(order))

    def allgather(self, buffers, ranks=None, *, size=None):
        return {r: b.clone() for r, b in sorted(self._meet("allgather", ranks, buffers[self.rank].clone()).items())}

    def gather(self, buffers, dst, ranks=None, *, size=None):
        got = self._meet("gather", ranks, buffers[self.rank].clone())
        return dict(sorted(got.items())) if self.rank == dst else None

    def broadcast(self, buffer, src, ranks=None, *, size=None):
        mine = buffer.clone() if self.rank == src else None
        return self._meet("broadcast", ranks, mine, needed=[src])[src].clone()

    def post(self, nbytes, src, dst):
        raise NotImplementedError("event-driven algorithms are not run one worker per process")


def run_one_worker_per_thread(cfg: RunConfig, steps: int) -> dict[int, dict]:
    """Train ``cfg.algorithm`` with one thread per rank; returns, per rank, its step infos, its final
    parameters and its ``eval_params()``."""
    hub, results, errors = Hub(), {}, []

    def worker(rank: int) -> None:
        try:
            r = Run(cfg.replace(algorithm="sync"))  # data, model and straggler model; its own algorithm below
            transport = ThreadTransport(hub, cfg.workers, rank)
            ctx = Context(world_size=cfg.workers, local_ranks=(rank,), transport=transport, oracle=r.oracle,
                          stragglers=r.ctx.stragglers, clock=SimClock(), seed=cfg.seed)
            alg = ALGORITHMS.build(cfg.algorithm)
            alg.setup(ctx, r.model.flatten(), OptimConfig(lr=cfg.lr, momentum=cfg.momentum), CodecConfig())
            infos = []
            for t in range(1, steps + 1):
                r.oracle.step = t
                infos.append(alg.step(ctx, t))
            results[rank] = {"infos": infos, "x": alg.replicas.x[rank].clone(), "eval": alg.eval_params().clone()}
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(cfg.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    hung = [k for k, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"ranks {hung} still running after 120 s"
    assert sorted(results) == list(range(cfg.workers)), f"results from ranks {sorted(results)} only"
    return results
