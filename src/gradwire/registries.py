"""Every registry of pluggable components, declared once.

``RunConfig.validate`` checks the spec held by each config key below, and ``gradwire list`` prints
the registries in this order (its ``what`` choices are their group names). A registry is imported
only when asked for, so reading this table (the command-line parser does) imports no torch code.

The names and keys of every registered spec are also written down, torch-free, in
``registry_names.py`` (generated: ``python -m gradwire.registries``), so that a mistyped name or key
is reported before torch is imported (:func:`check_spec_names`); ``tests/test_registry_names.py``
fails when that file and the registries differ.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from gradwire.spec import Registry


@dataclass(frozen=True)
class RegistryRef:
    group: str                       # plural name: ``gradwire list GROUP``
    key: str                         # the RunConfig field that holds a spec of this kind
    module: str                      # where the registry lives ...
    attr: str                        # ... and its name there
    build_to_validate: bool = False  # validate builds it (cheap; runs the range checks), else only resolves

    @property
    def registry(self) -> Registry:
        return getattr(importlib.import_module(self.module), self.attr)


REGISTRIES: tuple[RegistryRef, ...] = (
    RegistryRef("tasks", "task", "gradwire.tasks", "TASKS"),
    RegistryRef("partitions", "partition", "gradwire.tasks", "PARTITIONS", build_to_validate=True),
    RegistryRef("stragglers", "stragglers", "gradwire.transports.stragglers", "STRAGGLERS", build_to_validate=True),
    RegistryRef("networks", "network", "gradwire.transports.network", "NETWORKS", build_to_validate=True),
    RegistryRef("algorithms", "algorithm", "gradwire.algorithms", "ALGORITHMS"),
    RegistryRef("optimizers", "optimizer", "gradwire.algorithms.optim", "OPTIMIZERS", build_to_validate=True),
    RegistryRef("lr-schedules", "lr_schedule", "gradwire.algorithms.optim", "LR_SCHEDULES", build_to_validate=True),
    RegistryRef("compressors", "compressor", "gradwire.compress", "REGISTRY", build_to_validate=True),
    # averagers that are no byte compressor (PowerSGD: factors by allreduce): their specs go in --compressor too
    RegistryRef("averagers", "compressor", "gradwire.averaging", "AVERAGERS", build_to_validate=True),
)

GROUPS: tuple[str, ...] = tuple(r.group for r in REGISTRIES)


def check_spec_names(key: str, spec: str) -> None:
    """The name and keys of ``spec`` (config key ``key``) against the written-down table, with the
    registries' own messages, importing no registry; the values are the registries' to check."""
    from gradwire.errors import ConfigError
    from gradwire.registry_names import NAMES
    from gradwire.spec import parse_spec

    name, raw = parse_spec(spec)
    refs = [r for r in REGISTRIES if r.key == key]
    tables = [(ref, NAMES[ref.group]) for ref in refs]
    found = [(ref, table) for ref, table in tables if name in table["names"]]
    if not found:
        if len(refs) == 1:
            kind, names = tables[0][1]["kind"], sorted(tables[0][1]["names"])
            raise ConfigError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(names)}")
        valid = "; ".join(f"{ref.group}: {', '.join(sorted(table['names']))}" for ref, table in tables)
        raise ConfigError(f"unknown {key} {name!r}; valid {key}s are {valid}")
    table = found[0][1]
    params = table["names"][name]
    for k in raw:
        if k not in params:
            raise ConfigError(f"{table['kind']} {name!r} has no parameter {k!r}; valid parameters: "
                              f"{', '.join(params) or 'none'}")


def written_names() -> dict:
    """What ``registry_names.py`` holds, read from the registries themselves (imports them all)."""
    return {ref.group: {"kind": ref.registry.kind,
                        "names": {n: list(ref.registry.entry(n).params) for n in ref.registry.names()}}
            for ref in REGISTRIES}


def registry_for(key: str, spec: str) -> RegistryRef:
    """The registry that holds ``spec`` among those whose specs go in config key ``key`` (several
    share ``compressor``); an unknown name is a ConfigError listing every valid one."""
    from gradwire.errors import ConfigError
    from gradwire.spec import parse_spec

    refs = [r for r in REGISTRIES if r.key == key]
    if len(refs) == 1:
        return refs[0]
    name = parse_spec(spec)[0]
    for ref in refs:
        if name in ref.registry.names():
            return ref
    valid = "; ".join(f"{ref.group}: {', '.join(ref.registry.names())}" for ref in refs)
    raise ConfigError(f"unknown {key} {name!r}; valid {key}s are {valid}")


def write_names(target) -> None:
    """Write the table of ``registry_names.py`` to ``target``."""
    import pprint
    from pathlib import Path

    Path(target).write_text('"""The names and keys of every registered spec, torch-free (generated by\n'
                            '``python -m gradwire.registries`` from the registries; ``tests/test_registry_names.py``\n'
                            'checks it is current). See ``registries.check_spec_names``."""\n\n'
                            f"NAMES = {pprint.pformat(written_names(), width=118, sort_dicts=True, compact=True)}\n")


if __name__ == "__main__":  # python -m gradwire.registries: write registry_names.py anew
    from pathlib import Path

    target = Path(__file__).with_name("registry_names.py")
    write_names(target)
    print(f"wrote {target}")
