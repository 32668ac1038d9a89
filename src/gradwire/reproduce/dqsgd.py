"""DQ-SGD against QSGD with fixed levels at the same bytes on data of skewed volume (Yan et al.
2021; the experiment of docs/adaptive_compression.md, ``examples/adaptive_compression.yaml``, smaller)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from gradwire.config import RunConfig
from gradwire.reproduce.claim import TIE, Check, Claim, Scale, fmt, judge_checks, save_figure, tail_mean, variants
from gradwire.reproduce.dagc import QUICK_NOTE

NAME = "dqsgd"
TITLE = "Dynamic quantization beats fixed levels at the same communication"
CITATION = ("G. Yan, S.-L. Huang, T. Lan, L. Song 2021, \"DQ-SGD: Dynamic Quantization in SGD for "
            "Communication-Efficient Distributed Learning\", IEEE MASS 2021, arXiv:2107.14575")
STATEMENT = ("Choosing the quantization of every step to minimise the bits sent under a bound on the "
             "convergence error gives a better accuracy for the same communication than a fixed "
             "quantization, and the chosen quantization goes from coarse early in training to fine later "
             "(paraphrased from the abstract; gradwire's rule is its own derivation of that idea).")
SAME_BYTES = 0.05
FIXED, BUDGET, BOUND = "QSGD s=3 (fixed levels)", "DQ-SGD 3 bits", "DQ-SGD eps=1"

def judge(m: dict) -> list[Check]:
    """``m[variant]``: ``mb`` and ``tail`` (mean test accuracy over the last fifth); ``m["bits"]``:
    the error-bound run's mean bits per symbol in its first and last quarter of steps."""
    gap = abs(m[BUDGET]["mb"] - m[FIXED]["mb"]) / m[FIXED]["mb"]
    first, last = m["bits"]["first_quarter"], m["bits"]["last_quarter"]
    return [Check(f"DQ-SGD with a 3-bit budget sends the bytes of fixed 3-bit QSGD (within {SAME_BYTES:.0%})",
                  gap <= SAME_BYTES, f"{m[BUDGET]['mb']:.1f} vs {m[FIXED]['mb']:.1f} MB",
                  "the budget controller missed its target", precondition=True),
            Check(f"DQ-SGD is more accurate than fixed levels at those bytes (mean over the last fifth) by > {TIE}",
                  m[BUDGET]["tail"] > m[FIXED]["tail"] + TIE,
                  f"DQ-SGD {m[BUDGET]['tail']:.3f}, fixed {m[FIXED]['tail']:.3f}",
                  "the per-worker allocation does not pay off at this length"),
            Check("with an error bound the levels go from coarse to fine: more bits per symbol in the last "
                  "quarter of steps than in the first", last > first, f"{first:.2f} -> {last:.2f} bits",
                  "gradwire's bound is relative to the signal ||g||^2 at each step, so the levels only refine when "
                  "the signal-to-noise ratio falls, which it does not here; the adaptivity that pays is across "
                  "workers (large workers get more bits), not over time (docs/adaptive_compression.md)")]


def bit_quarters(bits: list[float]) -> dict:
    """The mean bits a step of the run's first quarter of steps and of its last quarter."""
    q = len(bits) // 4
    return {"first_quarter": statistics.mean(bits[:q]), "last_quarter": statistics.mean(bits[-q:])}


def run(out: Path, scale: Scale) -> Claim:
    started = time.perf_counter()
    steps = scale.pick(160, 2000)
    workers = scale.pick(5, 10)
    common = RunConfig(task="mnist1d-cnn", workers=workers, partition="dirichlet:alpha=0.5,skew=20", stragglers="none",
                       network="ps:mbps=100,latency_ms=1", steps=steps, batch_size=32, lr=0.05, momentum=0.9,
                       eval_every=steps // scale.pick(10, 20), seed=0)
    specs = {FIXED: {"algorithm": "dqsgd:levels=3"}, BUDGET: {"algorithm": "dqsgd:bits_budget=3"},
             BOUND: {"algorithm": "dqsgd:error_bound=1"}}
    res = variants(out / "runs", common, specs, "DQ-SGD vs fixed levels, skewed volumes", report=not scale.quick)
    measured: dict = {"steps": steps}
    for k, r in res.items():
        measured[k] = {"mb": r.summary["bytes_sent"] / 1e6, "tail": tail_mean(r.metrics, "test_acc"),
                       "final": r.final["test_acc"]}
    bits = [s["bits"] for s in res[BOUND].steps()]
    measured["bits"] = bit_quarters(bits)
    checks = judge(measured)
    verdict, reason = judge_checks(checks)
    rows = [[k, fmt(measured[k]["mb"]), fmt(measured[k]["tail"]), fmt(measured[k]["final"])] for k in res]
    plot = _plot(res, bits, out / f"{NAME}.png")
    return Claim(NAME, TITLE, CITATION, STATEMENT,
                 setup=(f"MNIST-1D CNN, {workers} workers, `dirichlet:alpha=0.5,skew=20`, batch 32, lr 0.05, "
                        f"momentum 0.9, {steps} steps, FedAvg weights in all three, seed 0"),
                 columns=["variant", "MB sent", "acc, last fifth", "final acc"], rows=rows, checks=checks,
                 verdict=verdict, reason=reason, measured=measured, plot=plot.name, runs="runs",
                 wall_time_s=time.perf_counter() - started,
                 notes=[*QUICK_NOTE * scale.quick,
                        "Only the paper's abstract was available; its equations were not, so the rule reproduced "
                        "is gradwire's derivation (docs/adaptive_compression.md). One seed."])


def _plot(res, bits, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, r in res.items():
        axes[0].plot([x["bytes_sent"] / 1e6 for x in r.metrics], [x["test_acc"] for x in r.metrics], label=name)
    axes[0].set(xlabel="MB sent", ylabel="test accuracy")
    axes[0].legend(fontsize=8)
    w = max(1, len(bits) // 20)
    smooth = [sum(bits[i:i + w]) / w for i in range(0, len(bits) - w + 1)]
    axes[1].plot(range(w, len(bits) + 1), smooth)
    axes[1].set(xlabel="step", ylabel=f"mean bits per symbol ({w}-step mean)", title=BOUND)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("Yan et al. 2021: DQ-SGD against fixed levels")
    return save_figure(fig, path)
