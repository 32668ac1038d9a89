"""The Triton kernels' tests: compiled on a CUDA device when there is one, else on CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1``, set here before any kernel is defined: Triton reads it
when a kernel is decorated). Skipped, with the reason, where Triton is not installed."""

import os

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    KERNEL_DEVICE = torch.device("cuda")
else:
    os.environ["TRITON_INTERPRET"] = "1"
    KERNEL_DEVICE = torch.device("cpu")

pytest.importorskip("triton", reason="Triton is not installed (pip install 'gradwire[kernels]'): "
                                     "the fused kernels are not tested here")


@pytest.fixture
def device() -> torch.device:
    return KERNEL_DEVICE


@pytest.fixture
def triton_kernels():
    """The codecs take the Triton path inside the test (the torch reference outside it)."""
    from gradwire import kernels

    kernels.use("triton")
    yield kernels
    kernels.use(None)


@pytest.fixture
def kernel_calls(monkeypatch):
    """``kernel_calls(module)``: count the calls of the module's public kernel wrappers, so that a
    test can assert the Triton path really ran."""
    import importlib

    counts: dict[str, int] = {}

    def watch(module_name: str):
        module = importlib.import_module(f"gradwire.kernels.{module_name}")
        for name in ("encode", "decode", "pack_signs", "unpack_signs"):
            if hasattr(module, name):
                original = getattr(module, name)

                def counted(*args, _name=name, _original=original, **kwargs):
                    counts[_name] = counts.get(_name, 0) + 1
                    return _original(*args, **kwargs)

                monkeypatch.setattr(module, name, counted)
        return counts

    return watch
