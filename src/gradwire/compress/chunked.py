"""Chunked top-k: the k largest magnitudes of every chunk of C consecutive elements, the kept values
optionally quantised, the positions Golomb-coded (``gapcode``).

SparseLoCo (Sarfi, Thérien, Lidin, Belilovsky 2025, "Communication Efficient LLM Pre-training with
SparseLoCo", arXiv:2508.15706, Algorithm 1) sends TopK per chunk of its error-feedback accumulator
with 2-bit values; DeMo (Peng, Quesnelle, Kingma 2024, "DeMo: Decoupled Momentum Optimization",
arXiv:2411.19870, Algorithm 1) sends the top-k DCT coefficients of every chunk of its momentum
(``algorithms/demo.py`` applies the DCT, this codec the selection). A chunk keeps k of C; the last
chunk, of L < C elements, keeps ``min(L, ceil(k L / C))``. So the count K travels nowhere: both ends
derive it from n, C and k.

Wire format, no header: ``[values][positions]``

- values, K of them in ascending position order: ``values=raw`` bit for bit in the input dtype
  (K × itemsize bytes); ``values=ternary`` DIANA's p-norm quantiser with p = ∞ (``pquant``: one
  float32 max-magnitude per ``block`` kept values, then each value stochastically rounded to
  {-1, 0, 1} × that scale, 5 trits per byte: ``4 ceil(K/block) + ceil(K/5)`` bytes). That is
  the symbol set of the papers' "2-bit" quantisation packed at log2(3) ≈ 1.6 bits, unbiased;
  what it loses goes back into the sender's error-feedback memory.
- positions: the ascending indices of the K kept elements in the whole tensor, as ``gapcode``
  sections them (Golomb-coded gaps, or a bitmap where that is no larger); their size depends on
  the data, so ``nbytes`` is None and the transports exchange sizes where they must.
"""

from __future__ import annotations

import math

import torch

from gradwire.compress import gapcode
from gradwire.compress.base import REGISTRY, Compressor, CorruptPayload, Packet
from gradwire.compress.positions import (
    check_finite,
    decode_positions,
    encode_positions,
    itemsize,
    positions_bytes,
    scatter,
)
from gradwire.compress.pquant import PQuant
from gradwire.compress.wire import flat, make_packet, raw, read
from gradwire.spec import require

VALUE_CODES = ("raw", "ternary")


def chunk_counts(n: int, chunk: int, k: int) -> tuple[int, int, int]:
    """(full chunks, elements of the last partial chunk, kept elements in it)."""
    full, tail = divmod(n, chunk)
    return full, tail, min(tail, math.ceil(k * tail / chunk))


def chunk_top_indices(x: torch.Tensor, chunk: int, k: int) -> torch.Tensor:
    """Ascending indices of the k largest magnitudes of each chunk of the 1-D ``x`` (ties: torch.topk)."""
    n = x.numel()
    full, tail, k_tail = chunk_counts(n, chunk, k)
    parts = []
    if full:
        rows = x[: full * chunk].view(full, chunk).abs()
        kept = torch.topk(rows, min(k, chunk), dim=1, sorted=False).indices.sort(dim=1).values
        parts.append((kept + torch.arange(full, device=x.device).unsqueeze(1) * chunk).reshape(-1))
    if k_tail:
        kept = torch.topk(x[full * chunk:].abs(), k_tail, sorted=False).indices.sort().values
        parts.append(kept + full * chunk)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=x.device)


@REGISTRY.register(
    "chunked-topk",
    help="top-k of every chunk of C elements (SparseLoCo, DeMo); values raw or ternary, Golomb-coded positions",
    params={"chunk": "C: elements per chunk (SparseLoCo: 4096)",
            "k": "elements kept per chunk, 1..C (SparseLoCo: 64 of 4096 = 1.56%)",
            "values": "raw (the input dtype) or ternary (pquant:p=inf per block: 1.6 bits + scales)",
            "block": "with values=ternary: kept values per float32 scale"},
)
class ChunkedTopK(Compressor):
    """Deterministic selection, biased; with ``values=ternary`` stochastic (the generator rounds)."""

    name = "chunked-topk"

    def __init__(self, *, chunk: int = 4096, k: int = 64, values: str = "ternary", block: int = 64):
        require(chunk >= 1, f"chunk must be >= 1, got {chunk}")
        require(1 <= k <= chunk, f"k must be in [1, chunk={chunk}], got {k}")
        require(values in VALUE_CODES, f"values={values!r}: valid choices are {', '.join(VALUE_CODES)}")
        require(block >= 1, f"block must be >= 1, got {block}")
        self.chunk, self.k, self.values, self.block = chunk, k, values, block
        self.quantiser = PQuant(p=math.inf, block=block) if values == "ternary" else None
        self.stochastic = self.quantiser is not None

    def count(self, numel: int) -> int:
        """K, the kept elements of a tensor of ``numel`` (both ends derive it)."""
        full, _, k_tail = chunk_counts(numel, self.chunk, self.k)
        return full * min(self.k, self.chunk) + k_tail

    def value_bytes(self, count: int, dtype: torch.dtype) -> int:
        return self.quantiser.nbytes(count) if self.quantiser is not None else count * itemsize(dtype)

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> None:
        return None

    def max_nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        """K values and the largest position section of K positions (``gapcode.max_section_bytes``)."""
        count = self.count(numel)
        return self.value_bytes(count, dtype) + gapcode.max_section_bytes(numel, count)

    def payload_bytes(self, numel: int, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> int:
        """The payload's size when the kept positions are the ascending ``index``."""
        return self.value_bytes(index.numel(), dtype) + positions_bytes(numel, index)

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        check_finite(xf, self.name)
        index = chunk_top_indices(xf, self.chunk, self.k)
        kept = xf[index]
        if self.quantiser is not None:
            values = self.quantiser.encode(kept, generator=generator).buffer
        else:
            values = kept.view(torch.uint8)
        return make_packet(torch.cat([values, encode_positions(xf.numel(), index)]), x)

    def decode(self, packet: Packet) -> torch.Tensor:
        index, values = self._kept(packet)
        return scatter(packet.numel, index, values, packet.dtype, self.name).reshape(packet.shape)

    def decode_sent(self, packet: Packet) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoded tensor and a boolean mask of the positions the payload carries (a kept value that
        quantised to 0 is still sent): what a mean over the senders of each position needs."""
        index, values = self._kept(packet)
        n = packet.numel
        sent = index if index.dtype == torch.bool else \
            torch.zeros(n, dtype=torch.bool, device=index.device).index_fill_(0, index, True)
        return scatter(n, index, values, packet.dtype, self.name).reshape(packet.shape), sent.reshape(packet.shape)

    def _kept(self, packet: Packet) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept positions (ascending indices, or a mask) and their decoded values."""
        n, dtype = packet.numel, packet.dtype
        buf = raw(packet, self.name)
        count = self.count(n)
        size = self.value_bytes(count, dtype)
        if buf.numel() < size:
            raise CorruptPayload(f"{self.name}: payload of {buf.numel()} bytes is shorter than its {count} "
                                 f"values ({size} bytes; truncated buffer)")
        if self.quantiser is not None:
            values = self.quantiser.decode(Packet(buf[:size], torch.Size([count]), dtype))
        else:
            values = read(buf[:size], dtype)
        return decode_positions(buf[size:], n, count, self.name), values
