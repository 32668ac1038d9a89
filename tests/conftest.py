"""Fixtures shared by every layer's tests.

Layout, by layer: compress/ (codecs), tasks/ (data, models, partitions), transports/ (network cost
and straggler models), algorithms/ (every algorithm on the simulator, checkpoints included),
backends/ (torch.distributed processes: sync, parameter server, coordinator, faults), ddp/ (the DDP
communication hook), cli/ (command line, example configs, spec strings), testbed/ (network
namespaces). Helpers that are functions, not fixtures, are in tests/helpers.py (the command line
``gw``, ``read_jsonl``, ``states_equal``, the config presets); torch.distributed launch helpers in
tests/backends/processes.py.
"""

import os
import random
import zlib
from pathlib import Path

import pytest
import torch

from tests import tiers

# Keep tests single-threaded: the machine has 2 cores and results must not depend on threading.
torch.set_num_threads(1)
# Triton reads TRITON_INTERPRET when a kernel is defined, which is when gradwire.kernels' family
# modules are first imported: by any test module or benchmark that a worker collects before
# tests/kernels. Without a GPU, set it here, before anything can import them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CI", "1")  # no progress bars in test output


@pytest.fixture(autouse=True)
def _seed_global_generators(request):
    """Seed torch's and Python's global generators from the test's id, so that what a test draws
    from them in its body (and in function-scoped fixtures) does not depend on which tests ran
    before it in this worker. Module- and session-scoped fixtures draw before this runs: they
    seed their own generators."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    random.seed(seed)


@pytest.fixture(autouse=True)
def _runs_draw_no_curves(request, monkeypatch):
    """A run's own curves.png costs 0.6 s of matplotlib per in-process run: 143 of the 330 CPU seconds
    of tests/algorithms and tests/cli's fast tier (249 runs). Only tests marked ``curves`` draw it;
    the processes a test starts are given ``--no-curves`` by tests/backends/processes.py."""
    if request.node.get_closest_marker("curves") is None:
        from gradwire.report.run_folder import RunFolder

        monkeypatch.setattr(RunFolder, "draw_curves", lambda self, label: None)


def pytest_collection_modifyitems(config, items):
    tiers.mark_multiprocess(items)
    tiers.longest_first(items)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """In ``make check`` (``-m "not multiprocess"``), a test that starts a process fails: the marker
    rule of tests/tiers.py missed it."""
    if tiers.fast_tier(request.config):
        tiers.forbid_processes(monkeypatch, request.node.nodeid)


NO_CUDA = "no CUDA device here (CI has none): the cuda case runs on a machine with a GPU"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Each device a test should pass on: the CPU always, CUDA where one is present."""
    return torch.device(request.param)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One dataset cache for the whole session (MNIST-1D is generated once)."""
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture
def make_config(tmp_path, data_dir):
    """The builder of a small run configuration: ``make_config(*presets, out="run", **overrides)``.

    digits-logreg on 4 workers, 12 steps of batch 16 at lr 0.1, evaluated every 4 steps, written to
    ``tmp_path / out``; every other field is RunConfig's default. Each preset (a dict, such as
    tests.helpers.LOCAL_UPDATES) then each keyword replaces fields, later ones winning.
    """

    from gradwire.config import RunConfig

    def make(*presets: dict, out: str = "run", **overrides) -> RunConfig:
        fields = dict(task="digits-logreg", workers=4, steps=12, batch_size=16, lr=0.1, eval_every=4)
        for preset in presets:
            fields |= preset
        fields |= overrides
        return RunConfig(**fields, out=str(tmp_path / out), data_dir=str(data_dir))

    return make
