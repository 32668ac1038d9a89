"""Natural compression: unbiased stochastic rounding of each |x| to a power of two.

Horvath, Ho, Horvath, Sahu, Canini, Richtarik (2019), "Natural compression for distributed deep
learning". For ``2^a <= |t| <= 2^(a+1)``, ``C_nat(t) = sign(t) * 2^a`` with probability
``(2^(a+1) - |t|) / 2^a``, else ``sign(t) * 2^(a+1)``: unbiased. Writing ``|t| = 2^a (1 + f)``,
``E(C - t)^2 = 4^a f(1 - f)`` and ``t^2 = 4^a (1 + f)^2``; the ratio peaks at f = 1/3 with value
1/8, hence ``omega = 1/8`` (the paper's bound). It holds for magnitudes of at least 2^-126 (the
smallest float32 normal); smaller ones round to 0 or 2^-126, unbiased but with a larger relative
variance.

float32 (and fp16/bf16, converted exactly to float32) uses the bit pattern: with
``|x| = 2^a (1 + m/2^23)``, adding a uniform 23-bit integer to the low bits of ``|x|``'s pattern
carries into the exponent with probability exactly ``m/2^23``: exact unbiased rounding, with
float32 subnormals rounded to 0 or 2^-126 by the same carry. float64 uses frexp and a uniform
double (bias below 2^-53).

Wire format: ``[n exponent bytes][n sign bits, 1 = negative, LSB first]``, ``n + ceil(n/8)``
bytes (9 bits per element). Exponent byte ``e`` means ``2^(e - 127)`` (float32's bias), 0 means
zero; 255 is invalid. Values that would round up past the output dtype's largest power of two
(2^127; 2^15 for float16) raise ValueError.
"""

from __future__ import annotations

import torch

from gradwire import kernels
from gradwire.compress import bitpack
from gradwire.compress.base import REGISTRY, Compressor, CorruptPayload, Packet, raise_non_finite
from gradwire.compress.sign import pack_signs
from gradwire.compress.wire import chunk_size, flat, make_packet, payload

_INF_BITS = 0x7F800000


def max_exponent(dtype: torch.dtype) -> int:
    """Largest exponent byte whose power of two the dtype holds: 2^15 for fp16, 2^127 otherwise."""
    return 127 + 15 if dtype == torch.float16 else 254


def _exponents_f32(x: torch.Tensor, out: torch.Tensor, limit: int, gen: torch.Generator | None) -> None:
    n, device = x.numel(), x.device
    chunk = chunk_size(n, device)
    size = min(chunk, n)
    a = torch.empty(size, dtype=torch.int32, device=device)
    f = torch.empty(size, dtype=torch.float32, device=device)
    words = torch.empty((size + 1) // 2, dtype=torch.int64, device=device)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        m = hi - lo
        if x.dtype == torch.float32:
            bits = x[lo:hi].view(torch.int32)
        else:
            bits = f[:m].copy_(x[lo:hi]).view(torch.int32)
        am = torch.bitwise_and(bits, 0x7FFFFFFF, out=a[:m])
        if int(am.amax()) >= _INF_BITS:
            raise_non_finite(x, "natural")
        r = words[: (m + 1) // 2].random_(-(2**63), None, generator=gen).view(torch.int32)[:m]
        am.add_(r.bitwise_and_(0x7FFFFF)).bitwise_right_shift_(23)  # carry = round up
        _check_limit(am, x, lo, limit)
        out[lo:hi].copy_(am)


def _exponents_f64(x: torch.Tensor, out: torch.Tensor, limit: int, gen: torch.Generator | None) -> None:
    if x.numel():
        lo, hi = torch.aminmax(x)
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            raise_non_finite(x, "natural")
    a = x.abs()
    mant, exp = torch.frexp(a)  # a = mant * 2^exp, mant in [0.5, 1): a lies in [2^(exp-1), 2^exp)
    u = torch.rand(a.shape, dtype=torch.float64, generator=gen, device=x.device)
    e = exp.add_(126) + (u < mant.mul_(2).sub_(1))  # 127 + (exp - 1), plus one when rounding up
    tiny = a < 2.0**-126  # below float32's normal range: 0 or 2^-126, unbiased
    e = torch.where(tiny, (u < a * 2.0**126).to(torch.int32), e)
    _check_limit(e, x, 0, limit)
    out.copy_(e)


def _check_limit(e: torch.Tensor, x: torch.Tensor, offset: int, limit: int) -> None:
    if e.numel() and int(e.amax()) > limit:
        index = offset + int((e > limit).nonzero()[0])
        raise ValueError(f"natural: {float(x[index]):g} at flat index {index} rounds up to "
                         f"2^{int(e[index - offset]) - 127}, beyond the range of {x.dtype}")


@REGISTRY.register(
    "natural",
    help="natural compression (Horvath et al. 2019): |x| rounded to a power of two, unbiased; 9 bits",
)
class Natural(Compressor):
    """Natural compression; unbiased, ``omega = 1/8`` (for magnitudes >= 2^-126)."""

    name = "natural"
    unbiased = True
    stochastic = True

    def omega(self, numel: int) -> float:
        return 1 / 8

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return numel + -(-numel // 8)

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        n = xf.numel()
        out = torch.empty(self.nbytes(n), dtype=torch.uint8, device=xf.device)
        if n and kernels.wanted(xf):
            from gradwire.kernels import natural as fused

            if not fused.encode(xf, out, max_exponent(xf.dtype), kernels.seed_word(generator, xf.device)):
                return make_packet(out, x)
            # a non-finite or out-of-range value: the reference below finds and names it
        exponents = _exponents_f64 if xf.dtype == torch.float64 else _exponents_f32
        exponents(xf, out[:n], max_exponent(xf.dtype), generator)
        pack_signs(xf, out[n:])
        return make_packet(out, x)

    def decode(self, packet: Packet) -> torch.Tensor:
        n, dtype = packet.numel, packet.dtype
        buf = payload(packet, self.nbytes(n), self.name)
        out = torch.empty(n, dtype=dtype, device=buf.device)
        if n and kernels.wanted(out):
            from gradwire.kernels import natural as fused

            if fused.decode(buf, n, out, max_exponent(dtype)):
                raise CorruptPayload(f"{self.name}: exponent byte above {max_exponent(dtype)} for {dtype}")
            return out.reshape(packet.shape)
        if n and int(buf[:n].amax()) > max_exponent(dtype):
            raise CorruptPayload(f"{self.name}: exponent byte above {max_exponent(dtype)} for {dtype}")
        device = buf.device
        chunk = chunk_size(n, device)
        size = min(chunk, -(-n // 8) * 8)
        v = torch.empty(size, dtype=torch.int32, device=device)
        s = torch.empty(size, dtype=torch.uint8, device=device)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            m, padded = hi - lo, -(-(hi - lo) // 8) * 8
            bitpack.unpack_bits(buf[n + lo // 8: n + (lo + padded) // 8], 1, s[:padded])
            vm = v[:m].copy_(s[:m]).bitwise_left_shift_(8).bitwise_or_(buf[lo:hi])  # sign | exponent
            out[lo:hi].copy_(vm.bitwise_left_shift_(23).view(torch.float32))
        return out.reshape(packet.shape)
