"""``Compressor.decode_rows``: k packets of one size decoded at once (the scatter route's chunk
messages, averaging/compressed.py) equal each packet decoded alone, bit for bit: sign's one-pass
override and the default's loop (a fixed-size codec), with bytes after each packet ignored."""

import pytest
import torch

from gradwire.compress import build
from gradwire.compress.base import Packet


@pytest.mark.parametrize("spec", ["sign:scaled=true", "sign", "qsgd:levels=4,bucket=32", "pquant:p=inf,block=32"])
@pytest.mark.parametrize("numel", [1, 7, 8, 61, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_decode_rows_is_each_row_decoded_alone(spec, numel, dtype, device):
    c, g = build(spec), torch.Generator(device=device).manual_seed(numel)
    packets = [c.encode(torch.randn(numel, generator=g, device=device).to(dtype), generator=g) for _ in range(5)]
    size = c.nbytes(numel, dtype)
    rows = torch.zeros(5, size + 3, dtype=torch.uint8, device=device)  # 3 bytes after each packet, as a slot pads
    for row, p in zip(rows, packets, strict=True):
        row[:size] = p.buffer
        row[size:] = 255
    got = c.decode_rows(rows[:, :], numel, dtype)
    assert got.shape == (5, numel) and got.dtype == dtype and got.device == packets[0].buffer.device
    for k, p in enumerate(packets):
        assert torch.equal(got[k], c.decode(Packet(p.buffer, torch.Size([numel]), dtype))), k


def test_a_negative_scale_in_any_row_is_refused():
    c = build("sign:scaled=true")
    rows = torch.stack([c.encode(torch.randn(16)).buffer for _ in range(3)])
    rows[1, :4] = torch.tensor([-1.0]).view(torch.uint8)
    with pytest.raises(ValueError, match="negative or non-finite scale"):
        c.decode_rows(rows, 16, torch.float32)
