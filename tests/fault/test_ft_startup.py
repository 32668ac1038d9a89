"""What a (restarted) replica's start costs before it can ask for a quorum: building a task's model
must not import torch's compiler stack (sympy, torch._dynamo), which the meta-device path of
``nn.Module.to_empty`` and ``nn.Embedding``'s own init did, seconds per process
(docs/fault_tolerance.md, the recovery timing); and the models are the same as before, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from gradwire.tasks.models import on_cpu, transformer_lm


@pytest.mark.multiprocess
def test_building_the_language_model_imports_neither_sympy_nor_dynamo():
    code = ("import sys, torch; from gradwire.tasks.models import transformer_lm; "
            "transformer_lm(torch.Generator().manual_seed(0), vocab=256, context=16, dim=32, layers=2, heads=4, "
            "dtype=torch.float32); print(sorted(m for m in ('sympy', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_on_cpu_is_to_empty_without_the_meta_path():
    def build():
        return nn.Sequential(nn.Linear(3, 4, device="meta"), nn.LayerNorm(4, device="meta"))

    ours, theirs = on_cpu(build()), build().to_empty(device="cpu")
    assert [(n, p.shape, p.dtype, p.device, p.requires_grad, type(p)) for n, p in ours.named_parameters()] == \
        [(n, p.shape, p.dtype, p.device, p.requires_grad, type(p)) for n, p in theirs.named_parameters()]
    shared = nn.Linear(2, 2, device="meta")
    tied = on_cpu(nn.Sequential(shared, shared))
    assert tied[0].weight is tied[1].weight  # a shared parameter stays shared


def test_the_language_model_draws_the_same_parameters_as_with_to_empty():
    """The same draws from the generator as the meta path's (first drawn values, to the bit)."""
    g = torch.Generator().manual_seed(3)
    model = transformer_lm(g, vocab=64, context=8, dim=16, layers=1, heads=2, dtype=torch.float32)
    g2 = torch.Generator().manual_seed(3)
    expected = torch.empty(64, 16).normal_(0.0, 0.02, generator=g2)
    assert torch.equal(model.embed.weight, expected)
    assert all(p.device.type == "cpu" for p in model.parameters())
