"""Helpers shared by tests."""

import torch


def states_equal(a, b) -> bool:
    """Bitwise equality of nested state dicts (tensors compared with torch.equal)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b
