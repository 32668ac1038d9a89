"""The compressor contract: a tensor in, a real byte buffer out, and back.

``encode`` turns a tensor into a :class:`Packet` whose ``buffer`` (1-D ``torch.uint8``) is exactly
what crosses the wire; ``decode`` rebuilds a tensor of the same shape and dtype from a packet.
A receiver that knows the shape and dtype (the transports do) rebuilds the packet as
``Packet(buffer, shape, dtype)`` and decodes from the bytes alone: no Python objects travel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from gradwire.errors import ConfigError
from gradwire.spec import Registry, Specced

REGISTRY = Registry("compressor")

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class CorruptPayload(ValueError):
    """A buffer whose size or header does not match what the decoder expects."""


@dataclass(frozen=True)
class Packet:
    """An encoded tensor: ``buffer`` is the wire payload, ``shape``/``dtype`` are known to both ends."""

    buffer: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(self.buffer.numel())

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


class Compressor(Specced, ABC):
    """Base class of every compressor.

    Subclasses set ``name``, ``unbiased`` (E[decode(encode(x))] == x) and ``summable`` (buffers of
    several workers can be summed element-wise without decoding, so an allreduce may carry them:
    true only for the dense casts). ``omega(numel)`` returns the variance bound of the paper, if
    any: E||C(x) - x||^2 <= omega * ||x||^2.
    """

    name: str = "?"
    unbiased: bool = False
    summable: bool = False
    stochastic: bool = False

    def omega(self, numel: int) -> float | None:
        return None

    @abstractmethod
    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet: ...

    @abstractmethod
    def decode(self, packet: Packet) -> torch.Tensor: ...

    @abstractmethod
    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int | None:
        """Exact payload size for a tensor of ``numel`` elements, or None where it depends on the data."""

    def decode_rows(self, rows: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """k packets of ``numel`` elements each, one at the start of each row of the uint8 ``rows``
        (k x at least ``nbytes(numel)``; the rest of a row is ignored), decoded: k x ``numel``, each
        row what :meth:`decode` gives for it. This default decodes them one by one (a codec of a fixed
        size only); a codec that can decode them in one pass overrides it (sign)."""
        size = self.nbytes(numel, dtype)
        if size is None:
            raise ValueError(f"{self.name}: decode_rows needs a fixed size")
        return torch.stack([self.decode(Packet(row[:size], torch.Size([numel]), dtype)) for row in rows])

    def max_nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int | None:
        """The most bytes a payload of ``numel`` elements can take, whatever the data: ``nbytes``
        for a fixed size; a codec whose size depends on the data but is bounded (a fixed count of
        kept positions) says its bound, which lets a transport carry it at a fixed size (a framed
        payload, ``averaging/compressed.py``) without first exchanging sizes; None: unbounded."""
        return self.nbytes(numel, dtype)

    def __repr__(self) -> str:
        return f"<compressor {self.spec()}>"


def check_input(x: torch.Tensor, what: str = "tensor") -> None:
    """Reject dtypes we do not encode. (Finiteness is checked by each encoder on a reduction it
    computes anyway, so no extra pass over the data is made.)"""
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"cannot compress a {x.dtype} {what}; supported dtypes: {SUPPORTED_DTYPES}")


def raise_non_finite(x: torch.Tensor, compressor: str) -> None:
    """Name the first non-finite element of ``x`` (called once a reduction came out non-finite)."""
    bad = (~torch.isfinite(x.reshape(-1))).nonzero()
    index = int(bad[0]) if bad.numel() else -1
    value = float(x.reshape(-1)[index]) if index >= 0 else float("nan")
    raise ValueError(f"{compressor}: tensor holds a non-finite value ({value}) at flat index {index}")


def build(spec: str) -> Compressor:
    """Build a compressor from a spec string such as ``"qsgd:levels=4,bucket=512"``."""
    return REGISTRY.build(spec)


def expect_size(packet: Packet, expected: int, compressor: str) -> None:
    if packet.nbytes != expected:
        raise CorruptPayload(
            f"{compressor}: payload of {packet.nbytes} bytes for a tensor of {packet.numel} elements, "
            f"expected {expected} bytes (truncated or oversized buffer)"
        )


__all__ = [
    "REGISTRY", "Packet", "Compressor", "CorruptPayload", "ConfigError", "build", "check_input",
    "raise_non_finite", "expect_size",
]
