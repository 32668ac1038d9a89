"""Training algorithms. Each module registers its algorithms in ``ALGORITHMS`` by spec name."""

from gradwire.algorithms import (  # noqa: F401  (registration)
    async_diloco,
    async_ps,
    backup_diloco,
    dagc,
    dasgd,
    demo,
    diana,
    diloco,
    dqsgd,
    easgd,
    local_sgd,
    lsgd,
    muloco,
    signsgd,
    sparseloco,
    sync,
)
from gradwire.algorithms.base import ALGORITHMS, Algorithm, CodecConfig, Context, OptimConfig

__all__ = ["ALGORITHMS", "Algorithm", "CodecConfig", "Context", "OptimConfig"]
