"""DIANA's p-norm quantization: the l2 against the l-infinity norm, and the block size
(Mishchenko et al. 2019, the pquant compressor of ``compress/pquant.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from gradwire.config import RunConfig
from gradwire.reproduce.claim import Check, Claim, Scale, first_reaching, fmt, judge_checks, variants
from gradwire.reproduce.diana_exact import CITATION, _plot

NAME = "diana-norms"
TITLE = "DIANA: l-infinity beats l2 quantization, and smaller blocks converge in fewer steps"
STATEMENT = ("DIANA's quantizer sends, per block, one norm and a ternary symbol per element. Its variance "
             "factor is 1/alpha_p(B) - 1 with alpha_2(B) = 1/sqrt(B) and alpha_inf(B) = 2/(1 + sqrt(B)), so the "
             "l-infinity norm quantizes with less noise than the l2 norm and converges in fewer iterations for "
             "the same bits; splitting the vector into smaller blocks lowers the variance further (fewer "
             "iterations) at the cost of one more norm per block.")
TASK = "synthetic-logreg:samples=400,dim=100,l2=0.1,l1=0.001,hetero=2.0"
EPS = 1e-8             # "converged": |f - f*| <= EPS at an evaluation
BLOCKS = (5, 20, 100)  # 100 = the whole vector in one block
NORMS = ("2", "inf")


def label(p: str, block: int) -> str:
    return f"p={p}, block={block}"


def judge(m: dict) -> list[Check]:
    """``m["steps_to_eps"]``: per ``label(p, block)`` the first evaluated step with |f - f*| <= EPS
    (None if never); ``m["blocks"]``: the block sizes run (default ``BLOCKS``), smallest first;
    ``m["bytes_per_step"]`` (where given): each variant's, the fairness precondition."""
    s, blocks = m["steps_to_eps"], tuple(m.get("blocks", BLOCKS))

    def le(a, b):  # reached, and no later than b (which may never have)
        return a is not None and (b is None or a <= b)

    def lt(a, b):
        return a is not None and (b is None or a < b)

    whole = blocks[-1]
    fair = []
    if "bytes_per_step" in m:  # "fewer steps" is "fewer bytes" only if each pair sends the same per step
        per = m["bytes_per_step"]
        fair = [Check("l2 and l-inf send the same bytes per step at every block size",
                      all(per[label("inf", b)] == per[label("2", b)] for b in blocks),
                      "; ".join(f"block {b}: {fmt(per[label('inf', b)])} and {fmt(per[label('2', b)])}"
                                for b in blocks),
                      "the two wire formats differ", precondition=True)]
    checks = fair + [Check(f"for every block size, l-inf reaches {EPS:g} in no more steps than l2",
                    all(le(s[label("inf", b)], s[label("2", b)]) for b in blocks),
                    "; ".join(f"block {b}: l-inf {fmt(s[label('inf', b)])}, l2 {fmt(s[label('2', b)])}"
                              for b in blocks),
                    "at some block size l2 converged faster"),
              Check(f"with the whole vector in one block ({whole}), l-inf takes strictly fewer steps than l2",
                    lt(s[label("inf", whole)], s[label("2", whole)]),
                    f"l-inf {fmt(s[label('inf', whole)])}, l2 {fmt(s[label('2', whole)])}",
                    "the two norms' variance differs too little here to show in steps")]
    for p in NORMS:
        counts = [s[label(p, b)] for b in blocks]
        checks.append(Check(f"l{p}: smaller blocks reach {EPS:g} in fewer steps (no more at each size, strictly "
                            f"fewer from {whole} to {blocks[0]})",
                            all(le(x, y) for x, y in zip(counts, counts[1:])) and lt(counts[0], counts[-1]),
                            "blocks " + ", ".join(map(str, blocks)) + ": " + ", ".join(fmt(x) for x in counts)
                            + " steps",
                            "the variance of one block is already low enough that the step size, not the "
                            "quantization, limits the rate (gamma*mu = 0.05 per step here), so smaller blocks only "
                            "cost bytes"))
    return checks


def run(out: Path, scale: Scale) -> Claim:
    started = time.perf_counter()
    steps = scale.pick(250, 600)
    common = RunConfig(task=TASK, workers=4, algorithm="diana", batch_size="full", dtype="float64", lr=0.5,
                       steps=steps, eval_every=5, seed=0)
    blocks = scale.pick((BLOCKS[0], BLOCKS[-1]), BLOCKS)  # --quick: the smallest block and the whole vector
    specs = {label(p, b): {"compressor": f"pquant:p={p},block={b}"} for b in blocks for p in NORMS}
    res = variants(out / "runs", common, specs, "DIANA: quantization norm and block size", report=not scale.quick)
    to_eps = {k: first_reaching([x | {"neg": -abs(x["suboptimality"])} for x in r.metrics], "neg", -EPS, "step")
              for k, r in res.items()}
    bytes_to_eps = {k: (None if to_eps[k] is None else
                        next(x["bytes_sent"] for x in r.metrics if x["step"] == to_eps[k]) / 1e6)
                    for k, r in res.items()}
    measured = {"blocks": list(blocks), "steps_to_eps": to_eps, "mb_to_eps": bytes_to_eps, "steps": steps,
                "final": {k: abs(r.final["suboptimality"]) for k, r in res.items()},
                "bytes_per_step": {k: r.summary["bytes_sent"] / steps for k, r in res.items()}}
    checks = judge(measured)
    verdict, reason = judge_checks(checks)
    rows = [[k, fmt(to_eps[k]), fmt(bytes_to_eps[k]), fmt(measured["bytes_per_step"][k]), fmt(measured["final"][k])]
            for k in res]
    plot = _plot(res, out / f"{NAME}.png", "Mishchenko et al. 2019: DIANA, l2 vs l-inf and block size")
    return Claim(NAME, TITLE, CITATION, STATEMENT,
                 setup=(f"`{TASK}` on 4 heterogeneous workers, DIANA, full local gradients, float64, step 0.5, "
                        f"{steps} steps, evaluated every 5, seed 0; `pquant:p=P,block=B` for P in l2, l-inf and "
                        f"B in {blocks}"),
                 columns=["quantizer", f"steps to {EPS:g}", f"MB to {EPS:g}", "bytes per step", "final |f - f*|"],
                 rows=rows, checks=checks, verdict=verdict, reason=reason, measured=measured, plot=plot.name,
                 runs="runs", wall_time_s=time.perf_counter() - started,
                 notes=["l2 and l-inf send the same bytes (same wire format), so fewer steps is also fewer bytes; "
                        "a smaller block costs one float32 norm more per block."])
