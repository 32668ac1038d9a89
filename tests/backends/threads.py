"""One worker per thread: the threads backend's transport (``gradwire.transports.threads``) runs an
algorithm exactly as the torch backend would. Each thread hosts one rank, holds only that rank's
state, and meets the others in collectives (subgroups included); here each thread steps the
algorithm itself, so every rank's step figures and parameters can be compared."""

from __future__ import annotations

import threading

from gradwire.algorithms import ALGORITHMS, CodecConfig, Context, OptimConfig
from gradwire.config import RunConfig
from gradwire.run.loop import Run
from gradwire.transports.sim import SimClock
from gradwire.transports.threads import Hub, ThreadTransport


def run_one_worker_per_thread(cfg: RunConfig, steps: int) -> dict[int, dict]:
    """Train ``cfg.algorithm`` with one thread per rank; returns, per rank, its step infos, its final
    parameters and its ``eval_params()``."""
    hub, results, errors = Hub(timeout_s=20.0), {}, []

    def worker(rank: int) -> None:
        try:
            # data, model and straggler model; its own algorithm below
            r = Run(cfg.replace(algorithm="sync", compressed_mean="gather", owner_compressor=""))
            transport = ThreadTransport(hub, cfg.workers, rank)
            ctx = Context(world_size=cfg.workers, local_ranks=(rank,), transport=transport, oracle=r.oracle,
                          stragglers=r.ctx.stragglers, clock=SimClock(), seed=cfg.seed,
                          param_shapes=r.ctx.param_shapes, param_roles=r.ctx.param_roles)
            alg = ALGORITHMS.build(cfg.algorithm)
            alg.setup(ctx, r.model.flatten(), OptimConfig(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov),
                      CodecConfig(compressor=cfg.compressor, error_feedback=cfg.error_feedback,
                                  compressed_mean=cfg.compressed_mean, owner_compressor=cfg.owner_compressor))
            infos = []
            for t in range(1, steps + 1):
                r.oracle.step = t
                infos.append(alg.step(ctx, t))
            alg.before_evaluation(ctx)  # every process, as the run loop at an evaluation step
            held = alg.replicas.x[rank] if hasattr(alg, "replicas") else alg.eval_params()  # no replicas: one model
            results[rank] = {"infos": infos, "x": held.clone(), "eval": alg.eval_params().clone()}
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
