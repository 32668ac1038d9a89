"""Error feedback's rules checked exactly (compress/error_feedback.py): for a tensor of any shape the
packet is ``C(lam * (x + e))`` with ``lam = ef_scale(C, x.numel())`` (1 where ``scaled=False``), the
new residual is ``x + e - decode(packet)``, and the state is a copy that a load replaces.

float64 tensors keep the work dtype equal to the tensor's, so every identity here is bitwise: both
sides are computed within the test, from the same generator states."""

from __future__ import annotations

import pytest
import torch

from gradwire.compress import ErrorFeedback, build
from gradwire.compress.error_feedback import ef_scale


def _replayed(g: torch.Generator) -> torch.Generator:
    """A generator in ``g``'s current state, for computing by hand what error feedback draws."""
    copy = torch.Generator()
    copy.set_state(g.get_state())
    return copy


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "pquant:p=2"])
def test_the_scale_of_a_matrix_is_that_of_all_its_elements(spec):
    """A (4, 256) tensor is scaled by 1/(1 + omega(1024)), the variance bound of the whole tensor the
    codec encodes (qsgd's 512-element buckets: omega = sqrt(512)/4, not sqrt(256)/4 for one row)."""
    # kills: ef_scale computed from x.shape[-1] instead of x.numel()
    c = build(spec)
    lam = ef_scale(c, 1024)
    assert lam < 1 and lam != ef_scale(c, 256)  # the shape would give another scale
    ef = ErrorFeedback(build(spec))
    g = torch.Generator().manual_seed(7)
    data = torch.Generator().manual_seed(8)
    residual = torch.zeros(4, 256, dtype=torch.float64)
    for step in range(3):
        x = torch.randn(4, 256, generator=data, dtype=torch.float64)
        expected = c.encode((x + residual) * lam, generator=_replayed(g))
        packet = ef.encode(x, key="w", generator=g)
        assert torch.equal(packet.buffer, expected.buffer), (spec, step)
        residual = x + residual - c.decode(expected)
        assert torch.equal(ef.residual("w"), residual), (spec, step)


def test_unscaled_error_feedback_encodes_x_plus_e_itself():
    """``scaled=False`` (MuLoCo's rule): the packet is C(x + e) even where omega >= 1, and the
    residual is x + e - decode(packet)."""
    # kills: the scaled flag ignored (ef_scale applied anyway)
    spec = "qsgd:levels=4"
    c = build(spec)
    assert ef_scale(c, 512) < 1
    ef = ErrorFeedback(build(spec), scaled=False)
    g = torch.Generator().manual_seed(1)
    data = torch.Generator().manual_seed(2)
    residual = torch.zeros(512, dtype=torch.float64)
    for step in range(3):
        x = torch.randn(512, generator=data, dtype=torch.float64)
        expected = c.encode(x + residual, generator=_replayed(g))
        assert torch.equal(ef.encode(x, key="w", generator=g).buffer, expected.buffer), step
        residual = x + residual - c.decode(expected)
        assert torch.equal(ef.residual("w"), residual), step


def test_loading_a_state_replaces_every_residual():
    """A loaded state is the whole memory: residuals of keys it lacks are forgotten, not kept."""
    # kills: load_state_dict merging into the residuals it already holds
    ef = ErrorFeedback(build("topk:ratio=0.1"))
    saved = ErrorFeedback(build("topk:ratio=0.1"))
    data = torch.Generator().manual_seed(3)
    saved.encode(torch.randn(40, generator=data), key="a")
    for key in ("a", "b"):
        ef.encode(torch.randn(40, generator=data), key=key)
    ef.load_state_dict(saved.state_dict())
    assert set(ef.residuals) == {"a"}
    assert torch.equal(ef.residual("a"), saved.residual("a"))
    assert ef.residual("b") is None


def test_the_state_is_a_copy_both_ways():
    """``state_dict()`` is a snapshot, and ``load_state_dict`` takes a copy: changing either dict's
    tensors afterwards leaves the residuals alone."""
    # kills: state_dict or load_state_dict handing out / keeping the caller's tensors
    ef = ErrorFeedback(build("topk:ratio=0.1"))
    ef.encode(torch.randn(40, generator=torch.Generator().manual_seed(4)), key="a")
    kept = ef.residual("a").clone()
    ef.state_dict()["a"].zero_()
    assert torch.equal(ef.residual("a"), kept)
    state = {"a": kept.clone()}
    other = ErrorFeedback(build("topk:ratio=0.1"))
    other.load_state_dict(state)
    state["a"].zero_()
    assert torch.equal(other.residual("a"), kept)
