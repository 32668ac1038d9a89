"""``gradwire report``: one self-contained HTML page for a run folder or a comparison folder."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write report.html for a run folder or a comparison folder",
                       description="One self-contained HTML page (images inlined, no script, opens from disk): "
                       "config, summary, curves, the per-worker timeline, bytes and staleness; for a comparison "
                       "every variant side by side.")
    p.add_argument("folder", metavar="RUN_OR_COMPARISON_DIR", help="a run folder (gradwire run --out) or a "
                   "comparison folder (gradwire compare --out)")
    p.add_argument("--out", default=None, help="where to write the page (default: FOLDER/report.html)")
    p.set_defaults(command_main=main)


def main(ns) -> int:
    from gradwire.report.pages import write_report as write_html

    print(write_html(Path(ns.folder), out=ns.out,
                     warn=lambda text: print(f"gradwire report: warning: {text}", file=sys.stderr)))
    return 0
