"""Training algorithms. Each module registers its algorithms in ``ALGORITHMS`` by spec name."""

from gradwire.algorithms import async_ps, diana, signsgd, sync  # noqa: F401  (registration)
from gradwire.algorithms.base import ALGORITHMS, Algorithm, CodecConfig, Context, OptimConfig

__all__ = ["ALGORITHMS", "Algorithm", "CodecConfig", "Context", "OptimConfig"]
