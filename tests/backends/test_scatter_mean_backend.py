"""The compressed mean's scatter route on real gloo processes (``gradwire launch``): its two
all-to-alls and the owners' reduction run on the torch transport's own thread and group, and give the
simulator's numbers and the same ledger (averaging/compressed.py; tests/averaging/test_scatter_mean.py
checks the rule itself)."""

import pytest
import torch

from tests.backends.processes import sim_and_torch

COMMON = ["--task", "digits-mlp", "--steps", "8", "--eval-every", "4", "--batch-size", "16", "--lr", "0.003",
          "--network", "ring:mbps=100,latency_ms=1", "--seed", "3", "--compressed-mean", "scatter"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", [
    # the round travels a step; the owners' messages in a codec of their own (stochastic, another slot size)
    "muloco:inner_steps=2,overlap=1,merge=carry||pquant:p=inf,block=32",
    "sync|sign:scaled=true|"])
def test_sim_and_torch_backends_agree(tmp_path, data_dir, spec):
    spec, compressor, owner = spec.split("|")
    args = COMMON + ["--algorithm", spec] + (["--compressor", compressor, "--error-feedback"] if compressor else []) \
        + (["--owner-compressor", owner] if owner else [])
    real, sim = sim_and_torch(tmp_path, data_dir, 3, args)
    assert [r["step"] for r in real] == [r["step"] for r in sim] and len(sim) == 3  # evaluated at round ends
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-5, atol=1e-6)
    assert real[-1]["bytes_sent"] == sim[-1]["bytes_sent"] > 0
