"""QSGD's wire formats: format 2 within 5 % of log2(2s+1) bits per symbol, format 1 still decodes."""

from __future__ import annotations

import math

import pytest
import torch

from gradwire.compress import CorruptPayload, Packet, bitpack, build
from gradwire.compress.qsgd import field_layout
from gradwire.errors import ConfigError
from tests.compress.compress_cases import QSGD_FIELDS


def test_every_level_count_is_within_five_percent_of_the_limit():
    for s in range(1, 128):
        k, w = field_layout(s)
        assert (2 * s + 1) ** k <= 2**w, s  # k symbols fit the field
        assert w / k <= 1.05 * math.log2(2 * s + 1), (s, k, w)
    for s, fields in QSGD_FIELDS.items():
        assert field_layout(s) == fields


@pytest.mark.parametrize("levels, bits_per_el", [(1, 1.6), (4, 13 / 4), (16, 31 / 6), (7, 4.0)])
def test_exact_size_at_the_limit(levels, bits_per_el):
    n = 6 * 5 * 4 * 1000  # a multiple of every k: no partial field
    c = build(f"qsgd:levels={levels},bucket={n}")
    assert c.nbytes(n) == 4 + n * bits_per_el / 8
    assert (8 * c.nbytes(n) - 32) / n <= 1.05 * math.log2(2 * levels + 1)


@pytest.mark.parametrize("levels", [1, 2, 3, 4, 5, 16, 64, 98])
@pytest.mark.parametrize("n", [1, 7, 61, 1003])
def test_format_2_decodes_to_format_1_values(levels, n):
    """Same generator, same symbols: the two formats differ only in packing, so they decode to the
    same values bit for bit."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    old, new = build(f"qsgd:levels={levels},bucket=5,format=1"), build(f"qsgd:levels={levels},bucket=5")
    a = old.encode(x, generator=torch.Generator().manual_seed(9))
    b = new.encode(x, generator=torch.Generator().manual_seed(9))
    assert torch.equal(old.decode(a), new.decode(b))


def test_old_payload_written_by_hand_still_decodes():
    """A format-1 payload built from its documented layout (b-bit symbols, LSB first) decodes."""
    s, n = 4, 11
    symbols = torch.tensor([0, 8, 4, 5, 3, 1, 7, 2, 6, 4, 8], dtype=torch.uint8)
    scale = torch.tensor([2.0], dtype=torch.float32)
    buf = torch.cat([scale.view(torch.uint8), bitpack.pack(symbols, 4)])
    out = build(f"qsgd:levels={s},bucket={n},format=1").decode(Packet(buf, torch.Size([n]), torch.float32))
    assert torch.equal(out, (symbols.float() - s) * 2.0 / s)


def test_levels_that_kept_their_width_send_the_same_bytes():
    x = torch.randn(777)
    for s in (7, 15, 127):
        a = build(f"qsgd:levels={s},format=1").encode(x, generator=torch.Generator().manual_seed(2))
        b = build(f"qsgd:levels={s}").encode(x, generator=torch.Generator().manual_seed(2))
        assert torch.equal(a.buffer, b.buffer)


def test_field_beyond_the_radix_is_corrupt():
    c = build("qsgd:levels=4,bucket=8")  # 4 symbols of radix 9 per 13-bit field: 9^4 = 6561 < 8192
    packet = c.encode(torch.randn(8))
    buf = packet.buffer.clone()
    buf[4:] = 0xFF  # every field 8191 >= 6561
    with pytest.raises(CorruptPayload, match="invalid symbol"):
        c.decode(Packet(buf, packet.shape, packet.dtype))


def test_bad_format_is_one_clear_error():
    with pytest.raises(ConfigError, match="format must be one of 1, 2, got 3"):
        build("qsgd:format=3")


def test_fixed_width_is_kept_exactly_where_documented():
    kept = [s for s in range(1, 128) if field_layout(s)[0] == 1]
    assert kept == [7, 14, 15, *range(26, 32), *range(51, 64), *range(98, 128)]
