"""Averaging: the mean over the participants (averaging/base.py), taken by a compressed mean
(a byte compressor with error feedback, averaging/compressed.py) or by PowerSGD (low-rank factors
by allreduce, averaging/powersgd.py).

A ``--compressor`` spec names either kind; :func:`build_averager`, used by the run's algorithms and
the DDP hook alike, is the only place that tells them apart (what differs for a caller is declared
on the classes: ``Averager.carries_payloads``, ``Averager.remembers_means``). :func:`build_method`
gives a spec's configuration object (to render a spec with its defaults filled in).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gradwire.averaging.base import Averager, Finished
from gradwire.averaging.compressed import CompressedMean
from gradwire.averaging.powersgd import AVERAGERS, PowerSGD, PowerSGDMean, PowerSGDMemory
from gradwire.compress import Compressor
from gradwire.compress import build as build_compressor
from gradwire.errors import ConfigError
from gradwire.spec import parse_spec

__all__ = ["AVERAGERS", "Averager", "CompressedMean", "Finished", "PowerSGD", "PowerSGDMean", "PowerSGDMemory",
           "build_averager", "build_method"]


def _averages_itself(spec: str) -> bool:
    """Whether ``spec`` names an averager (PowerSGD) rather than a byte compressor."""
    return parse_spec(spec)[0] in AVERAGERS.names()


def build_method(spec: str) -> Compressor | PowerSGD:
    """What a ``--compressor`` spec names, as configuration: a byte compressor, or PowerSGD's; an
    unknown name is one ConfigError listing both kinds."""
    from gradwire.registries import registry_for

    return registry_for("compressor", spec).registry.build(spec)


def build_averager(spec: str, *, workers: Sequence[int], seed: int, shapes: Sequence[torch.Size],
                   error_feedback: bool, generator: Callable[[int], torch.Generator],
                   payloads: bool, keys: Sequence[str] | None = None,
                   scaled_error_feedback: bool = True, route: str = "gather", world_size: int = 0,
                   owner_generator: Callable[[int], torch.Generator] | None = None,
                   owner_compressor: str = "") -> Averager:
    """The averager of ``spec`` for the local ``workers``, for the run's algorithms and the DDP hook
    alike. ``payloads``: the caller also handles compressed payloads itself (sends them to a server,
    keeps them in flight), which only a byte compressor makes, so PowerSGD is refused; ``shapes``:
    the model's tensors in the flat vector's order (PowerSGD works per matrix), ``keys`` their names
    where the averager's memory should be keyed by name (default: by position); ``generator(rank)``:
    worker ``rank``'s compression stream; ``scaled_error_feedback``: see ``ErrorFeedback``'s ``scaled``;
    ``route``, ``world_size``, ``owner_generator``, ``owner_compressor``: a compressed mean's route
    (gather or scatter) and what the scatter route needs or takes (``CompressedMean``; the owners'
    codec as a spec, "" for ``spec``'s)."""
    if _averages_itself(spec):
        if route != "gather":
            raise ConfigError(f"compressed_mean={route}: --compressor {spec} averages by allreduce itself; "
                              "the scatter route is for byte compressors (--compressed-mean gather)")
        if payloads:
            raise ValueError(f"--compressor {spec} averages gradients by allreduce itself: it runs with sync "
                             "(without backups) and the DDP hook only")
        averager = PowerSGDMean(spec, shapes=shapes, workers=workers, seed=seed, keys=keys)
        if error_feedback and not averager.powersgd.error_feedback:
            raise ConfigError(f"--error-feedback contradicts {spec}: PowerSGD keeps its own error feedback "
                              "(its error_feedback key, on by default)")
        return averager
    return CompressedMean(build_compressor(spec), {r: generator(r) for r in workers}, error_feedback=error_feedback,
                          identity=spec == "none", scaled_error_feedback=scaled_error_feedback, route=route,
                          world_size=world_size, owner_generator=owner_generator,
                          owner_compressor=build_compressor(owner_compressor) if owner_compressor else None)
