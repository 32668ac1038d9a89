"""``gradwire plan``: profile candidates at a few small m, fit both models, predict, recommend.

For each candidate (an algorithm with its compressor and flags, a RunConfig without ``workers``)
the planner runs short profiling runs at the worker counts the design chooses (design.py), fits
Ernest's system model f(m) to their seconds per iteration (system_model.py) and the convergence
model g(i, m) to their evaluated objective (convergence.py), then predicts for every m up to
``max_workers`` (from the smallest profiled count up: the models are not extrapolated below it)

    time to target(m) = f(m) · min{i : g(i, m) <= target}      (Hemingway, Pan et al. 2017)

or, with a deadline D, the objective g(D / f(m), m) reached in D seconds, and recommends the
(candidate, m) with the least time (or the lowest objective). ``validate`` runs held-out m (never
used in a fit) and the recommendation, and compares predicted with measured figures.

Runs go through ``gradwire.run.loop.run`` in this process (as ``gradwire compare`` does) on the
simulator and the threads backend; with ``backend: torch`` each run is a ``gradwire launch``
process group (m processes, one more for a server-mode algorithm). Time is the run's
``sim_time_s``: simulated seconds on the simulator, elapsed seconds on a real backend.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gradwire.config import KEYS, RunConfig
from gradwire.errors import ConfigError, DivergenceError
from gradwire.plan.convergence import ConvergenceModel, crossing
from gradwire.plan.design import RunCost, choose_workers, steps_wall
from gradwire.plan.system_model import SystemModel, distinct_enough, log2_grid
from gradwire.report.run_folder import read_json_or_empty, read_jsonl
from gradwire.run.combination import TooFewWorkers, check_combination

METRICS = ("train_loss", "suboptimality")
EXTRAPOLATED = 10.0  # predicted iterations beyond this many times the profiled steps are flagged


@dataclass
class PlanRequest:
    candidates: list[RunConfig]       # one per candidate; ``workers`` is set per run
    workers: list[int]                # worker counts the design may profile
    max_workers: int                  # predict for m up to this
    out: Path
    target: float | None = None       # objective to reach (``metric``), or
    deadline_s: float | None = None   # seconds available (simulated on sim)
    metric: str = "train_loss"        # train_loss, or suboptimality where the task knows f*
    budget_s: float | None = None     # wall-clock seconds for all profiling runs (None = run every m)
    validate: list[int] = field(default_factory=list)  # held-out m to measure (never fitted)
    validate_max_steps: int = 0       # longest validation run (0 = 20 x the profiling steps)
    work: float = 1.0                 # s of Ernest's θ1·s/m term
    fit_from: float = 0.5             # fit g(i, m) on evaluations at i >= this fraction of each run's steps

    def check(self) -> PlanRequest:
        if (self.target is None) == (self.deadline_s is None):
            raise ConfigError("plan needs exactly one goal: --target-loss X (time to reach X) or --deadline S "
                              "(best objective within S seconds)")
        if self.metric not in METRICS:
            raise ConfigError(f"metric={self.metric!r}: valid choices are {', '.join(METRICS)} (--metric)")
        if self.deadline_s is not None and not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ConfigError(f"deadline={self.deadline_s} must be a finite number of seconds > 0 (--deadline)")
        if self.target is not None and not math.isfinite(self.target):
            raise ConfigError(f"target-loss={self.target} must be a finite number (--target-loss)")
        if self.target is not None and self.target < 0:  # both metrics are >= 0: found only after profiling
            raise ConfigError(f"target-loss={self.target:g}: {self.metric} is never below 0, so no run reaches it; "
                              "give a target above the losses the runs start from (--target-loss)")
        if not (math.isfinite(self.work) and self.work > 0):
            raise ConfigError(f"work={self.work}: s of Ernest's θ1·s/m term must be a finite number > 0 (--work)")
        if not 0 <= self.fit_from < 1:
            raise ConfigError(f"fit-from={self.fit_from} must be in [0, 1): the fraction of each profiling run "
                              "left out of the convergence fit (--fit-from)")
        if any(m < 1 for m in self.workers):
            raise ConfigError(f"workers={self.workers}: every worker count must be >= 1 (--workers)")
        if not distinct_enough(self.workers):
            raise ConfigError(f"workers={','.join(map(str, self.workers))} gives {len(set(self.workers))} distinct "
                              "worker count(s); the system model (4 terms) needs at least 3, e.g. --workers 1,2,4,8")
        if self.max_workers < max(self.workers):
            raise ConfigError(f"max-workers={self.max_workers} is below the largest profiled count "
                              f"{max(self.workers)} (--max-workers)")
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise ConfigError(f"budget={self.budget_s} must be a finite number of seconds > 0; without --budget "
                              "every --workers count is profiled (--budget)")
        both = sorted(set(self.validate) & set(self.workers))
        if both:
            raise ConfigError(f"validate={self.validate}: {both} also profiled; held-out worker counts must not be "
                              f"in --workers {','.join(map(str, self.workers))}")
        if any(m < 1 or m > self.max_workers for m in self.validate):
            raise ConfigError(f"validate={self.validate}: held-out worker counts must be in 1..{self.max_workers} "
                              "(--max-workers)")
        labels = [c.label() for c in self.candidates]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ConfigError(f"candidates share the label(s) {dupes}; give each --candidate a distinct --name")
        for c in self.candidates:
            closed = None  # the refusal at a profiled m that is not open to the candidate
            for m in sorted(set(self.workers) | set(self.validate)):
                try:
                    check_combination(c.replace(workers=m))
                except TooFewWorkers as e:  # (sync:backups=2 at m <= 2) not open to it: refused when measured
                    if m in self.workers and closed is None:
                        closed = e
                    continue
                except ConfigError as e:
                    raise ConfigError(f"candidate {c.label()!r} at {m} workers: {e}") from None
            if closed is not None and all(_too_few(c, m) for m in self.workers):  # before any candidate runs
                raise ConfigError(f"candidate {c.label()!r} runs at none of --workers "
                                  f"{','.join(map(str, self.workers))}: {closed}")
        if self.metric == "suboptimality":  # known only to tasks that know f*: ask them before any run
            from gradwire.tasks.base import build_task

            for c in {c.task: c for c in reversed(self.candidates)}.values():  # each task once (its first)
                if build_task(c.task, num_workers=min(self.workers), seed=c.seed, data_dir=c.data_dir).f_star is None:
                    raise ConfigError(f"metric='suboptimality': task {c.task!r} does not know its optimum f* "
                                      "(the synthetic tasks do); use --metric train_loss (--metric)")
        return self


def _too_few(cfg: RunConfig, workers: int) -> bool:
    """Whether ``cfg``'s algorithm needs more than ``workers`` workers (TooFewWorkers)."""
    try:
        check_combination(cfg.replace(workers=workers))
    except TooFewWorkers:
        return True
    return False


@dataclass
class Measurement:
    """What one run measured."""

    candidate: str
    workers: int
    steps: int
    status: str
    seconds_per_iteration: float | None
    sim_time_s: float
    wall_time_s: float
    purpose: str                       # profile, validate
    folder: str
    points: list[tuple[int, float]]    # (step, objective) of each evaluation
    reached: tuple[float, float] | None = None  # (iterations, seconds) to the target, interpolated
    final: float | None = None         # objective at the last evaluation
    at_deadline: float | None = None   # objective at the last evaluation within --deadline (time <= D)
    covers_deadline: bool = False      # whether the run's clock reached --deadline (else at_deadline is early)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "points"} | {"evaluations": len(self.points)}


def seconds_per_step(steps: list[dict], evaluated: set[int]) -> float | None:
    """Mean time of the steps that follow no evaluation, from steps.jsonl (``sim_time_s`` after
    each step): on a real backend rank 0 evaluates between step k and k+1, and the others wait, so
    step k+1's interval holds the evaluation; the simulator leaves evaluations off its clock."""
    deltas = [b["sim_time_s"] - a["sim_time_s"] for a, b in zip(steps, steps[1:])
              if b["step"] == a["step"] + 1 and a["step"] not in evaluated]
    return sum(deltas) / len(deltas) if deltas else None


def ran_otherwise(folder: Path, cfg: RunConfig, free: tuple[str, ...] = ()) -> str | None:
    """How the run in ``folder`` (its config.json) differs from ``cfg`` resolved as a run resolves it
    (the algorithm's --lr filled in), keys in ``free`` aside: the first key that differs, as
    ``steps=100 (this plan: 10)``; None where the run is ``cfg``'s."""
    from gradwire.run.combination import resolved

    ran = read_json_or_empty(folder / "config.json")
    for key, value in resolved(cfg).to_dict().items():
        if key not in free and ran.get(key) != value:
            return f"{key}={ran.get(key)!r} (this plan: {value!r})"
    return None


def _figures(seconds: float) -> str:
    """``seconds`` to two significant digits in plain notation (0.0031, 0.42, 7.5, 130): a budget
    of milliseconds is not shown as 0."""
    return f"{float(f'{seconds:.2g}'):g}"


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_")[:80] or "run"


def run_folder(out: Path, purpose: str, label: str, workers: int) -> Path:
    """The folder of candidate ``label``'s ``purpose`` run (profile, validate) at ``workers`` workers
    in the plan folder ``out``: OUT/<purpose>/<label as a folder name>/m<workers>."""
    return Path(out) / purpose / _slug(label) / f"m{workers}"


def _torch_argv(cfg: RunConfig) -> list[str]:
    """``gradwire launch`` for one run: m processes (one more for a server-mode algorithm)."""
    server = check_combination(cfg).needs_server
    flags: list[str] = []
    for key, value in cfg.to_dict().items():
        if key in ("workers", "backend") or value == KEYS[key].default:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return [sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", str(cfg.processes(server)), "--",
            "run", *flags]


class Planner:
    def __init__(self, request: PlanRequest, *, log=print):
        self.req = request.check()
        self.log = log
        self.runs: list[Measurement] = []
        self.spent_s = 0.0
        self.count = 0

    # -- running ---------------------------------------------------------------------------------------------
    def measure(self, cfg: RunConfig, purpose: str) -> Measurement:
        """Run ``cfg`` (its folder under OUT/<purpose>/<candidate>/m<M>) and read what it measured."""
        from gradwire.run.loop import run

        self.count += 1
        self.log(f"[{self.count}] {purpose} {cfg.label()} at m={cfg.workers}: {cfg.steps} steps", flush=True)
        started = time.perf_counter()
        try:
            if (Path(cfg.out) / "summary.json").exists():
                (Path(cfg.out) / "summary.json").unlink()  # an earlier plan's: never read as this run's
            if cfg.backend == "torch":
                timeout = max(600.0, (self.req.budget_s or 0) * 2)
                proc = subprocess.run(_torch_argv(cfg), timeout=timeout, env=os.environ | {"PYTHONUNBUFFERED": "1"})
                if proc.returncode not in (0, 3):  # 3: diverged, with its summary written
                    raise ConfigError(f"gradwire launch of {cfg.label()!r} at {cfg.workers} workers exited "
                                      f"{proc.returncode} (see {cfg.out})")
            else:
                run(cfg)
        except DivergenceError as e:
            self.log(f"  diverged: {e}", flush=True)
        except ConfigError as e:  # e.g. sync:backups=2 on 2 workers: this m is not open to the candidate
            if not (Path(cfg.out) / "summary.json").exists():
                self.log(f"  refused: {e}", flush=True)
                m = Measurement(cfg.label(), cfg.workers, 0, f"refused: {e}", None, 0.0,
                                time.perf_counter() - started, purpose, str(cfg.out), [])
                self.runs.append(m)
                return m
            raise
        wall = time.perf_counter() - started
        if purpose == "profile":
            self.spent_s += wall
        m = self.read(cfg, purpose, wall)
        self.runs.append(m)
        shown = f"{m.seconds_per_iteration:.4g} s/iteration" if m.seconds_per_iteration else "no time per iteration"
        hit = (f", target reached after {m.reached[0]:.0f} iterations ({m.reached[1]:.4g} s)" if m.reached
               else "")
        self.log(f"  {m.status}: {shown}, {self.req.metric}={m.final if m.final is None else round(m.final, 5)}"
                 f"{hit}, {wall:.1f} s wall", flush=True)
        return m

    def read(self, cfg: RunConfig, purpose: str, wall: float | None = None) -> Measurement:
        """What the run in ``cfg.out`` measured (its summary.json and metrics.jsonl)."""
        summary = json.loads((Path(cfg.out) / "summary.json").read_text())
        records = read_jsonl(Path(cfg.out) / "metrics.jsonl")
        metric = self.req.metric
        if records and metric not in records[0]:
            raise ConfigError(f"metric={metric!r}: task {cfg.task!r} does not report it (it reports "
                              f"{', '.join(k for k in METRICS if k in records[0])}) (--metric)")
        points = [(int(r["step"]), float(r[metric])) for r in records
                  if r.get(metric) is not None and math.isfinite(r[metric])]
        # a run stopped by a signal (SIGTERM) measured its steps all the same
        ok = summary["status"] in ("finished", "stopped") and summary["steps"] > 0
        spi = summary["sim_time_s"] / summary["steps"] if ok else None
        if ok and cfg.backend != "sim":  # rank 0's evaluations are inside a real run's elapsed time
            spi = seconds_per_step(read_jsonl(Path(cfg.out) / "steps.jsonl"), {int(r["step"]) for r in records}) or spi
        reached = crossing(records, self.req.target, metric) if self.req.target is not None else None
        at_deadline, covers = None, False
        if self.req.deadline_s is not None:  # the objective the run had reached when D seconds had passed
            within = [float(r[metric]) for r in records if r.get(metric) is not None and math.isfinite(r[metric])
                      and r["sim_time_s"] <= self.req.deadline_s]
            at_deadline = within[-1] if within else None
            covers = summary["sim_time_s"] >= self.req.deadline_s
        return Measurement(cfg.label(), cfg.workers, summary["steps"], summary["status"], spi, summary["sim_time_s"],
                           summary["wall_time_s"] if wall is None else wall, purpose, str(cfg.out), points, reached,
                           points[-1][1] if points else None, at_deadline, covers)

    def load(self) -> None:
        """Read the runs an earlier plan left in OUT instead of running them: those whose config.json
        records the run this plan would make in their folder (a run of the same candidate's label with
        another task, --steps or any other setting measured something else, and is left out)."""
        for purpose in ("profile", "validate"):
            per_run = ("steps", "eval_every") if purpose == "validate" else ()  # a validation run's own length
            for cand in self.req.candidates:
                folder = self.req.out / purpose / _slug(cand.label())
                for sub in sorted(folder.glob("m*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else 0):
                    if sub.name[1:].isdigit() and (sub / "summary.json").exists():
                        cfg = self.config(cand, int(sub.name[1:]), purpose)
                        other = ran_otherwise(sub, cfg, per_run)
                        if other is not None:
                            self.log(f"not reused: {sub} ran {other}", flush=True)
                            continue
                        self.runs.append(self.read(cfg, purpose))
                        if purpose == "profile":
                            self.spent_s += self.runs[-1].wall_time_s

    def config(self, cand: RunConfig, m: int, purpose: str, steps: int | None = None) -> RunConfig:
        steps = steps or cand.steps
        # ~15 evaluations for the convergence fit; ~40 for a validation run's crossing of the target
        every = max(1, steps // 40) if purpose == "validate" else max(1, steps // 15)
        return cand.replace(workers=m, steps=steps, eval_every=every, overwrite=True, resume=False,
                            out=str(run_folder(self.req.out, purpose, cand.label(), m)))

    def profile(self) -> None:
        """The pilot (smallest m) of every candidate, then the design's choice for all candidates."""
        req = self.req
        pilot = min(req.workers)
        costs = {}
        for cand in req.candidates:  # the pilot: the smallest m the candidate runs at
            for w in sorted(set(req.workers)):
                m = self.measure(self.config(cand, w, "profile"), "profile")
                if not m.status.startswith("refused"):
                    break
            if m.status.startswith("refused"):
                raise ConfigError(f"candidate {cand.label()!r} runs at none of --workers "
                                  f"{','.join(map(str, req.workers))}: {m.status}")
            records = read_jsonl(Path(m.folder) / "metrics.jsonl")
            costs[cand.label()] = RunCost.from_pilot(m.wall_time_s, steps_wall(records), m.workers, max(m.steps, 1))

        def cost(w: int) -> float:  # every candidate is profiled at the same m
            return sum(costs[c.label()](w, c.steps) for c in req.candidates)

        order = choose_workers(req.workers, cost, req.budget_s, [pilot], self.spent_s, req.work)
        if not distinct_enough([pilot, *order]):
            cheapest = sorted((cost(w), w) for w in req.workers if w != pilot)[:2]
            need = self.spent_s + sum(c for c, _ in cheapest)
            raise ConfigError(f"budget={req.budget_s:g} s affords {len(order) + 1} distinct worker count(s) "
                              f"(the pilot at m={pilot} took {_figures(self.spent_s)} s); the system model needs 3: "
                              f"raise --budget to about {_figures(need)} s or lower --steps")
        self.log(f"profiling design: m = {', '.join(map(str, [pilot, *order]))}"
                 + (f" (within --budget {req.budget_s:g} s wall)" if req.budget_s else ""), flush=True)
        for w in order:
            for cand in req.candidates:
                if not any(r.candidate == cand.label() and r.workers == w for r in self.runs):
                    self.measure(self.config(cand, w, "profile"), "profile")

    # -- fitting and predicting ------------------------------------------------------------------------------
    def fit(self) -> dict[str, dict]:
        fits = {}
        for cand in self.req.candidates:
            label = cand.label()
            runs = [r for r in self.runs if r.candidate == label and r.purpose == "profile"]
            good = [r for r in runs if r.seconds_per_iteration]
            if not distinct_enough([r.workers for r in good]):
                bad = ", ".join(f"m={r.workers}: {r.status}" for r in runs if not r.seconds_per_iteration)
                fits[label] = {"error": f"too few finished profiling runs to fit ({bad or 'none'})"}
                continue
            system = SystemModel.fit([r.workers for r in good], [r.seconds_per_iteration for r in good],
                                     self.req.work)
            # the initial transient (the first fast drop from the random start) follows no power law:
            # g is fitted where the runs are in their asymptotic regime (docs/planning.md)
            pts = [(i, r.workers, v) for r in good for i, v in r.points if i >= max(1, self.req.fit_from * r.steps)]
            try:
                conv = ConvergenceModel.fit(*zip(*pts)) if pts else None
            except ValueError as e:
                fits[label] = {"error": str(e)}
                continue
            refused = [r.workers for r in runs if r.status.startswith("refused")]
            fits[label] = {"system": system, "convergence": conv, "profiled_steps": max(r.steps for r in good),
                           "smallest_workers": max(refused) + 1 if refused else 1}
        if all("error" in f for f in fits.values()):
            reasons = "; ".join(f"{k}: {v['error']}" for k, v in fits.items())
            raise ConfigError(f"no candidate could be fitted ({reasons})")
        return fits

    def predict(self, fits: dict[str, dict]) -> list[dict]:
        req = self.req
        grid = log2_grid(req.max_workers, [*req.workers, *req.validate])
        rows = []
        for label, fit in fits.items():
            if "error" in fit:
                continue
            system, conv = fit["system"], fit["convergence"]
            for m in (w for w in grid if w >= max(fit["smallest_workers"], min(req.workers))):
                spi = system(m)
                row = {"candidate": label, "workers": m, "seconds_per_iteration": spi,
                       "profiled": m in {r.workers for r in self.runs if r.candidate == label
                                         and r.purpose == "profile"}}
                if req.target is not None:
                    iters = conv.iterations_to(req.target, m)
                    row |= {"iterations": iters, "time_s": spi * iters,
                            "extrapolated": iters > EXTRAPOLATED * fit["profiled_steps"]}
                    hit = next((r.reached for r in self.runs if r.candidate == label and r.workers == m
                                and r.purpose == "profile" and r.reached is not None), None)
                    if hit is not None:  # the profiling run at this m reached the target: the fit's own check
                        row["measured_iterations"] = hit[0]
                else:
                    # the objective after the steps that end within D: floor(D / f(m)) of them (a step
                    # cut off by the deadline has not updated the model); none fits: no objective
                    iters = req.deadline_s / spi
                    done = math.floor(iters * (1 + 1e-12))
                    row |= {"iterations": iters, "steps_in_deadline": done,
                            "objective": float(conv.loss(done, m)) if done >= 1 else None,
                            "extrapolated": iters > EXTRAPOLATED * fit["profiled_steps"]}
                    if done < 1:
                        row["note"] = f"no step within the deadline (one takes {spi:.4g} s)"
                rows.append(row)
        return rows

    def recommend(self, rows: list[dict], fits: dict[str, dict]) -> dict:
        req = self.req
        if req.target is not None:
            finite = [r for r in rows if math.isfinite(r["time_s"])]
            if not finite:
                floors = sorted((f["convergence"].floor(req.max_workers), k) for k, f in fits.items()
                                if "error" not in f)
                lowest, who = floors[0]
                raise ConfigError(f"target-loss={req.target:g} is reached by no candidate at any m <= "
                                  f"{req.max_workers}: the lowest predicted {req.metric} floor is {lowest:.4g} "
                                  f"({who} at m={req.max_workers}); choose --target-loss above it")
            return min(finite, key=lambda r: (r["time_s"], r["workers"]))
        stepped = [r for r in rows if r["objective"] is not None]
        if not stepped:
            quickest = min(rows, key=lambda r: r["seconds_per_iteration"])
            raise ConfigError(f"deadline={req.deadline_s:g} s is shorter than one step of every candidate at every m "
                              f"(the quickest, {quickest['candidate']} at m={quickest['workers']}, is predicted to "
                              f"take {quickest['seconds_per_iteration']:.4g} s); give a longer --deadline")
        return min(stepped, key=lambda r: (r["objective"], r["workers"]))

    # -- validating ------------------------------------------------------------------------------------------
    def validate(self, rows: list[dict], best: dict) -> list[dict]:
        """Measure every candidate at each held-out m, and the recommendation; predicted vs measured."""
        req = self.req
        wanted = [(c, m) for m in req.validate for c in req.candidates]
        rec = next(c for c in req.candidates if c.label() == best["candidate"])
        if (rec, best["workers"]) not in wanted and not any(
                r.candidate == rec.label() and r.workers == best["workers"] for r in self.runs):
            wanted.append((rec, best["workers"]))
        cap = req.validate_max_steps or 20 * max(c.steps for c in req.candidates)
        out = []
        for cand, m in wanted:
            row = next((r for r in rows if r["candidate"] == cand.label() and r["workers"] == m), None)
            if row is None:
                continue
            meas = next((r for r in self.runs if r.purpose == "validate" and r.candidate == cand.label()
                         and r.workers == m), None)  # loaded from an earlier plan (Planner.load)
            if req.target is not None:
                want = row["iterations"] * 1.3 + 2 if math.isfinite(row["iterations"]) else cap
                steps = int(min(max(want, cand.steps), cap))
                if meas is None:
                    meas = self.measure(self.config(cand, m, "validate", steps), "validate")
            else:
                # scored at D seconds (the last evaluation at or before D), so the run needs to pass D and
                # no more: 1.3x the predicted steps + 2, not floored at --steps; where the prediction of
                # f(m) was too high and the run ended before D, it is rerun longer (to the cap)
                first = first_round(cand)  # (a run shorter than its first round is refused)
                steps = int(min(max(math.ceil(row["iterations"] * 1.3) + 2, first), cap))
                while meas is None or (not meas.covers_deadline and meas.seconds_per_iteration and meas.steps < cap
                                       and meas.purpose == "validate" and meas.status == "finished"):
                    if meas is not None:  # too short: as many steps as its own pace needs to pass D, +30 %
                        self.runs.remove(meas)
                        steps = int(min(max(math.ceil(req.deadline_s / meas.seconds_per_iteration * 1.3) + 2, first),
                                        cap))
                    meas = self.measure(self.config(cand, m, "validate", steps), "validate")
            out.append(self._compare(row, meas))
        return out

    def _compare(self, row: dict, meas: Measurement) -> dict:
        def err(pred, got):
            if pred is None or got is None or not math.isfinite(pred) or got == 0:
                return None
            return (pred - got) / got

        res = {"candidate": row["candidate"], "workers": row["workers"],
               "predicted_seconds_per_iteration": row["seconds_per_iteration"],
               "measured_seconds_per_iteration": meas.seconds_per_iteration,
               "error_seconds_per_iteration": err(row["seconds_per_iteration"], meas.seconds_per_iteration),
               "steps_run": meas.steps, "status": meas.status, "folder": meas.folder}
        if self.req.target is not None:
            got = meas.reached[1] if meas.reached else None
            res |= {"predicted_time_s": row["time_s"], "measured_time_s": got,
                    "error_time": err(row["time_s"], got),
                    "predicted_iterations": row["iterations"],
                    "measured_iterations": meas.reached[0] if meas.reached else None}
        else:
            got = meas.at_deadline if meas.covers_deadline else None  # a run that ended before D measured no D
            res |= {"predicted_objective": row["objective"], "measured_objective": got,
                    "error_objective": err(row["objective"], got)}
        return res

    def measured_best(self) -> dict | None:
        """The fastest measured (candidate, m) to the target over every run made (profiling and validation)."""
        hits = [r for r in self.runs if r.reached is not None]
        if not hits:
            return None
        best = min(hits, key=lambda r: r.reached[1])
        return {"candidate": best.candidate, "workers": best.workers, "time_s": best.reached[1],
                "purpose": best.purpose}


def _mean_abs(values) -> float | None:
    vals = [abs(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def make_plan(req: PlanRequest, *, log=print, reuse: bool = False) -> dict:
    """Profile, fit, predict, recommend (and validate); returns the plan (what plan.json holds).
    ``reuse``: read the runs an earlier plan left in ``req.out`` and make only the missing ones."""
    planner = Planner(req, log=log)
    if reuse:
        planner.load()
    else:
        planner.profile()
    fits = planner.fit()
    rows = planner.predict(fits)
    best = planner.recommend(rows, fits)
    validation = planner.validate(rows, best) if req.validate else []
    profile_runs = [r for r in planner.runs if r.purpose == "profile"]
    backends = {c.backend for c in req.candidates}
    plan = {
        "goal": {"target": req.target, "deadline_s": req.deadline_s, "metric": req.metric},
        "time_kind": "simulated seconds" if backends == {"sim"} else "elapsed seconds",
        "candidates": {c.label(): c.to_dict() for c in req.candidates},
        "max_workers": req.max_workers,
        "fits": {k: (v if "error" in v else {"system": v["system"].to_dict(), "convergence": v["convergence"].to_dict(),
                                             "profiled_steps": v["profiled_steps"],
                                             "smallest_workers": v["smallest_workers"]}) for k, v in fits.items()},
        "predictions": rows,
        "recommendation": best,
        "profiling": {"design": sorted({r.workers for r in profile_runs}), "wall_s": planner.spent_s,
                      "simulated_s": sum(r.sim_time_s for r in profile_runs), "budget_s": req.budget_s,
                      "budget_bounds": "wall-clock seconds of the profiling runs (validation runs not counted)",
                      "runs": len(profile_runs)},
        "runs": [r.to_dict() | {"time_to_target_s": r.reached[1] if r.reached else None} for r in planner.runs],
        "validation": validation,
    }
    if validation:
        summary = {"mean_abs_error_seconds_per_iteration": _mean_abs(v["error_seconds_per_iteration"]
                                                                      for v in validation)}
        if req.target is not None:
            summary["mean_abs_error_time"] = _mean_abs(v["error_time"] for v in validation)
            measured_best = planner.measured_best()
            rec = next((r for r in planner.runs if r.candidate == best["candidate"] and r.workers == best["workers"]
                        and r.reached is not None), None)
            summary["best_measured"] = measured_best
            summary["recommended_measured_time_s"] = rec.reached[1] if rec else None
            # (a target met at the first evaluation takes 0 s: no ratio to give)
            summary["regret"] = (rec.reached[1] / measured_best["time_s"] - 1
                                 if rec and measured_best and measured_best["time_s"] > 0 else None)
        else:
            summary["mean_abs_error_objective"] = _mean_abs(v["error_objective"] for v in validation)
        plan["validation_summary"] = summary
    plan["recommendation"] = best | trust(best, validation, req.target is not None)
    misfits = [(k, f["system"].residual_rel) for k, f in fits.items()
               if "error" not in f and f["system"].residual_rel > TARGET_ERROR]
    if misfits:  # Ernest's form does not hold on the profiled m: its predictions are no better than that
        said = ", ".join(f"{k} {100 * e:.0f}%" for k, e in misfits)
        note = (f"the system model misses its own profiling runs by {said} rms (beyond the planner's "
                f"{100 * TARGET_ERROR:.0f}% target): its time per iteration is not to be trusted; profile at more "
                "worker counts >= 2 (--workers)")
        plan["recommendation"]["system_fit_warning"] = note
        plan["recommendation"]["warning"] = "; ".join(w for w in (plan["recommendation"].get("warning"), note) if w)
    return _finite(plan)


# The planner aims to predict its goal (time to target, or the objective in the deadline) within 20 %
# of what is then measured (docs/planning.md: validation); beyond that a recommendation is a guess.
TARGET_ERROR = 0.20


def trust(best: dict, validation: list[dict], target: bool) -> dict:
    """How far to trust the recommendation, from the validation runs: the measured relative error of
    its own prediction (where it was validated), the largest over all held-out runs, and a warning
    when either exceeds TARGET_ERROR (or nothing was validated)."""
    key = "error_time" if target else "error_objective"
    own_run = next((v for v in validation if v["candidate"] == best["candidate"]
                    and v["workers"] == best["workers"]), None)
    own = own_run[key] if own_run else None
    errors = [v[key] for v in validation if v[key] is not None]
    worst = max(errors, key=abs) if errors else None
    what = "time to target" if target else "objective"
    out = {"measured_error": own, "largest_validation_error": worst, "target_error": TARGET_ERROR}
    measured = best.get("measured_iterations")
    fit_error = best["iterations"] / measured - 1 if target and measured else None
    misfit = ""
    if fit_error is not None and abs(fit_error) > TARGET_ERROR:  # the fit misses its own profiling run there
        out["fit_error"] = fit_error
        misfit = (f"; at m={best['workers']}, profiled, its own run reached the target in {measured:.0f} iterations "
                  f"where the fit predicts {best['iterations']:.3g} ({100 * fit_error:+.0f}%): the convergence model "
                  "does not fit this run; profile longer (--steps) or set --target-loss nearer the losses it reached")
    if not validation:
        out["warning"] = "not validated: --validate measures held-out worker counts and says how far to trust it"
    elif worst is None:
        out["warning"] = (f"no validation run measured a {what} (none reached the target): the prediction is "
                          "untested; raise --validate-max-steps or profile longer (--steps)")
    elif abs(worst) > TARGET_ERROR or (own is not None and abs(own) > TARGET_ERROR):
        mine = f"its own {100 * own:+.0f}%, " if own is not None else ""
        out["warning"] = (f"the predicted {what} erred by up to {100 * worst:+.0f}% on the held-out runs ({mine}"
                          f"beyond the planner's {100 * TARGET_ERROR:.0f}% target): treat the recommendation as a "
                          "guess; profile longer (--steps) or nearer the held-out m (--workers)")
    if misfit:
        out["warning"] = (out.get("warning", "") + misfit).removeprefix("; ")
    if own_run and own_run.get("status", "").startswith("refused"):  # the recommendation cannot run as recommended
        out["warning"] = (f"the recommended {best['candidate']} at m={best['workers']} did not run: "
                          f"{own_run['status']}; choose another recommendation from the predictions, or lower "
                          "--max-workers; "
                          + out.get("warning", "")).removesuffix("; ")
    return out


def _finite(value):
    """inf and nan as None, so plan.json is standard JSON ("never reached" is None)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def first_round(cfg: RunConfig) -> int:
    """The fewest steps a run of ``cfg``'s algorithm may take: its first round, for one whose evaluated
    model changes only at its rounds (``Algorithm.evaluated_rounds``: DiLoCo's H), else 1."""
    from gradwire.algorithms import ALGORITHMS

    rounds = ALGORITHMS.build(cfg.algorithm).evaluated_rounds()
    return 1 if rounds is None else rounds.first
