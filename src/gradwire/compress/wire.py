"""Helpers shared by the codecs: flattening the input, reading the wire, float32 scalars."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from gradwire.compress.base import CorruptPayload, Packet, check_input, expect_size

# Elements per pass of the chunked codecs. Working chunk by chunk keeps every scratch buffer
# in cache and reused, instead of allocating (and page-faulting) tensors of the full size: on the
# reference machine a fresh 100 MB tensor costs about as much as the arithmetic of a whole codec.
# But every pass also pays a dozen op dispatches of a few microseconds each: at 80k elements that
# was a third of qsgd's encode; 320k (1.3 MB per float scratch) took qsgd's encode + decode at 4M
# elements from 22 to 14 ms on one thread (benchmarks/gpu_codecs.py --device cpu). A multiple of
# 40, so that chunks hold whole groups of 8 bit-packed symbols and of 5 base-3 trits.
CHUNK = 40 * 8192


def chunk_size(n: int, device: torch.device) -> int:
    """Elements per pass over ``n`` elements on ``device``: ``CHUNK`` on the CPU; on a GPU the
    whole tensor at once (rounded up to whole groups), since there every pass costs kernel
    launches and scratch buffers are cheap."""
    return CHUNK if device.type == "cpu" else max(40, -(-n // 40) * 40)

_F32_MAX = torch.finfo(torch.float32).max


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Codecs compute in float32, and in float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def flat(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous 1-D tensor (a view when it already is contiguous)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    check_input(x)
    return x.detach().reshape(-1).contiguous()


def make_packet(buffer: torch.Tensor, x: torch.Tensor) -> Packet:
    return Packet(buffer, x.shape, x.dtype)


def raw(packet: Packet, name: str) -> torch.Tensor:
    """The packet's buffer after checking its type (``CorruptPayload`` otherwise) and its dtype."""
    buf = packet.buffer
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
        raise CorruptPayload(f"{name}: the wire buffer must be a 1-D torch.uint8 tensor")
    check_input(torch.empty(0, dtype=packet.dtype, device="meta"), "packet")
    return buf.contiguous()


def payload(packet: Packet, expected: int, name: str) -> torch.Tensor:
    """The packet's buffer after checking its type and exact size (``CorruptPayload`` otherwise)."""
    buf = raw(packet, name)
    expect_size(packet, expected, name)
    return buf


def read(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret the bytes ``buf`` as ``dtype``; copies first if the bytes are not aligned for it."""
    if buf.storage_offset() % dtype.itemsize:
        buf = buf.clone()
    return buf.view(dtype)


def write(dst: torch.Tensor, values: torch.Tensor) -> None:
    """Copy ``values`` bit for bit into the bytes ``dst`` (any alignment)."""
    dst.copy_(values.contiguous().reshape(-1).view(torch.uint8))


FRAME_BYTES = 4  # a framed payload's length header: uint32, little-endian


def frame(buffer: torch.Tensor, capacity: int) -> torch.Tensor:
    """``[uint32 length, little-endian][buffer][zeros up to capacity]``: a payload of at most
    ``capacity`` bytes carried at the fixed size ``capacity + FRAME_BYTES``, so that an all-gather
    needs no exchange of sizes first (gloo and NCCL gather equal sizes)."""
    n = buffer.numel()
    if n > capacity:
        raise ValueError(f"a payload of {n} bytes does not fit its frame of {capacity} (the codec's max_nbytes)")
    if n >= 2**32:
        raise ValueError(f"a payload of {n} bytes does not fit a frame's 32-bit length")
    out = torch.zeros(capacity + FRAME_BYTES, dtype=torch.uint8, device=buffer.device)
    out[:FRAME_BYTES] = torch.tensor([n], dtype=torch.int64).view(torch.uint8)[:FRAME_BYTES]
    out[FRAME_BYTES: FRAME_BYTES + n] = buffer
    return out


def unframe(buffer: torch.Tensor, name: str) -> torch.Tensor:
    """The payload inside a :func:`frame` (a view); ``CorruptPayload`` if its length does not fit."""
    if buffer.numel() < FRAME_BYTES:
        raise CorruptPayload(f"{name}: framed payload of {buffer.numel()} bytes is shorter than its header")
    n = int.from_bytes(bytes(buffer[:FRAME_BYTES].tolist()), "little")  # one host read of 4 bytes
    if n > buffer.numel() - FRAME_BYTES:
        raise CorruptPayload(f"{name}: framed payload says {n} bytes in a frame of {buffer.numel() - FRAME_BYTES}")
    return buffer[FRAME_BYTES: FRAME_BYTES + n]


def power_of_two_below(amax: torch.Tensor) -> torch.Tensor:
    """The power of two at or below each non-negative finite ``amax`` (0.5 for 0), in its dtype: dividing
    a tensor by it is exact and brings its largest |entry| into [1, 2), so a sum of squares taken
    afterwards neither overflows nor underflows (a float32 entry past about 1.8e19 squares to inf)."""
    _, exponent = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1); 0 gives e = 0
    return torch.ldexp(torch.ones_like(amax), exponent - 1)


def to_f32_up(value: torch.Tensor) -> torch.Tensor:
    """Round non-negative scalars to float32 upwards, so a scale on the wire never falls below the
    value it bounds (float64 inputs); fp32 values pass unchanged."""
    out = value.to(torch.float32)
    if value.dtype == torch.float64:
        low = out.double() < value
        out = torch.where(low, torch.nextafter(out, torch.full_like(out, float("inf"))), out)
    return out


def check_scales(scales: torch.Tensor, name: str) -> None:
    """Scales read from the wire must be finite and non-negative."""
    if scales.numel() and not bool(((scales >= 0) & (scales <= _F32_MAX)).all()):
        raise CorruptPayload(f"{name}: the payload holds a negative or non-finite scale")


def reduce_f64(x: torch.Tensor, kind: str, dtype: torch.dtype | None = None) -> float:
    """``sum(x)`` (kind "sum"), ``sum|x|`` ("l1") or ``sum x^2`` ("l2sq") of a 1-D tensor: rows of
    4096 reduced in ``dtype`` (default: the work dtype), combined in float64. torch's float32
    reduction of one long vector drifts (by 0.3% for 25M normal values); its row reductions keep
    the float32 rounding of 4096 terms (a relative error of order 1e-6 on sums of one sign)."""
    dtype = dtype or work_dtype(x.dtype)
    full = x.numel() // 4096 * 4096
    total = 0.0
    for rows in (x[:full].view(-1, 4096), x[full:].view(1, -1)):
        if rows.numel() == 0:
            continue
        if kind == "sum":
            part = rows.sum(dim=1, dtype=dtype).double()
        elif kind == "l1":
            part = torch.linalg.vector_norm(rows, 1, dim=1, dtype=dtype).double()
        else:
            part = torch.linalg.vector_norm(rows, 2, dim=1, dtype=dtype).double().square()
        total += float(part.sum())
    return total


def check_decodable(largest: torch.Tensor, dtype: torch.dtype, name: str,
                    remedy: str = "use smaller buckets (or p=inf, whose scale is max |x|)") -> None:
    """Refuse a float16 input whose decoded values would pass float16's 65,504: ``largest`` bounds
    them (a rand-k value times n/k; for the grid codecs, from each bucket's scale and its largest
    element: ``grid_decode_bound``). float16 values near 3,000 in a bucket of 512 have an L2 norm past
    65,504, which qsgd:levels=1 decodes to. bfloat16 has float32's range (within 0.4 %): not
    checked, and no host read there."""
    if dtype != torch.float16 or not largest.numel():
        return
    top = torch.finfo(dtype).max
    biggest = float(largest.max())
    if biggest > top:
        raise ValueError(f"{name}: a decoded value would reach {biggest:g}, beyond {dtype}'s range ({top:g}); "
                         f"send float32 gradients, or {remedy}")


def centred_l2sq(x: torch.Tensor, mean: float, chunk: int = 1 << 20) -> float:
    """``sum (x - mean)^2`` of a 1-D tensor, in float64, a chunk at a time (no temporary of x's
    size): the variance where ``sum x^2 - n mean^2`` would cancel."""
    total = 0.0
    for a in range(0, x.numel(), chunk):
        total += reduce_f64(x[a: a + chunk].double() - mean, "l2sq", torch.float64)
    return total


def spans(lo: int, hi: int, bucket: int) -> Iterator[tuple[int, int, int, int]]:
    """Split ``[lo, hi)`` along a grid of buckets of ``bucket`` elements into pieces that each are a
    whole number of rows of one shape: yields ``(start, stop, first_bucket, rows)``. A piece is
    either a run of full buckets or a part of one bucket (``rows == 1``)."""
    start = lo
    if start % bucket:
        stop = min(hi, (start // bucket + 1) * bucket)
        yield start, stop, start // bucket, 1
        start = stop
    full = (hi - start) // bucket
    if full:
        yield start, start + full * bucket, start // bucket, full
        start += full * bucket
    if start < hi:
        yield start, hi, start // bucket, 1
