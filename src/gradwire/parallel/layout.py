"""The tensor-parallel layout of a run, ``1d:p=P | 2d:q=Q | 2.5d:q=Q,d=D`` (``--tensor-parallel``),
parsed and checked against the processes and the model before any process group exists
(:mod:`gradwire.parallel.mesh` builds the groups)."""

from __future__ import annotations

from dataclasses import dataclass

from gradwire.errors import ConfigError
from gradwire.spec import parse_spec

LAYOUTS = "1d:p=P | 2d:q=Q | 2.5d:q=Q,d=D"


@dataclass(frozen=True)
class Layout:
    """A tensor-parallel layout: ``kind`` 1d (``size`` = p) or 2.5d (q, d; 2d is d = 1)."""

    kind: str  # "1d", "2d" or "2.5d" as written
    p: int = 1  # 1d: ranks per group
    q: int = 1  # 2d / 2.5d: the SUMMA grid is q x q
    d: int = 1  # 2.5d: depth

    @property
    def size(self) -> int:
        """Processes per tensor-parallel group (P)."""
        return self.p if self.kind == "1d" else self.q * self.q * self.d

    @property
    def summa(self) -> bool:
        return self.kind != "1d"

    def spec(self) -> str:
        return {"1d": f"1d:p={self.p}", "2d": f"2d:q={self.q}"}.get(self.kind, f"2.5d:q={self.q},d={self.d}")


def parse_layout(text: str) -> Layout:
    """``1d:p=4``, ``2d:q=2`` or ``2.5d:q=2,d=2`` as a Layout; ConfigError naming the bad part."""
    name, raw = parse_spec(text)
    keys = {"1d": ("p",), "2d": ("q",), "2.5d": ("q", "d")}
    if name not in keys:
        raise ConfigError(f"tensor_parallel={text!r}: unknown layout {name!r}; valid: {LAYOUTS}")
    if set(raw) != set(keys[name]):
        raise ConfigError(f"tensor_parallel={text!r}: layout {name} takes exactly "
                          f"{', '.join(k + '=' for k in keys[name])} (valid: {LAYOUTS})")
    values = {}
    for k, v in raw.items():
        if not v.isdigit() or int(v) < 1:
            raise ConfigError(f"tensor_parallel={text!r}: {k}={v} must be a positive integer (valid: {LAYOUTS})")
        values[k] = int(v)
    return Layout(kind=name, **values)


def check_layout(layout: Layout, *, world_size: int, dim: int, heads: int, vocab: int | None = None,
                 batch: int | None = None) -> int:
    """The number of data-parallel groups, after checking that ``layout`` fits ``world_size``
    processes and a transformer of width ``dim`` with ``heads`` heads (and ``vocab`` outputs, and a
    per-group ``batch`` of sequences); ConfigError otherwise -- before any process group exists."""
    P = layout.size
    if world_size % P:
        raise ConfigError(f"tensor_parallel={layout.spec()} needs P={P} processes per group, but "
                          f"{world_size} processes are not a multiple of {P}: start a multiple of {P}")
    split = layout.p if layout.kind == "1d" else layout.q
    if dim % split or heads % split:
        raise ConfigError(f"tensor_parallel={layout.spec()} splits the hidden size and the heads {split} ways: "
                          f"dim={dim} and heads={heads} must be multiples of {split}")
    if vocab is not None and layout.summa and vocab % layout.q:
        raise ConfigError(f"tensor_parallel={layout.spec()} splits the vocabulary {layout.q} ways: "
                          f"vocab={vocab} is not a multiple of {layout.q}")
    if batch is not None and layout.summa and batch % (layout.q * layout.d):
        raise ConfigError(f"tensor_parallel={layout.spec()} splits each batch of sequences d*q = "
                          f"{layout.q * layout.d} ways: batch_size={batch} is not a multiple of it")
    return world_size // P


