"""CompressedMean's rules checked exactly (averaging/compressed.py): each worker's tensor goes
through its own error feedback (its residual kept under the tensor's key) and its own generator;
gathered payloads are decoded and summed in rank order whatever order they arrive in; a payload at
its codec's size bound fits its frame; the state restores every worker's residuals and generator;
and a started mean's handle finishes when it is told to.

Where bitwise identity is the point, tensors are float64 (the codecs' work dtype is then the tensor's)
and both sides are computed within the test from the same seeds."""

from __future__ import annotations

import pytest
import torch

from gradwire.averaging import CompressedMean
from gradwire.averaging.combine import MessageCombine
from gradwire.compress import ErrorFeedback, build
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import RingNetwork
from gradwire.transports.sim import SimTransport

WORKERS = (0, 1, 2)


def transport() -> SimTransport:
    return SimTransport(len(WORKERS), RingNetwork(), SimClock())


def averager(spec: str, *, error_feedback: bool, scaled: bool = True) -> CompressedMean:
    return CompressedMean(build(spec), {r: torch.Generator().manual_seed(10 + r) for r in WORKERS},
                          error_feedback=error_feedback, scaled_error_feedback=scaled)


def grads(step: int, n: int = 300) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return {r: torch.randn(n, generator=g, dtype=torch.float64) for r in WORKERS}


def rank_order_mean(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total.div_(len(parts))


@pytest.mark.parametrize("spec,scaled", [("qsgd:levels=4", True), ("qsgd:levels=4", False), ("topk:ratio=0.1", True)])
def test_each_worker_has_its_own_error_feedback_and_generator(spec, scaled):
    """Three steps of ``mean`` with error feedback: the mean is, bit for bit, the rank-order mean of
    each worker's decoded packet, each worker encoding with its own ErrorFeedback and generator
    (qsgd:levels=4 scaled by 1/(1 + omega), or not with ``scaled_error_feedback=False``, MuLoCo's
    rule); every worker's residual is its own x + e - decode."""
    # kills: workers sharing one error feedback or generator, the residual or scaled flag dropped
    avg, t = averager(spec, error_feedback=True, scaled=scaled), transport()
    refs = {r: ErrorFeedback(build(spec), scaled=scaled) for r in WORKERS}
    gens = {r: torch.Generator().manual_seed(10 + r) for r in WORKERS}
    for step in range(3):
        x = grads(step)
        got = avg.mean(t, {r: v.clone() for r, v in x.items()})
        decoded = [refs[r].decode(refs[r].encode(x[r], key="grad", generator=gens[r])) for r in WORKERS]
        assert torch.equal(got, rank_order_mean(decoded)), (spec, step)
        for r in WORKERS:
            assert torch.equal(avg.ef[r].residual("grad"), refs[r].residual("grad")), (spec, step, r)
    assert len({float(avg.ef[r].residual("grad").norm()) for r in WORKERS}) == len(WORKERS)


def test_payloads_keep_a_residual_per_key():
    """``payloads(key=...)``: each fragment's residual is kept under its own key (streaming DiLoCo's
    fragments, of different sizes), and the payload is the packet that error feedback made for it."""
    # kills: the key dropped between payloads/encode and the error feedback
    spec = "topk:ratio=0.2"
    avg = averager(spec, error_feedback=True)
    refs = {r: ErrorFeedback(build(spec)) for r in WORKERS}
    for step in range(2):
        for key, n in (("fragment0", 120), ("fragment1", 80)):
            x = grads(step, n)
            payloads = avg.payloads({r: v.clone() for r, v in x.items()}, key=key)
            for r in WORKERS:
                assert torch.equal(payloads[r], refs[r].encode(x[r], key=key).buffer), (step, key, r)
    for r in WORKERS:
        assert set(avg.ef[r].residuals) == {"fragment0", "fragment1"}
        for key in ("fragment0", "fragment1"):
            assert torch.equal(avg.ef[r].residual(key), refs[r].residual(key))


@pytest.mark.parametrize("combine", [None, MessageCombine()], ids=["mean", "combine"])
def test_gathered_payloads_are_summed_in_rank_order_whatever_order_they_arrive_in(combine):
    """In float32, (1 + 1e8) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1: ranks 0, 1, 2 holding 1, 1e8, -1e8
    average to exactly 0 in rank order, to 1/3 in the order 1, 2, 0 in which they arrive here."""
    # kills: decode_mean (or the combined path) adding in the dict's order instead of sorted ranks
    avg = averager("topk:ratio=1.0", error_feedback=False)
    if combine is not None:
        avg.combine_by(combine)
    like = torch.zeros(4)
    values = {0: 1.0, 1: 1e8, 2: -1e8}
    packets = {r: avg.compressor.encode(torch.full((4,), v)) for r, v in values.items()}
    arrived = {r: packets[r].buffer for r in (1, 2, 0)}
    assert torch.equal(avg.decode_mean(arrived, like), torch.zeros(4))
    in_arrival_order = rank_order_mean([avg.decode(arrived[r], like) for r in (1, 2, 0)])
    assert not torch.equal(in_arrival_order, torch.zeros(4))  # the order is visible in the result


def test_a_payload_at_its_size_bound_travels_in_its_frame():
    """top-k keeping the last k positions makes the longest position section there is, exactly
    ``max_nbytes``; framed at that bound plus the 4-byte length, it is gathered and averaged."""
    # kills: the frame sized at the bound without its length header
    avg, t = averager("topk:ratio=0.1", error_feedback=False), transport()
    n, k = 100, 10
    x = {}
    for r in WORKERS:
        v = torch.full((n,), 0.01 * (r + 1))
        v[n - k:] = torch.arange(1.0, k + 1) * (r + 1)
        x[r] = v
        assert avg.compressor.encode(v).buffer.numel() == avg.compressor.max_nbytes(n)
    got = avg.mean(t, x)
    expected = torch.zeros(n)
    expected[n - k:] = torch.arange(1.0, k + 1) * 2  # the mean of 1x, 2x and 3x
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "fp16"])
def test_a_loaded_state_continues_every_worker_exactly(spec):
    """After two steps, a fresh averager that loads the state (every worker's residual and generator,
    each under its own rank) gives the same next means and residuals, bit for bit."""
    # kills: a state without the residuals or generators, or one worker's loaded into every worker
    a, b = averager(spec, error_feedback=True), averager(spec, error_feedback=True)
    ta, tb = transport(), transport()
    for step in range(2):
        a.mean(ta, grads(step))
    b.load_state_dict(a.state_dict())
    assert set(b.state_dict()) == {"generators", "error_feedback"}
    for step in range(2, 4):
        assert torch.equal(a.mean(ta, grads(step)), b.mean(tb, grads(step))), (spec, step)
        for r in WORKERS:
            assert torch.equal(a.ef[r].residual("grad"), b.ef[r].residual("grad")), (spec, step, r)
    assert len({float(a.ef[r].residual("grad").norm()) for r in WORKERS}) == len(WORKERS)


@pytest.mark.parametrize("spec", ["topk:ratio=0.1", "fp16"])
def test_a_started_mean_finishes_when_rescheduled(spec):
    """``Handle.reschedule``: a collective restarted after a resume keeps its first finish. The
    started mean's handle passes the new finish on to the transport's handle, whose ``wait`` moves
    the simulated clock to it; ``wait`` gives the same result each time, computed once: the
    blocking mean, in the gradients' dtype (float64 here; the simulator sums a cast in float32)."""
    # kills: Finished.reschedule not reaching the inner handle; Finished.wait finishing again;
    # the started all-reduced mean not cast back to the gradients' dtype
    avg, t = averager(spec, error_feedback=False), transport()
    handle = avg.start(t, grads(0))
    later = handle.finish_s + 5.0
    handle.reschedule(later)
    assert handle.finish_s == later
    first = handle.wait()
    assert t.clock.now == later
    assert handle.wait() is first
    blocking = averager(spec, error_feedback=False).mean(transport(), grads(0))
    assert first.dtype == blocking.dtype == torch.float64
    assert torch.equal(first, blocking)


@pytest.mark.parametrize("spec,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_cast_with_error_feedback_carries_x_plus_the_residual(spec, wire):
    """A cast is all-reduced in its wire dtype, but with error feedback what is cast is x + e: from
    the second step on (e is then the first cast's rounding), each payload is the worker's
    ErrorFeedback packet decoded into the wire dtype, not x cast, and ``mean`` is their all-reduced
    mean."""
    # kills: the cast's payload (payloads or mean) taken from the tensors instead of the packets
    blocking, gathered = averager(spec, error_feedback=True), averager(spec, error_feedback=True)
    refs = {r: ErrorFeedback(build(spec)) for r in WORKERS}
    t = transport()
    for step in range(3):
        x = grads(step)
        expected = {r: refs[r].decode(refs[r].encode(x[r], key="grad")).to(wire) for r in WORKERS}
        payloads = gathered.payloads({r: v.clone() for r, v in x.items()})
        got = blocking.mean(t, {r: v.clone() for r, v in x.items()})
        for r in WORKERS:
            assert payloads[r].dtype == wire and torch.equal(payloads[r], expected[r]), (spec, step, r)
        assert torch.equal(got, transport().allreduce_mean(expected).to(torch.float64)), (spec, step)
        if step:
            assert any(not torch.equal(expected[r], x[r].to(wire)) for r in WORKERS)  # e changed the cast
