"""Fused Triton kernels for the hot codecs, and the switch between them and the torch reference.

``gradwire.compress`` is the reference: every codec is written in torch ops, and that path is the
default everywhere. With ``--kernels triton`` (the run config's ``kernels`` key) or the
environment variable ``GRADWIRE_KERNELS=triton`` (for the DDP hook and library use), the codecs
below run as one or two Triton kernels each, on the same wire format:

* ``sign``: sign bits, plain and scaled, and their decoding (``kernels.sign``);
* ``grid``: QSGD, TernGrad and DIANA's p-norm quantiser, stochastic rounding and packing in one
  pass, and their decoding (``kernels.grid``);
* ``natural``: natural compression's exponent bytes and sign bits, and their decoding
  (``kernels.natural``).

A tensor takes the kernel path when kernels are ``triton`` and the tensor is float32, float16 or
bfloat16 (float64 stays on the reference) and either on a CUDA device or on the CPU with
``TRITON_INTERPRET=1`` (Triton's interpreter: slow, for tests). Everything else takes the torch
path, so CPU users never import Triton unless they ask for it: this module does not import it,
each family module does, and only when a kernel is first used.

The interpreter catches no code-generation or race bugs: until ``pytest tests/kernels`` has passed
on a GPU, Triton stays off by default on CUDA too (docs/gpu.md records where it has passed).

Randomness: the stochastic kernels draw Philox counters (``tl.randint``: Salmon, Moraes, Dror,
Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3", SC) keyed by one 64-bit word drawn from
the codec's ``torch.Generator``, with the element index as the counter. gradwire seeds that
generator from (seed, step, rank, tensor) (``gradwire.seeding.hash_seed``), so a payload is
reproducible from those four. The key stays on the device: no host read.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from gradwire.config import KERNEL_SETS as KERNELS  # the names, checked with the run config's values
from gradwire.errors import ConfigError

ENV = "GRADWIRE_KERNELS"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_choice: str | None = None  # set by use(); None: the environment variable, else "torch"


def available() -> bool:
    """Whether Triton is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def check(kind: str, what: str = "--kernels") -> str:
    """``kind`` if it names a kernel set that can run here, else one clear ConfigError."""
    if kind not in KERNELS:
        raise ConfigError(f"{what}={kind!r}: valid choices are {', '.join(KERNELS)}")
    if kind == "triton" and not available():
        raise ConfigError(f"{what}=triton: Triton is not installed; pip install 'gradwire[kernels]' "
                          "(or use torch)")
    return kind


def use(kind: str | None) -> None:
    """Choose the kernels for this process (None: back to the environment variable)."""
    global _choice
    _choice = None if kind is None else check(kind)


def current() -> str:
    """The kernels in use: set by :func:`use`, else ``$GRADWIRE_KERNELS``, else ``torch``."""
    if _choice is not None:
        return _choice
    return check(os.environ.get(ENV, "torch") or "torch", ENV)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def wanted(x: torch.Tensor) -> bool:
    """Whether ``x`` goes through the Triton kernels (see the module docstring)."""
    if x.dtype not in DTYPES or current() != "triton":
        return False
    return x.device.type == "cuda" or (x.device.type == "cpu" and interpreting())


def seed_word(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One random int64 in [0, 2^62) on ``device``, drawn from ``generator`` (torch's default one
    for the device when None): the Philox key of one encode. It stays on the device."""
    gen_device = generator.device if generator is not None else device
    word = torch.randint(0, 2**62, (1,), generator=generator, device=gen_device, dtype=torch.int64)
    return word.to(device)


__all__ = ["KERNELS", "ENV", "available", "check", "use", "current", "wanted", "seed_word"]
