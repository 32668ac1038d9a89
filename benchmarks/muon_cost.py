"""What Muon's update costs in MuLoCo's step, before and after a change, side by side in one process:

    .venv/bin/python benchmarks/muon_cost.py                      # against f6a1096's muloco.py
    .venv/bin/python benchmarks/muon_cost.py --baseline REV --rows muloco-k96-h3,muloco-k96-h3-ns3

Three measurements on one core (``torch.set_num_threads(1)``, ``time.process_time``, the candidates
taking turns block by block and each one's fastest block: ``time_to_quality.time_blocks``), on the
time-to-quality benchmark's model (``time_to_quality.TASK``, its tensor shapes):

1. the Newton-Schulz iteration alone, per matrix shape of the model (the baseline's on each matrix,
   this tree's on each matrix and on the shape's matrices as one batch);
2. the whole Muon + AdamW update (``MuonAdamW.apply``) on the model's flat gradient, baseline and this
   tree, at each ``--ns`` setting;
3. the benchmark rows' steps (``time_to_quality``'s compute stage: forward, backward, update, codec):
   DDP, each of ``--rows``, and the first MuLoCo row built with the baseline's ``Muon``/``MuonAdamW``.

The baseline is ``src/gradwire/algorithms/muloco.py`` at ``--baseline`` (``git show``), imported as
its own module. Writes ``--out``/muon_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import time_to_quality as ttq  # noqa: E402
from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402

BASELINE = "f6a1096"           # main before the batched Newton-Schulz


def baseline_module(rev: str, folder: Path):
    """muloco.py at ``rev``, imported under its own name (its imports resolve to this tree's gradwire;
    its MuLoCo class is not registered: the name is this tree's)."""
    from unittest import mock

    from gradwire.algorithms.base import ALGORITHMS

    path = folder / f"muloco_{rev}.py"
    path.write_text(subprocess.run(["git", "show", f"{rev}:src/gradwire/algorithms/muloco.py"], check=True,
                                   capture_output=True, text=True, cwd=HERE.parent, timeout=60).stdout)
    spec = importlib.util.spec_from_file_location(f"muloco_{rev}", path)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.object(ALGORITHMS, "register", lambda *a, **k: (lambda cls: cls)):
        spec.loader.exec_module(module)
    return module


def model_shapes(folder: Path):
    from gradwire.run.loop import Run

    r = Run(ttq.config(ttq.ROW["ddp"], 2e-3, ttq.TUNING_SEED, 1, ttq.N_STEPS, folder / "shapes"))
    return [tuple(s) for s in r.model.shapes]


def muon_adamw(module, shapes, x, ns: tuple[int, str] | None):
    """``module``'s MuonAdamW on ``x`` with MuLoCo's defaults (Muon η 0.02, μ 0.95 Nesterov; AdamW on the rest)."""
    from gradwire.algorithms.optim import AdamW

    extra = {} if ns is None else dict(ns_steps=ns[0], ns_coefficients=ns[1])
    return module.MuonAdamW(x, shapes, muon=lambda w: module.Muon(w, lr=0.02, momentum=0.95, nesterov=True,
                                                                  weight_decay=0.0, **extra),
                            adamw=lambda v: AdamW(v, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=BASELINE, help="the git revision whose muloco.py is the 'before'")
    p.add_argument("--rows", default="muloco-k96-h3", help="time_to_quality rows to time beside DDP")
    p.add_argument("--ns", default="5:jordan", help="Newton-Schulz settings K:coefficients for the update alone")
    p.add_argument("--blocks", type=int, default=10)
    add_run_flags(p, only=("out",), defaults={"out": "runs/time-to-quality"})
    args, _ = parse_run_args(p, argv)
    import torch

    from gradwire.algorithms import muloco
    from gradwire.run.loop import Run

    torch.set_num_threads(1)
    out = {"baseline": args.baseline, "blocks": args.blocks}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old = baseline_module(args.baseline, tmp)
        shapes = model_shapes(tmp)
        g = torch.Generator().manual_seed(0)

        # 1. Newton-Schulz alone, per shape
        steppers = {}
        for shape in sorted({s for s in shapes if len(s) == 2}):
            mats = [torch.randn(*shape, generator=g) for s in shapes if s == shape]
            batch = torch.stack(mats)
            steppers[f"ns {shape} x{len(mats)} before"] = lambda m=mats: [old.newton_schulz(u) for u in m]
            steppers[f"ns {shape} x{len(mats)} after, per matrix"] = lambda m=mats: [muloco.newton_schulz(u) for u in m]
            steppers[f"ns {shape} x{len(mats)} after, batched"] = lambda b=batch: muloco.newton_schulz(b)

        # 2. the whole update
        numel = sum(math.prod(s) for s in shapes)
        grads = [torch.randn(numel, generator=g) for _ in range(4)]

        def updater(opt):
            state = {"i": 0}

            def step():
                state["i"] += 1
                opt.apply(grads[state["i"] % len(grads)])
            return step

        steppers["update before"] = updater(muon_adamw(old, shapes, torch.randn(numel, generator=g), None))
        for spec in args.ns.split(","):
            k, name = spec.split(":")
            steppers[f"update after ns_steps={k} {name}"] = updater(
                muon_adamw(muloco, shapes, torch.randn(numel, generator=g), (int(k), name)))

        # 3. the rows' steps; the first MuLoCo row also with the baseline's Muon
        lrs = ttq.load_tuning(Path(args.out))
        rows = [ttq.ROW["ddp"]] + [ttq.ROW[k] for k in args.rows.split(",")]
        for row in rows:
            steppers[f"step {row.key}"] = ttq._sim_stepper(row, lrs.get(row.key, 2e-3), ttq.N_STEPS, tmp / row.key)
        first = next(r for r in rows if r.algorithm.startswith("muloco"))
        saved = muloco.Muon, muloco.MuonAdamW
        assert "ns_" not in first.algorithm  # the baseline knows 5 Jordan steps only

        def old_muon(w, ns_steps, ns_coefficients, **settings):
            return old.Muon(w, **settings)

        muloco.Muon, muloco.MuonAdamW = old_muon, old.MuonAdamW  # MuLoCo's factory reads these when it builds
        try:
            r = Run(ttq.config(first, lrs.get(first.key, 2e-3), ttq.TUNING_SEED, 1, ttq.N_STEPS, tmp / "before"))
            assert isinstance(r.algorithm.replicas.opt[0], old.MuonAdamW)
        finally:
            muloco.Muon, muloco.MuonAdamW = saved
        steppers[f"step {first.key} before"] = r.train_step

        means, _ = ttq.time_blocks(steppers, args.blocks)
    out["ms"] = {key: 1e3 * min(v) for key, v in means.items()}
    out["blocks_ms"] = {key: [1e3 * x for x in v] for key, v in means.items()}
    path = Path(args.out) / "muon_cost.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    ddp = out["ms"]["step ddp"]
    print(f"| measured (baseline {args.baseline}) | CPU ms, fastest of {args.blocks} blocks | x DDP's step |")
    print("|---|---|---|")
    for key, ms in out["ms"].items():
        print(f"| {key} | {ms:.2f} | {ms / ddp:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
