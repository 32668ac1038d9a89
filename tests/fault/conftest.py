"""Fixtures shared by the fault-tolerance tests."""

import gc

import pytest


@pytest.fixture(autouse=True)
def _free_groups_on_this_thread():
    """Collect a finished test's torchft objects (Managers, gloo groups, stores: they hold C++
    threads and sockets, and reference cycles keep some of them) here, on the main thread, rather
    than in a collection that some later test's thread happens to run (tests/ddp/conftest.py has
    what that did to a gloo group)."""
    yield
    gc.collect()
