"""Dense codecs: the tensor as is (``none``) or cast to 16-bit floats (``fp16``, ``bf16``).

Wire format: the ``n`` elements in the wire dtype, native (little-endian) byte order:
``n * itemsize`` bytes, with itemsize the input's for ``none`` (4 for float32, 8 for float64) and
2 for the casts. These are the only ``summable`` codecs: viewed as the wire dtype, buffers of
several workers add up element-wise, so an allreduce can carry them. (Decoding does not reject
non-finite values for that reason: a sum of fp16 buffers may legitimately overflow.)

Rounding to nearest is deterministic, hence biased; for values in the normal range of the wire
dtype the relative error is at most the unit roundoff ``u`` (2^-11 for fp16, 2^-8 for bf16), so
``||C(x) - x||^2 <= u^2 ||x||^2``, but values below the normal range lose their relative
precision (fp16 underflows below 6e-8), so no omega is claimed. A finite input that overflows
the wire dtype (|x| >= 65520 for fp16) raises ValueError instead of sending inf.
"""

from __future__ import annotations

import torch

from gradwire.compress.base import REGISTRY, Compressor, Packet, raise_non_finite
from gradwire.compress.wire import flat, make_packet, payload, read


class Dense(Compressor):
    """Send every element in the dtype ``cast_to`` (None: the input's own dtype)."""

    summable = True
    cast_to: torch.dtype | None = None

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype in which a tensor of ``dtype`` travels: view (and sum) buffers as this."""
        return dtype if self.cast_to is None else self.cast_to

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return numel * self.wire_dtype(dtype).itemsize

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        wire = self.wire_dtype(xf.dtype)
        out = torch.empty(self.nbytes(xf.numel(), xf.dtype), dtype=torch.uint8, device=xf.device)
        values = out.view(wire)
        values.copy_(xf)
        if xf.numel():
            lo, hi = torch.aminmax(values)  # NaN propagates; inf shows: catches input and overflow
            if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
                if not bool(torch.isfinite(xf).all()):
                    raise_non_finite(xf, self.name)
                index = int((~torch.isfinite(values)).nonzero()[0])
                raise ValueError(
                    f"{self.name}: value {float(xf[index]):g} at flat index {index} overflows {wire}"
                )
        return make_packet(out, x)

    def decode(self, packet: Packet) -> torch.Tensor:
        buf = payload(packet, self.nbytes(packet.numel, packet.dtype), self.name)
        values = read(buf, self.wire_dtype(packet.dtype))
        return values.to(packet.dtype, copy=True).reshape(packet.shape)


@REGISTRY.register("none", help="no compression: the tensor's own bytes (32 bits/element for fp32)")
class Identity(Dense):
    """Lossless: unbiased with omega 0."""

    name = "none"
    unbiased = True

    def omega(self, numel: int) -> float:
        return 0.0


@REGISTRY.register("fp16", help="cast to IEEE half precision (16 bits/element); range +-65504")
class Float16(Dense):
    name = "fp16"
    cast_to = torch.float16


@REGISTRY.register("bf16", help="cast to bfloat16 (16 bits/element): float32's range, 8-bit mantissa")
class BFloat16(Dense):
    name = "bf16"
    cast_to = torch.bfloat16
