"""Spec strings: the one grammar for every pluggable piece of gradwire.

A spec is ``name`` or ``name:key=value,key=value``. Values are parsed into the type that the
factory's keyword argument is annotated with (``int``, ``float``, ``bool`` or ``str``), so
``qsgd:levels=4,bucket=512`` calls ``QSGD(levels=4, bucket=512)``. Unknown names, unknown keys and
values of the wrong type raise :class:`~gradwire.errors.ConfigError` naming the bad part and
listing the valid choices.

An object knows its own spec: :meth:`Registry.build` records on it its registry name and the
resolved keyword values (defaults filled in), and :func:`spec_of` renders them back as
``name:key=value,...`` in the entry's parameter order. Classes that mix in :class:`Specced` get
that as their ``spec()`` method, so no class re-lists its parameters by hand.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradwire.errors import ConfigError

# the spellings of a bool, in any case: in a spec (sign:scaled=yes) and in a config file (curves: off)
BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "1": True, "0": False}
BOOL_SPELLINGS = "true/false, yes/no, on/off or 1/0"


def parse_bool(value: Any) -> bool:
    """``value`` (a bool, or text in one of :data:`BOOLS`' spellings, any case) as a bool; ValueError
    otherwise, whose caller names the value and :data:`BOOL_SPELLINGS`."""
    if isinstance(value, bool):
        return value
    try:
        return BOOLS[str(value).strip().lower()]
    except KeyError:
        raise ValueError(value) from None


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``name:k=v,k=v`` into the name and a dict of raw string values."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"empty spec {spec!r}: expected 'name' or 'name:key=value,...'")
    name, colon, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"spec {spec!r} has no name before ':'")
    kwargs: dict[str, str] = {}
    if colon and not rest.strip():
        raise ConfigError(f"spec {spec!r} has nothing after ':'; write {name!r} alone, or "
                          f"'{name}:key=value,...' (see gradwire list)")
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not item.strip():
                raise ConfigError(f"spec {spec!r} has an empty item (a stray ','); expected "
                                  f"'{name}:key=value,key=value'")
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
            return parse_bool(value)
        if kind is int:
            return int(value)
        if kind is float:
            out = float(value)
            if math.isnan(out):
                raise ValueError
            return out
        return str(value)
    except ValueError:
        valid = f": write {BOOL_SPELLINGS}" if kind is bool else ""
        raise ConfigError(f"{what}={value!r} is not a valid {kind.__name__}{valid}") from None


@dataclass(frozen=True)
class Param:
    """One keyword parameter of a registered factory."""

    name: str
    kind: type
    default: Any
    help: str = ""
    shown_default: str | None = None  # what the default means, where the factory resolves it (e.g. "" -> another key's)

    def describe(self) -> str:
        if self.default is inspect.Parameter.empty:
            default = "required"
        elif self.shown_default is not None:
            default = f"default {self.shown_default}"
        elif self.default == "":  # (printed "default ": register a shown default that says what it resolves to)
            default = "default ''"
        else:
            default = f"default {self.default}"
        text = f"{self.name} ({self.kind.__name__}, {default})"
        return f"{text}: {self.help}" if self.help else text


@dataclass
class Entry:
    name: str
    factory: Callable[..., Any]
    help: str
    params: dict[str, Param] = field(default_factory=dict)
    context: tuple[str, ...] = ()  # parameters the builder supplies (e.g. the run's seed): never rendered


RECORD = "_spec_record"  # attribute holding (name, values) on every object a Registry built


def format_value(value: Any) -> str:
    """One spec value as text that :func:`convert` reads back to the same value: bools as
    true/false, floats in their shortest exact form (``100`` for 100.0, ``0.01``, ``inf``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def render(name: str, values: dict[str, Any], fmt: Callable[[Any], str] = format_value) -> str:
    """``name:key=value,...`` (just ``name`` without values), keys in the order given."""
    if not values:
        return name
    return f"{name}:" + ",".join(f"{key}={fmt(value)}" for key, value in values.items())


def _record(obj: Any, entry: Entry, values: dict[str, Any]) -> None:
    values = {k: v for k, v in values.items() if k not in entry.context}
    try:  # plain data only (no factory), so the object still pickles
        setattr(obj, RECORD, (entry.name, values))
    except (AttributeError, TypeError):  # a plain value (a list, a number, a frozen record): no spec
        pass


def spec_of(obj: Any) -> str:
    """The spec that rebuilds ``obj``: its registry name and every parameter (defaults included),
    in the entry's order. An object no registry built, of a class no registry holds, is named by
    its ``name`` attribute."""
    record = vars(obj).get(RECORD) if hasattr(obj, "__dict__") else None
    if record is None:
        return obj.name
    name, values = record
    return render(name, values)


class Specced:
    """Mixin: ``spec()`` is :func:`spec_of`, rendered from the registry declaration.

    An instance built by :meth:`Registry.build` carries the resolved spec values; one constructed
    directly (``QSGD(levels=4)``) records its keyword arguments here, against the entry its class
    was registered with, so both render the same spec.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = super().__new__(cls)
        entry = cls.__dict__.get("_spec_entry")  # only the registered class itself, not subclasses
        if entry is not None:
            _record(obj, entry, {k: kwargs.get(k, p.default) for k, p in entry.params.items()})
        return obj

    def spec(self) -> str:
        return spec_of(self)


def _params_of(factory: Callable[..., Any], helps: dict[str, str], shown: dict[str, str]) -> dict[str, Param]:
    target = factory.__init__ if inspect.isclass(factory) else factory
    hints = typing.get_type_hints(target)
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(factory):  # __init__'s, not the class's: Specced.__new__ takes (*args, **kwargs)
        params = params[1:]  # self
    out: dict[str, Param] = {}
    for p in params:
        if p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) or p.name.startswith("_"):
            continue
        kind = hints.get(p.name, str)
        if typing.get_origin(kind) is not None:  # e.g. ``float | None``: take the concrete type
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        out[p.name] = Param(p.name, kind, p.default, helps.get(p.name, ""), shown.get(p.name))
    unknown = set(shown) - set(out)
    if unknown:  # a programming error in a registration, named at once
        raise RuntimeError(f"shown defaults for no parameter of {factory!r}: {sorted(unknown)}")
    return out


class Registry:
    """Named factories of one kind (compressor, algorithm, partition, ...), built from specs."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, *, help: str, params: dict[str, str] | None = None,
                 context: tuple[str, ...] = (), shown_defaults: dict[str, str] | None = None):
        """Decorator: register ``factory`` under ``name``; ``params`` documents its keywords.
        ``context`` names keywords that the builder passes (not part of the object's spec);
        ``shown_defaults`` says what a keyword's default resolves to where the signature's cannot
        (``eval=""``: "average (leader with async=true)"), for ``gradwire list``."""

        def deco(factory):
            if name in self._entries:
                raise RuntimeError(f"{self.kind} {name!r} registered twice")
            entry = Entry(name, factory, help, _params_of(factory, params or {}, shown_defaults or {}), tuple(context))
            self._entries[name] = entry
            if inspect.isclass(factory):
                factory._spec_entry = entry  # for Specced instances constructed directly
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
            obj = entry.factory(**kwargs, **context)
        except ConfigError:
            raise
        except ValueError as e:  # factories validate ranges with ValueError
            raise ConfigError(f"{self.kind} spec {spec!r}: {e}") from None
        _record(obj, entry, {k: kwargs.get(k, p.default) for k, p in entry.params.items() if k not in context})
        return obj

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
