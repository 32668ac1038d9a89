"""``gradwire reproduce``: each implemented paper's headline experiment at small scale, judged.

One module per paper claim (``NAME``, ``TITLE``, ``CITATION``, ``STATEMENT``, a pure
``judge(measured) -> [Check]`` and ``run(out, scale) -> Claim``); ``run_claims`` runs the chosen
ones into ``OUT/<name>/`` and ``write_report`` writes ``claims.json`` (structured, for other
renderers: ``load_claims``) and ``reproduce.md`` (per claim: statement and citation, measurement
table, plot, verdict and reason). ``claim.py`` says how a verdict follows from the checks.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from gradwire.errors import ConfigError
from gradwire.reproduce import backup_workers, dagc, dasgd, diana_exact, diana_norms, dqsgd, lsgd_easgd, lsgd_symmetry
from gradwire.reproduce.claim import VERDICTS, Check, Claim, Scale, met

__all__ = ["CLAIMS", "Check", "Claim", "Scale", "load_claims", "run_claims", "select", "write_report"]

CLAIMS = {m.NAME: m for m in (backup_workers, diana_exact, diana_norms, lsgd_symmetry, lsgd_easgd, dagc, dqsgd, dasgd)}


def select(only: str | None) -> list[str]:
    """The claims named in ``only`` (comma-separated; all when None), in the registry's order; an
    ``only`` that names none (``""``, ``","``) is refused, not read as all."""
    if only is None:
        return list(CLAIMS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--only {only!r} names no claim; valid: {', '.join(CLAIMS)}")
    bad = [n for n in names if n not in CLAIMS]
    if bad:
        raise ConfigError(f"unknown claim {', '.join(map(repr, bad))} for --only; valid: {', '.join(CLAIMS)}")
    return [n for n in CLAIMS if n in names]


def recorded_claim_dirs(out: Path) -> list[Path]:
    """The claims' folders of the reproduction in ``out`` as its claims.json names them ([] where there
    is none, or it cannot be read): ``out/<claim name>/``."""
    try:
        recorded = json.loads((Path(out) / "claims.json").read_text()).get("claims", [])
        names = [c["name"] for c in recorded]
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return []
    return [Path(out) / n for n in names if isinstance(n, str) and n not in ("", ".", "..") and "/" not in n
            and (Path(out) / n).is_dir() and not (Path(out) / n).is_symlink()]  # a link: not the claim's own


def run_claims(out: Path, *, quick: bool, names: list[str] | None = None,
               echo: Callable[[str], None] = lambda s: None) -> list[Claim]:
    """Run the named claims (all by default) into ``out/<name>/`` and return them. A claim whose
    experiment raises is returned with verdict ``error`` (never ``not``: nothing was measured) and
    the exception as its reason, its traceback in ``measured``."""
    scale, claims = Scale(quick=quick), []
    names = names or list(CLAIMS)
    for i, name in enumerate(names, 1):
        module = CLAIMS[name]
        echo(f"[{i}/{len(names)}] {name}: {module.TITLE}")
        started = time.perf_counter()
        try:
            claim = module.run(out / name, scale)
        except Exception as e:  # noqa: BLE001 - reported as the claim's outcome, not hidden
            claim = Claim(name, module.TITLE, module.CITATION, module.STATEMENT, setup="(failed)", columns=[],
                          rows=[], checks=[], verdict="error", reason=f"the experiment raised {type(e).__name__}: {e}",
                          measured={"error": traceback.format_exc(limit=3)})
        claim.wall_time_s = time.perf_counter() - started
        claim.plot = f"{name}/{claim.plot}" if claim.plot else None
        claim.runs = f"{name}/{claim.runs}" if claim.runs else None
        echo(f"  {claim.verdict} ({claim.wall_time_s:.0f} s)")
        claims.append(claim)
    return claims


def write_report(out: Path, claims: list[Claim], *, quick: bool, command: str, wall_time_s: float) -> dict[str, Path]:
    """``claims.json``, ``reproduce.md`` and ``report.html`` (the same content, plots inlined) in ``out``."""
    from gradwire import version

    meta = {"gradwire_version": version(), "mode": "quick" if quick else "full", "command": command,
            "wall_time_s": wall_time_s, "written": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    (out / "claims.json").write_text(json.dumps(meta | {"claims": [c.to_dict() for c in claims]}, indent=1,
                                                default=_json_default) + "\n")
    (out / "reproduce.md").write_text(markdown(claims, meta))
    write_html(out, claims, meta)
    return {"json": out / "claims.json", "markdown": out / "reproduce.md", "html": out / "report.html"}


def write_html(out: Path, claims: list[Claim], meta: dict) -> Path:
    """``out/report.html``: one self-contained page (report/html.py), per claim the paper's
    statement with its citation, the measurement table, the plot, the verdict and every criterion."""
    from gradwire.report.html import Heading, Image, Paragraph, Table, write_page

    counts = ", ".join(f"{n} {v}" for v, n in ((v, sum(c.verdict == v for c in claims)) for v in VERDICTS))
    blocks: list = [Paragraph(f"{meta['command']} - gradwire {meta['gradwire_version']}, {meta['written']}, "
                              f"{meta['wall_time_s']:.0f} s of wall time. Verdicts: {counts}. All criteria met is "
                              "reproduced, none is not, some is partly; a failed precondition is not; error: the "
                              "experiment raised, nothing was judged."),
                    Table(["claim", "paper", "verdict", "criteria met", "wall time (s)"],
                          [[f"{c.title} ({c.name})", short_citation(c.citation), c.verdict,
                            met(c.checks) if c.checks else None, round(c.wall_time_s)] for c in claims])]
    for c in claims:
        blocks += [Heading(f"{c.title} ({c.name}): {c.verdict}"), Paragraph(f"Paper: {c.citation}."),
                   Paragraph(f"Claim: {c.statement}"), Paragraph(f"Set-up: {c.setup}.")]
        if c.rows:
            blocks.append(Table(c.columns, c.rows))
        if c.plot and (out / c.plot).exists():
            blocks.append(Image(out / c.plot, alt=f"{c.name}: {c.title}"))
        blocks.append(Table(["criterion", "met", "measured", "why not"],
                            [[("precondition: " if k.precondition else "") + k.criterion, "yes" if k.passed else "NO",
                              k.detail, "" if k.passed else k.if_failed] for k in c.checks])
                      if c.checks else Paragraph(f"Verdict: {c.verdict}. {c.reason}"))
        blocks += [Paragraph(f"Note: {n}") for n in c.notes]
    return write_page(out / "report.html", f"gradwire reproduce ({meta['mode']})", blocks)


def load_claims(folder: Path | str) -> list[Claim]:
    """The claims a ``gradwire reproduce`` run wrote into ``folder/claims.json``."""
    data = json.loads((Path(folder) / "claims.json").read_text())
    return [Claim(**(c | {"checks": [Check(**k) for k in c["checks"]]})) for c in data["claims"]]


def verdict_table(claims: list[Claim]) -> str:
    lines = ["| claim | paper | verdict | criteria met | wall time (s) |", "|---|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {c.title} (`{c.name}`) | {short_citation(c.citation)} | **{c.verdict}** | "
                     f"{met(c.checks) if c.checks else '–'} | "
                     f"{c.wall_time_s:.0f} |")
    return "\n".join(lines)


def markdown(claims: list[Claim], meta: dict) -> str:
    counts = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    parts = [f"# gradwire reproduce ({meta['mode']})", "",
             f"`{meta['command']}`, gradwire {meta['gradwire_version']}, {meta['written']}, "
             f"{meta['wall_time_s']:.0f} s of wall time. Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items())
             + ". A verdict follows from the criteria below each claim, stated before measuring: all met is "
             "*reproduced*, none is *not*, some is *partly*; a failed precondition (a comparison that is not "
             "fair, e.g. unequal bytes) is *not*; *error* means the experiment raised, so nothing was judged. "
             "Criteria met counts the claim's own criteria.", "",
             verdict_table(claims), ""]
    for c in claims:
        parts += [f"## {c.title} (`{c.name}`)", "", f"**Paper.** {c.citation}.", "", f"**Claim.** {c.statement}", "",
                  f"**Set-up.** {c.setup}.", ""]
        if c.rows:
            parts += [_row(c.columns), "|" + "---|" * len(c.columns)] + [_row(row) for row in c.rows]
            parts.append("")
        if c.plot:
            parts += [f"![{c.name}]({c.plot})", ""]
        parts.append(f"**Verdict: {c.verdict}.**" + ("" if c.checks else f" {c.reason}"))
        parts.append("")
        for k in c.checks:
            line = (f"- {'met' if k.passed else '**not met**'}: {'precondition: ' * k.precondition}{k.criterion} "
                    f"({k.detail})")
            parts.append(line + (f". Why: {k.if_failed}." if not k.passed and k.if_failed else ""))
        parts += [f"- Note: {n}" for n in c.notes]
        if c.runs:
            parts.append(f"- Runs: `{c.runs}/` (each with config.json, metrics.jsonl, summary.json"
                         + ("; comparison.md beside them)." if meta["mode"] == "full" else ")."))
        parts.append("")
    return "\n".join(parts)


def _row(cells) -> str:
    return "| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |"


def short_citation(citation: str) -> str:
    """"J. Chen, X. Pan, ... 2016, ..." -> "Chen et al. 2016"."""
    import re

    year = re.search(r"\b(?:19|20)\d\d\b", citation)
    return f"{citation.split(',')[0].split()[-1]} et al. {year.group(0) if year else ''}".strip()


def _json_default(x):
    return float(x) if hasattr(x, "__float__") else str(x)
