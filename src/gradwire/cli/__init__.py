"""gradwire's command line: ``run``, ``compare``, ``plan``, ``report``, ``launch``, ``reproduce``, ``list``.

One module per command (``gradwire.cli.run``, ..., ``gradwire.cli.listing``), each with
``add_parser(sub)`` and ``main(ns)``; the run flags, which the commands and the benchmarks share,
are in ``gradwire.cli.flags``; ``gradwire.cli.supervise`` is the per-process supervisor that
``gradwire launch`` has torchrun start. Every ``run`` flag is a key of the run config (see
``gradwire run --help``); a YAML or TOML file given with ``--config`` holds the same keys and flags
override it.

This module imports the command modules only when a parser is built, so that the supervisor
(``python -m gradwire.cli.supervise``) starts without them; no command imports torch before its
arguments are checked.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

# each command's module, in the order of `gradwire --help` (``list`` is in ``listing``: a submodule
# named ``list`` would shadow the builtin in this package's namespace once imported)
COMMANDS = {"run": "run", "compare": "compare", "plan": "plan", "report": "report", "launch": "launch",
            "reproduce": "reproduce", "list": "listing"}


def build_parser() -> argparse.ArgumentParser:
    """The ``gradwire`` parser: one sub-parser per command, whose namespace carries the command's
    ``main`` as ``command_main``."""
    from importlib import import_module

    from gradwire import version
    from gradwire.cli.flags import Parser

    parser = Parser(prog="gradwire", description="Communication-efficient, straggler-tolerant distributed "
                    "training: compare algorithms and compressors on a simulated cluster.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMANDS.values():
        import_module(f"gradwire.cli.{module}").add_parser(sub)
    return parser


# options whose value is a quoted list of run flags: ``--variant "--error-feedback"`` is one value, not
# an option, so it is read as ``--variant=--error-feedback`` (argparse takes a word that starts with a
# dash for an option, "expected one argument")
FLAG_LIST_OPTIONS = ("--variant", "--candidate")


def join_flag_lists(argv: list[str]) -> list[str]:
    """``argv`` with each ``--variant X`` / ``--candidate X`` written ``--variant=X`` (up to a bare
    ``--``, after which the words are another command's: ``gradwire launch ... -- run ...``)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return out + argv[i:]
        if word in FLAG_LIST_OPTIONS and i + 1 < len(argv):
            out.append(f"{word}={argv[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    from gradwire.errors import CommunicationError, ConfigError, DivergenceError

    ns = build_parser().parse_args(join_flag_lists(list(sys.argv[1:] if argv is None else argv)))
    try:
        code = ns.command_main(ns)
        sys.stdout.flush()  # here, so that a closed pipe is seen below and not at exit
        return code
    except BrokenPipeError:  # `gradwire list | head`: the reader has gone; no traceback
        _drop_stdout()
        return 128 + signal.SIGPIPE  # as a command killed by SIGPIPE ends (the shell's 141)
    except ConfigError as e:
        _refuse(f"gradwire {ns.command}: error: {e}", ns.command)
        return 2
    except DivergenceError as e:
        print(f"gradwire {ns.command}: diverged: {e} (metrics so far are in the run folder)", file=sys.stderr)
        return 3
    except CommunicationError as e:
        print(f"gradwire {ns.command}: communication error: {e}", file=sys.stderr)
        return 4
    except KeyboardInterrupt as e:  # SIGTERM or SIGINT: the run wrote its summary ("stopped")
        return _stopped(ns.command, e)


def _refuse(line: str, command: str) -> None:
    """The one line of a refused configuration, on stderr; a run under ``gradwire launch`` adds it to
    the launcher's note of refusals instead, and the launcher prints each different line once (every
    process of the group refuses alike: N processes printed it N times)."""
    from gradwire.cli.supervise import REFUSED_ENV

    refused = os.environ.get(REFUSED_ENV)
    if command == "run" and refused:
        try:
            with open(refused, "a") as f:  # one short write in append mode: the processes' lines do not mix
                f.write(line + "\n")
            return
        except OSError:
            pass
    print(line, file=sys.stderr)


def _drop_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so that Python's own flush at exit finds
    nowhere to fail (the Python docs' recipe, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _stopped(command: str, e: KeyboardInterrupt) -> int:
    """One line on stderr for a run ended by a signal; the exit status is 128 + the signal."""
    from gradwire.errors import Stopped

    if not isinstance(e, Stopped) or e.step is None:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        print(f"gradwire {command}: stopped by {signal.Signals(signum).name} (metrics so far are in the run folder)",
              file=sys.stderr)
        return 128 + signum
    resume = (f"--resume continues from step {e.checkpoint_step}" if e.checkpoint_step is not None
              else "no checkpoint to resume from")
    written = f"{Path(e.out) / 'summary.json'} written" if e.out is not None else "rank 0 writes the summary"
    print(f"gradwire {command}: stopped by {signal.Signals(e.signum).name} at step {e.step}; {written}; {resume}",
          file=sys.stderr)
    return 128 + e.signum
