"""docs/ARCHITECTURE.md names real files: every `path.py` it cites exists under src/gradwire (so a
move or a rename that forgets the picture fails here), and its list of layers is the import test's."""

import re
from pathlib import Path

import gradwire
from tests.test_import_layers import LAYERS

SRC = Path(gradwire.__file__).parent
DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"


def test_every_cited_module_exists():
    text = DOC.read_text()
    cited = set(re.findall(r"([A-Za-z_][\w/]*\.py)\b", text))
    files = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")}
    missing = sorted(c for c in cited
                     if not any(f == c.removeprefix("gradwire/") or f.endswith("/" + c) for f in files)
                     and not c.startswith("tests/"))
    assert missing == []


def test_the_pictured_layers_are_the_tested_ones():
    text = DOC.read_text()
    picture = text[text.index("## The layers"):text.index("## One step")]
    for layer in LAYERS:
        for name in layer - {"__init__", "__main__"}:
            assert re.search(rf"\b{re.escape(name)}\b", picture), name


def test_the_pictured_layer_numbers_are_the_tested_ones():
    """Each numbered line of the picture names (first) a module of that layer of LAYERS."""
    text = DOC.read_text()
    picture = text[text.index("## The layers"):text.index("## One step")]
    numbered = re.findall(r"^\s*(\d+)\s+([\w.]+)", picture, flags=re.MULTILINE)
    assert len(numbered) == len(LAYERS)
    for number, name in numbered:
        name = name.removesuffix(".py")
        assert name in LAYERS[int(number)], (number, name)
