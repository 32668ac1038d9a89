"""The probes behind docs/defaults.md's tenth round that are not a sweep of an algorithm's own keys:
what each figure there came from, runnable (each line prints its settings and figures).

    OMP_NUM_THREADS=1 python benchmarks/defaults_probes.py replies --reply mean --lrs 0.012,0.024 --seeds 3,4
    OMP_NUM_THREADS=1 python benchmarks/defaults_probes.py replies --reply ef-tensor --lrs 0.015 --momentum 0.8 \\
        --seeds 3,4,5,6,7,8
    OMP_NUM_THREADS=1 python benchmarks/defaults_probes.py reply-scale --seeds 3 --at 0,50,100,200,499
    OMP_NUM_THREADS=1 python benchmarks/defaults_probes.py trace --algorithm dagc --lr 2.0 --seeds 1 --steps 520 \\
        --show 490-506      # (with ATEN_CPU_CAPABILITY=default for the run of the doc)
    OMP_NUM_THREADS=1 python benchmarks/defaults_probes.py lsgd-search --rng 1 --draws 30 --seeds 3,4,5,6

``replies``: signSGD's workers vote as in ``signsgd.py``; rank 0's reply is one the algorithm does not
offer, applied in place of its step (no transport: the figures are the learning, not the bytes):
``mean`` (the votes' mean t as it is), ``ef-vector`` / ``ef-tensor`` / ``ef-block`` (the error-fed
scaled sign of ``down=ef``, its scale a float32 mean over the whole vector, as the patched copy of the
doc's first trials took it, / per tensor / per ``--block`` elements), ``relative`` (the majority's sign
times each tensor's initial RMS, at least ``--floor``), ``relative-mean`` (t times it). ``ef`` and
``vote`` run the algorithm's own ``down=ef`` / ``down=vote``. ``reply-scale``: s = mean |u| of the
default reply at the steps asked. ``trace``: the minibatch loss and how far the evaluated parameters
moved, step by step. ``lsgd-search``: Leader SGD's keys drawn at random (``random.Random(--rng)``).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
from pathlib import Path

REPLIES = ("vote", "ef", "mean", "ef-vector", "ef-tensor", "ef-block", "relative", "relative-mean")


def _config(tmp: Path, **kw):
    from gradwire.config import RunConfig

    return RunConfig(out=str(tmp / "run"), overwrite=True, curves=False, **kw)


def _final(tmp: Path, **kw) -> float:
    """The final test accuracy of one run; NaN for one that diverged (reported, the probe goes on)."""
    from gradwire.errors import DivergenceError
    from gradwire.run.loop import run

    try:
        return run(_config(tmp, **kw), progress=False)["final"]["test_acc"]
    except DivergenceError:
        return math.nan


def _line(label: str, accs: list[float]) -> str:
    return f"{label}: " + " / ".join(f"{a:.3f}" for a in accs) + f"  mean {statistics.mean(accs):.3f}"


def _probe_reply(reply: str, block: int, floor: float):
    """(setup, step) for signSGD with rank 0's reply replaced (``replies``): the workers' Signum signs
    as the algorithm makes them, then the reply computed where the algorithm's own would be."""
    import torch

    from gradwire.algorithms.signsgd import SignSGD

    own_setup = SignSGD.setup

    def parts(shapes, n):
        if reply == "ef-vector":
            return [slice(0, n)]
        if reply == "ef-block":
            return [slice(i, min(i + block, n)) for i in range(0, n, block)]
        offsets = [0]
        for shape in shapes:
            offsets.append(offsets[-1] + shape.numel())
        return [slice(a, b) for a, b in zip(offsets, offsets[1:])]

    def setup(self, ctx, params, optim, codec):
        own_setup(self, ctx, params, optim, codec)
        self.parts = parts(ctx.param_shapes, params.numel())
        self.error = torch.zeros_like(params)
        self.initial_rms = [max(float(params[p].pow(2).mean().sqrt()), floor) for p in self.parts]

    def step(self, ctx, step):
        ctx.compute_all(step)
        losses, signs = {}, []
        for r in ctx.local_ranks:
            losses[r], g = ctx.gradient(r, self.x)
            if self.m is not None:
                g = self.m[r].mul_(self.momentum).add_(g, alpha=1 - self.momentum)
            signs.append(torch.where(g >= 0, 1.0, -1.0).to(self.x.dtype))
        t = torch.stack(signs).mean(0)
        if reply == "mean":
            update = t
        elif reply.startswith("ef-"):
            u = self.error.add_(t)
            update = torch.empty_like(u)
            for p in self.parts:
                update[p] = u[p].abs().mean() * torch.where(u[p] >= 0, 1.0, -1.0)
            u.sub_(update)
        else:  # relative, relative-mean
            update = torch.where(t >= 0, 1.0, -1.0).to(t.dtype) if reply == "relative" else t.clone()
            for p, rms in zip(self.parts, self.initial_rms):
                update[p] *= rms
        self.x.sub_(update, alpha=self.rate.at(self.updates))
        self.updates += 1
        return {"loss": sum(losses.values()) / len(losses), "gradients": ctx.world_size}

    return setup, step


def replies(tmp: Path, ns, run_keys: dict) -> None:
    from gradwire.algorithms.signsgd import SignSGD

    spec = f"signsgd:momentum={ns.momentum:g}" + (",down=vote" if ns.reply == "vote" else "")
    own = SignSGD.setup, SignSGD.step
    if ns.reply not in ("vote", "ef"):
        SignSGD.setup, SignSGD.step = _probe_reply(ns.reply, ns.block, ns.floor)
    try:
        for lr in ns.lrs:
            accs = [_final(tmp, algorithm=spec, lr=lr, lr_schedule=ns.lr_schedule, seed=s, **run_keys)
                    for s in ns.seeds]
            print(_line(f"{ns.reply} β={ns.momentum:g} {ns.lr_schedule} --lr {lr:g}", accs), flush=True)
    finally:
        SignSGD.setup, SignSGD.step = own


def reply_scale(tmp: Path, ns, run_keys: dict) -> None:
    from gradwire.algorithms.signsgd import SignSGD
    from gradwire.compress import Packet
    from gradwire.run.loop import Run

    scales = []
    reply = SignSGD._reply

    def recording(self, votes, voters):
        buffer = reply(self, votes, voters)
        scales.append(float(self.reply.decode(Packet(buffer, self.x.shape, self.x.dtype)).abs().mean()))
        return buffer

    SignSGD._reply = recording
    try:
        r = Run(_config(tmp, algorithm="signsgd", seed=ns.seed, **run_keys))
        for _ in range(r.cfg.steps):
            r.train_step()
    finally:
        SignSGD._reply = reply
    print(f"signsgd seed {ns.seed}: s = mean |u| at step " + ", ".join(f"{k}: {scales[k]:.3f}" for k in ns.at))


def trace(tmp: Path, ns, run_keys: dict) -> None:
    from gradwire.run.loop import Run

    first, last = (int(x) for x in ns.show.split("-"))
    r = Run(_config(tmp, algorithm=ns.algorithm, lr=ns.lr, seed=ns.seed, **run_keys))
    before = r.algorithm.eval_params().clone()
    for k in range(1, r.cfg.steps + 1):
        info = r.train_step()
        now = r.algorithm.eval_params()
        moved = float((now - before).norm())
        before = now.clone()
        if first <= k <= last:
            print(f"{ns.algorithm} --lr {ns.lr:g} seed {ns.seed} step {k}: minibatch loss {info['loss']:.3f}, "
                  f"parameters moved {moved:.3f}", flush=True)


def lsgd_search(tmp: Path, ns, run_keys: dict) -> None:
    rng = random.Random(ns.rng)
    for _ in range(ns.draws):
        lr = rng.choice([0.8, 1.2, 1.6, 2.0])
        pull = rng.choice([0.05, 0.1, 0.2, 0.4, 0.7, 1.0])
        period = rng.choice([1, 2, 4, 8])
        prox = min(rng.choice([0.0, 0.1, 0.3, 1.0]), period)
        momentum = rng.choice([0.0, 0.0, 0.5, 0.9])
        schedule = rng.choice(["constant", "constant", "linear", "cosine"])
        if momentum:
            lr = lr * (1 - momentum) * rng.choice([1, 2])
        spec = f"lsgd:pull={pull},period={period},prox={prox}"
        accs = [_final(tmp, algorithm=spec, lr=lr, momentum=momentum, lr_schedule=schedule, seed=s, **run_keys)
                for s in ns.seeds]
        print(_line(f"{spec} --lr {lr:g} --momentum {momentum} --lr-schedule {schedule}", accs), flush=True)


def main(argv: list[str] | None = None) -> None:
    from gradwire.cli.flags import add_run_flags, parse_run_args

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("replies", "reply-scale", "trace", "lsgd-search"))
    parser.add_argument("--reply", choices=REPLIES, default="ef", help="replies: rank 0's reply")
    parser.add_argument("--lrs", default="0.02", help="replies: comma-separated --lr values")
    parser.add_argument("--block", type=int, default=64, help="replies ef-block: elements a scale")
    parser.add_argument("--floor", type=float, default=0.01, help="replies relative: the least RMS a tensor counts")
    parser.add_argument("--at", default="0,50,100,200,499", help="reply-scale: the steps (0-based) to print s at")
    parser.add_argument("--show", default="490-506", help="trace: the steps to print, FIRST-LAST")
    parser.add_argument("--rng", type=int, default=1, help="lsgd-search: the draws' seed")
    parser.add_argument("--draws", type=int, default=30, help="lsgd-search: settings drawn")
    add_run_flags(parser, only=("algorithm", "lr", "momentum", "lr_schedule", "seed", "task", "steps", "workers",
                                "data_dir"),
                  defaults={"algorithm": "dagc", "lr": 2.0, "momentum": 0.8, "lr_schedule": "linear", "seed": [3]},
                  sweep=("seed",),
                  helps={"algorithm": "trace: the algorithm", "lr": "trace: --lr", "momentum": "replies: Signum's β",
                         "lr_schedule": "replies: --lr-schedule",
                         "seed": "the runs' seeds (reply-scale, trace: the first)"})
    ns, _ = parse_run_args(parser, argv)
    ns.lrs = [float(x) for x in ns.lrs.split(",")]
    ns.seed = ns.seeds[0]
    ns.at = [int(x) for x in ns.at.split(",")]
    run_keys = {"task": ns.task, "steps": ns.steps, "workers": ns.workers, "data_dir": ns.data_dir}
    with tempfile.TemporaryDirectory() as tmp:
        {"replies": replies, "reply-scale": reply_scale, "trace": trace, "lsgd-search": lsgd_search}[ns.what](
            Path(tmp), ns, run_keys)

if __name__ == "__main__":
    main()
