"""Seeds for every random stream, derived from the run's one seed and a label."""

from __future__ import annotations

import hashlib


def hash_seed(seed: int, *parts) -> int:
    """A 63-bit seed derived from ``seed`` and labels, stable across processes and runs
    (Python's hash() is salted per process, so it cannot be used)."""
    h = hashlib.sha256(repr((int(seed),) + tuple(parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)
