"""gradwire's command line: ``run``, ``compare``, ``plan``, ``report``, ``reproduce``, ``launch``, ``list``.

Every ``run`` flag is a key of the run config (see ``gradwire run --help``); a YAML or TOML file
given with ``--config`` holds the same keys and flags override it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from gradwire import config as config_mod
from gradwire import version  # the package root's (gradwire.cli.version is the same function)
from gradwire.config import KEYS, RunConfig, coerce, from_mapping, read_config_file
from gradwire.errors import AlreadyFinished, CommunicationError, ConfigError, DivergenceError, Stopped
from gradwire.launch import EPILOG_LAUNCH, cmd_launch
from gradwire.registries import GROUPS, REGISTRIES
from gradwire.report.run_folder import holds_run, refuse_existing, require_named

EPILOG_RUN = """examples:
  gradwire run --task mnist1d-cnn --workers 8 --algorithm sync:backups=2 --stragglers tail:p=0.05,slowdown=10
  gradwire run --task mnist1d-mlp --compressor qsgd:levels=4 --error-feedback --network ring:mbps=100
  gradwire run --task synthetic-logreg:l1=0.001 --algorithm diana --batch-size full --dtype float64
  gradwire run --config run.yaml --steps 2000      (flags override the file)
Spec strings are name or name:key=value,...; `gradwire list` shows every name and parameter."""

EPILOG_COMPARE = """each --variant is a quoted list of run flags applied on top of the common ones, e.g.
  gradwire compare --task mnist1d-mlp --steps 300 --out runs/cmp \\
      --variant "--algorithm sync" --variant "--algorithm sync:backups=2" \\
      --variant "--name qsgd-ef --compressor qsgd:levels=4 --error-feedback"
A config file may hold the common keys and a list `variants:` of mappings of keys.
With --seeds 0,1,2 every variant runs once per seed (folders VARIANT-seedS); comparison.md adds, per
variant, the mean, standard deviation and range of its final losses and accuracy over the seeds, and
its paired difference from the first variant (seed by seed: the same initial model and batches), so
that a 1 % difference can be told from seed-to-seed noise; the plot shows the mean curves."""

EPILOG_PLAN = """examples:
  gradwire plan --task synthetic-logreg:samples=4096 --batch-size 8 --steps 200 --network ring:mbps=100 \\
      --stragglers tail:p=0.1,slowdown=20,compute_s=0.01 --algorithms sync,sync:backups=2 \\
      --workers 4,8,16 --max-workers 256 --target-loss 0.5 --validate 32
  gradwire plan --config base.yaml --compressors none,qsgd:levels=4 --workers 2,4,8,16 --deadline 60
  gradwire plan ... --candidate "--name topk-ef --compressor topk:ratio=0.01 --error-feedback"
  gradwire plan ... --budget 120 --validate 32,64        (profiling within 120 s wall; held-out m measured)
Candidates: every --algorithms x --compressors pair, plus each --candidate (quoted run flags on top of the
common ones). Profiling runs go to OUT/profile/, validation runs to OUT/validate/; OUT gets plan.json,
plan.md and plan.png. Time is simulated on --backend sim, elapsed on torch (each run a `gradwire launch`).
The models and the design are explained in docs/planning.md."""


EPILOG_REPRODUCE = """examples:
  gradwire reproduce --quick                         (every claim, small: a few minutes on 2 cores)
  gradwire reproduce --only dagc,dqsgd --out runs/adaptive-claims
  gradwire reproduce --list                          (the claims' names and titles)
Writes OUT/claims.json, OUT/reproduce.md, a PNG per claim and each claim's run folders."""


def _field_help() -> dict[str, str]:
    """The comment beside each RunConfig field is its --help text (one source of truth)."""
    out = {}
    for line in inspect.getsource(config_mod.RunConfig).splitlines():
        m = re.match(r"\s+(\w+):.*?#\s*(.*)$", line)
        if m and m.group(1) in KEYS:
            out[m.group(1)] = m.group(2)
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# what the command line does when a flag is left out, where that is not the field's own default
SHOWN_DEFAULTS = {"out": "a fresh runs/<label>-<YYYYmmdd-HHMMSS>",
                  "lr": "the algorithm's", "momentum": "the algorithm's"}


def _add_run_flags(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    helps = _field_help()
    p.add_argument("--config", help="YAML or TOML file with any of the keys below")
    for key, f in KEYS.items():
        if key in skip:
            continue
        flag = "--" + key.replace("_", "-")
        text = f"{helps.get(key, '')} (default: {SHOWN_DEFAULTS.get(key, f.default)})"
        if isinstance(f.default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text)
        else:
            p.add_argument(flag, dest=key, default=argparse.SUPPRESS, metavar=key.upper(), help=text)


# config-file keys that only `gradwire compare` reads (every other key is a RunConfig field); the
# other commands take a comparison's file for its common keys (docs/leader_sgd.md does)
COMPARE_KEYS = ("variants", "seeds")


def _config_from(ns: argparse.Namespace, base: RunConfig | None = None) -> RunConfig:
    cfg = base or RunConfig()
    if getattr(ns, "config", None):
        cfg = from_mapping({k: v for k, v in read_config_file(ns.config).items() if k not in COMPARE_KEYS}, cfg)
    given = {k: coerce(k, v) for k, v in vars(ns).items() if k in KEYS}
    return cfg.replace(**given)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_")[:80] or "run"


def _out_given(ns) -> bool:
    """Whether --out (or ``out:`` in the --config file) names the folder."""
    return "out" in vars(ns) or bool(getattr(ns, "config", None) and "out" in read_config_file(ns.config))


def fresh_out(name: str, cfg: RunConfig) -> str:
    """The folder of a run given no --out: ``runs/NAME-YYYYmmdd-HHMMSS`` (``-2``, ``-3``, ... when
    taken), so no run lands on another. A time stamp (not a counter) names runs in the order they
    ran and needs no look at the others; under torchrun every process must find the same name, so
    ``gradwire launch`` fixes the stamp for its processes (GRADWIRE_RUN_STAMP), which also brings a
    restarted group back to its folder; plain torchrun, or several nodes, need --out."""
    stamp = os.environ.get("GRADWIRE_RUN_STAMP")
    if cfg.resuming and not stamp:
        raise ConfigError("--resume continues the run in --out: name its folder")
    base = Path("runs") / f"{_slug(name)}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    if cfg.backend == "torch" and "WORLD_SIZE" in os.environ:  # every process must agree: no suffix
        if not stamp:
            raise ConfigError("under torchrun every process must name the same run folder: pass --out "
                              "(gradwire launch picks a fresh one for you)")
        if os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]) != os.environ["WORLD_SIZE"]:
            raise ConfigError("a run on several nodes needs --out, the same folder on every node")
        return str(base)
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return str(path)


def describe_setup(algorithm: str, info: dict, workers: int) -> str:
    """An algorithm's set-up choices: scalars on one line, per-worker lists as a small table."""
    per_worker = {k: v for k, v in info.items() if isinstance(v, list) and len(v) == workers}
    scalars = ", ".join(f"{k}={v}" for k, v in info.items() if k not in per_worker)
    lines = [f"{algorithm} set-up: {scalars}"]
    if per_worker:
        def cell(v):
            return f"{v:.4g}" if isinstance(v, float) else str(v)

        lines.append("  worker " + " ".join(f"{k:>12}" for k in per_worker))
        for w in range(workers):
            lines.append(f"  {w:>6} " + " ".join(f"{cell(v[w]):>12}" for v in per_worker.values()))
    return "\n".join(lines)


def cmd_run(ns) -> int:
    cfg = _config_from(ns).check_values()  # before torch is imported: a mistyped value is reported at once
    if not _out_given(ns):
        cfg = cfg.replace(out=fresh_out(cfg.label(), cfg))
    from gradwire.run.loop import run

    reports = not (cfg.backend == "torch" and os.environ.get("RANK", "0") != "0")  # rank 0 reports for the group
    try:
        summary = run(cfg)
    except AlreadyFinished as e:
        if reports:
            print(f"gradwire run: {e}")
        return 0
    if not reports:
        return 0
    info_path = Path(cfg.out) / "algorithm.json"
    if info_path.exists():
        print(describe_setup(cfg.algorithm, json.loads(info_path.read_text()), cfg.workers))
    final = summary["final"]
    parts = [f"{k}={final[k]:.4g}" for k in ("train_loss", "test_acc", "suboptimality") if final.get(k) is not None]
    mb = summary["bytes_sent"] / 1e6
    print(f"{summary['label']}: {summary['steps']} steps, {' '.join(parts)}, {mb:.3f} MB sent, "
          f"{summary['sim_time_s']:.2f} s {'simulated' if cfg.backend == 'sim' else 'elapsed'}, "
          f"{summary['wall_time_s']:.1f} s wall -> {cfg.out}")
    if summary.get("lost_workers"):
        reasons = "; ".join(f"worker {w}: {why}" for w, why in summary["lost_reasons"].items())
        print(f"lost {len(summary['lost_workers'])} worker(s) during the run, finished with the rest ({reasons})")
    return 0


def variants_of(ns, parser) -> tuple[RunConfig, list[RunConfig]]:
    common = _config_from(ns)
    specs: list[RunConfig] = []
    own_seed: list[bool] = []  # whether the variant sets its own seed (which --seeds would override)
    file_variants = read_config_file(ns.config).get("variants", []) if getattr(ns, "config", None) else []
    for v in file_variants:
        if not isinstance(v, dict):
            raise ConfigError(f"each entry of 'variants' in {ns.config} must be a mapping of config keys")
        specs.append(from_mapping(v, common))
        own_seed.append("seed" in v)
    for text in ns.variant or []:
        sub = parser.parse_args(shlex.split(text))
        specs.append(_config_from(sub, common))
        own_seed.append("seed" in vars(sub) or bool(sub.config and "seed" in read_config_file(sub.config)))
    if not specs:
        raise ConfigError("compare needs at least one --variant (or a 'variants' list in the config file)")
    labels = [c.label() for c in specs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"variants share the label(s) {dupes}; give each a distinct --name")
    folders: dict[str, str] = {}
    for label in labels:  # one folder per variant: labels that differ only where _slug rewrites would share one
        other = folders.setdefault(_slug(label).casefold(), label)
        if other != label:
            raise ConfigError(f"variants {other!r} and {label!r} would share the folder {_slug(label)!r}; "
                              "give them names that differ in letters or digits")
    if not _out_given(ns):
        common = common.replace(out=fresh_out("compare", common))
    require_named(common.out)
    root = Path(common.out)
    seeds = seeds_of(ns)
    if seeds:
        pinned = [c.label() for c, own in zip(specs, own_seed, strict=True) if own]
        if pinned:
            raise ConfigError(f"variant(s) {pinned} set their own seed; with --seeds every variant runs every "
                              f"seed ({','.join(map(str, seeds))}): drop the variant's seed")
    if len(seeds) > 1:  # seed-major: an interrupted comparison leaves whole seeds, every variant paired
        specs = [c.replace(seed=s, name=f"{c.label()} seed {s}", out=str(root / f"{_slug(c.label())}-seed{s}"))
                 for s in seeds for c in specs]
    else:  # one seed (--seeds 5: as --seed 5) or none
        specs = [c.replace(out=str(root / _slug(c.label())), **({"seed": seeds[0]} if seeds else {}))
                 for c in specs]
    for c in specs:
        c.check_values()  # before torch is imported (the second stage's modules import it)
    from gradwire.run.combination import check_combination

    for c in specs:
        check_combination(c)
    return common, specs


def seeds_of(ns) -> list[int]:
    """compare's --seeds (or ``seeds:`` in its config file): distinct integers in [0, 2**63), given
    as 0,1,2 (or a list in the file); [] when not given."""
    text = getattr(ns, "seeds", None)
    where = "--seeds"
    if text is None and getattr(ns, "config", None):
        text, where = read_config_file(ns.config).get("seeds"), f"seeds in {ns.config}"
    if text is None:
        return []
    items = text if isinstance(text, list) else str(text).split(",")
    seeds = []
    for item in items:
        value = str(item).strip()
        if not re.fullmatch(r"\d{1,19}", value) or int(value) >= 2**63:
            raise ConfigError(f"{where}={text!r}: {value!r} is not a seed (an integer in [0, 2**63)); give e.g. 0,1,2")
        seeds.append(int(value))
    if not seeds:
        raise ConfigError(f"{where} is empty; give e.g. 0,1,2")
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ConfigError(f"{where}={text!r} names seed(s) {twice} more than once; each seed runs once")
    return seeds


def refuse_to_replace(common: RunConfig, specs: list[RunConfig]) -> None:
    """Before any variant runs: a comparison or variant run already in the folder is replaced only
    with --overwrite (or continued with --resume)."""
    root = Path(common.out)
    if (root / "comparison.md").exists() and not (common.overwrite or common.resuming):
        raise ConfigError(f"compare folder {root} already holds a comparison (comparison.md); pass --overwrite "
                          "to replace it or --resume to continue its runs (or choose another --out)")
    for c in specs:
        refuse_existing(Path(c.out), overwrite=c.overwrite, resume=c.resuming)


def resumed_variants(common: RunConfig, specs: list[RunConfig]) -> list[RunConfig]:
    """compare --resume continues a comparison: each variant from its checkpoint, or from step 0
    where it has none (it had not started, or saved no checkpoint); one that finished is kept as it
    is. A folder holding none of the variants' runs has nothing to resume (--resume-or-start starts it)."""
    if not common.resume or common.resume_or_start:
        return specs
    if not any(holds_run(Path(c.out)) for c in specs):
        raise ConfigError(f"resume=true: nothing to resume: compare folder {common.out} holds none of the variants' "
                          "runs; check --out, or pass --resume-or-start to start the comparison (--resume)")
    return [c.replace(resume=False, resume_or_start=True) for c in specs]


def cmd_compare(ns, variant_parser) -> int:
    common, specs = variants_of(ns, variant_parser)
    refuse_to_replace(common, specs)
    specs = resumed_variants(common, specs)
    from gradwire.report.compare import write_report
    from gradwire.run.loop import run

    root = Path(common.out)
    root.mkdir(parents=True, exist_ok=True)
    seeds = seeds_of(ns)
    summaries = []
    for i, c in enumerate(specs, 1):
        print(f"[{i}/{len(specs)}] {c.label()}", flush=True)
        try:
            summaries.append(run(c))
        except AlreadyFinished as e:  # --resume: a variant that finished before
            print(f"  already finished at step {e.summary['steps']}", flush=True)
            summaries.append(e.summary)
        except DivergenceError as e:
            print(f"  diverged: {e}", flush=True)
            summaries.append(json.loads((Path(c.out) / "summary.json").read_text()))
        s = summaries[-1]
        acc = (s.get("final") or {}).get("test_acc")
        print(f"  {s['status']}: test_acc={acc if acc is None else round(acc, 4)}, "
              f"{s['bytes_sent'] / 1e6:.2f} MB, {s['sim_time_s']:.1f} s "
              f"{'simulated' if c.backend == 'sim' else 'elapsed'}, {s['wall_time_s']:.1f} s wall", flush=True)
    title = f"{common.task}, {common.workers} workers, {common.stragglers} stragglers, {common.network}"
    labels = None
    if len(seeds) > 1:  # the variants' own labels: those of the first seed's runs, less " seed S"
        labels = [c.label().removesuffix(f" seed {seeds[0]}") for c in specs[:len(specs) // len(seeds)]]
    files = write_report(root, summaries, [Path(c.out) for c in specs], title, seeds=seeds, labels=labels)
    print((root / "comparison.md").read_text())
    print(f"report: {files['markdown']}  plot: {files['plot']}")
    if ns.html:
        from gradwire.report.pages import write_report as write_html

        print(f"html: {write_html(root, [Path(c.out) for c in specs], title=f'gradwire comparison: {title}')}")
    return 0


def cmd_report(ns) -> int:
    from gradwire.report.pages import write_report as write_html

    print(write_html(Path(ns.folder), out=ns.out,
                     warn=lambda text: print(f"gradwire report: warning: {text}", file=sys.stderr)))
    return 0


def spec_list(text: str) -> list[str]:
    """``sync:backups=2,diana,local:period=8,eval=average`` -> one spec per name: a comma starts a
    new spec unless what follows is another key=value of the one before."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if specs and "=" in part and ":" not in part.split("=")[0]:
            specs[-1] += "," + part
        elif part:
            specs.append(part)
    return specs


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None


def cmd_plan(ns, variant_parser) -> int:
    base = _config_from(argparse.Namespace(**{k: v for k, v in vars(ns).items() if k != "workers"}))  # a list here
    base.check_values()  # before torch is imported
    candidates = [base.replace(algorithm=a, compressor=c, name="" if (ns.algorithms or ns.compressors) else base.name)
                  for a in spec_list(ns.algorithms or base.algorithm)
                  for c in spec_list(ns.compressors or base.compressor)]
    if ns.candidate:  # explicit candidates replace the implicit base one unless lists were given
        candidates = candidates if (ns.algorithms or ns.compressors) else []
        candidates += [_config_from(variant_parser.parse_args(shlex.split(t)), base) for t in ns.candidate]
    workers = _int_list(ns.workers, "--workers")
    if ns.validate == "auto":  # the next two powers of two above the profiled counts
        validate = [m for m in (2 * max(workers), 4 * max(workers)) if m <= ns.max_workers]
    else:
        validate = _int_list(ns.validate or "", "--validate")
    out = Path(base.out if _out_given(ns) else fresh_out("plan", base))
    if (out / "plan.json").exists() and not base.overwrite:
        raise ConfigError(f"plan folder {out} already holds a plan (plan.json); pass --overwrite to replace it "
                          "(or choose another --out)")
    from gradwire.plan.output import prediction_table, recommendation_lines, validation_table, write_plan
    from gradwire.plan.planner import PlanRequest, make_plan

    req = PlanRequest(candidates=candidates, workers=workers, max_workers=ns.max_workers, out=out,
                      target=ns.target_loss, deadline_s=ns.deadline, metric=ns.metric, budget_s=ns.budget,
                      validate=validate, validate_max_steps=ns.validate_max_steps, work=ns.work,
                      fit_from=ns.fit_from)
    plan = make_plan(req)
    files = write_plan(out, plan)
    print("\n".join(prediction_table(plan)))
    val = validation_table(plan)
    if val:
        print("\nvalidation (held-out m):\n" + "\n".join(val))
    print("\n".join(recommendation_lines(plan)))
    print(f"plan: {files['markdown']}  {files['json']}  plot: {files['plot']}")
    return 0


def cmd_reproduce(ns) -> int:
    from gradwire import reproduce

    if ns.list:
        for name, module in reproduce.CLAIMS.items():
            print(f"{name:16} {module.TITLE} ({reproduce.short_citation(module.CITATION)})")
        return 0
    names = reproduce.select(ns.only)
    out = Path(ns.out if ns.out is not None else fresh_out("reproduce", RunConfig()))
    require_named(str(out))
    if (out / "claims.json").exists() and not ns.overwrite:
        raise ConfigError(f"{out} already holds a reproduction (claims.json); pass --overwrite or another --out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    claims = reproduce.run_claims(out, quick=ns.quick, names=names, echo=lambda s: print(s, flush=True))
    command = " ".join(["gradwire reproduce"] + ["--quick"] * ns.quick + [f"--only {','.join(names)}"] * bool(ns.only))
    files = reproduce.write_report(out, claims, quick=ns.quick, command=command,
                                   wall_time_s=time.perf_counter() - started)
    print(reproduce.verdict_table(claims))
    print(f"report: {files['markdown']}  claims: {files['json']}")
    return 1 if any(c.verdict == "error" for c in claims) else 0  # an experiment raised


def cmd_list(ns) -> int:
    for ref in REGISTRIES:
        if ns.what in (None, ref.group):
            print(f"{ref.group} (spec: name or name:key=value,...):\n{ref.registry.describe()}\n")
    return 0


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = _Parser(prog="gradwire", description="Communication-efficient, straggler-tolerant distributed "
                     "training: compare algorithms and compressors on a simulated cluster.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p_run = sub.add_parser("run", help="train once and write a run folder", epilog=EPILOG_RUN,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Train a task on N workers with one algorithm; writes config.json, "
                           "metrics.jsonl, summary.json and curves.png into --out.")
    _add_run_flags(p_run)
    p_cmp = sub.add_parser("compare", help="run several variants and write a side-by-side report",
                           epilog=EPILOG_COMPARE, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Run variants on the same task, seed and partition; writes "
                           "comparison.md, comparison.csv, comparison.png and report.html into --out.")
    _add_run_flags(p_cmp)
    p_cmp.add_argument("--variant", action="append", help="run flags of one variant (quoted); repeatable")
    p_cmp.add_argument("--seeds", default=None, metavar="S,S,...",
                       help="run every variant once per seed (e.g. 0,1,2; replaces --seed) and add each variant's "
                            "mean, spread and paired difference from the first variant over the seeds")
    p_plan = sub.add_parser("plan", help="profile short runs, fit time and convergence models, recommend an "
                            "algorithm, compressor and worker count", epilog=EPILOG_PLAN,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Run short profiling runs of each candidate at a few worker counts, fit "
                            "Ernest's time-per-iteration model and a convergence model, predict the time to a target "
                            "(or the objective within a deadline) up to --max-workers, and recommend one; writes "
                            "plan.json, plan.md and plan.png into --out.")
    _add_run_flags(p_plan, skip=("workers",))
    p_plan.add_argument("--algorithms", help="comma-separated algorithm specs, e.g. sync,sync:backups=2,diana")
    p_plan.add_argument("--compressors", help="comma-separated compressor specs, e.g. none,qsgd:levels=4")
    p_plan.add_argument("--candidate", action="append", help="run flags of one more candidate (quoted); repeatable")
    p_plan.add_argument("--workers", default="1,2,4,8", help="worker counts the profiling may use (default 1,2,4,8; "
                        "at least 3 distinct)")
    p_plan.add_argument("--max-workers", type=int, default=64, help="predict up to this many workers (default 64)")
    goal = p_plan.add_mutually_exclusive_group()
    goal.add_argument("--target-loss", type=float, help="objective to reach (see --metric): minimise the time to it")
    goal.add_argument("--deadline", type=float, help="seconds available: minimise the objective reached in them")
    p_plan.add_argument("--metric", default="train_loss", help="train_loss (default) or suboptimality (f - f*, "
                        "tasks that know f*)")
    p_plan.add_argument("--budget", type=float, help="wall-clock seconds for all profiling runs together "
                        "(default: profile every --workers count)")
    p_plan.add_argument("--validate", nargs="?", const="auto", help="also measure held-out worker counts M,... (bare: "
                        "2x and 4x the largest profiled) and the recommendation; report predicted vs measured")
    p_plan.add_argument("--validate-max-steps", type=int, default=0, help="longest validation run in steps "
                        "(default 20x --steps)")
    p_plan.add_argument("--work", type=float, default=1.0, help="s in Ernest's θ1·s/m term (default 1)")
    p_plan.add_argument("--fit-from", type=float, default=0.5, help="fit the convergence model on each profiling "
                        "run's evaluations from this fraction of its steps on (default 0.5: the second half)")
    p_cmp.add_argument("--html", action=argparse.BooleanOptionalAction, default=True,
                       help="also write report.html, the whole comparison on one self-contained page (default: yes)")
    p_rep = sub.add_parser("report", help="write report.html for a run folder or a comparison folder",
                           description="One self-contained HTML page (images inlined, no script, opens from disk): "
                           "config, summary, curves, the per-worker timeline, bytes and staleness; for a comparison "
                           "every variant side by side.")
    p_rep.add_argument("folder", metavar="RUN_OR_COMPARISON_DIR", help="a run folder (gradwire run --out) or a "
                       "comparison folder (gradwire compare --out)")
    p_rep.add_argument("--out", default=None, help="where to write the page (default: FOLDER/report.html)")
    p_launch = sub.add_parser("launch", help="train on torch.distributed: start `run` on N processes via torchrun",
                              epilog=EPILOG_LAUNCH, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Start a `gradwire run --backend torch` group with torchrun's launcher "
                              "and rendezvous (gloo on CPU, NCCL on GPU). Rank 0 writes the run folder.")
    p_launch.add_argument("--nproc-per-node", type=int, required=True, help="worker processes on this node")
    p_launch.add_argument("--nnodes", default="1", help="number of nodes, or a range MIN:MAX (default 1)")
    p_launch.add_argument("--node-rank", type=int, default=0,
                          help="this node's index (multi-node; the c10d rendezvous may order nodes itself)")
    p_launch.add_argument("--rdzv-endpoint", default="", help="HOST:PORT of the rendezvous (multi-node)")
    p_launch.add_argument("--rdzv-id", default="gradwire", help="job id shared by all nodes")
    p_launch.add_argument("--ifname", default="", help="network interface for gloo/NCCL traffic "
                          "(sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)")
    p_launch.add_argument("--local-addr", default="", help="this node's address as the rendezvous should see it")
    p_launch.add_argument("--max-restarts", type=int, default=0,
                          help="restart the group this often after a failure (restarted attempts resume from the last "
                               "checkpoint)")
    p_launch.add_argument("rest", nargs=argparse.REMAINDER, help="-- run [run flags]")
    p_rep = sub.add_parser("reproduce", help="run each implemented paper's headline experiment small and judge it",
                           epilog=EPILOG_REPRODUCE, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Run each paper's headline experiment at small scale on the simulator and "
                           "judge it by criteria stated in advance: reproduced, partly or not, with the reason.")
    p_rep.add_argument("--quick", action="store_true", help="smaller experiments (under 5 minutes on 2 cores)")
    p_rep.add_argument("--out", help="output folder (default: a fresh runs/reproduce-<YYYYmmdd-HHMMSS>)")
    p_rep.add_argument("--only", metavar="NAMES", help="comma-separated claims to run (default: all; see --list)")
    p_rep.add_argument("--list", action="store_true", help="list the claims and exit")
    p_rep.add_argument("--overwrite", action="store_true", help="replace a reproduction already in --out")
    p_list = sub.add_parser("list", help="show every task, partition, straggler model, network, algorithm, compressor")
    p_list.add_argument("what", nargs="?", choices=GROUPS)
    variant_parser = _Parser(prog="gradwire compare --variant", add_help=False)
    _add_run_flags(variant_parser)
    return parser, variant_parser


def main(argv: list[str] | None = None) -> int:
    parser, variant_parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command == "run":
            return cmd_run(ns)
        if ns.command == "compare":
            return cmd_compare(ns, variant_parser)
        if ns.command == "plan":
            return cmd_plan(ns, variant_parser)
        if ns.command == "report":
            return cmd_report(ns)
        if ns.command == "launch":  # one time stamp for the group's default --out, kept across restarts
            os.environ.setdefault("GRADWIRE_RUN_STAMP", time.strftime("%Y%m%d-%H%M%S"))
            return cmd_launch(ns)
        if ns.command == "reproduce":
            return cmd_reproduce(ns)
        return cmd_list(ns)
    except ConfigError as e:
        print(f"gradwire {ns.command}: error: {e}", file=sys.stderr)
        return 2
    except DivergenceError as e:
        print(f"gradwire {ns.command}: diverged: {e} (metrics so far are in the run folder)", file=sys.stderr)
        return 3
    except CommunicationError as e:
        print(f"gradwire {ns.command}: communication error: {e}", file=sys.stderr)
        return 4
    except KeyboardInterrupt as e:  # SIGTERM or SIGINT: the run wrote its summary ("stopped")
        return _stopped(ns.command, e)


def _stopped(command: str, e: KeyboardInterrupt) -> int:
    """One line on stderr for a run ended by a signal; the exit status is 128 + the signal."""
    if not isinstance(e, Stopped) or e.step is None:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        print(f"gradwire {command}: stopped by {signal.Signals(signum).name} (metrics so far are in the run folder)",
              file=sys.stderr)
        return 128 + signum
    resume = (f"--resume continues from step {e.checkpoint_step}" if e.checkpoint_step is not None
              else "no checkpoint to resume from")
    written = f"{Path(e.out) / 'summary.json'} written" if e.out is not None else "rank 0 writes the summary"
    print(f"gradwire {command}: stopped by {signal.Signals(e.signum).name} at step {e.step}; {written}; {resume}",
          file=sys.stderr)
    return 128 + e.signum


if __name__ == "__main__":
    sys.exit(main())
