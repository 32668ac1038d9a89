"""Choosing the kernels: --kernels / GRADWIRE_KERNELS, clear errors, torch by default."""

import os
import subprocess
import sys

import pytest

from gradwire import kernels
from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.run.combination import check_combination


def test_torch_is_the_default_and_bad_values_are_one_clear_error(monkeypatch):
    kernels.use(None)  # a run earlier in this process chose its config's kernels
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert kernels.current() == "torch"
    monkeypatch.setenv(kernels.ENV, "cuda")
    with pytest.raises(ConfigError, match="GRADWIRE_KERNELS='cuda': valid choices are torch, triton"):
        kernels.current()
    with pytest.raises(ConfigError, match="--kernels='fast': valid choices are torch, triton"):
        kernels.use("fast")
    monkeypatch.setenv(kernels.ENV, "triton")
    assert kernels.current() == "triton"
    kernels.use("torch")  # the run config overrides the environment
    assert kernels.current() == "torch"
    kernels.use(None)


def test_run_config_key(monkeypatch, device):
    check_combination(RunConfig(kernels="triton", device=device.type))  # CUDA, or the interpreter (conftest)
    with pytest.raises(ConfigError, match="kernels='tpu': valid choices are torch, triton"):
        RunConfig(kernels="tpu").validate()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="runs only under Triton's interpreter"):
        check_combination(RunConfig(kernels="triton"))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_cpu_users_never_import_triton():
    code = ("import sys, torch; from gradwire.compress import build\n"
            "for spec in ('sign', 'qsgd', 'natural'): c = build(spec); c.decode(c.encode(torch.randn(100)))\n"
            "assert 'triton' not in sys.modules, 'triton was imported'")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", kernels.ENV)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
