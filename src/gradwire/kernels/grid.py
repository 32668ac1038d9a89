"""Stochastic rounding onto a bucket's grid and packing, in one pass; and the decoding.

QSGD (Alistarh et al. 2017), TernGrad (Wen et al. 2017) and DIANA's p-norm quantiser (Mishchenko
et al. 2019) share one core (``gradwire.compress.levels``): element ``x`` of bucket ``b`` becomes
the symbol ``q = floor(clamp(x * s/r_b + s + u, 0, 2s))`` in ``0..2s``, packed by the codec's
layout, and decodes to ``(q - s) * r_b/s``. The bucket scales ``r_b`` come from the reference
(one reduction, with its finiteness check); the kernels do the rest.

Every layout of the grid codecs is one case of: ``K`` symbols of radix ``R`` per ``W``-bit field
``v = q_0 + R q_1 + ...``, fields in an LSB-first bit stream, so eight fields fill ``W`` bytes
(a "super group"). Base-3 trits are ``(3, 5, 8)``, fixed ``b``-bit symbols ``(2s+1, 1, b)``, QSGD's
format 2 ``(2s+1, k, w)``. One program packs whole super groups: no two programs write a byte.

References (tests/kernels compares them): :func:`gradwire.compress.levels.encode_grid` (same law,
other random numbers: compared in distribution, and byte for byte where rounding is certain) and
:func:`gradwire.compress.levels.decode_grid` (deterministic: bit for bit).

Randomness: ``u = ((r >> 16) + 1/2) / 2^16`` from the Philox word ``r`` of the element: 2^16
equally likely values, as in the reference, so ``|P(round up) - frac(y)| <= 2^-17``, and
``integer + s + u`` is exact in float32 (at most 8 + 16 bits): an element on a grid point rounds to
it whatever ``u``, the case where the kernel and the reference must send the same bytes.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gradwire.kernels.common import output_view, store_rounded

SUPER = 32  # super groups (8 fields each) per program


@triton.jit
def _encode(x_ptr, mult_ptr, seed_ptr, pow_ptr, out_ptr, n, nbytes, bucket, levels,
            R: tl.constexpr, K: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
            SUPER: tl.constexpr):
    group = tl.program_id(0) * SUPER + tl.arange(0, SUPER)
    f = tl.arange(0, 8)
    j = tl.arange(0, KP)
    elem = (group[:, None, None] * 8 + f[None, :, None]) * K + j[None, None, :]  # [SUPER, 8, KP]
    valid = (j[None, None, :] < K) & (elem < n)
    x = tl.load(x_ptr + elem, mask=valid, other=0.0).to(tl.float32)
    mult = tl.load(mult_ptr + elem // bucket, mask=valid, other=0.0)
    r = tl.randint(tl.load(seed_ptr), elem)
    u = (((r >> 16) & 0xFFFF).to(tl.float32) + 0.5) * (1.0 / 65536.0)
    y = tl.minimum(tl.maximum(x * mult + levels + u, 0.0), 2.0 * levels)
    q = tl.where(valid, tl.floor(y), 0.0).to(tl.int64)
    power = tl.load(pow_ptr + j, mask=j < K, other=0)
    v = tl.sum(q * power[None, None, :], axis=2)  # [SUPER, 8] field values
    t = tl.arange(0, WP)
    shift = 8 * t[None, :, None] - W * f[None, None, :]  # [1, WP, 8]: byte t's bits within field f
    part = tl.where(shift >= 0, v[:, None, :] >> tl.minimum(tl.maximum(shift, 0), 63),
                    v[:, None, :] << tl.minimum(tl.maximum(-shift, 0), 63)) & 255
    overlap = (shift > -8) & (shift < W)
    byte = tl.sum(tl.where(overlap, part, 0), axis=2)  # bits of distinct fields: the sum is the OR
    addr = group[:, None] * W + t[None, :]
    tl.store(out_ptr + addr, byte.to(tl.uint8), mask=(t[None, :] < W) & (addr < nbytes))


@triton.jit
def _decode(data_ptr, step_ptr, pow_ptr, out_ptr, bad_ptr, n, nbytes, bucket, levels,
            R: tl.constexpr, K: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
            SUPER: tl.constexpr, BF16: tl.constexpr):
    group = tl.program_id(0) * SUPER + tl.arange(0, SUPER)
    f = tl.arange(0, 8)
    j = tl.arange(0, KP)
    t = tl.arange(0, WP)
    addr = group[:, None] * W + t[None, :]
    byte = tl.load(data_ptr + addr, mask=(t[None, :] < W) & (addr < nbytes), other=0).to(tl.int64)
    shift = 8 * t[None, :, None] - W * f[None, None, :]  # [1, WP, 8]
    part = tl.where(shift >= 0, byte[:, :, None] << tl.minimum(tl.maximum(shift, 0), 63),
                    byte[:, :, None] >> tl.minimum(tl.maximum(-shift, 0), 63))
    overlap = (shift > -8) & (shift < W)
    v = tl.sum(tl.where(overlap, part, 0), axis=1) & ((1 << W) - 1)  # [SUPER, 8]
    power = tl.load(pow_ptr + j, mask=j < K, other=1)
    q = (v[:, :, None] // power[None, None, :]) % R  # [SUPER, 8, KP]
    elem = (group[:, None, None] * 8 + f[None, :, None]) * K + j[None, None, :]
    valid = (j[None, None, :] < K) & (elem < n)
    step = tl.load(step_ptr + elem // bucket, mask=valid, other=0.0)
    value = (q - levels).to(tl.float32) * step
    store_rounded(out_ptr, elem, value, valid, BF16)
    top = tl.load(pow_ptr + K)  # R^K: a field at or above it holds a digit >= R
    # every field on the wire is checked, the padding's too, as the reference decoder does
    fields = (group[:, None] * 8 + f[None, :]) * W < nbytes * 8
    tl.store(bad_ptr + tl.program_id(0), tl.max(tl.where(fields & (v >= top), 1, 0)))


def layout(levels: int, bits: int | None, per_field: int) -> tuple[int, int, int]:
    """``(R, K, W)`` of a grid codec's symbol stream (``bits`` None: base-3 trits)."""
    if bits is None:
        return 3, 5, 8
    return 2 * levels + 1, per_field, bits


@functools.lru_cache(maxsize=64)
def _powers(radix: int, k: int, device: torch.device) -> torch.Tensor:
    """Made once per (radix, k, device): built from a Python list on every call, it made the GPU wait
    for a host-to-device copy in every encode and decode. Read only."""
    return torch.tensor([radix**j for j in range(k + 1)], dtype=torch.int64, device=device)


def _grid(n: int, k: int) -> tuple[int]:
    return (max(1, triton.cdiv(n, 8 * k * SUPER)),)


def _sizes(radix: int, k: int, w: int) -> dict:
    return dict(R=radix, K=k, W=w, KP=triton.next_power_of_2(k), WP=triton.next_power_of_2(w), SUPER=SUPER)


def encode(x: torch.Tensor, bucket: int, scales: torch.Tensor, levels: int, bits: int | None, per_field: int,
           out: torch.Tensor, seed: torch.Tensor) -> None:
    """Write the symbol stream of the contiguous 1-D ``x`` into ``out`` (exactly its stream bytes);
    ``seed``: the Philox key (:func:`gradwire.kernels.seed_word`)."""
    radix, k, w = layout(levels, bits, per_field)
    n = x.numel()
    s = scales.float()
    mult = torch.where(s > 0, levels / s, torch.zeros_like(s))
    _encode[_grid(n, k)](x, mult, seed, _powers(radix, k, x.device), out, n, out.numel(), bucket, float(levels),
                         **_sizes(radix, k, w))


def decode(data: torch.Tensor, n: int, bucket: int, scales: torch.Tensor, levels: int, bits: int | None,
           per_field: int, out: torch.Tensor) -> bool:
    """Decode the stream bytes ``data`` of ``n`` symbols into ``out``; returns whether a field held
    a digit beyond the radix (a corrupt payload; one host read)."""
    radix, k, w = layout(levels, bits, per_field)
    step = scales.float() / levels
    grid = _grid(n, k)
    bad = torch.zeros(grid[0], dtype=torch.int32, device=data.device)
    view, bf16 = output_view(out)
    _decode[grid](data, step, _powers(radix, k, data.device), view, bad, n, data.numel(), bucket, levels,
                  **_sizes(radix, k, w), BF16=bf16)
    return bool(bad.any())
