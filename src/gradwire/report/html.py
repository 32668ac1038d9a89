"""One self-contained HTML page from a list of blocks: no script, no external style sheet, every
image inlined as a base64 PNG, so the file opens from disk with no server and no network.

    from gradwire.report.html import Heading, Image, Paragraph, Table, write_page
    write_page("report.html", "My runs", [
        Heading("Summary"),
        Paragraph("Every number below is from summary.json."),         # text is escaped
        Table(["variant", "test acc"], [["sync", 0.91], ["async", 0.88]]),
        Image("curves.png", alt="loss against steps"),                 # a path or PNG bytes
    ])

Blocks: :class:`Heading` (text, level 2..4), :class:`Paragraph` (text), :class:`Preformatted`
(text in a monospace box), :class:`Table` (headers, rows; floats shown with 4 significant
digits), :class:`Image` (PNG path or bytes, alt text, optional caption) and :class:`Row` (blocks
side by side, wrapping on a narrow window). ``page(title, blocks)`` returns the HTML text.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2   # 2, 3 or 4 (the page's title is the only h1)


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Preformatted:
    text: str


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence]


@dataclass(frozen=True)
class Image:
    png: str | Path | bytes   # a PNG file, or its bytes
    alt: str
    caption: str = ""


@dataclass(frozen=True)
class Row:
    blocks: Sequence = field(default_factory=list)


# td/th overflow-wrap:anywhere: a long spec string or path (no spaces) may break inside, so a
# table as wide as its text shrinks to the page instead of running off it (a 1400-px window cut
# off the last variants of "where the variants differ")
STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1400px;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.3em}h2{margin-top:1.8em;font-size:1.3em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .6em;
text-align:right;vertical-align:top;overflow-wrap:anywhere}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
img{max-width:100%;height:auto;border:1px solid #eee}figure{margin:.8em 0}figcaption{font-size:.85em;color:#555}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em}
.table{overflow-x:auto}.row{display:flex;flex-wrap:wrap;gap:1.2em}.row>div{flex:1 1 420px;min-width:0}"""


def cell(value) -> str:
    """A table cell's text: None as an en dash, floats with 4 significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        return f"{value:.3e}" if (value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6)) else f"{value:.4g}"
    return str(value)


def png_bytes(png: str | Path | bytes) -> bytes:
    data = png if isinstance(png, bytes) else Path(png).read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"not a PNG image: {png if not isinstance(png, bytes) else 'the bytes given'}")
    return data


def render(block) -> str:
    esc = html.escape
    if isinstance(block, Heading):
        level = min(max(block.level, 2), 4)
        return f"<h{level}>{esc(block.text)}</h{level}>"
    if isinstance(block, Paragraph):
        return f"<p>{esc(block.text)}</p>"
    if isinstance(block, Preformatted):
        return f"<pre>{esc(block.text)}</pre>"
    if isinstance(block, Table):
        head = "".join(f"<th>{esc(str(h))}</th>" for h in block.headers)
        body = "".join("<tr>" + "".join(f"<td>{esc(cell(v))}</td>" for v in row) + "</tr>" for row in block.rows)
        return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    if isinstance(block, Image):
        data = base64.b64encode(png_bytes(block.png)).decode("ascii")
        caption = f"<figcaption>{esc(block.caption)}</figcaption>" if block.caption else ""
        return f'<figure><img src="data:image/png;base64,{data}" alt="{esc(block.alt, quote=True)}">{caption}</figure>'
    if isinstance(block, Row):
        return '<div class="row">' + "".join(f"<div>{render(b)}</div>" for b in block.blocks) + "</div>"
    raise TypeError(f"not a page block: {type(block).__name__} (Heading, Paragraph, Preformatted, Table, Image, Row)")


def page(title: str, blocks: Sequence) -> str:
    """The whole page: ``title`` as its <title> and <h1>, then every block in order."""
    body = "\n".join(render(b) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n"
            f"<body><h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def write_page(path: str | Path, title: str, blocks: Sequence) -> Path:
    """Write ``page(title, blocks)`` to ``path`` (atomically: a temp file, then a rename), making the
    folders above it that are missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(page(title, blocks), encoding="utf-8")
    tmp.replace(path)
    return path
