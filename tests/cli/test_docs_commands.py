"""Every `gradwire` command written in docs/*.md and README.md (shell blocks, and spans of prose)
still parses and
passes the checks a run makes before it starts (the parser, the resolved configuration,
`check_combination`; a comparison's variants; a launch's torchrun command line), and every row
that a documented `time_to_quality.py` command names exists. Nothing is run: this catches a doc
that drifted from the flags, spec keys and rows (README's own lines run end to end in
test_documented_examples.py). A command with a placeholder (`...`, `$VAR`, an upper-case word
such as ALGORITHM or HOST) is left out: it is not meant to run as written; a span of prose that
names a flag without its value is a mention, not a command; a command the docs show refused must
still be refused."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from gradwire.cli import build_parser, join_flag_lists
from gradwire.cli.flags import config_from_args, parse_flag_string, run_parser
from gradwire.errors import ConfigError
from gradwire.run.combination import check_combination
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"\.\.\.|\$|<|\b[A-Z][A-Z_0-9]*\b")
# commands the docs show being refused (docs/robustness.md's table): each must still be refused
SHOWN_REFUSED = {("run", "--wokers", "4")}
# a span of prose that names a flag (`gradwire run --lr-schedule`) rather than giving a command
MENTION = ("expected one argument", "the following arguments are required", "launch needs a run command")
ENV = re.compile(r"^[A-Z_]+=\S*$")
SUBCOMMANDS = ("run", "compare", "plan", "report", "launch", "reproduce", "list")


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each command in the ```bash (or ```sh, or unlabelled) blocks:
    continuation lines joined, comments cut, `;` and `&&` lists and `for ... do` split."""
    lines, out, fenced, language, start, pending = text.splitlines(), [], False, "", 0, ""
    variables: dict[str, str] = {}  # B=benchmarks/time_to_quality.py, O="--out ...": the doc's, from where set
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            fenced, language = not fenced, line.strip()[3:].strip()
            continue
        if not fenced or language not in ("bash", "sh", "console", ""):
            continue
        if not pending:
            start = number
        pending += " " + line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        for name, value in variables.items():
            pending = re.sub(rf"\$\{{?{name}\b\}}?", value, pending)
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:
            words = []
        pending = ""
        for word in words:
            if re.fullmatch(r"[A-Z]=\S+", word) or re.fullmatch(r"[A-Z]=.*\s.*", word):
                variables[word[0]] = word[2:].removesuffix(";")
        command: list[str] = []
        for word in [*words, ";"]:
            if word in (";", "&&", "||", "do", "done", "then", "fi") or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    command.append(word[:-1])
                if command:
                    out.append((start, shlex.join(command)))
                command = []
            else:
                command.append(word)
    return out


def inline_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each `...` span of the prose (outside the fenced blocks) that
    starts with a program's name: a span may wrap over lines."""
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [(prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
            for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose)
            if re.match(r"(gradwire|python3? -m gradwire|torchrun) ", " ".join(m.group(1).split()))]


def gradwire_argv(command: str) -> list[str] | None:
    """The command line after `gradwire` (or `python -m gradwire`, `torchrun ... -m gradwire`),
    environment assignments and `sudo` dropped; None for any other program."""
    words = shlex.split(command)
    while words and (ENV.match(words[0]) or words[0] in ("sudo", "time", "nice")):
        words = words[1:]
    if words[:1] in (["gradwire"], [".venv/bin/gradwire"]):
        return words[1:]
    if "-m" in words and words.index("-m") + 1 < len(words) and words[words.index("-m") + 1] == "gradwire" \
            and Path(words[0]).name in ("python", "python3", "torchrun"):
        return words[words.index("-m") + 2:]
    return None


def documented() -> list[tuple[str, list[str], bool]]:
    """(doc:line, argv after `gradwire`, whether it is a span of prose) of every documented command."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for inline, commands in ((False, shell_lines(text)), (True, inline_commands(text))):
            for number, command in commands:
                try:
                    argv = gradwire_argv(command)
                except ValueError:  # a span that is not a whole command line (an unclosed quote)
                    continue
                if not argv or (len(argv) == 1 and argv != ["list"]):  # another program, or a name in prose
                    continue
                argv = [w[1:-1] if w.startswith("[") and w.endswith("]") else w for w in argv]  # [--optional]
                if argv[0] in SUBCOMMANDS and not PLACEHOLDER.search(" ".join(argv)):
                    found.append((f"{doc.relative_to(ROOT)}:{number}", argv, inline))
    return found


COMMANDS = documented()


def check(argv: list[str]) -> None:
    """Raise (ConfigError, SystemExit) where `gradwire ARGV` would refuse before running."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            ns = build_parser().parse_args(join_flag_lists(argv))
        except SystemExit as e:
            if e.code == 0:  # --help
                raise
            raise ConfigError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(e)) from e
    if argv[0] in ("run", "compare"):
        config = config_from_args(ns)
        check_combination(config)
        for text in getattr(ns, "variant", None) or []:
            check_combination(config_from_args(parse_flag_string(run_parser("variant"), text, "--variant"), config))
    elif argv[0] == "launch":  # the run command after --, checked as launch checks it (backend torch, P)
        from gradwire.cli.launch import torchrun_argv

        torchrun_argv(ns)


def test_the_documented_commands_are_found():
    places = {where.split(":")[0] for where, _, _ in COMMANDS}
    assert len(COMMANDS) >= 50, len(COMMANDS)
    assert {"README.md", "docs/robustness.md", "docs/diloco.md", "docs/torch_backend.md"} <= places
    assert {argv[0] for _, argv, _ in COMMANDS} >= {"run", "compare", "report", "launch", "plan", "reproduce"}
    shown = {tuple(argv) for _, argv, _ in COMMANDS}
    assert SHOWN_REFUSED <= shown, SHOWN_REFUSED - shown


@pytest.mark.parametrize("where,argv,inline", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_a_documented_command_passes_the_checks_before_a_run(where, argv, inline, data_dir, tmp_path):
    shown_refused = tuple(argv) in SHOWN_REFUSED
    argv = [w for w in argv if w != "--resume"]  # refused without its folder: the flags are checked
    if "--out" in argv[:-1]:  # a fresh folder: none of this checkout's runs/ decides
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
    try:
        check(argv)
    except SystemExit as e:
        if e.code != 0:  # 0: --help
            raise
    except ConfigError as e:
        if shown_refused or (inline and any(m in str(e) for m in MENTION)):
            return
        pytest.fail(f"{where}: gradwire {shlex.join(argv)}\n  {e}")
    else:
        assert not shown_refused, f"{where}: the docs show gradwire {shlex.join(argv)} refused, and it passes"


def test_the_rows_that_time_to_quality_commands_name_exist():
    bench = load_script(ROOT / "benchmarks" / "time_to_quality.py", "time_to_quality_rows_check")
    named = []
    for doc in DOCS:
        for number, command in shell_lines(doc.read_text()):
            words = shlex.split(command)
            if any(w.endswith("time_to_quality.py") for w in words) and "--rows" in words:
                value = words[words.index("--rows") + 1]
                if not PLACEHOLDER.search(value):
                    named += [(f"{doc.relative_to(ROOT)}:{number}", row) for row in value.split(",")]
    assert len(named) >= 100, len(named)
    missing = [f"{where}: {row}" for where, row in named if row not in bench.ROW]
    assert not missing, "\n".join(missing)


def test_a_stale_flag_or_spec_key_is_caught():
    """The check can fail: a flag that does not exist and a spec key of another name are refused."""
    with pytest.raises((ConfigError, SystemExit)):
        check(["run", "--task", "mnist1d-mlp", "--wokers", "4"])
    with pytest.raises(ConfigError):
        check(["run", "--algorithm", "diloco:inner_step=5"])
    assert isinstance(build_parser(), argparse.ArgumentParser)
