"""Unbiased stochastic rounding onto a symmetric grid, bucket by bucket: the core shared by QSGD
(Alistarh et al. 2017), TernGrad (Wen et al. 2017) and DIANA's p-norm quantizer (Mishchenko et
al. 2019).

Bucket ``b`` has a scale ``r_b`` (a norm, float32 on the wire) and the grid ``{-s, ..., s} * r_b/s``.
Element ``x`` travels as the symbol ``q = floor(x*s/r_b + s + u)`` in ``0..2s``, ``u`` uniform in
[0, 1), and decodes to ``(q - s) * r_b/s``. As P(q = floor(y) + 1) = frac(y) for ``y = x*s/r_b + s``,
E[q] = y and the decoded value is unbiased. Stochastic rounding of a signed value to the integer
grid has the same law as the papers' ``sign(x) * round(|x|)``, so neither abs nor sign is computed.

Randomness: ``u`` takes the 2^16 values ``(k + 1/2) / 2^16``, drawn as int16 from int64 random
words (four per word: the cheapest random bytes torch's CPU generator makes). Then
``|P(round up) - frac(y)| <= 2^-17``; float32 arithmetic adds at most an ulp of ``y`` (2^-16 for
s = 127, 2^-20 for s <= 7). The bias is therefore below 2^-16 of one grid step per element, far
under the sampling noise of any test or training run.
"""

from __future__ import annotations

import torch

from gradwire import kernels
from gradwire.compress import bitpack
from gradwire.compress.base import Compressor, CorruptPayload, Packet, raise_non_finite
from gradwire.compress.stream import SymbolStream
from gradwire.compress.wire import (
    check_decodable,
    check_scales,
    flat,
    make_packet,
    payload,
    read,
    reduce_f64,
    spans,
    to_f32_up,
    work_dtype,
    write,
)

_INF = float("inf")
_LONG_ROW = 65536  # torch's float32 row norms stay within 2e-6 up to this length


def bucket_norms(x: torch.Tensor, bucket: int, p: float, dtype: torch.dtype) -> torch.Tensor:
    """The ``p``-norm (1, 2 or inf) of each bucket of the 1-D ``x``, computed in ``dtype``."""
    n = x.numel()
    if p != _INF and bucket > _LONG_ROW:  # few long buckets: accumulate each in float64 by rows
        kind = "l1" if p == 1 else "l2sq"
        sums = [reduce_f64(x[a: a + bucket], kind, dtype) for a in range(0, n, bucket)]
        return torch.tensor(sums, dtype=torch.float64, device=x.device).pow_(1 / p).to(dtype)
    full = n // bucket * bucket
    parts = [x[:full].view(-1, bucket)] if full else []
    if full < n:
        parts.append(x[full:].view(1, -1))
    out = []
    for rows in parts:
        if p == _INF:  # amax and amin are each one cheap pass; abs() would write a full temporary
            out.append(torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg()).to(dtype))
        else:
            out.append(torch.linalg.vector_norm(rows, p, dim=1, dtype=dtype))
    return torch.cat(out) if out else torch.zeros(0, dtype=dtype, device=x.device)


# Below this L2 norm a float32 sum of squares may have underflowed (squares of values under ~1e-19
# are below float32's smallest normal): such buckets are measured again in float64.
_UNDERFLOW = 2.0 ** -60


def _remeasured(x: torch.Tensor, norms: torch.Tensor, bucket: int) -> torch.Tensor:
    """``norms`` (L2, one per bucket of ``x``) with those below 2^-60 measured again in float64:
    only those buckets, so that an all-zero bucket (a frozen layer) costs its own elements only."""
    n, out = x.numel(), norms.to(torch.float64)
    low = torch.nonzero(norms < _UNDERFLOW).flatten()
    full = n // bucket
    rows = low[low < full]
    if rows.numel():
        out[rows] = torch.linalg.vector_norm(x[: full * bucket].view(-1, bucket)[rows].double(), dim=1)
    if bool((low == full).any()):  # the short last bucket
        out[full] = torch.linalg.vector_norm(x[full * bucket:].double())
    return out


def grid_decode_bound(x: torch.Tensor, scales: torch.Tensor, bucket: int, levels: int) -> torch.Tensor:
    """The largest magnitude each bucket can decode to: its scale times (the level its largest |x|
    rounds up to, at most ``levels``) / ``levels``."""
    amax = bucket_norms(x, bucket, _INF, torch.float32)
    up = torch.clamp(torch.floor(levels * amax / scales.clamp(min=torch.finfo(torch.float32).tiny)) + 1, max=levels)
    return scales * up / levels


def wire_scales(x: torch.Tensor, norms: torch.Tensor, bucket: int, p: float, name: str) -> torch.Tensor:
    """Float32 wire scales from norms, rejecting non-finite input. A norm is non-finite iff an input
    is, except when a float32 sum of squares overflows: then every norm is computed again in
    float64. An L2 norm below 2^-60 may have underflowed (subnormal inputs square to 0, and every
    value would decode to 0): those buckets alone are measured again in float64."""
    if not norms.numel():
        return to_f32_up(norms)
    if not bool(torch.isfinite(norms).all()):
        if not bool(torch.isfinite(x).all()):
            raise_non_finite(x, name)
        norms = bucket_norms(x, bucket, p, torch.float64)
    elif p == 2 and bool((norms < _UNDERFLOW).any()):
        norms = _remeasured(x, norms, bucket)
    scales = to_f32_up(norms)
    if scales.numel() and not bool(torch.isfinite(scales).all()):
        raise ValueError(f"{name}: a bucket's scale exceeds the float32 range; the wire cannot carry it")
    return scales


def encode_grid(x: torch.Tensor, bucket: int, scales: torch.Tensor, levels: int, bits: int | None,
                out: torch.Tensor, generator: torch.Generator | None, per_field: int = 1) -> None:
    """Write the symbols of ``x`` into ``out`` (``per_field`` radix-(2s+1) symbols per ``bits``-bit
    field, or base-3 trits if ``bits`` is None), chunk by chunk. ``out`` must hold the stream of
    ``n`` rounded up to a whole group."""
    n = x.numel()
    work = work_dtype(x.dtype)
    s = scales.to(work)
    mult = torch.where(s > 0, levels / s, torch.zeros_like(s))
    if not bool(torch.isfinite(mult).all()):  # s/levels overflows for subnormal scales: use float64
        work, s = torch.float64, scales.double()
        mult = torch.where(s > 0, levels / s, torch.zeros_like(s))
    stream = SymbolStream(bits, 2 * levels + 1, 1.0, -levels, work, x.device, per_field)
    chunk, device = stream.chunk(n, x.device), x.device
    size = min(chunk, -(-n // stream.group) * stream.group)
    t, u = torch.empty(size, dtype=work, device=device), torch.empty(size, dtype=work, device=device)
    words = torch.empty((size + 3) // 4, dtype=torch.int64, device=device)
    sym = torch.empty(0 if stream.per_byte else size, dtype=torch.uint8, device=device)
    # u = (r + 2^15 + 1/2) / 2^16 for the random int16 r, so y + s + u = y + r/2^16 + offset
    offset = levels + 0.5 + 2.0**-17
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        m, padded = hi - lo, -(-(hi - lo) // stream.group) * stream.group
        for a, b, first, rows in spans(lo, hi, bucket):
            dst, scale = t[a - lo: b - lo].view(rows, -1), mult[first: first + rows].unsqueeze(1)
            if x.dtype == work:
                torch.mul(x[a:b].view(rows, -1), scale, out=dst)
            else:
                dst.copy_(x[a:b].view(rows, -1)).mul_(scale)
        r = words[: (m + 3) // 4].random_(-(2**63), None, generator=generator)
        tm, um = t[:m], u[:m]
        um.copy_(r.view(torch.int16)[:m])
        # clamp: guards the uint8 cast against the rounding of norms (and is TernGrad's clipping)
        tm.add_(um, alpha=2.0**-16).add_(offset).clamp_(0, 2 * levels)
        t[m:padded] = 0
        first, stop = stream.span(lo, padded)
        stream.pack(t[:padded], out[first:stop], u, sym)


def decode_grid(data: torch.Tensor, n: int, bucket: int, scales: torch.Tensor, levels: int,
                bits: int | None, dtype: torch.dtype, name: str, per_field: int = 1) -> torch.Tensor:
    """Inverse of :func:`encode_grid`; ``data`` holds exactly the stream bytes of ``n`` symbols."""
    work = work_dtype(dtype)
    device = data.device
    stream = SymbolStream(bits, 2 * levels + 1, 1.0, -levels, work, device, per_field)
    step = scales.to(work) / levels
    out = torch.empty(n, dtype=dtype, device=device)
    chunk = stream.chunk(n, device)
    size = min(chunk, -(-n // stream.group) * stream.group)
    f, sym = torch.empty(size, dtype=work, device=device), torch.empty(size, dtype=torch.uint8, device=device)
    index = torch.empty(-(-size // max(stream.per_byte, 1)), dtype=torch.int64, device=device)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        m, padded = hi - lo, -(-(hi - lo) // stream.group) * stream.group
        first, stop = stream.span(lo, padded)
        src = data[first:stop]
        if src.numel() < stop - first:  # the last group is cut short on the wire: pad it with zeros
            src = torch.cat([src, src.new_zeros(stop - first - src.numel())])
        direct = dtype == work and padded == m  # decode straight into the output
        dst = out[lo:hi] if direct else f[:padded]
        stream.unpack(src, dst, sym, index, name)  # dst = symbol - s: exact, 0 for the middle one
        for a, b, first_bucket, rows in spans(lo, hi, bucket):
            dst[a - lo: b - lo].view(rows, -1).mul_(step[first_bucket: first_bucket + rows].unsqueeze(1))
        if not direct:
            out[lo:hi].copy_(dst[:m])
    return out


class GridCompressor(Compressor):
    """A compressor sending one float32 scale per bucket, then the stream of grid symbols.

    Wire format: ``[num_buckets x float32 scale][symbol stream]``. Subclasses set ``levels`` and
    ``bits`` (None: base-3 trits) and ``per_field``, and define ``_bucket(n)`` and ``_scales(flat_x)``.
    """

    unbiased = True
    stochastic = True
    levels: int = 1
    bits: int | None = None
    per_field: int = 1  # symbols per bits-bit field (radix 2s+1); 1: plain fixed-width symbols

    def _bucket(self, n: int) -> int:
        raise NotImplementedError

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _num_buckets(self, n: int) -> int:
        return -(-n // self._bucket(n))

    def _stream_bytes(self, n: int) -> int:
        if self.bits is None:
            return -(-n // 5)
        return bitpack.packed_bytes(-(-n // self.per_field), self.bits)

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return 4 * self._num_buckets(numel) + self._stream_bytes(numel)

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        n = xf.numel()
        scales = self._scales(xf)
        if x.dtype == torch.float16 and scales.numel() and float(scales.max()) > torch.finfo(torch.float16).max:
            check_decodable(grid_decode_bound(xf, scales, self._bucket(n), self.levels), x.dtype, self.name)
        head = 4 * scales.numel()
        group = 5 if self.bits is None else 8 * self.per_field
        out = torch.empty(head + self._stream_bytes(-(-n // group) * group), dtype=torch.uint8,
                          device=xf.device)
        write(out[:head], scales)
        stream = out[head: head + self._stream_bytes(n)]
        if not (n and kernels.wanted(xf) and self._fused_encode(xf, scales, stream, generator)):
            encode_grid(xf, self._bucket(n), scales, self.levels, self.bits, out[head:], generator, self.per_field)
        return make_packet(out[: head + self._stream_bytes(n)], x)

    def _fused_encode(self, xf: torch.Tensor, scales: torch.Tensor, stream: torch.Tensor,
                      generator: torch.Generator | None) -> bool:
        """The Triton path (gradwire.kernels.grid); False where the float32 multipliers ``s/r``
        overflow (subnormal scales), which the reference handles in float64."""
        if not bool(torch.isfinite(self.levels / scales[scales > 0]).all()):
            return False
        from gradwire.kernels import grid

        seed = kernels.seed_word(generator, xf.device)
        grid.encode(xf, self._bucket(xf.numel()), scales, self.levels, self.bits, self.per_field, stream, seed)
        return True

    def decode(self, packet: Packet) -> torch.Tensor:
        n = packet.numel
        buf = payload(packet, self.nbytes(n), self.name)
        head = 4 * self._num_buckets(n)
        scales = read(buf[:head], torch.float32)
        check_scales(scales, self.name)
        probe = torch.empty(0, dtype=packet.dtype, device=buf.device)
        if n and kernels.wanted(probe):
            from gradwire.kernels import grid

            out = torch.empty(n, dtype=packet.dtype, device=buf.device)
            if grid.decode(buf[head:], n, self._bucket(n), scales, self.levels, self.bits, self.per_field, out):
                raise CorruptPayload(f"{self.name}: invalid symbol in the payload")
        else:
            out = decode_grid(buf[head:], n, self._bucket(n), scales, self.levels, self.bits, packet.dtype,
                              self.name, self.per_field)
        return out.reshape(packet.shape)

