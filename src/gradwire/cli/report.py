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


def check_page_path(out: str) -> None:
    """``--out`` names a file whose folder exists or can be made: ConfigError otherwise, before the
    page is drawn (a folder given as the page, or a folder that cannot be made, was a traceback).
    Makes nothing: the page's writer makes the missing folders once the page is drawn."""
    from gradwire.config import check_out_folder
    from gradwire.errors import ConfigError

    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"--out {out!r} is a folder; name the page's file, e.g. {str(path / 'report.html')!r}")
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ConfigError(f"--out {out!r}: {str(above)!r} is a file, not a folder")
    try:
        check_out_folder(str(path.parent))  # writable, or creatable: probed with a temporary folder
    except ConfigError:
        raise ConfigError(f"--out {out!r}: its folder {str(path.parent)!r} cannot be made or written here") from None


def main(ns) -> int:
    from gradwire.report.pages import write_report as write_html

    if ns.out is not None:
        check_page_path(ns.out)
    print(write_html(Path(ns.folder), out=ns.out,
                     warn=lambda text: print(f"gradwire report: warning: {text}", file=sys.stderr)))
    return 0
