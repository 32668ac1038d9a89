"""Bit packing against a bit-by-bit reference of the documented little-endian stream."""

from __future__ import annotations

import pytest
import torch

from gradwire.compress import bitpack
from gradwire.compress.stream import SymbolStream


def reference_stream(symbols: list[int], bits: int) -> list[int]:
    """Symbol i occupies stream bits [bits*i, bits*i + bits); stream bit k is bit k % 8 of byte k // 8."""
    out = [0] * ((len(symbols) * bits + 7) // 8)
    for i, s in enumerate(symbols):
        for j in range(bits):
            k = bits * i + j
            out[k // 8] |= ((s >> j) & 1) << (k % 8)
    return out


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 61, 256])
def test_pack_matches_reference(bits, n, device):
    sym = torch.randint(0, 1 << bits, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    sym = sym.to(device)
    packed = bitpack.pack(sym, bits)
    assert packed.device == device
    assert packed.tolist() == reference_stream(sym.tolist(), bits)
    assert torch.equal(bitpack.unpack(packed, n, bits), sym)


@pytest.mark.parametrize("width", [0, 1, 5, 10, 17, 33, 62, 63])
def test_pack_uint(width, device):
    """The whole range of each width, its top bit included (bit 62 for width 63)."""
    words = torch.empty(35, dtype=torch.int64).random_(-(2**63), None, generator=torch.Generator().manual_seed(width))
    values = torch.cat([words.bitwise_and((1 << width) - 1), torch.tensor([0, (1 << width) - 1])]).to(device)
    if width:
        assert int((values >> (width - 1) & 1).sum()) >= 10  # the top bit is set in many values
    packed = bitpack.pack_uint(values, width)
    assert packed.tolist() == reference_stream(values.tolist(), width)
    assert packed.device == device
    assert packed.numel() == (37 * width + 7) // 8
    assert torch.equal(bitpack.unpack_uint(packed, 37, width), values)


def test_trits_are_base_three(device):
    trits = torch.randint(0, 3, (500,), dtype=torch.uint8).to(device)
    out = torch.empty(100, dtype=torch.uint8, device=device)
    bitpack.pack_trits(trits.clone(), out)
    t = trits.view(-1, 5).long()
    assert out.long().tolist() == (t * torch.tensor([1, 3, 9, 27, 81], device=device)).sum(1).tolist()
    back = torch.empty(500, dtype=torch.uint8, device=device)
    bitpack.unpack_trits(out, back)
    assert torch.equal(back, trits)


@pytest.mark.parametrize("bits", [None, 1, 2, 3, 4, 7, 8])
def test_float_stream_matches_bitpack(bits, device):
    """The float fast path writes the same bytes as the uint8 packers and decodes a*q + b."""
    count = 3 if bits is None else (1 << bits) - 1
    stream = SymbolStream(bits, count, 0.5, -1.0, torch.float32, device)
    n = 40 * 7
    q = torch.randint(0, count, (n,), dtype=torch.uint8).to(device)
    t = q.float() + torch.rand(n).to(device) * 0.99  # floats in [q, q + 1): packing floors them
    out = torch.empty(stream.nbytes(n), dtype=torch.uint8, device=device)
    stream.pack(t, out, torch.empty(n, device=device), torch.empty(n, dtype=torch.uint8, device=device))
    if bits is None:
        ref = torch.empty(n // 5, dtype=torch.uint8, device=device)
        bitpack.pack_trits(q.clone(), ref)
    else:
        ref = bitpack.pack(q, bits)
    assert torch.equal(out, ref)
    values = torch.empty(n, device=device)
    stream.unpack(out, values, torch.empty(n, dtype=torch.uint8, device=device),
                  torch.empty(n, dtype=torch.int64, device=device), "test")
    assert torch.equal(values, q.float() * 0.5 - 1.0)


@pytest.mark.parametrize("width", [1, 3, 7, 8, 13, 17, 31, 36, 56])
def test_pack_fields_is_the_lsb_first_stream_of_pack_uint(width):
    values = torch.randint(0, 1 << width, (8 * 37,), generator=torch.Generator().manual_seed(width))
    out = torch.empty(37 * width, dtype=torch.uint8)
    bitpack.pack_fields(values, width, out)
    assert torch.equal(out, bitpack.pack_uint(values, width))  # bit planes: an independent packer
    assert torch.equal(bitpack.unpack_fields(out, width), values)
