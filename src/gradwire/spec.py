"""Spec strings: the one grammar for every pluggable piece of gradwire.

A spec is ``name`` or ``name:key=value,key=value``. Values are parsed into the type that the
factory's keyword argument is annotated with (``int``, ``float``, ``bool`` or ``str``), so
``qsgd:levels=4,bucket=512`` calls ``QSGD(levels=4, bucket=512)``. Unknown names, unknown keys and
values of the wrong type raise :class:`~gradwire.errors.ConfigError` naming the bad part and
listing the valid choices.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradwire.errors import ConfigError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``name:k=v,k=v`` into the name and a dict of raw string values."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"empty spec {spec!r}: expected 'name' or 'name:key=value,...'")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"spec {spec!r} has no name before ':'")
    kwargs: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise ConfigError(f"spec {spec!r}: {item.strip()!r} is not of the form key=value")
            if key in kwargs:
                raise ConfigError(f"spec {spec!r}: key {key!r} given twice")
            kwargs[key] = value
    return name, kwargs


def convert(value: str, kind: type, *, what: str) -> Any:
    """Convert one raw spec value to ``kind``; ``what`` names it in the error."""
    try:
        if kind is bool:
            low = value.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if kind is int:
            return int(value)
        if kind is float:
            out = float(value)
            if math.isnan(out):
                raise ValueError
            return out
        return str(value)
    except ValueError:
        raise ConfigError(f"{what}={value!r} is not a valid {kind.__name__}") from None


@dataclass(frozen=True)
class Param:
    """One keyword parameter of a registered factory."""

    name: str
    kind: type
    default: Any
    help: str = ""

    def describe(self) -> str:
        default = "required" if self.default is inspect.Parameter.empty else f"default {self.default}"
        text = f"{self.name} ({self.kind.__name__}, {default})"
        return f"{text}: {self.help}" if self.help else text


@dataclass
class Entry:
    name: str
    factory: Callable[..., Any]
    help: str
    params: dict[str, Param] = field(default_factory=dict)


def _params_of(factory: Callable[..., Any], helps: dict[str, str]) -> dict[str, Param]:
    target = factory.__init__ if inspect.isclass(factory) else factory
    hints = typing.get_type_hints(target)
    out: dict[str, Param] = {}
    for p in inspect.signature(factory).parameters.values():
        if p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) or p.name.startswith("_"):
            continue
        kind = hints.get(p.name, str)
        if typing.get_origin(kind) is not None:  # e.g. ``float | None``: take the concrete type
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        out[p.name] = Param(p.name, kind, p.default, helps.get(p.name, ""))
    return out


class Registry:
    """Named factories of one kind (compressor, algorithm, partition, ...), built from specs."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, *, help: str, params: dict[str, str] | None = None):
        """Decorator: register ``factory`` under ``name``; ``params`` documents its keywords."""

        def deco(factory):
            if name in self._entries:
                raise RuntimeError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = Entry(name, factory, help, _params_of(factory, params or {}))
            return factory

        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"
            )
        return self._entries[name]

    def resolve(self, spec: str) -> tuple[Entry, dict[str, Any]]:
        """Parse and validate ``spec`` without building it."""
        name, raw = parse_spec(spec)
        entry = self.entry(name)
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in entry.params:
                valid = ", ".join(entry.params) or "none"
                raise ConfigError(f"{self.kind} {name!r} has no parameter {key!r}; valid parameters: {valid}")
            kwargs[key] = convert(value, entry.params[key].kind, what=f"{self.kind} {name!r}: {key}")
        empty = inspect.Parameter.empty
        missing = [p.name for p in entry.params.values() if p.default is empty and p.name not in kwargs]
        if missing:
            raise ConfigError(f"{self.kind} {name!r} needs {', '.join(missing)} (spec {spec!r})")
        return entry, kwargs

    def build(self, spec: str, **context: Any) -> Any:
        """Build the object named by ``spec``; ``context`` passes extra keywords (not from the spec)."""
        entry, kwargs = self.resolve(spec)
        try:
            return entry.factory(**kwargs, **context)
        except ConfigError:
            raise
        except ValueError as e:  # factories validate ranges with ValueError
            raise ConfigError(f"{self.kind} spec {spec!r}: {e}") from None

    def describe(self) -> str:
        """Human-readable listing of every entry and its parameters (for ``gradwire list``)."""
        lines = []
        for name in self.names():
            e = self._entries[name]
            lines.append(f"  {name:<14} {e.help}")
            for p in e.params.values():
                lines.append(f"      {p.describe()}")
        return "\n".join(lines)


def require(cond: bool, message: str) -> None:
    """Raise ValueError(message) unless ``cond``: the factories' argument checks."""
    if not cond:
        raise ValueError(message)
