"""``gradwire plan``: profile short runs, fit time and convergence models, recommend an algorithm,
compressor and worker count (docs/planning.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gradwire.cli.flags import (
    COMPARE_KEYS,
    add_run_flags,
    config_from_args,
    fresh_out,
    out_given,
    parse_flag_string,
    run_parser,
)
from gradwire.config import RunConfig, from_mapping, read_config_file
from gradwire.errors import ConfigError
from gradwire.report.run_folder import (
    holds_run_labelled,
    refuse_other_kind,
    refuse_others,
    remove_replaced,
    require_named,
)

EPILOG = """examples:
  gradwire plan --task synthetic-logreg:samples=4096 --batch-size 8 --steps 100 --network ring:mbps=100 \\
      --stragglers tail:p=0.1,slowdown=20,compute_s=0.01 --algorithms sync,sync:backups=2 \\
      --workers 4,8,16 --max-workers 256 --target-loss 0.5 --fit-from 0.1 --validate 32
  gradwire plan --config base.yaml --compressors none,qsgd:levels=4 --workers 2,4,8,16 --deadline 60
  gradwire plan ... --candidate "--name topk-ef --compressor topk:ratio=0.01 --error-feedback"
  gradwire plan ... --budget 120 --validate 32,64        (profiling within 120 s wall; held-out m measured)
Candidates: every --algorithms x --compressors pair, plus each --candidate (quoted run flags on top of the
common ones). Profiling runs go to OUT/profile/, validation runs to OUT/validate/; OUT gets plan.json,
plan.md and plan.png. Time is simulated on --backend sim, elapsed on torch (each run a `gradwire launch`).
The models and the design are explained in docs/planning.md."""


OUT_HELP = ("plan folder: plan.json, plan.md and plan.png, the profiling runs in OUT/profile/ and the validation "
            "runs in OUT/validate/")
OVERWRITE_HELP = ("replace the plan already in OUT: plan.json, plan.md, plan.png and each run the new plan makes; "
                  "the run folders of the replaced plan that this one does not make (those its plan.json names) go "
                  "once the new plan is written")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="profile short runs, fit time and convergence models, recommend an "
                       "algorithm, compressor and worker count", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run short profiling runs of each candidate at a few worker counts, fit "
                       "Ernest's time-per-iteration model and a convergence model, predict the time to a target "
                       "(or the objective within a deadline) up to --max-workers, and recommend one; writes "
                       "plan.json, plan.md and plan.png into --out.")
    add_run_flags(p, skip=("workers",), helps={"out": OUT_HELP, "overwrite": OVERWRITE_HELP},
                  shown_defaults={"out": "a fresh runs/plan-<YYYYmmdd-HHMMSS>"})
    p.add_argument("--algorithms", help="comma-separated algorithm specs, e.g. sync,sync:backups=2,diana")
    p.add_argument("--compressors", help="comma-separated compressor specs, e.g. none,qsgd:levels=4")
    p.add_argument("--candidate", action="append", help="run flags of one more candidate (quoted); repeatable; a "
                   "single flag is a value too: --candidate \"--error-feedback\"")
    p.add_argument("--workers", default=None, help="worker counts the profiling may use (default: workers in the "
                   "--config file, else 1,2,4,8; at least 3 distinct)")
    p.add_argument("--max-workers", type=int, default=64, help="predict up to this many workers (default 64)")
    goal = p.add_mutually_exclusive_group()
    goal.add_argument("--target-loss", type=float, help="objective to reach (see --metric): minimise the time to it")
    goal.add_argument("--deadline", type=float, help="seconds available: minimise the objective reached in them")
    p.add_argument("--metric", default="train_loss", help="train_loss (default) or suboptimality (f - f*, "
                   "tasks that know f*)")
    p.add_argument("--budget", type=float, help="wall-clock seconds for all profiling runs together "
                   "(default: profile every --workers count)")
    p.add_argument("--validate", nargs="?", const="auto", help="also measure held-out worker counts M,... (bare: "
                   "2x and 4x the largest --workers count) and the recommendation; report predicted vs measured")
    p.add_argument("--validate-max-steps", type=int, default=0, help="longest validation run in steps "
                   "(default 20x --steps)")
    p.add_argument("--work", type=float, default=1.0, help="s in Ernest's θ1·s/m term (default 1)")
    p.add_argument("--fit-from", type=float, default=0.5, help="fit the convergence model on each profiling "
                   "run's evaluations from this fraction of its steps on (default 0.5: the second half)")
    p.set_defaults(command_main=main)


def comma_items(text: str, flag: str, expected: str) -> list[str]:
    """The comma-separated items of ``flag``'s value ``text``, stripped. A value that names none
    (``''``, ``','``) or has an empty item (``sync,,local``, ``none,``) is refused, not read as
    fewer items; ``expected`` says what to give instead."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise ConfigError(f"{flag} {text!r} gives no value; expected {expected}")
    if "" in items:
        raise ConfigError(f"{flag} {text!r} has an empty item (a stray ','); expected {expected}")
    return items


# plan's lists of the candidates' specs, each with the run flag whose value it replaces (and whose
# registered names it takes)
SPEC_LIST_OF = {"algorithms": "algorithm", "compressors": "compressor"}


def spec_list(text: str, flag: str) -> list[str]:
    """``sync:backups=2,diana,local:period=8,eval=average`` -> one spec per name: a comma starts a
    new spec unless what follows is another key=value of the one before. ``flag`` (--algorithms,
    --compressors) names the value where it names no spec or has an empty item."""
    from gradwire.registries import REGISTRIES
    from gradwire.registry_names import NAMES

    key = SPEC_LIST_OF[flag.removeprefix("--")]
    names = sorted(n for r in REGISTRIES if r.key == key for n in NAMES[r.group]["names"])
    specs: list[str] = []
    for part in comma_items(text, flag, f"comma-separated {key} specs ({', '.join(names)})"):
        if specs and "=" in part and ":" not in part.split("=")[0]:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _int_list(text: str, flag: str) -> list[int]:
    items = comma_items(text, flag, "comma-separated integers, e.g. 1,2,4,8")
    try:
        return [int(x) for x in items]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None


# run keys that plan sets for each of its runs itself: given to plan (or in its --config file) or to a
# --candidate they would be ignored, so they are refused; why, for the message
PLAN_SETS = {
    "workers": "plan runs every candidate at the --workers counts of plan itself",
    "out": "each run goes to OUT/profile/<candidate>/m<M> (or OUT/validate/...): give --out to plan itself",
    "overwrite": "plan replaces its own profiling runs; --overwrite of plan itself replaces a plan",
    "resume": "plan starts every profiling run afresh (it replaces them); a plan cannot be resumed",
    "resume_or_start": "plan starts every profiling run afresh (it replaces them); a plan cannot be resumed",
    "checkpoint_every": "plan's profiling runs are never resumed, so a checkpoint would be written for nothing",
}
PLAN_OWN = ("workers", "out", "overwrite")  # plan's own flags (or keys of its config file) of the same name


def _refuse_plan_keys(given: dict, where: str, keys) -> None:
    """A key in ``keys`` given with a value that asks for something (not None, False or 0)."""
    given = {str(k).replace("-", "_"): v for k, v in given.items()}  # a file may spell them resume-or-start
    for key in keys:
        if given.get(key) not in (None, False, 0):
            flag = "--" + key.replace("_", "-")
            value = "" if isinstance(given[key], bool) else f" {given[key]}"
            raise ConfigError(f"{where} sets {flag}{value}, which plan would ignore: {PLAN_SETS[key]} ({flag})")


def workers_of(ns) -> str:
    """plan's --workers, else ``workers`` in its --config file (a list, 2,4,8 or one count), else 1,2,4,8."""
    if ns.workers is not None:
        return ns.workers
    if ns.config and "workers" in (file := read_config_file(ns.config)):
        value = file["workers"]
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return "1,2,4,8"


def candidates_of(ns, base: RunConfig) -> list[RunConfig]:
    """The candidates: every --algorithms x --compressors pair on top of ``base`` (the common flags),
    plus one per --candidate (whose run flags go on top of ``base``); without lists, ``base`` itself
    unless --candidate is given. A run flag that a list replaces (--algorithm with --algorithms) and a
    --candidate of no flags are refused: each would be dropped, or add nothing, unseen."""
    for many, one in SPEC_LIST_OF.items():
        if getattr(ns, many) is not None and one in vars(ns):  # (a flag left out is not in ns)
            raise ConfigError(f"--{one} {getattr(ns, one)} and --{many} {getattr(ns, many)}: the candidates' "
                              f"{one}s are those of --{many}, so --{one} would be ignored; give one of them (add "
                              f"{getattr(ns, one)} to --{many})")
    listed = ns.algorithms is not None or ns.compressors is not None
    algorithms = spec_list(ns.algorithms, "--algorithms") if ns.algorithms is not None else [base.algorithm]
    compressors = spec_list(ns.compressors, "--compressors") if ns.compressors is not None else [base.compressor]
    candidates = [base.replace(algorithm=a, compressor=c, name="" if listed else base.name)
                  for a in algorithms for c in compressors]
    if ns.candidate:  # explicit candidates replace the implicit base one unless lists were given
        candidates = candidates if listed else []
        parser = run_parser("gradwire plan --candidate")
        for text in ns.candidate:
            if not text.strip():
                raise ConfigError(f"--candidate {text!r} gives no run flags; give the flags that make the candidate "
                                  "differ from the common ones, e.g. --candidate \"--compressor topk:ratio=0.01\"")
            sub = parse_flag_string(parser, text, "--candidate")
            _refuse_plan_keys(vars(sub), f"--candidate {text!r}", PLAN_SETS)
            if sub.config:
                _refuse_plan_keys(read_config_file(sub.config), f"--candidate {text!r}'s {sub.config}", PLAN_SETS)
            candidates.append(config_from_args(sub, base))
    return candidates


def replaced_run_dirs(out: Path) -> list[tuple[Path, str]]:
    """The run folders of the plan in ``out`` (with --overwrite, the plan being replaced), each with its
    candidate's label, as its plan.json records its runs: for each run only the folder plan itself
    gives it (``planner.run_folder``); [] where there is no plan.json or it cannot be read."""
    from gradwire.plan.planner import run_folder

    try:
        recorded = {(r["purpose"], r["candidate"], int(r["workers"]))
                    for r in json.loads((out / "plan.json").read_text())["runs"]}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return []
    return [(run_folder(out, purpose, label, m), label) for purpose, label, m in sorted(recorded)
            if purpose in ("profile", "validate") and isinstance(label, str)]


def remove_unwritten(out: Path, replaced: list[tuple[Path, str]], runs: list[dict]) -> None:
    """Once the new plan is written: remove the replaced plan's run folders (``replaced``) that its
    ``runs`` did not write, each only where it is still a real folder below ``out`` holding a run of
    the replaced plan's label for it (never a run or file of the user's), then the candidate's folder
    (and OUT/validate/) where that left it empty; says on stderr what went."""
    from gradwire.plan.planner import run_folder

    written = {str(run_folder(out, r["purpose"], r["candidate"], r["workers"])).casefold() for r in runs}
    stale = [folder for folder, label in replaced if str(folder).casefold() not in written  # (one folder on a
             and folder.resolve() == out.resolve() / folder.relative_to(out)  # case-insensitive disk; no link)
             and holds_run_labelled(folder, label)]
    remove_replaced(stale, "plan's run folders", echo=lambda line: print(line, file=sys.stderr, flush=True),
                    root=out)
    for folder in {f.parent for f in stale}:
        for empty in (folder, folder.parent):  # rmdir: only an empty folder goes
            if empty.is_dir() and not empty.is_symlink() and not any(empty.iterdir()):
                empty.rmdir()


def main(ns) -> int:
    own = [k for k in PLAN_SETS if k not in PLAN_OWN]
    _refuse_plan_keys(vars(ns), "plan's command line", own)
    if ns.config:
        _refuse_plan_keys(read_config_file(ns.config), f"{ns.config}", own)
    if ns.validate_max_steps < 0:
        raise ConfigError(f"validate-max-steps={ns.validate_max_steps} must be >= 0 (0: 20x --steps) "
                          "(--validate-max-steps)")
    workers_text = workers_of(ns)
    # the file's keys, less its worker counts (plan's --workers, above): then the flags given
    in_file = {k: v for k, v in (read_config_file(ns.config) if ns.config else {}).items()
               if k not in (*COMPARE_KEYS, "workers")}
    base = config_from_args(argparse.Namespace(**{k: v for k, v in vars(ns).items() if k not in ("workers", "config")}),
                            from_mapping(in_file, RunConfig()))
    if out_given(ns):
        require_named(base.out)  # before check_values probes the folder: --out / and --out . are refused
    base.check_values()  # before torch is imported
    candidates = candidates_of(ns, base)
    workers = _int_list(workers_text, "--workers")
    if ns.validate == "auto":  # 2x and 4x the largest --workers count (known before any run; docs/planning.md)
        validate = [m for m in (2 * max(workers), 4 * max(workers)) if m <= ns.max_workers]
    else:
        validate = _int_list(ns.validate, "--validate") if ns.validate is not None else []
    out = Path(base.out if out_given(ns) else fresh_out("plan", base))
    require_named(out)
    refuse_other_kind(out, "plan")
    refuse_others(out, own=("profile", "validate"))
    if (out / "plan.json").exists() and not base.overwrite:
        raise ConfigError(f"plan folder {out} already holds a plan (plan.json); pass --overwrite to replace it "
                          "(or choose another --out)")
    from gradwire.plan.output import prediction_table, recommendation_lines, validation_table, write_plan
    from gradwire.plan.planner import PlanRequest, make_plan

    req = PlanRequest(candidates=candidates, workers=workers, max_workers=ns.max_workers, out=out,
                      target=ns.target_loss, deadline_s=ns.deadline, metric=ns.metric, budget_s=ns.budget,
                      validate=validate, validate_max_steps=ns.validate_max_steps, work=ns.work,
                      fit_from=ns.fit_from)
    replaced = replaced_run_dirs(out) if base.overwrite else []  # read before the new plan.json replaces it
    plan = make_plan(req)
    files = write_plan(out, plan)
    remove_unwritten(out, replaced, plan["runs"])
    print("\n".join(prediction_table(plan)))
    val = validation_table(plan)
    if val:
        print("\nvalidation (held-out m):\n" + "\n".join(val))
    print("\n".join(recommendation_lines(plan)))
    print(f"plan: {files['markdown']}  {files['json']}  plot: {files['plot']}")
    return 0
