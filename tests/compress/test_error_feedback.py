"""Error feedback: x + residual_before == decode(packet) + residual_after, and its state."""

from __future__ import annotations

import pytest
import torch

from gradwire.compress import ErrorFeedback, build


@pytest.mark.parametrize("spec", ["topk:ratio=0.05", "sign:scaled=true", "qsgd:levels=1", "natural",
                                  "threshold:tau=1", "randk:ratio=0.1", "fp16", "terngrad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_identity_over_steps(spec, dtype, device):
    ef = ErrorFeedback(build(spec))
    g = torch.Generator(device=device).manual_seed(0)
    for _ in range(5):
        x = torch.randn(3, 100, generator=g, device=device).to(dtype)
        before = ef.residual("w")
        before = torch.zeros(3, 100, dtype=torch.float64, device=device) if before is None else before.double()
        packet = ef.encode(x, key="w", generator=g)
        assert packet.dtype == dtype and packet.shape == x.shape
        decoded = ef.decode(packet)
        assert decoded.dtype == dtype
        after = ef.residual("w").double()
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(x.double() + before, decoded.double() + after, rtol=tol, atol=tol)


def test_residual_carries_what_topk_dropped():
    ef = ErrorFeedback(build("topk:ratio=0.5"))
    x = torch.tensor([4.0, -1.0, 3.0, 0.5])
    assert ef.decode(ef.encode(x, key="a")).tolist() == [4.0, 0.0, 3.0, 0.0]
    assert ef.residual("a").tolist() == [0.0, -1.0, 0.0, 0.5]
    # the next message includes the residual: [0, -1, 0, 0.5] + [0, -1, 0, 0.25] -> keeps -2 and 0.75
    second = ef.decode(ef.encode(torch.tensor([0.0, -1.0, 0.0, 0.25]), key="a"))
    assert second.tolist() == [0.0, -2.0, 0.0, 0.75]
    assert ef.residual("b") is None  # keys are independent


def test_without_feedback_error_accumulates_with_it_does_not():
    """Sum of decoded messages tracks the sum of inputs up to one residual (the point of EF)."""
    g = torch.Generator().manual_seed(1)
    ef, c = ErrorFeedback(build("sign:scaled=true")), build("sign:scaled=true")
    xs = [torch.randn(200, generator=g) + 0.3 for _ in range(50)]
    sent_ef = sum(ef.decode(ef.encode(x, key="k")) for x in xs)
    sent_plain = sum(c.decode(c.encode(x)) for x in xs)
    total = sum(xs)
    torch.testing.assert_close(sent_ef + ef.residual("k"), total, rtol=1e-4, atol=1e-4)
    assert float((sent_ef - total).norm()) < 0.5 * float((sent_plain - total).norm())


def test_state_dict_round_trip(tmp_path):
    ef = ErrorFeedback(build("topk:ratio=0.1"))
    for key in ("layer1", "layer2.bias"):
        ef.encode(torch.randn(50), key=key)
    ef.encode(torch.randn(7, dtype=torch.float16), key="half")
    path = tmp_path / "ef.pt"
    torch.save(ef.state_dict(), path)
    state = torch.load(path, weights_only=True)
    other = ErrorFeedback(build("topk:ratio=0.1"))
    other.load_state_dict(state)
    assert set(other.residuals) == {"layer1", "layer2.bias", "half"}
    for key, r in ef.residuals.items():
        assert torch.equal(other.residual(key), r)
    assert other.residual("half").dtype == torch.float32  # residuals keep float32 precision
    x = torch.randn(50)
    assert torch.equal(ef.encode(x, key="layer1").buffer, other.encode(x, key="layer1").buffer)


def test_reset_and_bad_use():
    ef = ErrorFeedback(build("sign"))
    ef.encode(torch.randn(10), key="a")
    ef.encode(torch.randn(10), key="b")
    ef.reset("a")
    assert ef.residual("a") is None and ef.residual("b") is not None
    ef.reset()
    assert not ef.residuals
    ef.encode(torch.randn(10), key="a")
    with pytest.raises(ValueError, match="shape"):
        ef.encode(torch.randn(11), key="a")
    before = ef.residual("a").clone()
    with pytest.raises(ValueError, match="non-finite"):
        ef.encode(torch.full((10,), float("nan")), key="a")
    assert torch.equal(ef.residual("a"), before)  # a failed encode leaves the state alone
    with pytest.raises(ValueError, match="map names to tensors"):
        ef.load_state_dict({"a": [1.0, 2.0]})
    with pytest.raises(TypeError):
        ErrorFeedback("sign")
