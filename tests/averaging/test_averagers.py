"""The averager contract (gradwire/averaging): the factory picks the kind from the spec, and both
kinds give the mean over the participants through the transport, blocking or started."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gradwire
from gradwire.averaging import CompressedMean, PowerSGDMean, build_averager
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import RingNetwork
from gradwire.transports.sim import SimTransport

SHAPES = (torch.Size([6, 5]), torch.Size([5]))
WORKERS = (0, 1, 2)


def averager(spec: str, *, payloads: bool = False, error_feedback: bool = False, device="cpu"):
    return build_averager(spec, workers=WORKERS, seed=0, shapes=SHAPES, error_feedback=error_feedback,
                          generator=lambda r: torch.Generator(device=device).manual_seed(r), payloads=payloads)


def grads(seed: int = 0, device="cpu") -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {r: torch.randn(35, generator=g).to(device) for r in WORKERS}


def transport() -> SimTransport:
    return SimTransport(len(WORKERS), RingNetwork(), SimClock())


def test_the_factory_tells_the_kinds_apart():
    assert isinstance(averager("topk:ratio=0.5"), CompressedMean)
    assert isinstance(averager("powersgd:rank=1"), PowerSGDMean)
    with pytest.raises(ValueError, match="averages gradients by allreduce itself"):
        averager("powersgd:rank=1", payloads=True)
    with pytest.raises(ValueError, match="contradicts powersgd"):
        averager("powersgd:rank=1,error_feedback=false", error_feedback=True)


def test_the_uncompressed_mean_is_the_mean():
    x = grads()
    mean = averager("none").mean(transport(), x)
    torch.testing.assert_close(mean, torch.stack(list(x.values())).mean(0))


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "fp16", "powersgd:rank=2"])
def test_started_and_blocking_means_agree_in_values_and_bytes(spec, device):
    """``start(...).wait()`` is ``mean`` (the same payloads, the same bytes), for each kind, on
    each device (the mean stays on the gradients' device)."""
    blocking, started = averager(spec, device=device), averager(spec, device=device)
    t1, t2 = transport(), transport()
    for step in range(3):
        x = grads(step, device)
        a = blocking.mean(t1, {r: t.clone() for r, t in x.items()})
        b = started.start(t2, {r: t.clone() for r, t in x.items()}).wait()
        assert torch.equal(a, b), (spec, step)
        assert a.device.type == device.type
    assert t1.bytes_sent == t2.bytes_sent > 0


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "topk:ratio=0.3", "fp16", "sign:scaled=true"])
def test_the_compressed_mean_is_the_mean_of_each_workers_decoded_payload(spec):
    """Two steps: the mean equals, computed here, the mean over every worker of the compressor's own
    decode of that worker's encode (with the worker's seeded generator, drawn on across steps), and
    the transport counts one payload per worker; a mean that skipped or doubled a worker fails."""
    from gradwire.compress import build as build_compressor

    avg, t = averager(spec), transport()
    compressor = build_compressor(spec)
    gens = {r: torch.Generator().manual_seed(r) for r in WORKERS}
    for step in range(2):
        x = grads(step)
        got = avg.mean(t, {r: v.clone() for r, v in x.items()})
        decoded = [compressor.decode(compressor.encode(x[r], generator=gens[r])) for r in WORKERS]
        torch.testing.assert_close(got, torch.stack(decoded).mean(0), rtol=1e-6, atol=1e-7)
        for r in WORKERS:  # each worker's own payload differs from the mean (the test can tell them apart)
            assert not torch.allclose(decoded[r], got)
    assert t.bytes_sent > 0


@pytest.mark.parametrize("spec,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_cast_payload_decodes_to_the_cast(spec, wire):
    """A cast's payload is the tensor in the wire dtype (it is all-reduced, not gathered as bytes):
    one participant's payload, as the mean counts it (``decode_payload``, what eager Streaming
    DiLoCo subtracts as its own share), is that cast back in the gradients' dtype."""
    avg = averager(spec, payloads=True)
    x = grads()
    payloads = avg.payloads(x)
    for r in WORKERS:
        assert payloads[r].dtype == wire
        own = avg.decode_payload(payloads[r], x[r])
        assert own.dtype == x[r].dtype
        assert torch.equal(own, x[r].to(wire).to(x[r].dtype))
        assert not torch.equal(own, x[r])  # the cast rounds: the test can tell it from the tensor


def test_powersgd_state_keeps_the_checkpoint_layout():
    """PowerSGD's state is saved under "powersgd", as checkpoints written before averaging/ hold it;
    a fresh averager that loads it continues identically."""
    a = averager("powersgd:rank=2")
    t = transport()
    a.mean(t, grads(0))
    state = a.state_dict()
    assert set(state) == {"powersgd"}
    b = averager("powersgd:rank=2")
    b.load_state_dict(state)
    assert torch.equal(a.mean(t, grads(1)), b.mean(transport(), grads(1)))


def test_no_aggregator_checks_outside_averaging():
    """Only gradwire/averaging tells a byte compressor from PowerSGD (its factory)."""
    src = Path(gradwire.__file__).parent
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py")
                 if "averaging" not in p.parts and ("aggregator" in p.read_text() or "is_aggregator" in p.read_text())]
    assert offenders == []
