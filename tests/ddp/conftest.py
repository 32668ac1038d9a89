"""Fixtures shared by the DDP hook's tests."""

import gc

import pytest
import torch.distributed as dist

# Every process group these tests destroy, kept until the process exits (see the fixture below).
_DESTROYED_GROUPS = []


def destroy_default_group() -> None:
    """``dist.destroy_process_group()``, but the group object itself is kept alive until the process
    exits, so that its destructor never runs on one of its own threads (below)."""
    _DESTROYED_GROUPS.append(dist.group.WORLD)
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _collect_on_the_main_thread_only():
    """No automatic garbage collection during a test: its garbage is collected here, on the main
    thread, once it is over.

    A gloo group's destructor joins the group's threads; run on one of them, it aborts the process
    ("terminate called after throwing an instance of 'std::system_error', what(): Resource deadlock
    avoided"). DDP keeps its group alive through reference cycles, and a future's Python callback
    (the hook's) runs on a gloo thread, where it can start a collection or drop a last reference:
    this folder's in-process tests aborted in 2 of 45 runs, and an xdist worker with them in CI.
    Collecting after each test still left 1 in 36 (faulthandler named the thread "Garbage-collecting");
    with automatic collection off as well, 2 in 60 (no Python frame: a last reference dropped there).
    So a destroyed group is also kept (``destroy_default_group``): its destructor never runs while
    the tests do."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.enable()


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group for the test's duration (the hook's calls outside a spawned group)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        destroy_default_group()
