import os
from pathlib import Path

import pytest
import torch

# Keep tests single-threaded: the machine has 2 cores and results must not depend on threading.
torch.set_num_threads(1)
os.environ.setdefault("CI", "1")  # no progress bars in test output


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One dataset cache for the whole session (MNIST-1D is generated once)."""
    return tmp_path_factory.mktemp("data-cache")
