"""``gradwire reproduce``: each implemented paper's headline experiment, small, judged by criteria
stated in advance."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gradwire.cli.flags import fresh_out
from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.report.run_folder import refuse_other_kind, refuse_others, remove_replaced, require_named

EPILOG = """examples:
  gradwire reproduce --quick                         (every claim, small: about 1 min on 2 quiet cores)
  gradwire reproduce --only dagc,dqsgd --out runs/adaptive-claims
  gradwire reproduce --list                          (the claims' names and titles)
Writes OUT/claims.json, OUT/reproduce.md, a PNG per claim and each claim's run folders."""


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="run each implemented paper's headline experiment small and judge it",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run each paper's headline experiment at small scale on the simulator and "
                       "judge it by criteria stated in advance: reproduced, partly or not, with the reason.")
    p.add_argument("--quick", action="store_true",
                   help="smaller experiments (about 1 min on 2 quiet cores: docs/results.md)")
    p.add_argument("--out", help="output folder (default: a fresh runs/reproduce-<YYYYmmdd-HHMMSS>)")
    p.add_argument("--only", metavar="NAMES", help="comma-separated claims to run (default: all; see --list)")
    p.add_argument("--list", action="store_true", help="list the claims and exit")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a reproduction already in --out: the claims run, and the report; the folders of "
                        "its claims this one does not run (those its claims.json names) go once the report is written")
    p.set_defaults(command_main=main)


def main(ns) -> int:
    from gradwire import reproduce

    if ns.list:
        for name, module in reproduce.CLAIMS.items():
            print(f"{name:16} {module.TITLE} ({reproduce.short_citation(module.CITATION)})")
        return 0
    names = reproduce.select(ns.only)
    out = Path(ns.out if ns.out is not None else fresh_out("reproduce", RunConfig()))
    require_named(str(out))
    refuse_other_kind(out, "reproduction")  # --overwrite replaces a reproduction, not a run, comparison or plan
    refuse_others(out, own=tuple(reproduce.CLAIMS))  # (runs/: a folder of results, not one of its own)
    if (out / "claims.json").exists() and not ns.overwrite:
        raise ConfigError(f"{out} already holds a reproduction (claims.json); pass --overwrite or another --out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    stale = [d for d in reproduce.recorded_claim_dirs(out) if d.name not in names] if ns.overwrite else []
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    claims = reproduce.run_claims(out, quick=ns.quick, names=names, echo=lambda s: print(s, flush=True))
    command = " ".join(["gradwire reproduce"] + ["--quick"] * ns.quick + [f"--only {','.join(names)}"] * bool(ns.only))
    files = reproduce.write_report(out, claims, quick=ns.quick, command=command,
                                   wall_time_s=time.perf_counter() - started)
    # the replaced reproduction's claims that this one did not run (checked again now)
    remove_replaced([folder for folder in stale if folder.is_dir() and not folder.is_symlink()],
                    "reproduction's claim folders", echo=lambda line: print(line, flush=True))
    print(reproduce.verdict_table(claims))
    print(f"report: {files['markdown']}  claims: {files['json']}")
    return 1 if any(c.verdict == "error" for c in claims) else 0  # an experiment raised
