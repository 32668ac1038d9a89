"""LSGD against EASGD on the symmetric double well: the curse of symmetry (Teng et al. 2019).
The problem and its simulation are ``reproduce/double_well.py``; this module runs it over seeds."""

from __future__ import annotations

import time
from pathlib import Path

from gradwire.reproduce.claim import Check, Claim, Scale, judge_checks

NAME = "lsgd-symmetry"
TITLE = "LSGD escapes the symmetric saddle where EASGD's center is trapped"
CITATION = ("Y. Teng, W. Gao, F. Chalus, A. Choromanska, D. Goldfarb, A. Weller 2019, \"Leader Stochastic "
            "Gradient Descent for Distributed Training of Deep Learning Models\", NeurIPS 2019")
STATEMENT = ("On a symmetric landscape with workers spread over two equivalent minima, averaging-based "
             "coupling (EASGD's center variable) is pulled to the symmetric point between them, a saddle, and "
             "stays there (the curse of symmetry); LSGD pulls every worker towards the current best worker, "
             "so all of them end in one minimum.")
MINIMUM, SADDLE = 0.1, 0.5   # f < 0.1: in a well (f = 0 at the minima); f > 0.5: at the saddle (f = 1 there)
SHARE = 0.75                 # the share of seeds in which each must happen


def judge(m: dict) -> list[Check]:
    """``m["lsgd_f"]``, ``m["easgd_f"]``: f at each seed's evaluated point (LSGD's average, EASGD's center)."""
    n = len(m["lsgd_f"])
    in_well = sum(v < MINIMUM for v in m["lsgd_f"])
    at_saddle = sum(v > SADDLE for v in m["easgd_f"])
    return [Check(f"LSGD ends in a minimum (f < {MINIMUM}) in >= {SHARE:.0%} of seeds", in_well >= SHARE * n,
                  f"{in_well} of {n} seeds; f = " + ", ".join(f"{v:.3f}" for v in m["lsgd_f"]),
                  "the pull towards the leader is too weak for this noise"),
            Check(f"EASGD's center stays at the saddle (f > {SADDLE}) in >= {SHARE:.0%} of seeds",
                  at_saddle >= SHARE * n,
                  f"{at_saddle} of {n} seeds; f = " + ", ".join(f"{v:.3f}" for v in m["easgd_f"]),
                  "the elastic coupling drew the workers into one well, so the center followed")]


def run(out: Path, scale: Scale) -> Claim:
    from gradwire.reproduce import double_well  # here, so `python -m gradwire.reproduce.double_well` runs clean

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(scale.pick(4, 8)))
    runs = {spec: [double_well.simulate(spec, seed=s) for s in seeds]
            for spec in (double_well.LSGD_SPEC, double_well.EASGD_SPEC)}
    lsgd_f, easgd_f = ([double_well.f(alg.eval_params()) for alg, _ in runs[spec]]
                       for spec in (double_well.LSGD_SPEC, double_well.EASGD_SPEC))
    measured = {"seeds": seeds, "lsgd_f": lsgd_f, "easgd_f": easgd_f}
    checks = judge(measured)
    verdict, reason = judge_checks(checks)
    path = out / f"{NAME}.png"
    double_well.plot(str(path), double_well.LSGD_SPEC, double_well.EASGD_SPEC, seed=seeds[0],
                     runs={spec: r[0] for spec, r in runs.items()})
    rows = [[s, f"{a:.4f}", f"{b:.4f}"] for s, a, b in zip(seeds, lsgd_f, easgd_f)]
    return Claim(NAME, TITLE, CITATION, STATEMENT,
                 setup=(f"f(x) = (x1^2 - 1)^2 + x2^2, {double_well.WORKERS} workers, half started at x1 = "
                        f"+{double_well.START} and half at -{double_well.START}, noisy gradients (sigma 0.5), "
                        f"lr 0.05, 300 steps, `{double_well.LSGD_SPEC}` (the workers' average evaluated) against "
                        f"`{double_well.EASGD_SPEC}` (its center evaluated), seeds {seeds[0]}..{seeds[-1]}"),
                 columns=["seed", "LSGD: f at the average", "EASGD: f at the center"], rows=rows, checks=checks,
                 verdict=verdict, reason=reason, measured=measured, plot=path.name,
                 wall_time_s=time.perf_counter() - started,
                 notes=["It depends on the coupling: with tau = 1 EASGD's workers end in one well and its center "
                        "with them (docs/leader_sgd.md)."])
