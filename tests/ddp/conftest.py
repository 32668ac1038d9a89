"""Fixtures shared by the DDP hook's tests."""

import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group for the test's duration (the hook's calls outside a spawned group)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
