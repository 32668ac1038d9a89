"""Fixtures shared by the DDP hook's tests."""

import gc

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def _free_process_groups_on_this_thread():
    """Collect the test's garbage here, on the main thread, once the test is over.

    DDP keeps its process group alive through reference cycles, so a finished test's DDP model, and
    with it a one-rank gloo group, is freed by Python's cyclic collector on whichever thread happens
    to run it. When that is one of gloo's own threads (running a future's callback), the group's
    destructor joins that very thread, and the process aborts ("terminate called after throwing an
    instance of 'std::system_error', what(): Resource deadlock avoided"): about one run in 20 of this
    folder's in-process tests did, and an xdist worker with them. Torn down last, this runs after
    ``one_rank`` has destroyed its group (which collects too, while the group is still registered)."""
    yield
    gc.collect()


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group for the test's duration (the hook's calls outside a spawned group)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        gc.collect()  # the test's DDP models first, here, while the group is still registered
        dist.destroy_process_group()
