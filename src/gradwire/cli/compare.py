"""``gradwire compare``: run several variants (and seeds) and write a side-by-side report."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from gradwire.cli.flags import (
    add_run_flags,
    config_from_args,
    fresh_out,
    out_given,
    parse_flag_string,
    run_parser,
    slug,
)
from gradwire.config import FOLDER_MODE_KEYS, RunConfig, from_mapping, read_config_file
from gradwire.errors import AlreadyFinished, ConfigError, DivergenceError, NoCheckpointToContinue
from gradwire.report.run_folder import (
    holds_run,
    holds_run_labelled,
    refuse_existing,
    refuse_other_kind,
    refuse_others,
    remove_replaced,
    require_named,
)

EPILOG = """each --variant is a quoted list of run flags applied on top of the common ones, e.g.
  gradwire compare --task mnist1d-mlp --steps 300 --out runs/cmp \\
      --variant "--algorithm sync" --variant "--algorithm sync:backups=2" \\
      --variant "--name qsgd-ef --compressor qsgd:levels=4 --error-feedback"
A variant of one flag is given the same way: --variant "--error-feedback".
A config file may hold the common keys and a list `variants:` of mappings of keys.
With --seeds 0,1,2 every variant runs once per seed (folders VARIANT-seedS); comparison.md adds, per
variant, the mean, standard deviation and range of its final losses and accuracy over the seeds, and
its paired difference from the first variant (seed by seed: the same initial model and batches), so
that a 1 % difference can be told from seed-to-seed noise; the plot shows the mean curves."""


# what the run flags that name OUT, its files and its runs are in a comparison: OUT holds the table,
# and each variant's run is in OUT/<variant>/ (variant_folder)
HELPS = {
    "out": "comparison folder: comparison.md, comparison.csv, comparison.png, report.html, and each variant's run "
           "in OUT/<variant>/ (its label, --name or algorithm + compressor, as a folder name)",
    "overwrite": "replace the comparison already in OUT: each variant's run, and the table; the folders of its "
                 "variants this one lacks go once the new table is written (those its comparison.csv names: a "
                 "comparison stopped before its table leaves them)",
    "resume": "continue the comparison in OUT: each variant from its checkpoint, or from step 0 where it has none; "
              "one that finished its --steps is kept (refused when OUT holds none of the variants' runs)",
    "resume_or_start": "as --resume, but a folder that holds none of the variants' runs starts the comparison",
    "checkpoint_every": "each variant saves a checkpoint every K steps into OUT/<variant>/checkpoint (0 = never)",
    "tensorboard": "also write each variant's scalars to OUT/<variant>/tensorboard (needs tensorboard)",
    "curves": "draw each variant's OUT/<variant>/curves.png at the end (comparison.png is drawn either way; "
              "--no-curves: gradwire report can, later)",
}


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="run several variants and write a side-by-side report",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run variants (on the same task, seed and partition unless a variant sets "
                       "its own); writes comparison.md, comparison.csv, comparison.png and report.html into --out.")
    add_run_flags(p, helps=HELPS, shown_defaults={"out": "a fresh runs/compare-<YYYYmmdd-HHMMSS>"})
    p.add_argument("--variant", action="append", help="run flags of one variant (quoted); repeatable; a single "
                   "flag is a value too: --variant \"--error-feedback\" (or --variant=--error-feedback)")
    p.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="run every variant once per seed (e.g. 0,1,2; instead of --seed: not both) and add each "
                        "variant's mean, spread and paired difference from the first variant over the seeds")
    p.add_argument("--html", action=argparse.BooleanOptionalAction, default=True,
                   help="also write report.html, the whole comparison on one self-contained page (default: yes)")
    p.set_defaults(command_main=main)


def variants_of(ns, parser: argparse.ArgumentParser | None = None) -> tuple[RunConfig, list[RunConfig]]:
    """The common config and one config per variant (per seed with --seeds), each checked; ``parser``
    reads a --variant's flags (default: the run flags)."""
    parser = parser or run_parser("gradwire compare --variant")
    common = config_from_args(ns)
    specs: list[RunConfig] = []
    own_seed: list[bool] = []  # whether the variant sets its own seed (which --seeds would override)
    file_variants = read_config_file(ns.config).get("variants", []) if getattr(ns, "config", None) else []
    if not isinstance(file_variants, list):
        raise ConfigError(f"'variants' in {ns.config} must be a list of mappings of config keys, "
                          f"got {type(file_variants).__name__} {file_variants!r}")
    for v in file_variants:
        if not isinstance(v, dict):
            raise ConfigError(f"each entry of 'variants' in {ns.config} must be a mapping of config keys")
        _refuse_comparison_keys(v, f"a variant in {ns.config}")
        specs.append(from_mapping(v, common))
        own_seed.append("seed" in v)
    for text in ns.variant or []:
        if not text.strip():  # as plan's --candidate: a variant of no flags repeats the common ones, unseen
            raise ConfigError(f"--variant {text!r} gives no run flags; give the flags that make the variant differ "
                              "from the common ones, e.g. --variant \"--algorithm sync:backups=2\"")
        sub = parse_flag_string(parser, text, "--variant")
        _refuse_comparison_keys(vars(sub), f"--variant {text!r}")
        if sub.config:
            _refuse_comparison_keys(read_config_file(sub.config), f"--variant {text!r}'s {sub.config}")
        specs.append(config_from_args(sub, common))
        own_seed.append("seed" in vars(sub) or bool(sub.config and "seed" in read_config_file(sub.config)))
    if not specs:
        raise ConfigError("compare needs at least one --variant (or a 'variants' list in the config file)")
    labels = [c.label() for c in specs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"variants share the label(s) {dupes}; give each a distinct --name")
    folders: dict[str, str] = {}
    for label in labels:  # one folder per variant: labels that differ only where _slug rewrites would share one
        other = folders.setdefault(variant_folder(label).casefold(), label)
        if other != label:
            raise ConfigError(f"variants {other!r} and {label!r} would share the folder {variant_folder(label)!r}; "
                              "give them names that differ in letters or digits")
    if not out_given(ns):
        common = common.replace(out=fresh_out("compare", common))
    require_named(common.out)
    root = Path(common.out)
    seeds = seeds_of(ns)
    if seeds and getattr(ns, "seed", None) is not None:  # --seed on the command line; --seeds there or in --config
        raise ConfigError(f"--seeds {','.join(map(str, seeds))} runs every variant once per seed, which replaces "
                          f"--seed {ns.seed}: "
                          "give one of them")
    if seeds:
        pinned = [c.label() for c, own in zip(specs, own_seed, strict=True) if own]
        if pinned:
            raise ConfigError(f"variant(s) {pinned} set their own seed; with --seeds every variant runs every "
                              f"seed ({','.join(map(str, seeds))}): drop the variant's seed")
    if len(seeds) > 1:  # seed-major: an interrupted comparison leaves whole seeds, every variant paired
        specs = [c.replace(seed=s, name=f"{c.label()} seed {s}", out=str(root / variant_folder(c.label(), s)))
                 for s in seeds for c in specs]
    else:  # one seed (--seeds 5: as --seed 5) or none
        specs = [c.replace(out=str(root / variant_folder(c.label())), **({"seed": seeds[0]} if seeds else {}))
                 for c in specs]
    for c in specs:
        c.check_values()  # before torch is imported (the second stage's modules import it)
    from gradwire.run.combination import check_combination, check_started_here

    for c in specs:  # every variant before any runs: a later one's error must not stop the comparison halfway
        check_combination(c)
        check_started_here(c)
    return common, specs


# keys a comparison sets for all its variants: where each writes (OUT/<its name>) and whether the
# folders are replaced or continued
COMPARISON_KEYS = ("out", *FOLDER_MODE_KEYS)


def _refuse_comparison_keys(given: dict, where: str) -> None:
    """A variant that sets a key the comparison sets for every variant (it was ignored)."""
    keys = {str(k).replace("-", "_"): v for k, v in given.items()}  # a file may spell them resume-or-start
    own = [k for k in COMPARISON_KEYS if keys.get(k) not in (None, False)]
    if own:
        flags = ", ".join("--" + k.replace("_", "-") for k in own)
        raise ConfigError(f"{where} sets {flags}, which the comparison sets for every variant (each runs in "
                          "OUT/<its name>; --name names it): give it to compare itself, not to one variant")


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
    refuse_other_kind(root, "comparison")  # --overwrite would replace a comparison, not a run
    if not (root / "comparison.md").exists():  # not a comparison yet: its subfolders are the variants' alone,
        # or (--overwrite, --resume) an interrupted comparison's, whose variants or seeds may have changed
        refuse_others(root, own=tuple(Path(c.out).name for c in specs), runs=not (common.overwrite or common.resuming))
    if (root / "comparison.md").exists() and not (common.overwrite or common.resuming):
        raise ConfigError(f"compare folder {root} already holds a comparison (comparison.md); pass --overwrite "
                          "to replace it or --resume to continue its runs (or choose another --out)")
    for c in specs:
        refuse_existing(Path(c.out), overwrite=c.overwrite, resume=c.resuming)


def resumed_variants(common: RunConfig, specs: list[RunConfig]) -> list[RunConfig]:
    """compare --resume continues a comparison: each variant from its checkpoint, or from step 0
    where it has none (it had not started, or saved no checkpoint); one that finished is kept as it
    is. A folder holding none of the variants' runs has nothing to resume (--resume-or-start starts it),
    and a variant that finished without a checkpoint cannot go on to more --steps nor with other
    settings (check_resume's reasons, each named with its variant): all refused before any variant runs."""
    if not common.resume or common.resume_or_start:
        return specs
    if not any(holds_run(Path(c.out)) for c in specs):
        raise ConfigError(f"resume=true: nothing to resume: compare folder {common.out} holds none of the variants' "
                          "runs; check --out, or pass --resume-or-start to start the comparison (--resume)")
    specs = [c.replace(resume=False, resume_or_start=True) for c in specs]
    from gradwire.run.combination import resolved
    from gradwire.run.loop import check_resume

    for c in specs:  # before any variant runs: one that cannot continue stops the comparison here, not halfway
        try:  # resolved, as the run checks it: config.json holds the algorithm's --lr, --momentum, --lr-schedule
            check_resume(resolved(c))
        except AlreadyFinished:
            pass
        except NoCheckpointToContinue as e:  # (its own message names --resume-or-start, which compare gives it)
            raise ConfigError(f"resume=true: variant {c.label()!r} finished at step {e.steps} in {c.out} and saved "
                              f"no checkpoint, so it cannot go on to --steps {c.steps}; run the comparison again with "
                              "--overwrite, or choose another --out (--resume)") from None
        except ConfigError as e:  # other settings than its run's, fewer --steps than it finished
            raise ConfigError(f"variant {c.label()!r}: {e}") from None
        try:  # a checkpoint written with other settings (checkpoint.load's own check, here before any run)
            checkpoint_fits(resolved(c))
        except ConfigError as e:
            raise ConfigError(f"variant {c.label()!r}: {e} (--resume)") from None
    return specs


def checkpoint_fits(cfg: RunConfig) -> None:
    """ConfigError where the latest checkpoint in ``cfg.out`` was written by another configuration
    (what resuming from it would refuse once loading: a variant's after the earlier variants ran)."""
    from gradwire import checkpoint

    stepdir = checkpoint.latest(Path(cfg.out) / "checkpoint")
    files = sorted(stepdir.glob("*.pt")) if stepdir is not None else []
    if files:
        checkpoint.load(stepdir, files[0].stem, cfg.to_dict())


def variant_folder(label: str, seed: int | None = None) -> str:
    """The folder compare gives the variant ``label``: ``slug(label)``, or with --seeds one per seed,
    ``slug(label)-seedS`` (its run then labelled ``"label seed S"``)."""
    return slug(label) if seed is None else f"{slug(label)}-seed{seed}"


def variant_folder_names(run_label: str) -> set[str]:
    """The folders :func:`variant_folder` may have given the run labelled ``run_label`` (a variant's
    label, or a seed's run of it, ``"X seed S"``)."""
    names = {variant_folder(run_label)}
    seeded = re.fullmatch(r"(.*) seed (\d+)", run_label)
    if seeded:
        names.add(variant_folder(seeded[1], int(seeded[2])))
    return names


def stale_variant_dirs(root: Path, specs: list[RunConfig]) -> list[tuple[Path, str]]:
    """With --overwrite: the variant folders of the comparison in ``root`` that this one does not
    write, each with its label, as that comparison's own record names them: for each label of its
    comparison.csv, only the folder compare itself gave that label (``variant_folder_names``), and only
    where that folder holds a run of that label. They go once this comparison's table replaces the
    record (each checked again then). A run of the user's in the folder (another name), a link, or a comparison
    stopped before its table (no record) is never among them."""
    from gradwire.report.pages import table_labels

    if not root.is_dir():
        return []
    new = {Path(c.out).name.casefold() for c in specs}  # casefold: one folder on a case-insensitive disk
    return sorted((root / name, label) for label in table_labels(root / "comparison.csv") or []
                  for name in variant_folder_names(label)
                  if name.casefold() not in new and holds_run_labelled(root / name, label))


# what a comparison's title says of the variants' setting, where they all share it
TITLE_KEYS = {"task": "{}", "workers": "{} workers", "stragglers": "{} stragglers", "network": "{}"}


def comparison_title(specs: list[RunConfig]) -> str:
    """The comparison's title: the task, workers, stragglers and network the variants share, then
    those they differ in (the common flags' values would describe no variant that sets its own)."""
    shared, varies = [], []
    for key, form in TITLE_KEYS.items():
        values = {getattr(c, key) for c in specs}
        if len(values) == 1:
            shared.append(form.format(values.pop()))
        else:
            varies.append(key)
    return ", ".join([*shared, *([f"variants differ in {' and '.join(varies)}"] if varies else [])])


def main(ns) -> int:
    common, specs = variants_of(ns)
    refuse_to_replace(common, specs)
    specs = resumed_variants(common, specs)
    from gradwire.report.compare import write_report
    from gradwire.run.loop import run

    root = Path(common.out)
    stale = stale_variant_dirs(root, specs) if common.overwrite else []
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
    title = comparison_title(specs)
    labels = None
    if len(seeds) > 1:  # the variants' own labels: those of the first seed's runs, less " seed S"
        labels = [c.label().removesuffix(f" seed {seeds[0]}") for c in specs[:len(specs) // len(seeds)]]
    files = write_report(root, summaries, [Path(c.out) for c in specs], title, seeds=seeds, labels=labels)
    # the comparison just replaced had these, this one has not; each still holds its run of its old label
    remove_replaced([folder for folder, label in stale if holds_run_labelled(folder, label)],
                    "comparison's variant folders", echo=lambda line: print(line, flush=True))
    print((root / "comparison.md").read_text())
    print(f"report: {files['markdown']}  plot: {files['plot']}")
    if ns.html:
        from gradwire.report.pages import write_report as write_html

        print(f"html: {write_html(root, [Path(c.out) for c in specs], title=f'gradwire comparison: {title}')}")
    return 0
