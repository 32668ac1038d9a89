"""Bounded messages: top-k and chunked top-k keep a fixed count of positions, so their payloads
have an upper bound (``max_nbytes``) although their size depends on the data; framed at it (a
4-byte length, the payload, zeros), they travel at a fixed size and no transport exchanges sizes
before an all-gather. The payload and frame tests run on the CPU and, where one is present, on CUDA
(the ``device`` fixture)."""

import pytest
import torch

from gradwire.compress import build, gapcode
from gradwire.compress.base import CorruptPayload
from gradwire.compress.wire import FRAME_BYTES, frame, unframe


def position_sets(n: int, k: int):
    """Kept positions the gap code finds hardest and easiest: spread evenly (the largest gaps),
    the last k, the first k, one cluster in the middle, random."""
    middle = min(n // 2, n - k)
    yield torch.linspace(0, n - 1, k).round().long().unique()
    yield torch.arange(n - k, n)
    yield torch.arange(k)
    yield torch.arange(middle, middle + k)
    yield torch.randperm(n, generator=torch.Generator().manual_seed(0))[:k].sort().values


@pytest.mark.parametrize("n,k", [(1000, 1), (1000, 10), (4096, 512), (137_216, 1372), (500, 200), (64, 60)])
def test_no_set_of_k_positions_takes_more_than_the_bound(n, k):
    bound = gapcode.max_section_bytes(n, k)
    sizes = [gapcode.encode(n, index).numel() for index in position_sets(n, k)]
    assert max(sizes) <= bound
    # the spread-out set (gaps summing to n - k, each as near b's multiple as they come) sits close to it
    assert bound - max(sizes) <= max(2, bound // 10)


@pytest.mark.parametrize("spec,dtype", [("chunked-topk:chunk=4096,k=512", torch.float32),
                                        ("chunked-topk:chunk=64,k=1,values=raw", torch.float64),
                                        ("chunked-topk:chunk=256,k=8,values=raw", torch.bfloat16),
                                        ("topk:ratio=0.01", torch.float32), ("topk:ratio=0.3", torch.float16)])
def test_every_payload_fits_its_codecs_bound_and_comes_back_through_its_frame(spec, dtype, device):
    c, n = build(spec), 20_000
    bound = c.max_nbytes(n, dtype)
    g = torch.Generator().manual_seed(1)
    draws = torch.Generator(device).manual_seed(1)
    for trial in range(6):
        x = torch.randn(n, generator=g, dtype=torch.float32)
        if trial % 2:  # magnitudes rising along each window of 4096: the kept positions bunch at its end
            x *= torch.arange(n) % 4096 + 1.0
        p = c.encode(x.to(dtype).to(device), generator=draws)
        assert p.buffer.numel() <= bound
        framed = frame(p.buffer, bound)
        assert framed.numel() == bound + FRAME_BYTES and framed.device == p.buffer.device
        assert torch.equal(unframe(framed, c.name), p.buffer)


def test_the_codecs_without_a_bound_and_with_a_fixed_size():
    assert build("threshold:tau=0.1").max_nbytes(1000) is None  # any count of values
    assert build("qsgd:levels=7").max_nbytes(1000) == build("qsgd:levels=7").nbytes(1000)


def test_a_frame_refuses_what_does_not_fit_and_a_corrupt_length(device):
    with pytest.raises(ValueError, match="does not fit its frame of 3"):
        frame(torch.zeros(4, dtype=torch.uint8, device=device), 3)
    bad = frame(torch.ones(3, dtype=torch.uint8, device=device), 3)
    bad[0] = 9
    with pytest.raises(CorruptPayload, match="says 9 bytes in a frame of 3"):
        unframe(bad, "topk")
    with pytest.raises(CorruptPayload, match="shorter than its header"):
        unframe(torch.zeros(2, dtype=torch.uint8, device=device), "topk")
