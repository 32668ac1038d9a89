"""Sparsifiers that keep the largest elements: ``topk`` and ``threshold`` (``randk``: randk.py).

Wire formats: values in the input dtype, then their positions as Golomb-coded gaps (``gapcode``),
whose size depends on where the kept elements are: ``nbytes`` is None for both.
"""

from __future__ import annotations

import math

import torch

from gradwire.compress import gapcode
from gradwire.compress.base import REGISTRY, Compressor, CorruptPayload, Packet
from gradwire.compress.positions import (
    check_finite,
    check_ratio,
    decode_positions,
    encode_positions,
    itemsize,
    keep_count,
    positions_bytes,
    scatter,
)
from gradwire.compress.wire import chunk_size, flat, make_packet, raw, read, work_dtype
from gradwire.spec import require


def round_up(tau: float, dtype: torch.dtype) -> float:
    """The smallest ``dtype`` number >= tau: then, for x in dtype, x >= result  <=>  x >= tau."""
    t = torch.tensor(tau, dtype=torch.float64, device="cpu").to(dtype)  # a host scalar
    if float(t) < tau:
        t = torch.nextafter(t, torch.tensor(math.inf, dtype=dtype, device="cpu"))
    return float(t)


def _abs_at_least(xc: torch.Tensor, t: float, mask: torch.Tensor, tmp: torch.Tensor, f: torch.Tensor) -> None:
    """mask = |xc| >= t, computed in f's dtype without writing |xc| (two compares are cheaper)."""
    if xc.dtype != f.dtype:
        xc = f[: xc.numel()].copy_(xc)
    torch.ge(xc, t, out=mask)
    mask.logical_or_(torch.le(xc, -t, out=tmp))


def abs_at_least(x: torch.Tensor, t: float, limit: int | None = None,
                 mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """Ascending indices of the elements of the 1-D ``x`` with ``|x| >= t`` (t exact in the work
    dtype), chunk by chunk; None as soon as there are more than ``limit``. With ``mask`` (bool, n
    elements) the full mask is written there instead and None returned."""
    n = x.numel()
    chunk = chunk_size(n, x.device)  # a GPU takes one pass: one nonzero(), one host sync
    size = min(chunk, n)
    f = torch.empty(size, dtype=work_dtype(x.dtype), device=x.device)
    part = torch.empty(size, dtype=torch.bool, device=x.device)
    tmp = torch.empty(size, dtype=torch.bool, device=x.device)
    found, count = [], 0
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        m = mask[lo:hi] if mask is not None else part[: hi - lo]
        _abs_at_least(x[lo:hi], t, m, tmp[: hi - lo], f)
        if mask is None:
            found.append(m.nonzero().view(-1).add_(lo))
            count += found[-1].numel()
            if limit is not None and count > limit:
                return None
    if mask is not None:
        return None
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.int64, device=x.device)


def top_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending indices of k elements of largest magnitude (x finite).

    torch.topk over 25M elements takes 0.4 s. When k is a small fraction of n, a threshold is read
    off a strided sample of about 1000 n/k elements (its rank padded by 5% and three standard
    deviations), one chunked pass collects the candidates at or above it, and topk runs on those:
    the same set, several times faster. If the sample misleads (fewer than k or more than 4k
    candidates), the full topk decides.
    """
    n = x.numel()
    if k == n:
        return torch.arange(n, device=x.device)
    if k and 32 * k <= n and n >= 1 << 16:
        sample = x[:: max(1, n // max(1 << 16, 1000 * n // k))].to(work_dtype(x.dtype))
        expected = k * sample.numel() / n
        rank = min(sample.numel(), math.ceil(1.05 * expected + 3 * math.sqrt(expected)) + 1)
        t = float(torch.topk(sample.abs(), rank, sorted=False).values.min())
        index = abs_at_least(x, t, 4 * k) if t > 0 else None
        if index is not None and index.numel() >= k:
            if index.numel() > k:
                keep = torch.topk(x[index].abs(), k, sorted=False).indices
                index = index[keep].sort().values
            return index
    return torch.topk(x.abs(), k, sorted=False).indices.sort().values


def _values_and_positions(buf: torch.Tensor, n: int, k: int, dtype: torch.dtype, name: str):
    """Split ``[k values][positions]`` and decode the positions."""
    size = k * itemsize(dtype)
    if buf.numel() < size:
        raise CorruptPayload(f"{name}: payload of {buf.numel()} bytes is shorter than its {k} values "
                             f"({size} bytes; truncated buffer)")
    return read(buf[:size], dtype), decode_positions(buf[size:], n, k, name)


@REGISTRY.register(
    "topk",
    help="top-k by magnitude, k = ceil(ratio*n); values in the input dtype + Golomb-coded index gaps",
    params={"ratio": "fraction of elements kept, in (0, 1]"},
)
class TopK(Compressor):
    """Top-k sparsification. Deterministic and biased; a contraction with
    ``||C(x) - x||^2 <= (1 - k/n) ||x||^2`` (the k largest squares are at least a k/n share of the
    sum; Stich, Cordonnier, Jaggi 2018, "Sparsified SGD with memory", NeurIPS), exposed as omega.

    Wire format: ``[k values, input dtype][positions]`` (positions: ``gapcode``), no header: the
    receiver derives k from n. The size depends on the positions, so :meth:`nbytes` returns None
    and :meth:`payload_bytes` gives it for known positions. Ties in magnitude are broken by
    ``torch.topk``.
    """

    name = "topk"

    def __init__(self, *, ratio: float = 0.01):
        self.ratio = check_ratio(ratio)

    def spec(self) -> str:  # not spec_of: repr keeps "ratio=1.0" as earlier records have it
        return f"topk:ratio={self.ratio!r}"

    def count(self, numel: int) -> int:
        """How many elements are kept of ``numel`` (both ends derive it; it never travels)."""
        return keep_count(self.ratio, numel)

    def omega(self, numel: int) -> float:
        return 1 - self.count(numel) / numel if numel else 0.0

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> None:
        return None

    def max_nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        """k values and the largest position section of k positions (``gapcode.max_section_bytes``)."""
        k = self.count(numel)
        return k * itemsize(dtype) + gapcode.max_section_bytes(numel, k)

    @staticmethod
    def payload_bytes(numel: int, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> int:
        """The payload's size when the kept positions are the ascending ``index``."""
        return index.numel() * itemsize(dtype) + positions_bytes(numel, index)

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        n = xf.numel()
        k = self.count(n)
        check_finite(xf, self.name)
        index = top_indices(xf, k)
        return make_packet(torch.cat([xf[index].view(torch.uint8), encode_positions(n, index)]), x)

    def decode(self, packet: Packet) -> torch.Tensor:
        n, dtype = packet.numel, packet.dtype
        values, index = _values_and_positions(raw(packet, self.name), n, self.count(n), dtype, self.name)
        return scatter(n, index, values, dtype, self.name).reshape(packet.shape)


@REGISTRY.register(
    "threshold",
    help="hard threshold: keep |x| >= tau (as in DAGC-A); variable size with a 4-byte count header",
    params={"tau": "keep elements with |x| >= tau; tau >= 0 (scale-dependent: no universal default)"},
)
class Threshold(Compressor):
    """Hard-threshold sparsification (Sahu, Dutta, Abdelmoniem, Banerjee, Canini, Kalnis 2021,
    "Rethinking gradient sparsification as total error minimization", NeurIPS): deterministic,
    biased; ``||C(x) - x||^2 <= min(||x||^2, n*tau^2)``, no relative omega.

    Wire format: ``[uint32 count c, little-endian][c values, input dtype][positions]`` (positions
    as for ``topk`` with k = c); :meth:`nbytes` returns None (data-dependent),
    :meth:`payload_bytes` gives the size for known positions.
    """

    name = "threshold"

    def __init__(self, *, tau: float = 1e-3):
        require(math.isfinite(tau) and tau >= 0, f"tau must be a finite number >= 0, got {tau}")
        self.tau = tau

    def spec(self) -> str:  # not spec_of: repr keeps "tau=1.0" as earlier records have it
        return f"threshold:tau={self.tau!r}"

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> None:
        return None

    @staticmethod
    def payload_bytes(numel: int, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> int:
        return 4 + TopK.payload_bytes(numel, index, dtype)

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        n = xf.numel()
        if n >= 2**32:
            raise ValueError(f"{self.name}: {n} elements do not fit the 32-bit count header")
        check_finite(xf, self.name)
        tau = round_up(self.tau, work_dtype(xf.dtype))
        # Above n/3 kept elements an index list costs more memory than a mask; above 0.382 n the
        # positions are a bitmap (Golomb b = 1), so the indices are never needed.
        index = abs_at_least(xf, tau, n // 3)
        if index is None:
            mask = torch.empty(n, dtype=torch.bool, device=xf.device)
            abs_at_least(xf, tau, mask=mask)
            if gapcode.golomb_parameter(n, int(mask.sum())) == 1:
                values, positions = torch.masked_select(xf, mask), gapcode.encode_mask(n, mask)
            else:
                index = mask.nonzero().view(-1)
        if index is not None:
            values, positions = xf[index], encode_positions(n, index)
        count = torch.tensor([values.numel()], dtype=torch.int64, device=xf.device).view(torch.uint8)[:4]
        return make_packet(torch.cat([count, values.view(torch.uint8), positions]), x)

    def decode(self, packet: Packet) -> torch.Tensor:
        n, dtype = packet.numel, packet.dtype
        buf = raw(packet, self.name)
        if buf.numel() < 4:
            raise CorruptPayload(f"{self.name}: payload of {buf.numel()} bytes is shorter than its header")
        count = int.from_bytes(bytes(buf[:4].tolist()), "little")  # one host read of 4 bytes
        if count > n:
            raise CorruptPayload(f"{self.name}: header counts {count} values for a tensor of {n} elements")
        values, index = _values_and_positions(buf[4:], n, count, dtype, self.name)
        return scatter(n, index, values, dtype, self.name).reshape(packet.shape)


class KeepTopK(TopK):
    """Top-k by magnitude with an exact count ``k`` (``topk`` derives k from a ratio, whose
    rounding cannot hit every integer). Wire format as ``topk``: ``[k values][positions]``; the
    receiver knows k from the allocation, so no header travels."""

    name = "keep-topk"

    def __init__(self, *, k: int):
        require(k >= 0, f"k must be >= 0, got {k}")
        self.k = int(k)

    def spec(self) -> str:  # not registered (an algorithm sets k per worker): no spec string to derive
        return f"keep-topk:k={self.k}"

    def count(self, numel: int) -> int:
        return min(self.k, numel)
