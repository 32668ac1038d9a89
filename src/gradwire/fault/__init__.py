"""Fault tolerance on torchft: replicas that leave and join mid-run (docs/fault_tolerance.md)."""
