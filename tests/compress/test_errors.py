"""Bad input: non-finite tensors, bad specs, and corrupt payloads never decode to garbage."""

from __future__ import annotations

import pytest
import torch

from gradwire.compress import REGISTRY, CorruptPayload, Packet, build
from gradwire.errors import ConfigError
from tests.compress.compress_cases import DTYPES, SPECS


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("bad, index", [(float("nan"), 3), (float("inf"), 700), (float("-inf"), 0)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_finite_input_is_named(spec, bad, index, dtype):
    x = torch.randn(1000).to(dtype)
    x[index] = bad
    with pytest.raises(ValueError, match=rf"non-finite value \({bad}\) at flat index {index}\b"):
        build(spec).encode(x)


def test_fp16_overflow_is_named():
    x = torch.ones(10)
    x[4] = 1e5  # fits float32, not float16
    with pytest.raises(ValueError, match="value 100000 at flat index 4 overflows torch.float16"):
        build("fp16").encode(x)


@pytest.mark.parametrize("dtype, big", [(torch.float16, 65504.0), (torch.float32, 3.4e38),
                                        (torch.bfloat16, 3.38e38)])
def test_natural_overflow_is_named(dtype, big):
    """The largest values round up past the dtype's largest power of two with probability > 0.99."""
    x = torch.ones(10, dtype=dtype)
    x[4] = big
    with pytest.raises(ValueError, match="index 4 rounds up to 2"):
        build("natural").encode(x, generator=torch.Generator().manual_seed(0))


def test_unsupported_dtype():
    with pytest.raises(TypeError, match="supported dtypes"):
        build("qsgd").encode(torch.arange(10))


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown compressor 'nope'; valid compressors: bf16, chunked-topk, fp16, natural, none, pquant, qsgd"),
    ("qsgd:level=3", "no parameter 'level'; valid parameters: levels, bucket"),
    ("topk:fraction=0.1", "valid parameters: ratio"),
    ("qsgd:levels=0", "levels must be in 1..127"),
    ("qsgd:levels=128", "levels must be in 1..127"),
    ("qsgd:levels=two", "levels='two' is not a valid int"),
    ("qsgd:bucket=0", "bucket must be >= 1"),
    ("pquant:block=0", "block must be >= 1"),
    ("pquant:p=3", "p must be one of 1, 2, inf"),
    ("topk:ratio=0", r"ratio must be in \(0, 1\]"),
    ("randk:ratio=1.5", r"ratio must be in \(0, 1\]"),
    ("threshold:tau=-1", "tau must be a finite number >= 0"),
    ("terngrad:clip=-2", "clip must be a finite number >= 0"),
    ("sign:scaled=maybe", "not a valid bool"),
])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ConfigError, match=message):
        build(spec)


def test_registry_describes_every_compressor():
    text = REGISTRY.describe()
    for name in REGISTRY.names():
        assert name in text


def _packet(buffer, like):
    return Packet(buffer, like.shape, like.dtype)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [0, 1, 13, 1000])
def test_truncated_or_oversized_buffers(spec, n):
    c = build(spec)
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))  # fixed: see below
    buf = c.encode(x).buffer
    if buf.numel():
        with pytest.raises(CorruptPayload):
            c.decode(_packet(buf[:-1], x))
    with pytest.raises(CorruptPayload):
        c.decode(_packet(torch.cat([buf, torch.zeros(1, dtype=torch.uint8)]), x))
    with pytest.raises(CorruptPayload):
        c.decode(_packet(buf.to(torch.int16), x))  # not uint8


@pytest.mark.parametrize("n", [9, 13, 20])  # sizes whose gap code can be one byte short of the bitmap
def test_sparse_buffers_with_one_trailing_zero_byte_are_refused(n):
    """A gap code one byte shorter than the bitmap, with a zero byte appended, has the bitmap's size;
    it decodes as a bitmap with the right count for some inputs (seed 7 at n=13 did), so the decoder
    must also check that the encoder would have sent a bitmap for those positions."""
    c = build("topk:ratio=0.1")
    gen = torch.Generator().manual_seed(n)
    for _ in range(300):
        x = torch.randn(n, dtype=torch.float64, generator=gen)
        buf = c.encode(x).buffer
        with pytest.raises(CorruptPayload):
            c.decode(_packet(torch.cat([buf, torch.zeros(1, dtype=torch.uint8)]), x))


def _corrupt(spec, x, edit):
    c = build(spec)
    buf = c.encode(x).buffer.clone()
    edit(buf)
    with pytest.raises(CorruptPayload):
        c.decode(_packet(buf, x))


def _set_f32(buf, offset, value):
    buf[offset: offset + 4] = torch.tensor([value], dtype=torch.float32).view(torch.uint8)


@pytest.mark.parametrize("spec", ["qsgd", "pquant:p=2", "terngrad", "sign:scaled=true"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_bad_scale_in_header(spec, value):
    _corrupt(spec, torch.randn(100), lambda b: _set_f32(b, 0, value))


def test_invalid_symbols():
    x = torch.randn(100)
    _corrupt("qsgd:levels=7", x, lambda b: b.__setitem__(4 + 10, 0xFF))  # symbol 15 > 2s = 14
    _corrupt("qsgd:levels=2,bucket=512", x, lambda b: b.__setitem__(4 + 3, 0xFF))  # 3-bit symbol 7 > 4
    _corrupt("terngrad", x, lambda b: b.__setitem__(4 + 7, 243))  # not a base-3 byte
    _corrupt("pquant", x, lambda b: b.__setitem__(4 + 19, 250))
    _corrupt("natural", x, lambda b: b.__setitem__(5, 255))  # exponent byte 255 is not a number
    _corrupt("natural", x.half(), lambda b: b.__setitem__(5, 200))  # 2^73 does not fit float16


def test_sparse_headers_inconsistent_with_shape():
    x = torch.randn(1000)
    # topk gap code (k = 10 positions after 40 value bytes): too many ones, then none
    _corrupt("topk:ratio=0.01", x, lambda b: b[40:].fill_(0xFF))
    _corrupt("topk:ratio=0.01", x, lambda b: b[40:].fill_(0))
    # topk bitmap (k = 500): one marked element too many, and a bit beyond n = 1001 (the last
    # element is kept, so the bitmap runs to its end)
    _corrupt("topk:ratio=0.5", x, lambda b: b[2000:].fill_(0xFF))
    last_kept = torch.cat([torch.randn(1000), torch.tensor([100.0])])
    _corrupt("topk:ratio=0.5", last_kept, lambda b: b.__setitem__(-1, b[-1] | 0x80))
    # threshold: a count above n, and a count that does not match the size
    for count in (1001, 3):
        header = torch.tensor([count], dtype=torch.int32).view(torch.uint8)
        _corrupt("threshold:tau=1", x, lambda b, h=header: b[:4].copy_(h))
    _corrupt("threshold:tau=1", x, lambda b: b[4:8].copy_(torch.tensor([float("nan")]).view(torch.uint8)))
    c = build("threshold:tau=1")
    with pytest.raises(CorruptPayload, match="shorter than its header"):
        c.decode(_packet(torch.zeros(3, dtype=torch.uint8), x))
