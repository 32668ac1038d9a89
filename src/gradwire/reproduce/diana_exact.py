"""DIANA against QSGD, TernGrad and DQGD on regularised logistic regression (Mishchenko et al.
2019): the set-up of ``benchmarks/diana_vs_dqgd.py`` and ``tests/algorithms/test_diana.py``."""

from __future__ import annotations

import time
from pathlib import Path

from gradwire.config import RunConfig
from gradwire.reproduce.claim import Check, Claim, Scale, fmt, judge_checks, save_figure, variants

NAME = "diana-optimum"
TITLE = "DIANA reaches the exact optimum where quantized gradient methods stall"
CITATION = ("K. Mishchenko, E. Gorbunov, M. Takáč, P. Richtárik 2019, \"Distributed Learning with Compressed "
            "Gradient Differences\", arXiv:1901.09269")
STATEMENT = ("Quantizing gradient differences against per-worker memories that learn each worker's gradient at "
             "the optimum makes the quantization noise vanish: with full local gradients DIANA converges "
             "linearly to the exact optimum of a strongly convex (L2+L1-regularised) problem, while methods "
             "that quantize the gradients themselves (QSGD, TernGrad, DQGD) stop at a neighbourhood set by the "
             "quantization variance at the optimum when the workers' data differ.")
# heterogeneous workers: each worker's gradient at x* is far from zero, which is what DQGD cannot quantize away
TASK = "synthetic-logreg:samples=400,dim=10,l2=0.1,l1=0.001,hetero=2.0"
EXACT = 1e-10   # DIANA must end within this of f* (float64; one unit of round-off in f is ~6e-17)
FLOOR = 1e-8    # a baseline "stalls" when it never gets below this in the second half of the run
COMPRESSOR = "pquant:p=inf,block=10"
BASELINES = {"QSGD (s=4)": {"algorithm": "sync", "compressor": "qsgd:levels=4"},
             "TernGrad": {"algorithm": "sync", "compressor": "terngrad"},
             "DQGD (same quantizer, no memory)": {"algorithm": "dqgd", "compressor": COMPRESSOR}}
VARIANTS = {"DIANA": {"algorithm": "diana", "compressor": COMPRESSOR}} | BASELINES


def judge(m: dict) -> list[Check]:
    """``m["final"]``: |f - f*| at the end per variant; ``m["floor"]``: the smallest |f - f*| over
    the second half of each run."""
    diana = m["final"]["DIANA"]
    checks = [Check(f"DIANA ends within {EXACT:g} of f*", diana <= EXACT, f"|f - f*| = {diana:.2e}",
                    "DIANA's memories did not converge in this many steps")]
    for name in BASELINES:
        floor = m["floor"][name]
        checks.append(Check(f"{name} stalls: never below {FLOOR:g} in the second half of the run",
                            floor >= FLOOR, f"min |f - f*| = {floor:.2e}",
                            "its quantization noise at the optimum is below the floor on this problem"))
    return checks


def run(out: Path, scale: Scale) -> Claim:
    started = time.perf_counter()
    steps = scale.pick(300, 1000)
    common = RunConfig(task=TASK, workers=4, batch_size="full", dtype="float64", lr=0.5, steps=steps,
                       eval_every=10, seed=0)
    res = variants(out / "runs", common, VARIANTS, "DIANA vs quantized GD, logistic regression", report=not scale.quick)
    final = {k: abs(r.final["suboptimality"]) for k, r in res.items()}
    floor = {k: min(abs(x["suboptimality"]) for x in r.metrics if x["step"] >= steps / 2) for k, r in res.items()}
    measured = {"final": final, "floor": floor, "steps": steps,
                "mb_sent": {k: r.summary["bytes_sent"] / 1e6 for k, r in res.items()}}
    checks = judge(measured)
    verdict, reason = judge_checks(checks)
    rows = [[k, fmt(final[k]), fmt(floor[k]), fmt(measured["mb_sent"][k])] for k in res]
    plot = _plot(res, out / f"{NAME}.png", "Mishchenko et al. 2019: DIANA against quantized gradient methods")
    return Claim(NAME, TITLE, CITATION, STATEMENT,
                 setup=(f"`{TASK}` on 4 heterogeneous workers, full local gradients, float64, step 0.5, "
                        f"{steps} steps, seed 0; DIANA and DQGD with `{COMPRESSOR}`, QSGD with 4 levels, TernGrad"),
                 columns=["variant", "final |f - f*|", "min |f - f*|, second half", "MB sent"], rows=rows,
                 checks=checks, verdict=verdict, reason=reason, measured=measured, plot=plot.name, runs="runs",
                 wall_time_s=time.perf_counter() - started)


def _plot(res, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, r in res.items():
        pts = [(x["step"], x["bytes_sent"] / 1e6, max(abs(x["suboptimality"]), 1e-17)) for x in r.metrics]
        axes[0].plot([p[0] for p in pts], [p[2] for p in pts], label=name)
        axes[1].plot([p[1] for p in pts], [p[2] for p in pts], label=name)
    for ax, xlabel in zip(axes, ("step", "MB sent")):
        ax.set(xlabel=xlabel, ylabel="|f(x) - f*| (floored at 1e-17)", yscale="log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(fig, path)
