"""Every registry of pluggable components, declared once.

``RunConfig.validate`` checks the spec held by each config key below, and ``gradwire list`` prints
the registries in this order (its ``what`` choices are their group names). A registry is imported
only when asked for, so reading this table (the command-line parser does) imports no torch code.
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
    RegistryRef("partitions", "partition", "gradwire.tasks", "PARTITIONS"),
    RegistryRef("stragglers", "stragglers", "gradwire.transports.stragglers", "STRAGGLERS", build_to_validate=True),
    RegistryRef("networks", "network", "gradwire.transports.network", "NETWORKS"),
    RegistryRef("algorithms", "algorithm", "gradwire.algorithms", "ALGORITHMS"),
    RegistryRef("optimizers", "optimizer", "gradwire.algorithms.optim", "OPTIMIZERS", build_to_validate=True),
    RegistryRef("lr-schedules", "lr_schedule", "gradwire.algorithms.optim", "LR_SCHEDULES", build_to_validate=True),
    RegistryRef("compressors", "compressor", "gradwire.compress", "REGISTRY", build_to_validate=True),
    # averagers that are no byte compressor (PowerSGD: factors by allreduce): their specs go in --compressor too
    RegistryRef("averagers", "compressor", "gradwire.averaging", "AVERAGERS", build_to_validate=True),
)

GROUPS: tuple[str, ...] = tuple(r.group for r in REGISTRIES)


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
