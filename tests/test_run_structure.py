"""The run holds one Driver and never asks which; only a transport writes its counters.

Read from the source (ast), in process: ``Run.train_step`` and the run loop (``_run``, ``_train``
of run/loop.py) contain no ``isinstance``/``hasattr``/``getattr`` on anything, save the loop's
``isinstance`` of the exception it caught, and use of the driver only through the methods of the
``Driver`` interface; and no module outside transports/ assigns a transport's counters.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import gradwire
from gradwire.servers.driver import Driver

SRC = Path(gradwire.__file__).parent
LOOP = SRC / "run" / "loop.py"
PROBES = {"isinstance", "hasattr", "getattr"}
COUNTERS = {"bytes_sent", "comm_time_s"}  # Transport's counters (transports/base.py)
INTERFACE = {name for name, _ in inspect.getmembers(Driver, inspect.isfunction) if not name.startswith("_")}


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's functions and its classes' methods, as NAME and CLASS.NAME."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            found |= {f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)}
    return found


def driver_questions(source: str, names: tuple[str, ...]) -> list[str]:
    """Where the functions ``names`` of ``source`` ask which driver they hold: a probe call (the
    caught exception's isinstance aside), or a use of ``.driver`` other than an interface method."""
    functions = _functions(ast.parse(source))
    problems = []
    for name in names:
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES:
                exception = node.func.id == "isinstance" and ast.unparse(node.args[0]) == "e"
                if not exception:
                    problems.append(f"{name}: {ast.unparse(node)}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "driver" and node.attr not in INTERFACE:
                problems.append(f"{name}: {ast.unparse(node)} is not a method of the Driver interface")
    return problems


def counter_writes(source: str) -> list[str]:
    """Assignments to a transport's counters in ``source`` (``x.transport.bytes_sent = ...``,
    ``transport.comm_time_s += ...``, ``setattr(transport, "bytes_sent", ...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Attribute) and leaf.attr in COUNTERS and "transport" in ast.unparse(leaf.value):
                    found.append(ast.unparse(node).splitlines()[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and "transport" in ast.unparse(node.args[0]) \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in COUNTERS:
            found.append(ast.unparse(node))
    return found


def test_the_run_never_asks_which_driver_it_holds():
    names = ("Run.train_step", "_run", "_train")
    assert driver_questions(LOOP.read_text(), names) == []
    assert {"step", "save_checkpoint", "before_evaluation", "finish", "train"} <= INTERFACE


def test_the_driver_check_catches_a_question():  # the check above can fail
    source = textwrap.dedent("""
        class Run:
            def train_step(self):
                if isinstance(self.driver, RealServer):
                    return self.driver.checkpoint_cut()
                return self.driver.step(1) if hasattr(self.driver, "step") else None
        def _run():
            return r.driver.queue
        def _train(r):
            try:
                pass
            except Exception as e:
                isinstance(e, KeyError)
    """)
    found = driver_questions(source, ("Run.train_step", "_run", "_train"))
    assert len(found) == 4, found  # isinstance, hasattr, checkpoint_cut, queue; not the exception's


def test_only_transports_write_their_counters():
    writes = {str(p.relative_to(SRC)): w for p in SRC.rglob("*.py")
              if p.relative_to(SRC).parts[0] != "transports" and (w := counter_writes(p.read_text()))}
    assert writes == {}
    caught = counter_writes("r.transport.bytes_sent = 0\nself.transport.comm_time_s += 1.0\n"
                            "setattr(transport, 'bytes_sent', 3)\nstate.bytes_sent += 4\n")
    assert len(caught) == 3, caught  # a DDP hook's own ledger (state.bytes_sent) is no transport's
