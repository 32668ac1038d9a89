"""What ``gradwire plan`` leaves: plan.json (everything), plan.md (the tables) and plan.png (time to
target, or the objective within the deadline, against m: a predicted line per candidate, measured
points on it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _f(v, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        if math.isinf(v):
            return "never"
        return f"{v:.{digits}g}"
    return str(v)


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:+.1f}%"


def prediction_table(plan: dict) -> list[str]:
    goal_target = plan["goal"]["target"] is not None
    head = (["candidate", "m", "s/iteration", "iterations to target", "time to target (s)", "notes"] if goal_target
            else ["candidate", "m", "s/iteration", "iterations in deadline", f"predicted {plan['goal']['metric']}",
                  "notes"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best = plan["recommendation"]
    for r in plan["predictions"]:
        mark = []
        if r["candidate"] == best["candidate"] and r["workers"] == best["workers"]:
            mark.append("**recommended**")
        if r["profiled"]:
            measured = r.get("measured_iterations")
            mark.append(f"profiled (reached it in {_f(measured, 5)})" if measured is not None else "profiled")
        if r["extrapolated"]:
            mark.append("extrapolated >10x the profiled steps")
        if r.get("note"):
            mark.append(r["note"])
        last = r["time_s"] if goal_target else r["objective"]
        never = "never" if goal_target else "–"  # plan.json holds an unreachable target as null
        lines.append(f"| {r['candidate']} | {r['workers']} | {_f(r['seconds_per_iteration'])} | "
                     f"{_f(r['iterations'], 5) if r['iterations'] is not None else never} | "
                     f"{_f(last) if last is not None else never} | {', '.join(mark)} |")
    return lines


def validation_table(plan: dict) -> list[str]:
    rows = plan.get("validation") or []
    if not rows:
        return []
    target = plan["goal"]["target"] is not None
    head = ["candidate", "m", "s/iter predicted", "s/iter measured", "error"]
    head += (["time to target predicted", "measured", "error"] if target else
             ["objective predicted", "measured", "error"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in rows:
        cells = [v["candidate"], v["workers"], _f(v["predicted_seconds_per_iteration"]),
                 _f(v["measured_seconds_per_iteration"]), _pct(v["error_seconds_per_iteration"])]
        if target:
            cells += [_f(v["predicted_time_s"]), _f(v["measured_time_s"]) if v["measured_time_s"] is not None
                      else f"not reached in {v['steps_run']} steps", _pct(v["error_time"])]
        else:
            cells += [_f(v["predicted_objective"]), _f(v["measured_objective"]), _pct(v["error_objective"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    s = plan["validation_summary"]
    lines += ["", f"Mean absolute error, time per iteration: {_pct(s['mean_abs_error_seconds_per_iteration'])}; "
              + (f"time to target: {_pct(s.get('mean_abs_error_time'))}" if target
                 else f"objective: {_pct(s.get('mean_abs_error_objective'))}") + "."]
    if s.get("regret") is not None:
        lines.append(f"The recommendation measured {_f(s['recommended_measured_time_s'])} s against the best "
                     f"measured {_f(s['best_measured']['time_s'])} s ({s['best_measured']['candidate']} at "
                     f"m={s['best_measured']['workers']}): {_pct(s['regret'])}.")
    return lines


def recommendation_lines(plan: dict) -> list[str]:
    """The recommendation with its measured error (the validation runs'), and the planner's warning
    when that error is beyond its target or unknown."""
    g, r = plan["goal"], plan["recommendation"]
    what = (f"{_f(r['time_s'])} s to the target" if g["target"] is not None
            else f"{g['metric']} {_f(r['objective'])} within the deadline")
    error = r.get("measured_error")
    measured = f"; measured error of this prediction {_pct(error)}" if error is not None else ""
    lines = [f"recommended: {r['candidate']} on {r['workers']} workers ({what}, {plan['time_kind']}{measured})"]
    if r.get("warning"):
        lines.append(f"warning: {r['warning']}")
    return lines


def write_markdown(out: Path, plan: dict) -> Path:
    g = plan["goal"]
    goal = (f"reach {g['metric']} <= {g['target']:g}" if g["target"] is not None
            else f"lowest {g['metric']} within {g['deadline_s']:g} s")
    r = plan["recommendation"]
    rec = (f"**{r['candidate']} on {r['workers']} workers**: "
           + (f"{_f(r['time_s'])} s to the target ({_f(r['iterations'], 5)} iterations of "
              f"{_f(r['seconds_per_iteration'])} s)" if g["target"] is not None
              else f"{g['metric']} {_f(r['objective'])} after {_f(r['iterations'], 5)} iterations"))
    error = r.get("measured_error")
    rec += f" (measured error of this prediction: {_pct(error)})" if error is not None else ""
    warning = [f"**Warning:** {r['warning']}.", ""] if r.get("warning") else []
    lines = [f"# Plan: {goal}", "", f"Time is {plan['time_kind']}. Recommended: {rec}.", "", *warning,
             "## Fitted models", "",
             "| candidate | system model (Ernest) | fit error | convergence model | fit error |",
             "|---|---|---|---|---|"]
    for label, f in plan["fits"].items():
        if "error" in f:
            lines.append(f"| {label} | not fitted: {f['error']} | | | |")
            continue
        rms_system, rms_conv = f["system"]["fit_rms_relative_error"], f["convergence"]["fit_rms_relative_error"]
        lines.append(f"| {label} | {f['system']['formula']} | {100 * rms_system:.1f}% rms | "
                     f"{f['convergence']['formula']} | {100 * rms_conv:.1f}% rms |")
    lines += ["", "## Predictions", "", *prediction_table(plan), "", f"![plan]({plan['files']['plot']})", ""]
    val = validation_table(plan)
    if val:
        lines += ["## Validation on held-out worker counts", "", *val, ""]
    p = plan["profiling"]
    lines += ["## Profiling runs", "", f"{p['runs']} runs, {p['wall_s']:.1f} s wall"
              + (f" (budget {p['budget_s']:g} s wall)" if p["budget_s"] else "")
              + f", worker counts {p['design']}.", "",
              "| candidate | m | purpose | steps | status | s/iteration | wall (s) | folder |",
              "|---|---|---|---|---|---|---|---|"]
    for m in plan["runs"]:
        lines.append(f"| {m['candidate']} | {m['workers']} | {m['purpose']} | {m['steps']} | {m['status']} | "
                     f"{_f(m['seconds_per_iteration'])} | {m['wall_time_s']:.1f} | {m['folder']} |")
    path = out / "plan.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_plan(out: Path, plan: dict) -> Path:
    target = plan["goal"]["target"] is not None
    key = "time_s" if target else "objective"
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, label in enumerate(plan["fits"]):
        color = f"C{i}"
        pts = [(r["workers"], r[key]) for r in plan["predictions"] if r["candidate"] == label
               and r[key] is not None]
        if pts:
            ax.plot(*zip(*pts), color=color, label=f"{label} (predicted)")
        meas = [(v["workers"], v["measured_time_s" if target else "measured_objective"])
                for v in plan.get("validation") or [] if v["candidate"] == label]
        if target:
            meas += [(m["workers"], m["time_to_target_s"]) for m in plan["runs"]
                     if m["candidate"] == label and m["purpose"] == "profile"]
        meas = [(m, y) for m, y in meas if y is not None]
        if meas:
            ax.plot(*zip(*meas), "o", color=color, markerfacecolor="none" if not target else color)
    r = plan["recommendation"]
    ax.plot([r["workers"]], [r[key]], "*", color="black", markersize=14, label="recommended")
    ax.plot([], [], "o", color="gray", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers m")
    ax.set_ylabel(f"time to {plan['goal']['metric']} <= {plan['goal']['target']:g} ({plan['time_kind']})"
                  if target else f"{plan['goal']['metric']} after {plan['goal']['deadline_s']:g} s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "plan.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plan(out: Path, plan: dict) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    plan["files"] = {"json": "plan.json", "markdown": "plan.md", "plot": "plan.png"}
    png = plot_plan(out, plan)
    md = write_markdown(out, plan)
    path = out / "plan.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan, indent=2, default=lambda v: None))
    tmp.replace(path)
    return {"json": path, "markdown": md, "plot": png}
