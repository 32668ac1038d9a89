"""The position code of the sparsifiers (compress/gapcode.py): exact round trips on awkward sets,
sizes against the information limit log2 C(n, k), the worst case, corrupt sections, and device
genericity (every tensor on the input's device)."""

from __future__ import annotations

import math

import pytest
import torch

from gradwire.compress import CorruptPayload, Packet, bitpack, build, gapcode
from gradwire.compress.sparse import KeepTopK
from tests.compress.compress_cases import positions as expected_positions


def log2_binomial(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def index_sets(n: int) -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(n)
    sets = {"none": [], "all": list(range(n)), "first": [0], "last": [n - 1],
            "front": list(range(min(n, 5))), "end": list(range(max(0, n - 5), n)),
            "odd": list(range(1, n, 2)), "half-end": list(range(n // 2, n))}
    for ratio in (0.001, 0.01, 0.1, 0.3, 0.37, 0.4, 0.6):
        k = max(1, round(ratio * n))
        sets[f"random-{ratio}"] = torch.randperm(n, generator=g)[:k].sort().values.tolist()
        sets[f"block-end-{ratio}"] = list(range(n - k, n))  # clustered at the end
        sets[f"blocks-{ratio}"] = sorted({(i // 3) * 17 % n for i in range(k)})  # clustered in runs
    return sets


SIZES = [1, 2, 7, 8, 9, 13, 64, 1000, 4097, 100003]


@pytest.mark.parametrize("n", SIZES)
def test_round_trip_is_exact_and_sizes_match_the_formula(n):
    for label, kept in index_sets(n).items():
        index = torch.tensor(kept, dtype=torch.int64)
        section = gapcode.encode(n, index)
        assert section.dtype == torch.uint8 and section.numel() == expected_positions(n, kept), label
        assert section.numel() == gapcode.section_bytes(n, index.numel(), gapcode.quotient_sum(n, index))
        out = gapcode.decode(section, n, index.numel(), "test")
        got = out.nonzero().view(-1) if out.dtype == torch.bool else out
        assert got.tolist() == kept, (n, label)
        assert torch.equal(section, gapcode.encode(n, index.clone())), label  # same set, same bytes


@pytest.mark.parametrize("n", SIZES)
def test_never_larger_than_a_bitmap_and_within_the_worst_case_bound(n):
    for label, kept in index_sets(n).items():
        k = len(kept)
        if not k:
            continue
        b = gapcode.golomb_parameter(n, k)
        bound = gapcode.remainder_bits(k, b) + k + (n - k) // b  # the gaps sum to at most n - k
        size = gapcode.encode(n, torch.tensor(kept)).numel()
        assert size <= min(math.ceil(n / 8), math.ceil(bound / 8)), (n, label)


@pytest.mark.parametrize("n, ratio", [(10**6, 0.01), (10**6, 0.001), (4097, 0.01), (100003, 0.05)])
def test_random_positions_cost_within_one_percent_of_the_limit(n, ratio):
    """topk of iid normal data keeps a uniformly random set: its payload (32-bit values and
    positions, no header) is within 1% of 32 k + log2 C(n, k) bits."""
    c = build(f"topk:ratio={ratio}")
    k = c.count(n)
    limit = 32 * k + log2_binomial(n, k)
    for seed in range(3):
        x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
        bits = 8 * c.encode(x).nbytes
        assert limit <= bits + 8 * 8  # a code cannot beat the limit by much on random sets
        assert bits <= 1.01 * limit + 8, (bits / limit - 1)
    # the positions alone, against log2 C(n, k), at the ratios of the brief
    index = torch.randperm(n, generator=torch.Generator().manual_seed(9))[:k].sort().values
    assert 8 * gapcode.encode(n, index).numel() <= 1.02 * log2_binomial(n, k) + 8


def test_golomb_parameter():
    assert gapcode.golomb_parameter(1000, 0) == 1 and gapcode.golomb_parameter(1000, 500) == 1
    assert gapcode.golomb_parameter(1000, 382) == 1 and gapcode.golomb_parameter(1000, 300) == 2
    assert gapcode.golomb_parameter(10**6, 10**4) == 64  # Golomb's 69 less a power of two's waste
    for n, k in [(10**6, 1), (10**9, 10**3), (7, 1), (100, 49)]:
        b = gapcode.golomb_parameter(n, k)
        g, w = gapcode.radix_group(b)
        assert b >= 1 and b**g <= 2**62 and w == (b**g - 1).bit_length()


def test_bit_streams_match_the_bit_packer():
    g = torch.Generator().manual_seed(0)
    for n in (8, 64, 8 * 1001):
        bits = torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8)
        packed = gapcode.bits_to_bytes(bits.clone())
        assert torch.equal(packed, bitpack.pack(bits, 1))
        assert torch.equal(gapcode.bytes_to_bits(packed), bits)
    every = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(gapcode.bits_to_bytes(gapcode.bytes_to_bits(every).clone()), every)


# --- corrupt sections --------------------------------------------------------------------------------

def _stream(n: int, k: int, ones: list[int], remainder_fill: int = 0, extra_bytes: int = 0) -> torch.Tensor:
    """A hand-written gap section: remainder bits all ``remainder_fill``, ones at the unary offsets."""
    rbits = gapcode.remainder_bits(k, gapcode.golomb_parameter(n, k))
    size = (rbits + max(ones) + 1 + 7) // 8 + extra_bytes
    bits = torch.zeros(8 * size, dtype=torch.uint8)
    bits[:rbits] = remainder_fill
    bits[torch.tensor(ones) + rbits] = 1
    return gapcode.bits_to_bytes(bits)


def test_hand_written_section_decodes():
    n, k = 1000, 10  # b = 64: ten remainders in one 60-bit field
    assert gapcode.golomb_parameter(n, k) == 64
    index = gapcode.decode(_stream(n, k, list(range(k))), n, k, "t")
    assert index.tolist() == list(range(k))  # all gaps 0
    index = gapcode.decode(_stream(n, k, [*range(k - 1), k + 1]), n, k, "t")
    assert index.tolist() == [*range(k - 1), k - 1 + 2 * 64]  # the last quotient is 2


@pytest.mark.parametrize("section, message", [
    (lambda: _stream(1000, 10, [*range(9), 9 + 20]), "out of range"),  # last index 9 + 20*64 > n
    (lambda: _stream(1000, 10, list(range(11))), "11 ones for 10"),
    (lambda: _stream(1000, 10, list(range(9))), "9 ones for 10"),
    (lambda: _stream(1000, 10, list(range(10)), extra_bytes=1), "padding after the last"),
    (lambda: torch.zeros(3, dtype=torch.uint8), "shorter than the 70 bits"),
    (lambda: torch.zeros(126, dtype=torch.uint8), "at most 125"),  # longer than the bitmap
    (lambda: torch.full((125,), 0xFF, dtype=torch.uint8), "bitmap marks 1000 elements"),
])
def test_corrupt_gap_sections_are_rejected(section, message):
    with pytest.raises(CorruptPayload, match=message):
        gapcode.decode(section(), 1000, 10, "t")


def test_remainder_fields_beyond_the_radix_are_rejected():
    n, k = 10**6, 1000
    b = gapcode.golomb_parameter(n, k)
    g, w = gapcode.radix_group(b)
    assert b**g < 2**w - 1  # not a power of two: some W-bit fields are not remainders
    with pytest.raises(CorruptPayload, match=f"remainder field of b={b} too large"):
        gapcode.decode(_stream(n, k, list(range(k)), remainder_fill=1), n, k, "t")


def test_corrupt_bitmap_sections_are_rejected():
    n, k = 1001, 600  # b = 1: the bitmap, cut after its last nonzero byte
    good = gapcode.encode(n, torch.arange(k))
    assert good.numel() == 75 and int(good[-1]) == 0xFF
    with pytest.raises(CorruptPayload, match="ends in a zero byte"):
        gapcode.decode(torch.cat([good, torch.zeros(1, dtype=torch.uint8)]), n, k, "t")
    with pytest.raises(CorruptPayload, match="marks 601"):
        gapcode.decode(torch.cat([good, torch.ones(1, dtype=torch.uint8)]), n, k, "t")
    full = torch.cat([good, torch.zeros(51, dtype=torch.uint8)])
    full[-1] = 0x80  # element 1007 of 1001
    full[0] = 0xFE
    with pytest.raises(CorruptPayload, match="beyond its 1001 elements"):
        gapcode.decode(full, n, k, "t")
    with pytest.raises(CorruptPayload, match="at most 0"):
        gapcode.decode(good, n, 0, "t")


@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "threshold:tau=1"])
def test_truncated_values_and_inconsistent_headers(spec):
    x = torch.randn(1000)
    c = build(spec)
    buf = c.encode(x).buffer
    with pytest.raises(CorruptPayload, match="shorter than its"):
        c.decode(Packet(buf[: 20], x.shape, x.dtype))
    if spec.startswith("threshold"):  # a count that the rest of the buffer cannot hold
        bad = buf.clone()
        bad[:4] = torch.tensor([900], dtype=torch.int32).view(torch.uint8)
        with pytest.raises(CorruptPayload, match="shorter than its 900 values"):
            c.decode(Packet(bad, x.shape, x.dtype))


# --- through the compressors -------------------------------------------------------------------------

def _spiky(n: int, where: list[int], dtype=torch.float32) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 1e-3
    x[torch.tensor(where, dtype=torch.int64)] = torch.arange(1, len(where) + 1, dtype=torch.float32) * 10
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("n", [1, 9, 1000, 4097])
def test_compressors_keep_clustered_and_trailing_positions(n, dtype):
    for where in (list(range(n - max(1, n // 10), n)), list(range(max(1, n // 10))), [n - 1]):
        x = _spiky(n, where, dtype)
        expected = torch.zeros_like(x)
        expected[where] = x[where]
        for c in (KeepTopK(k=len(where)), build("threshold:tau=5")):
            assert torch.equal(c.decode(c.encode(x)), expected), (c, where[:3])
    x = _spiky(n, [n - 1], dtype)
    assert torch.equal(build("topk:ratio=1").decode(build("topk:ratio=1").encode(x)), x)
    assert torch.equal(KeepTopK(k=0).decode(KeepTopK(k=0).encode(x)), torch.zeros_like(x))
    assert KeepTopK(k=0).encode(x).nbytes == 0


def test_same_input_same_bytes():
    x = torch.randn(100003, generator=torch.Generator().manual_seed(4))
    for spec in ("topk:ratio=0.01", "topk:ratio=0.3", "threshold:tau=1", "randk:ratio=0.01"):
        c = build(spec)
        a = c.encode(x, generator=torch.Generator().manual_seed(1)).buffer
        assert torch.equal(a, c.encode(x.clone(), generator=torch.Generator().manual_seed(1)).buffer)


@pytest.mark.parametrize("compressor", [build("topk:ratio=0.01"), build("topk:ratio=0.5"), build("topk:ratio=1"),
                                        build("threshold:tau=1"), build("threshold:tau=0.1"),
                                        build("threshold:tau=0.45"), build("randk:ratio=0.01"),
                                        build("randk:ratio=0.7"), KeepTopK(k=3)], ids=repr)
@pytest.mark.parametrize("n", [0, 1, 1000, 1 << 17])
def test_every_tensor_is_made_on_the_input_device(compressor, n):
    """With "meta" as the default device, a factory call without ``device=`` makes a meta tensor,
    which fails as soon as it meets the CPU input (or yields a meta result): the CPU stand-in for
    a CUDA run."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    reference = compressor.encode(x, generator=torch.Generator().manual_seed(0))
    with torch.device("meta"):
        packet = compressor.encode(x, generator=torch.Generator(device="cpu").manual_seed(0))
        y = compressor.decode(packet)
    assert packet.buffer.device.type == "cpu" and y.device.type == "cpu"
    assert torch.equal(packet.buffer, reference.buffer)
    assert torch.equal(y, compressor.decode(reference))


@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "topk:ratio=0.6", "threshold:tau=1"])
def test_decodes_from_a_slice_at_any_offset(spec):
    """Receivers slice payloads out of one gathered buffer (the DDP hook): no alignment is assumed."""
    c = build(spec)
    x = torch.randn(4099, generator=torch.Generator().manual_seed(5))
    buf = c.encode(x).buffer
    for offset in (1, 3, 7):
        big = torch.zeros(offset + buf.numel() + 5, dtype=torch.uint8)
        big[offset: offset + buf.numel()] = buf
        sliced = Packet(big[offset: offset + buf.numel()], x.shape, x.dtype)
        assert torch.equal(c.decode(sliced), c.decode(Packet(buf, x.shape, x.dtype)))
