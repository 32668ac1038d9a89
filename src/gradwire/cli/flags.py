"""The run flags: every key of the run config as a flag, for the commands and the benchmarks alike.

A flag is the key with dashes (``batch_size`` -> ``--batch-size``); its help text is the comment
beside the field in ``RunConfig`` (one source of truth). Flags left out stay out of the namespace
(``argparse.SUPPRESS``), so :func:`config_from_args` tells a flag given from a default: a
``--config`` file's keys apply first and the flags given override them.

A benchmark takes its run flags from here rather than declaring its own::

    parser = argparse.ArgumentParser()
    add_run_flags(parser, only=("task", "workers", "steps"), defaults={"steps": 120})
    ns, cfg = parse_run_args(parser)          # cfg: a RunConfig; ns.steps etc. hold typed values

Nothing here imports torch: a mistyped value is reported at once (benchmarks/time_to_typo.py).
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import re
import shlex
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gradwire import config as config_mod
from gradwire.config import COMPARE_KEYS, FOLDER_MODE_KEYS, KEYS, RunConfig, coerce, from_mapping, read_config_file
from gradwire.errors import ConfigError


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, with no usage dump; ``help_hint``: where its
    help is, when it has no --help of its own (a --variant's flags are `gradwire run`'s)."""

    def __init__(self, *args, help_hint: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.help_hint = help_hint

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.help_hint or self.prog + ' --help'})\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but words no parser took are refused by the command's own parser (argparse
        leaves a sub-command's to the top parser: "gradwire: error: ... (see gradwire --help)"), with
        the command's flag that the first unknown one most resembles."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = self._command_parser(ns)
            close = owner.closest_flag(extras)
            owner.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; did you mean {close}?" if close else ""))
        return ns

    def _command_parser(self, ns: argparse.Namespace) -> Parser:
        """The parser of the sub-command ``ns`` ran (this one where it has none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(ns, action.dest, None) or "")
                if isinstance(chosen, Parser):
                    return chosen._command_parser(ns)
        return self

    def closest_flag(self, words: list[str]) -> str | None:
        """This parser's long flag closest to the first unknown flag in ``words`` (difflib), or None."""
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        for word in words:
            if word.startswith("--"):
                match = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.75)
                return match[0] if match else None
        return None


def flag_of(key: str) -> str:
    """The flag of run config key ``key``: ``batch_size`` -> ``--batch-size``."""
    return "--" + key.replace("_", "-")


def field_help() -> dict[str, str]:
    """The comment beside each RunConfig field is its --help text (one source of truth), with the
    comment lines under it whose ``#`` is in the same column (a comment that goes on)."""
    out, key, column = {}, None, -1
    for line in inspect.getsource(config_mod.RunConfig).splitlines():
        m = re.match(r"\s+(\w+):.*?(#\s*)(.*)$", line)
        if m and m.group(1) in KEYS:
            key, column = m.group(1), m.start(2)
            out[key] = m.group(3)
        elif key is not None and line.find("#") == column and not line[:column].strip():
            out[key] += " " + line[column + 1:].strip()
        else:
            key = None
    return out


# what the command line does when a flag is left out, where that is not the field's own default
SHOWN_DEFAULTS = {"out": "a fresh runs/<label>-<YYYYmmdd-HHMMSS>",
                  "lr": "the algorithm's", "momentum": "the algorithm's",
                  "lr_schedule": "the algorithm's, constant for most", "name": "algorithm + compressor",
                  "tensor_parallel": "none: each worker holds the whole model",
                  "owner_compressor": "--compressor's"}


# the flag of a swept key where its plural reads better (as ``gradwire compare --seeds``)
SWEEP_FLAGS = {"seed": "--seeds"}


class Sweep(argparse.Action):
    """Several values of one run key, typed at once: ``--workers 2 4`` or ``--workers 2,4``; the key is
    the flag's metavar (``metavar="SEED"``: each value a seed), a bad value one parser error."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, [coerce(self.metavar.lower(), part.strip()) for value in values
                                           for part in value.split(",") if part.strip()])
        except ConfigError as e:
            parser.error(f"{option_string}: {e}")


def add_run_flags(parser: argparse.ArgumentParser, *, only: Iterable[str] | None = None, skip: Iterable[str] = (),
                  defaults: Mapping[str, Any] | None = None, sweep: Iterable[str] = (),
                  helps: Mapping[str, str] | None = None, shown_defaults: Mapping[str, str] | None = None) -> None:
    """Add the run config's keys to ``parser`` as flags (``--config FILE`` with them).

    ``only=None`` (the commands): every key, less those in ``skip``; a flag left out stays out of
    the namespace. ``only=keys`` (a benchmark): those keys, each in the namespace with its value
    from ``defaults`` when given there (the benchmark's own scale), else the run config's default;
    no ``--config``. Keys in ``sweep`` take several values, one run each (``--workers 2 4`` or
    ``--workers 2,4``; the seeds' flag is ``--seeds``, dest ``seeds``), typed as they are read.
    ``helps`` says what a key is in the caller, where it says more than the run config's comment,
    and ``shown_defaults`` what the caller does when its flag is left out, where that is not
    :data:`SHOWN_DEFAULTS`. :func:`parse_run_args` types the others and builds the run config."""
    keys = list(KEYS) if only is None else list(only)
    sweep = set(sweep)
    unknown = [k for k in [*keys, *(defaults or {}), *sweep, *(helps or {}), *(shown_defaults or {})] if k not in KEYS]
    if unknown:  # a programming error in a caller, named at once
        raise ValueError(f"not run config keys: {unknown}; valid keys: {', '.join(KEYS)}")
    helps = field_help() | dict(helps or {})
    shown = SHOWN_DEFAULTS | dict(shown_defaults or {})
    if only is None:
        parser.add_argument("--config", help="YAML or TOML file with any of the keys below")
    values = {} if only is None else {k: [KEYS[k].default] if k in sweep else KEYS[k].default for k in keys}
    values.update(defaults or {})
    for key in keys:
        if key in skip:
            continue
        text = f"{helps.get(key, '')} (default: {values.get(key, shown.get(key, KEYS[key].default))})"
        if key in sweep:
            flag = SWEEP_FLAGS.get(key, flag_of(key))
            parser.add_argument(flag, dest=flag[2:].replace("-", "_"), nargs="+", action=Sweep,
                                default=values[key], metavar=key.upper(),
                                help=f"{text}; several values (or a comma-separated list), one run each")
        elif isinstance(KEYS[key].default, bool):
            parser.add_argument(flag_of(key), action=argparse.BooleanOptionalAction,
                                default=values.get(key, argparse.SUPPRESS), help=text)
        else:
            parser.add_argument(flag_of(key), dest=key, default=values.get(key, argparse.SUPPRESS),
                                metavar=key.upper(), help=text)


def config_from_args(ns: argparse.Namespace, base: RunConfig | None = None) -> RunConfig:
    """The run config the flags in ``ns`` describe: ``base`` (default ``RunConfig()``), then the
    ``--config`` file's keys (:func:`file_keys`), then the flags given (None: the field's own
    default, e.g. ``lr``). Swept keys (lists) are left out."""
    cfg = from_mapping(file_keys(ns), base or RunConfig())
    given = {k: coerce(k, v) for k, v in vars(ns).items() if k in KEYS and v is not None and not isinstance(v, list)}
    return cfg.replace(**given)


def file_keys(ns: argparse.Namespace) -> dict[str, Any]:
    """The run keys of the ``--config`` file in ``ns`` that the flags leave to it ({} without one):
    every key but compare's own (COMPARE_KEYS) and, where a flag makes that choice, the file's choice
    of how the folder is treated (FOLDER_MODE_KEYS: overwrite, resume, resume_or_start, one choice)."""
    if not getattr(ns, "config", None):
        return {}
    flag_mode = any(getattr(ns, k, None) for k in FOLDER_MODE_KEYS)
    return {k: v for k, v in read_config_file(ns.config).items() if k not in COMPARE_KEYS
            and not (flag_mode and str(k).replace("-", "_") in FOLDER_MODE_KEYS)}


def parse_run_args(parser: argparse.ArgumentParser, argv: list[str] | None = None,
                   ) -> tuple[argparse.Namespace, RunConfig]:
    """Parse ``argv`` (default: the process's), check the run flags' values (no torch imported) and
    write them back typed into the namespace (a None default stays None); a bad value is the
    parser's one-line error, exit 2.
    Returns the namespace and the run config its run flags describe."""
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_args(ns).check_values()
    except ConfigError as e:
        parser.error(str(e))
    for key in KEYS:  # None stays None: the caller's own default (as lr's is the algorithm's)
        if getattr(ns, key, None) is not None and not isinstance(getattr(ns, key), list):
            setattr(ns, key, getattr(cfg, key))
    return ns, cfg


def parse_flag_string(parser: argparse.ArgumentParser, text: str, flag: str) -> argparse.Namespace:
    """The flags of one ``--variant`` or ``--candidate``, a shell-quoted string, read by ``parser``; a
    stray quote is a ConfigError naming the flag and the string."""
    try:
        words = shlex.split(text)
    except ValueError as e:  # "No closing quotation", "No escaped character"
        raise ConfigError(f"{flag} {text!r}: {e}") from None
    return parser.parse_args(words)


def run_parser(prog: str, *, add_help: bool = False) -> Parser:
    """A parser of run flags alone, as ``gradwire run`` reads them (a compare variant, a plan
    candidate, the run command after ``gradwire launch --``)."""
    hint = None if add_help else "gradwire run --help for the run flags"
    parser = Parser(prog=prog, add_help=add_help, help_hint=hint)
    add_run_flags(parser)
    return parser


def out_given(ns: argparse.Namespace) -> bool:
    """Whether --out (or ``out:`` in the --config file) names the folder."""
    return "out" in vars(ns) or bool(getattr(ns, "config", None) and "out" in read_config_file(ns.config))


def slug(text: str) -> str:
    """``text`` as a folder name: runs of other characters than letters, digits and ``.=+-`` become
    one ``_``; no leading dot (``..`` or ``.`` would name the folder above, or this one, and ``.x`` a
    hidden one); at most 80 characters."""
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_").lstrip(".")[:80] or "run"


def fresh_out(name: str, cfg: RunConfig) -> str:
    """The folder of a run given no --out: ``runs/NAME-YYYYmmdd-HHMMSS`` (``-2``, ``-3``, ... when
    taken), so no run lands on another. A time stamp (not a counter) names runs in the order they
    ran and needs no look at the others; under torchrun every process must find the same name, so
    ``gradwire launch`` fixes the stamp for its processes (GRADWIRE_RUN_STAMP), which also brings a
    restarted group back to its folder; plain torchrun, or several nodes, need --out."""
    stamp = os.environ.get("GRADWIRE_RUN_STAMP")
    if cfg.resuming and not stamp:
        raise ConfigError("--resume continues the run in --out: name its folder")
    base = Path("runs") / f"{slug(name)}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    if cfg.backend == "torch" and "WORLD_SIZE" in os.environ:  # every process must agree: no suffix
        if not stamp:
            raise ConfigError("under torchrun every process must name the same run folder: pass --out "
                              "(gradwire launch picks a fresh one for you)")
        if os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]) != os.environ["WORLD_SIZE"]:
            raise ConfigError("a run on several nodes needs --out, the same folder on every node")
        return str(base)
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return str(path)
