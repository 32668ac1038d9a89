"""gradwire's top-level modules import downwards only, and never in a cycle.

The layers, bottom to top (a module may import its own layer's package and any layer below):

 0. foundation: errors, spec, seeding, registries (a table of names, resolved on demand; registry_names,
    the specs' names and keys written down torch-free), checkpoint
    (the file format), report (leaf libraries: recorders such as the timeline that every layer
    writes into, and the pages that read run folders; report imports nothing but errors)
 1. config: typed values and names, each checked on its own (whether they combine is asked of the
    components by run/combination.py)
 2. tasks: data, models, partitions, gradient oracles
 3. kernels: fused Triton twins of the hot codecs
 4. compress: the byte compressors (encode/decode a real buffer), which dispatch to the kernels
 5. transports: the transport contract, its clocks and straggler models, the simulator, threads,
    torch.distributed, the network cost model and the byte ledger
 6. fault: fault tolerance on torchft above its transport (transports/ft.py, whose spec is
    transports/ft_spec.py): the replica driver, live state transfer, the fault-injection harness
 7. averaging: the mean over the participants (compressed mean, PowerSGD)
 8. algorithms: what a worker computes and sends, and how messages combine
 9. ddp: the DDP communication hook, a library entry point over averaging (above it, below any run)
10. parallel: tensor parallelism, whose layers talk through counted process-group collectives
11. servers: the drivers of a run's steps (collective, the simulated and the real server)
12. run: the run loop, which builds every layer below
13. plan, reproduce: commands' engines that make runs
14. cli, __main__: the command line: one module per command, the run flags the benchmarks share
    (cli/flags.py), and starting and supervising processes (cli/launch.py, cli/supervise.py:
    torchrun)

Data flows config -> task and partition -> algorithm -> averager/driver -> transport -> metrics
and reports; the import order differs only where a later stage is a contract or a recorder that
an earlier one holds (the transport contract, the timeline), which therefore sits lower.

Every import counts, the lazy ones inside functions too: a lazy upward import is still a
dependency, only a hidden one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gradwire

SRC = Path(gradwire.__file__).parent

LAYERS = [
    {"errors", "spec", "seeding", "registries", "registry_names", "checkpoint", "report", "__init__"},
    {"config"},
    {"tasks"},
    {"kernels"},
    {"compress"},
    {"transports"},
    {"fault"},
    {"averaging"},
    {"algorithms"},
    {"ddp"},
    {"parallel"},
    {"servers"},
    {"run"},
    {"plan", "reproduce"},
    {"cli", "__main__"},
]
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# Upward imports that remain, each to be removed by the change named beside it; this list only
# shrinks (a fixed one makes the test fail until its line is deleted, so the list stays true).
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def top_level(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def imported(path: Path, root: Path = SRC) -> set[str]:
    """The gradwire top-level modules that the file at ``path`` (under ``root``, the package's
    folder) imports, anywhere in it."""
    package = ["gradwire", *path.relative_to(root).parent.parts]  # what "." means in that file
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names = [base] if base != "gradwire" else [f"gradwire.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "gradwire" and len(parts) > 1:
                found.add(parts[1] if parts[1] in LAYER else "__init__")
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        source = top_level(path)
        graph.setdefault(source, set()).update(imported(path) - {source})
    return graph


def test_every_top_level_module_has_a_layer():
    modules = {top_level(p) for p in SRC.rglob("*.py")}
    assert modules - set(LAYER) == set(), "give each new top-level module a layer in LAYERS above"


def test_imports_go_down_the_layers():
    graph = import_graph()
    upward = {(a, b) for a, targets in graph.items() for b in targets if LAYER[b] > LAYER[a]}
    assert upward - ALLOWED_UPWARD == set(), "upward imports (move the code down, or invert the dependency)"
    assert ALLOWED_UPWARD - upward == set(), "fixed: delete these from ALLOWED_UPWARD"


def test_no_import_cycle():
    """No cycle, whatever the layers say (plan and reproduce share one), once the allowed upward
    imports are left out: each of those closes a cycle until it is removed."""
    graph = {a: {b for b in targets if (a, b) not in ALLOWED_UPWARD} for a, targets in import_graph().items()}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif len(path) < len(graph):
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []


def test_the_walk_sees_relative_lazy_and_package_imports(tmp_path):
    """The walker itself: each import form is found (a test that cannot fail is a defect)."""
    package = tmp_path / "gradwire"
    (package / "algorithms").mkdir(parents=True)
    code = ("from . import base\nfrom ..transports import sim\nimport torch\n"
            "def f():\n    import gradwire.cli\n    from gradwire import config, __version__\n")
    (package / "algorithms" / "x.py").write_text(code)
    (package / "algorithms" / "__init__.py").write_text("from .x import f\nfrom .. import registries\n")
    assert imported(package / "algorithms" / "x.py", package) == {"algorithms", "transports", "cli", "config",
                                                                 "__init__"}
    assert imported(package / "algorithms" / "__init__.py", package) == {"algorithms", "registries"}


# Where torch.distributed may be imported: the transports, and the entry points that run processes
# (the DDP hook is a user's comm hook; the cli's launch starts torchrun).
DISTRIBUTED_ALLOWED = {"transports", "ddp", "cli"}


def test_torch_distributed_stays_in_the_transports_and_entry_points():
    users = {top_level(p) for p in SRC.rglob("*.py")
             if any(isinstance(n, ast.Import | ast.ImportFrom) and "torch.distributed" in ast.unparse(n)
                    for n in ast.walk(ast.parse(p.read_text())))}
    assert users - DISTRIBUTED_ALLOWED == set()


# The modules that import gradwire code by name (importlib), which the walk above cannot see: the
# registries' table (layer 0, docs/ARCHITECTURE.md: a spec is checked by the component it names, a
# plug-in found through the table) and the cli's package, which loads its own subcommand modules.
BY_NAME_ALLOWED = {"registries.py", "cli/__init__.py"}


def imports_by_name(path: Path) -> bool:
    """Whether the file calls ``importlib.import_module`` or ``__import__`` (under any alias)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                return True
    return False


def test_imports_by_name_stay_in_the_registries_table_and_the_cli(tmp_path):
    users = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if imports_by_name(p)}
    assert users == BY_NAME_ALLOWED
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib as il\ndef f(n):\n    return il.import_module(n)\n")
    assert imports_by_name(probe)
    probe.write_text("import importlib\nx = importlib.util\n")
    assert not imports_by_name(probe)
